"""What a trace file must hold, field by field, checked when it is loaded (``load_trace``).

The readers (summary, plot, to_chrome, layer_table) index, add and compare what a file holds, so
one value of the wrong type (an offset that is a string, a start that is a list, a role nobody
knows) would be a traceback in the middle of a picture. A check is a function (value, where)
that raises Malformed; the file's shape is written below as checks built from a few leaves.

Version 2 added the steps' times to the totals (``times``: each iteration kind's iterations after
its first, ``times_first``: its first, ``times_pending``: those of an iteration not ended yet) and
the layers' types to each plan (``types``). A version 1 file without them loads (its time tables
say it holds no step times); a version 2 file must hold them. The copies' bytes and seconds per
iteration kind (``copies`` in ``times``) came later in version 2: a file without them loads, and
its time tables leave the copies out.
"""
import math

from .fold import PHASES, ROLE_ORDER, SINCE_VERSION_2


class Malformed(ValueError):
    """Where in a trace file a value is wrong: ``where: expected ..., found ...``."""

    def __init__(self, where: str, expected: str, found):
        shown = "nothing (no such key)" if found is _MISSING else " ".join(repr(found).split())
        if len(shown) > 60:
            shown = shown[:57] + "..."
        super().__init__(f"{where}: expected {expected}, found {shown}")


_MISSING = object()
# Bytes and counts are bounded so that sums of them stay exact as floats and fit the int64
# arrays of the timeline; 2^53 bytes is 8 PiB, beyond any pool.
LIMIT = 2 ** 53


def _described(check, expected: str):
    """``check``, carrying what it expects (for the message when its key is missing)."""
    check.expected = expected
    return check


def _leaf(test, expected: str):
    def check(value, where):
        if not test(value):
            raise Malformed(where, expected, value)
    check.test = test           # for the events' fast path
    return _described(check, expected)


def _is_number(value) -> bool:
    if type(value) is int:
        return -LIMIT <= value <= LIMIT
    return type(value) is float and math.isfinite(value)


TEXT = _leaf(lambda v: type(v) is str, "a string")
FLAG = _leaf(lambda v: type(v) is bool, "true or false")
INTEGER = _leaf(lambda v: type(v) is int and -LIMIT <= v <= LIMIT,
                "an integer between -2^53 and 2^53")
COUNT = _leaf(lambda v: type(v) is int and 0 <= v <= LIMIT, "an integer 0..2^53")
BYTES = _leaf(lambda v: type(v) is int and 0 <= v <= LIMIT, "a byte count (an integer 0..2^53)")
NUMBER = _leaf(_is_number, "a finite number")
ROLE = _leaf(lambda v: type(v) is str and v in ROLE_ORDER, f"a role ({', '.join(ROLE_ORDER)})")
DIRECTION = _leaf(lambda v: v in ("h2d", "d2h") and type(v) is str, "'h2d' or 'd2h'")
PHASE = _leaf(lambda v: type(v) is str and v in PHASES, "a step kind (forward, backward, update)")


def _described_as(expected: str):
    return lambda check: _described(check, expected)


def _optional(check):
    def optional(value, where):
        if value is not None:
            check(value, where)
    return _described(optional, f"{check.expected} or null")


def _list_of(check, expected: str):
    def list_of(value, where):
        if type(value) is not list:
            raise Malformed(where, expected, value)
        for index, item in enumerate(value):
            check(item, f"{where}[{index}]")
    return _described(list_of, expected)


def _dict_of(check, expected: str, key=TEXT):
    def dict_of(value, where):
        if type(value) is not dict:
            raise Malformed(where, expected, value)
        for name, item in value.items():
            key(name, f"{where} (a key)")
            check(item, f"{where}[{name!r}]")
    return _described(dict_of, expected)


def _row(checks, expected: str):
    """A list of exactly ``len(checks)`` values, each checked by its own."""
    def row(value, where):
        if type(value) is not list or len(value) != len(checks):
            raise Malformed(where, expected, value)
        for index, (check, item) in enumerate(zip(checks, value)):
            check(item, f"{where}[{index}]")
    return _described(row, expected)


def _record(fields: dict, expected: str, optional=(), extra: bool = True):
    """A JSON object with ``fields`` (each required unless ``optional``); others are allowed
    when ``extra`` (an event's detail may carry more), else refused."""
    def record(value, where):
        if type(value) is not dict:
            raise Malformed(where, expected, value)
        for key, check in fields.items():
            inside = f"{where}.{key}" if where else key
            if key in value:
                check(value[key], inside)
            elif key not in optional:
                raise Malformed(inside, check.expected, _MISSING)
        if not extra:
            unknown = [key for key in value if key not in fields]
            if unknown:
                raise Malformed(where, f"only the keys {', '.join(fields)}", unknown[0])
    return _described(record, expected)


LIVE = _list_of(_row((INTEGER, TEXT, BYTES, ROLE), "[offset, owner, bytes, role]"),
                "a list of [offset, owner, bytes, role] (what the pool held)")
ROLES = _dict_of(ROLE, "a role by blob name (a JSON object)")
PLAN_FIELDS = {"policy": TEXT, "capacity": BYTES, "train": FLAG, "roles": ROLES,
               "sizes": _dict_of(BYTES, "bytes by blob name"),
               "pinned": _list_of(TEXT, "a list of blob names"),
               "steps": _list_of(TEXT, "a list of step names"),
               "owners": _dict_of(TEXT, "a layer by blob name"),
               "predicted": _record({"h2d": BYTES, "d2h": BYTES, "peak": BYTES},
                                    "the bytes predicted per iteration (h2d, d2h, peak)"),
               "least_pool": _optional(BYTES),
               "types": _dict_of(TEXT, "a layer type by layer name")}
PLAN_SINCE_VERSION_2 = ("types",)
_PLAN = _record(PLAN_FIELDS, "a plan (a JSON object)",
                optional=("least_pool", *PLAN_SINCE_VERSION_2), extra=False)


@_described_as("a plan (a JSON object)")
def check_plan(value, where):
    _PLAN(value, where)
    unsized = [name for name in value["pinned"] if name not in value["sizes"]]
    if unsized:
        raise Malformed(f"{where}.pinned", "blobs the plan's sizes list", unsized[0])


DIRECTIONS = ("h2d", "d2h")
STEP_TIMES = _dict_of(_dict_of(_row((NUMBER, COUNT), "[seconds, steps]"),
                               "[seconds, steps] by step kind", key=PHASE),
                      "the steps' times by layer name")
COPY_TIMES = _record({d: _row((BYTES, NUMBER), "[bytes, seconds]") for d in DIRECTIONS},
                     "the copies' [bytes, seconds] by direction (h2d, d2h)", extra=False)
TIMES = _record({"iterations": COUNT, "wall": NUMBER, "stall": NUMBER, "steps": STEP_TIMES,
                 "copies": COPY_TIMES}, "times (iterations, wall, stall, steps, copies)",
                optional=("copies",), extra=False)
ONE = _leaf(lambda v: type(v) is int and v == 1, "1 (one iteration)")
FIRST_TIMES = _record({"iterations": ONE, "wall": NUMBER, "stall": NUMBER, "steps": STEP_TIMES,
                       "copies": COPY_TIMES},
                      "one iteration's times (iterations, wall, stall, steps, copies)",
                      optional=("copies",), extra=False)
TOTALS_FIELDS = {
    "peak": BYTES, "peak_time": _optional(NUMBER),
    "peak_step": _optional(_row((INTEGER, TEXT), "[step index, step name]")),
    "at_peak": _dict_of(BYTES, "bytes by role", key=ROLE),
    "peak_owners": _list_of(_row((TEXT, BYTES, ROLE), "[owner, bytes, role]"),
                            "a list of [owner, bytes, role]"),
    "role_peak": _dict_of(BYTES, "bytes by role", key=ROLE),
    "issued": _record({d: _dict_of(_row((BYTES, COUNT), "[bytes, copies]"),
                                   "[bytes, copies] by blob name") for d in DIRECTIONS},
                      "copies issued by direction (h2d, d2h)", extra=False),
    "dropped": _dict_of(BYTES, "bytes by blob name"),
    "ran": _record({d: _row((BYTES, COUNT, NUMBER), "[bytes, copies, seconds]")
                    for d in DIRECTIONS}, "copies run by direction (h2d, d2h)", extra=False),
    "stall": _row((NUMBER, COUNT, NUMBER, _optional(TEXT)),
                  "[seconds, waits, longest, its step]"),
    "kernels": COUNT, "compute_seconds": NUMBER,
    "iterations": _dict_of(COUNT, "a count by iteration kind"),
    "first_time": _optional(NUMBER), "last_time": _optional(NUMBER),
    "owner_layer": _dict_of(TEXT, "a layer by blob name"),
    "waiting": _list_of(_row((NUMBER, TEXT), "[time, owner]"), "a list of [time, owner]"),
    "head_end": _optional(COUNT), "live": LIVE,
    "times": _optional(_dict_of(TIMES, "times by iteration kind")),
    "times_first": _optional(_dict_of(FIRST_TIMES, "the first iteration's times by kind")),
    "times_pending": _optional(TIMES)}
# Exactly these: Fold.from_json puts every key into the fold, so an extra one could replace
# part of it (its "pool").
_TOTALS = _record(TOTALS_FIELDS, "the totals (a JSON object)", optional=SINCE_VERSION_2,
                  extra=False)


@_described_as("the totals (a JSON object)")
def check_totals(value, where):
    _TOTALS(value, where)
    if (value["first_time"] is None) != (value["last_time"] is None):
        raise Malformed(f"{where}.last_time", "a time exactly when first_time is one",
                        value["last_time"])


# What the readers take from each kind of event (an event may carry more).
_SPAN = {"start": NUMBER, "end": NUMBER}
DETAILS = {
    "alloc": {"offset": INTEGER, "in_use": BYTES},
    "free": {"offset": INTEGER, "in_use": BYTES},
    "copy": {"direction": DIRECTION, **_SPAN, "stream": TEXT},
    "kernel": {"layer": TEXT, "phase": PHASE, "step": INTEGER, **_SPAN},
    "stall": {"step": INTEGER, **_SPAN},
    "iteration": {"index": INTEGER, **_SPAN},
    "gap": {"iterations": COUNT, "live": LIVE},
}
DETAIL_KEYS = {kind: tuple(fields) for kind, fields in DETAILS.items()}   # the names, for people
_DETAIL_CHECKS = {kind: _record(fields, f"the detail of a {kind} event (a JSON object)")
                  for kind, fields in DETAILS.items()}
_DETAIL_CHECKS.update({kind: _record({"role": ROLE}, f"the detail of a {kind} event",
                                     optional=("role",)) for kind in ("h2d", "d2h", "drop")})
_ROW = _row((TEXT, TEXT, BYTES, NUMBER, _record({}, "a JSON object")),
            "an event: [kind, who, bytes, time, detail]")


# The fast path: a file holds up to max_events (100,000) events, and the checks above, with
# their messages' places built as they go, would double the time a trace takes to load. Each
# event is first tested with plain predicates (key, test, required); only one that fails them,
# or whose detail holds more than leaves (a gap's live slots), takes the slow path, which finds
# and names what is wrong.
_FAST = {kind: tuple((key, check.test, True) for key, check in fields.items())
         for kind, fields in DETAILS.items() if all(hasattr(c, "test") for c in fields.values())}
_FAST.update({kind: (("role", ROLE.test, False),) for kind in ("h2d", "d2h", "drop")})


def _plainly_fine(row) -> bool:
    if type(row) is not list or len(row) != 5:
        return False
    kind, who, nbytes, when, detail = row
    if not (type(kind) is str and type(who) is str and type(nbytes) is int
            and 0 <= nbytes <= LIMIT and _is_number(when) and type(detail) is dict):
        return False
    if kind in _FAST:
        tests = _FAST[kind]
    elif kind in _DETAIL_CHECKS:        # a gap: its live slots take the slow path
        return False
    else:                               # a kind the readers skip ("plan")
        tests = ()
    for key, test, required in tests:
        if key in detail:
            if not test(detail[key]):
                return False
        elif required:
            return False
    return True


@_described_as("a list of events")
def check_events(value, where):
    if type(value) is not list:
        raise Malformed(where, "a list of events", value)
    for index, row in enumerate(value):
        if _plainly_fine(row):
            continue
        at = f"{where}[{index}]"
        _ROW(row, at)
        check = _DETAIL_CHECKS.get(row[0])
        if check is not None:
            check(row[4], f"{at} ({row[0]}) detail")


_DOCUMENT = _record({
    "origin": NUMBER, "capacity_hint": _optional(BYTES), "initial_live": _optional(LIVE),
    "roles": ROLES, "plans": _list_of(check_plan, "a list of plans"), "totals": check_totals,
    "events": check_events}, "a trace (a JSON object)")


def check_document(document: dict, version: int) -> None:
    """Raise Malformed at the first field of a loaded trace file the readers could not use."""
    _DOCUMENT(document, "")
    totals = document["totals"]
    if version >= 2:
        for key in SINCE_VERSION_2:
            if key not in totals:
                raise Malformed(f"totals.{key}", TOTALS_FIELDS[key].expected, _MISSING)
        for index, plan in enumerate(document["plans"]):
            for key in PLAN_SINCE_VERSION_2:
                if key not in plan:
                    raise Malformed(f"plans[{index}].{key}", PLAN_FIELDS[key].expected, _MISSING)
    # The step times come whole or not at all, and a kind's iterations after its first (times)
    # with that first (times_first).
    held = [key for key in SINCE_VERSION_2 if totals.get(key) is not None]
    lacking = [key for key in SINCE_VERSION_2 if key not in held] if held else ()
    if lacking:
        raise Malformed(f"totals.{lacking[0]}", f"step times, as totals.{held[0]} holds",
                        totals.get(lacking[0], _MISSING))
    times, first = totals.get("times"), totals.get("times_first")
    unfirst = sorted(set(times) - set(first)) if times else ()
    if unfirst:
        raise Malformed("totals.times (a key)", "a kind whose first iteration times_first "
                        "holds", unfirst[0])

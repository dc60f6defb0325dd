"""What a minilms config may say: every setting, its default and what it accepts, in one place.

``SCHEMA`` is data: a ``Section`` (with a docstring) maps each key to a ``Field`` (a check and a
default) or to a nested ``Section``. ``minilms.config`` walks it to validate a YAML file, fill in
defaults, check overrides and write the resolved config; nothing here knows about files or lines.

A check is a callable that returns the value as the config will hold it (ints stay ints, numbers
become floats, choices lower case, sizes exactly as written) or raises ``Invalid``, which says what
was expected and what was found. ``check_together`` holds the rules that span several fields.

The accepted ``data.dataset`` values and which of them need ``data.root`` are read from the dataset
registry (``minilms.datasets.registry``, the layer below), where each format declares its facts
once: a new format is accepted here without an edit.
"""
import copy
import math
from dataclasses import dataclass

from .. import zoo
from ..datasets.registry import DATASETS as FORMATS
from ..device.link import LINKS_GBPS
from ..errors import ConfigError, did_you_mean
from ..sizes import EXPECTED as SIZE_EXPECTED
from ..sizes import parse_size

ZOO_MODELS = tuple(zoo.MODELS)     # the zoo's names, from the zoo itself
DATASETS = tuple(FORMATS)
# formats a config must give data.root for: their class count is in their files
ROOT_REQUIRED = tuple(name for name, format_ in FORMATS.items() if format_.config_needs_root)
LINKS = tuple(LINKS_GBPS)


class Invalid(Exception):
    """A rejected value. ``at`` is where below the checked key (``"[2].type"``, or ``""`` for the
    key itself); ``found_text`` replaces ``repr(found)`` when the finding is a description."""

    def __init__(self, expected: str, found, at: str = "", hint: str = "", found_text: str = ""):
        super().__init__(expected)
        self.expected, self.found, self.at, self.hint, self.found_text = (
            expected, found, at, hint, found_text)


class Check:
    """``expected`` is the phrase errors use ("an integer >= 1"); ``accept`` normalizes a value
    or raises Invalid."""

    def __init__(self, expected: str, accept):
        self.expected, self.accept = expected, accept

    def __call__(self, value):
        return self.accept(value)


def simple(expected: str, test, convert=lambda value: value) -> Check:
    """A check that is one test: the value passes it (and is converted) or is rejected."""
    def accept(value):
        if not test(value):
            raise Invalid(expected, value)
        return convert(value)
    return Check(expected, accept)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _is_size(value) -> bool:
    try:
        parse_size(value)
    except (ConfigError, ValueError, OverflowError):     # nan and inf fail in int()
        return False
    return True


def integer(low: int) -> Check:
    # 5e4 reads as a float; a whole number written that way is still meant as an integer
    return simple(f"an integer >= {low}",
                  lambda value: _is_number(value) and value == int(value) and value >= low, int)


def number(low: float, high: float | None = None, *, open_low=False, open_high=False) -> Check:
    if high is None:
        expected = f"a number {'>' if open_low else '>='} {low:g}"
    else:
        left, right = "(" if open_low else "[", ")" if open_high else "]"
        expected = f"a number in {left}{low:g}, {high:g}{right}"

    def within(value) -> bool:
        above = value > low if open_low else value >= low
        below = high is None or (value < high if open_high else value <= high)
        return above and below
    return simple(expected, lambda value: _is_number(value) and within(value), float)


def choice(*options) -> Check:
    """One of ``options``; words match in any case (``SGD`` is ``sgd``); near misses get a hint."""
    words = [str(option) for option in options]
    expected = " or ".join(words) if len(options) == 2 else "one of " + ", ".join(words)

    def accept(value):
        for option in options:
            if value == option and type(value) is type(option):
                return option
            if isinstance(value, str) and isinstance(option, str) and value.lower() == option:
                return option
        raise Invalid(expected, value, hint=did_you_mean(value, words) if isinstance(value, str)
                      else "")
    return Check(expected, accept)


def either(*checks: Check, expected: str | None = None) -> Check:
    """The first check that accepts the value decides; errors name all the alternatives."""
    expected = expected or " or ".join(check.expected for check in checks)

    def accept(value):
        hint = ""
        for check in checks:
            try:
                return check(value)
            except Invalid as error:
                if error.at:        # the check got as far as an item: its complaint is the one
                    raise
                hint = hint or error.hint
        raise Invalid(expected, value, hint=hint)
    return Check(expected, accept)


def _is_text(value) -> bool:
    return isinstance(value, str) and bool(value.strip())


BOOL = simple("true or false", lambda value: isinstance(value, bool))
STRING = simple("a non-empty string", _is_text)
# the name becomes a folder: runs/<name>-<timestamp>
RUN_NAME = simple("a non-empty name without '/' (it names the run's folder)",
                  lambda value: _is_text(value) and "/" not in value and "\\" not in value)
NULL = simple("null", lambda value: value is None)
# kept as written: "512MiB" reads better in a saved config than a count of bytes
SIZE = simple(SIZE_EXPECTED, _is_size)
AUTO = choice("auto")
OFF = simple("off", lambda value: value is False, lambda value: "off")   # YAML reads off as false
ZERO = simple("0", lambda value: _is_number(value) and value == 0, lambda value: 0)


def nullable(check: Check) -> Check:
    return either(check, NULL, expected=f"{check.expected}, or null")


def list_of(item: Check, expected: str, *, increasing=False, length: int | None = None) -> Check:
    """A list whose items each pass ``item``; an item's error names its index."""
    def accept(value):
        if not isinstance(value, list) or (length is not None and len(value) != length):
            raise Invalid(expected, value)
        items = []
        for index, entry in enumerate(value):
            try:
                items.append(item(entry))
            except Invalid as error:
                raise Invalid(error.expected, entry, f"[{index}]{error.at}", error.hint) from None
        if increasing and any(b <= a for a, b in zip(items, items[1:])):
            raise Invalid(expected, value)
        return items
    return Check(expected, accept)


def _accept_layers(value):
    # each layer's own options are the net builder's to check; only the shape of the list is ours
    if not isinstance(value, list) or not value:
        raise Invalid(LAYERS.expected, value)
    for index, layer in enumerate(value):
        if not isinstance(layer, dict):
            raise Invalid("a layer: a mapping with a name and a type", layer, f"[{index}]")
        for key, what in (("name", "a layer name"), ("type", "a layer type like Convolution")):
            if not isinstance(layer.get(key), str) or not layer[key].strip():
                raise Invalid(f"{what} (a string)", layer.get(key), f"[{index}].{key}")
    return copy.deepcopy(value)


LAYERS = Check("a non-empty list of layers, each a mapping with a name and a type", _accept_layers)


@dataclass(frozen=True)
class Field:
    check: Check
    default: object = None


class Section:
    """A group of keys: ``doc`` says what it is for; ``fields`` keep the order configs use."""

    def __init__(self, doc: str, **fields):
        self.doc, self.fields = doc, fields

    def defaults(self) -> dict:
        return {key: spec.defaults() if isinstance(spec, Section) else copy.deepcopy(spec.default)
                for key, spec in self.fields.items()}


SCHEMA = Section(
    """A minilms run: what to train, on which data and device, with which LMS settings and solver.
    ``name`` defaults to the config file's stem; ``run_dir`` null means ``runs/<name>-<timestamp>``,
    which the trainer resolves.""",
    name=Field(nullable(RUN_NAME), None),
    seed=Field(integer(0), 0),
    run_dir=Field(nullable(STRING), None),
    init_weights=Field(nullable(STRING), None),
    trace=Field(BOOL, False),
    model=Section(
        """The network: exactly one of ``zoo`` (a built-in model, with ``options``) or ``layers``
        (Caffe-style layer mappings, kept as written; the net builder checks their options).
        ``options.num_classes`` null means the dataset's; ``width`` divides every channel count.
        ``fuse``: each in-place ReLU runs in the pass of the layer before it where that layer can
        take it, the same numbers in fewer passes (``minilms.fusion``): ``auto`` batch norms, and
        residual adds too where that costs the run nothing (with ``lms.enabled: false``, where
        every blob stays resident; with LMS on, where the pool holds the fused net's plan with
        whole steps, else the adds and their ReLUs stay as written), ``all`` residual adds
        whatever the pool (a fused add's backward holds one blob more), ``none`` the layers as
        written.""",
        zoo=Field(nullable(choice(*ZOO_MODELS)), None),
        options=Section(
            """Arguments of the zoo model: how many classes it tells apart, its width divisor.""",
            num_classes=Field(nullable(integer(2)), None),
            width=Field(integer(1), 1),
        ),
        layers=Field(nullable(LAYERS), None),
        fuse=Field(choice("auto", "all", "none"), "auto"),
    ),
    data=Section(
        f"""The dataset and how batches are made. ``root`` is where files are (required for
        {" and ".join(ROOT_REQUIRED)}; every format's ``files`` says what it reads there);
        ``num_classes`` null means the dataset's own; ``val_size`` 0 means no validation;
        ``prefetch`` is how many batches the loader prepares ahead.""",
        dataset=Field(choice(*DATASETS), "shapes"),
        root=Field(nullable(STRING), None),
        image_size=Field(integer(1), 32),
        channels=Field(choice(1, 3), 3),
        num_classes=Field(nullable(integer(2)), None),
        train_size=Field(integer(1), 2000),
        val_size=Field(integer(0), 500),
        batch_size=Field(integer(1), 32),
        augment=Section(
            """Training-time augmentation: random crops after padding, horizontal flips, and
            per-channel normalization.""",
            crop_padding=Field(integer(0), 0),
            flip=Field(BOOL, False),
            normalize=Field(BOOL, True),
        ),
        prefetch=Field(integer(0), 2),
    ),
    device=Section(
        """Where kernels run. ``memory`` is the pool, a hard cap (a size, or auto: a share of what
        is free, divided by the processes of a data-parallel run that share the device, and no
        more than the net needs with LMS off);
        ``link`` models the host-device link of the cpu device (a name or GB/s).""",
        kind=Field(choice("auto", "cpu", "cuda"), "auto"),
        memory=Field(either(SIZE, AUTO, expected=f"{SIZE_EXPECTED}, or 'auto'"), "auto"),
        link=Field(either(NULL, choice(*LINKS), number(0, open_low=True),
                          expected=f"null, one of {', '.join(LINKS)}, or a bandwidth in GB/s > 0"),
                   None),
    ),
    lms=Section(
        """Large Model Support (see docs/design.md, "The knobs"). Off: every blob stays resident.
        ``policy: auto`` computes the knobs below (the fastest plan that fits); ``manual`` takes
        them as given. ``min_swap_bytes``: smaller blobs stay resident; ``limit``: bytes kept
        resident after their step before LMS swaps (null or 0: only what the next step needs,
        Caffe's default); ``start_fraction``: the same as a share of the pool (the larger wins);
        ``prefetch``: how many steps ahead swap-ins are issued (0: on demand); ``keep_state``:
        parameters and optimizer state stay resident across iterations. ``split``: a step whose
        working set does not fit the pool runs in chunks of samples (``auto``: only such steps,
        into as few chunks as fit; ``off``: never; a number: at most that many chunks).
        ``recompute``: activations rebuilt by re-running their forwards before backward reads
        them, instead of kept or swapped (``auto``: where the cost model predicts it faster, or
        only it fits; ``off``; a list of layer types: every activation those layers make).
        ``write_back``: when a swap-out's copy home is issued (``lazy``: when its space is wanted;
        ``early``: as soon as the blob is last written, so the eviction later waits for nothing;
        ``policy: auto`` weighs ``early`` on cuda, and keeps ``lazy`` on the cpu device, whose
        copies share the kernels' cores).""",
        enabled=Field(BOOL, True),
        policy=Field(choice("auto", "manual"), "auto"),
        min_swap_bytes=Field(either(ZERO, SIZE, expected=f"{SIZE_EXPECTED}, or 0"), 0),
        limit=Field(nullable(SIZE), None),
        start_fraction=Field(number(0, 1), 0.0),
        prefetch=Field(integer(0), 0),
        keep_state=Field(BOOL, False),
        split=Field(either(choice("auto", "off"), OFF, integer(1),
                           expected="auto, off, or a chunk count >= 1"), "auto"),
        recompute=Field(either(choice("auto", "off"), OFF,
                               list_of(STRING, "a list of layer types"),
                               expected="auto, off, or a list of layer types"), "off"),
        write_back=Field(choice("lazy", "early"), "lazy"),
    ),
    solver=Section(
        """The optimizer, as PyTorch defines it: SGD (momentum, Nesterov, weight decay) or Adam
        (betas, eps, weight decay). Settings of the other type are ignored.""",
        type=Field(choice("sgd", "adam"), "sgd"),
        lr=Field(number(0, open_low=True), 0.01),
        momentum=Field(number(0), 0.9),
        nesterov=Field(BOOL, False),
        weight_decay=Field(number(0), 0.0),
        betas=Field(list_of(number(0, 1, open_high=True), "a pair of numbers in [0, 1), like "
                            "[0.9, 0.999]", length=2), [0.9, 0.999]),
        eps=Field(number(0, open_low=True), 1e-8),
        schedule=Section(
            """The learning rate over iterations (Caffe's lr_policy): constant; step (times
            ``gamma`` every ``step_size`` iterations); multistep (times ``gamma`` at each of
            ``milestones``); cosine (down to ``min_lr``). A linear warm-up of ``warmup_iters``
            iterations comes first.""",
            type=Field(choice("constant", "step", "multistep", "cosine"), "constant"),
            step_size=Field(nullable(integer(1)), None),
            gamma=Field(number(0, open_low=True), 0.1),
            milestones=Field(list_of(integer(1), "a list of increasing integers >= 1 (iterations)",
                                     increasing=True), []),
            warmup_iters=Field(integer(0), 0),
            min_lr=Field(number(0), 0.0),
        ),
    ),
    distributed=Section(
        """Data-parallel training, when launched with ``mpiexec -n N`` (one process: ignored).
        Each rank trains on its own shard with batch ``data.batch_size`` and gradients are
        averaged, so N ranks step as one process with batch ``N * data.batch_size``.
        ``lr_scaling``: ``none`` keeps ``solver.lr``; ``linear`` multiplies it (and
        ``min_lr``) by N, the usual rule for a batch N times larger. ``timeout``: seconds a rank
        waits in a collective (a gradient average, a broadcast) before it decides another rank
        died or hangs and ends the job. ``overlap``: average each layer's gradients while earlier
        layers' backward steps compute (false: all after the last backward).""",
        lr_scaling=Field(choice("none", "linear"), "none"),
        timeout=Field(number(0, open_low=True), 300.0),
        overlap=Field(BOOL, True),
    ),
    train=Section(
        """How long, and how often to look. The run stops at ``epochs`` or ``max_iters``,
        whichever comes first (null: no bound; not both). ``eval_every`` and ``checkpoint_every``
        count epochs (0: never); ``log_every`` counts iterations. ``keep_checkpoints``: the newest
        checkpoints kept (older ones are deleted), besides the best by validation accuracy.
        ``on_nonfinite_loss``: ``stop`` ends the run with one line naming the iteration where the
        loss became NaN or infinite; ``continue`` trains on.""",
        epochs=Field(nullable(integer(1)), 1),
        max_iters=Field(nullable(integer(1)), None),
        eval_every=Field(integer(0), 1),
        checkpoint_every=Field(integer(0), 1),
        log_every=Field(integer(1), 10),
        keep_checkpoints=Field(integer(1), 3),
        on_nonfinite_loss=Field(choice("stop", "continue"), "stop"),
    ),
)


def check_together(values: dict) -> None:
    """The rules that span fields, on resolved values; raises Invalid, ``at`` a full key path."""
    model, data, solver = values["model"], values["data"], values["solver"]
    schedule, options = solver["schedule"], model["options"]
    if model["zoo"] is None and model["layers"] is None:
        raise Invalid("model.zoo (a zoo model) or model.layers (a list of layers)", None,
                      "model", found_text="neither")
    if model["zoo"] is not None and model["layers"] is not None:
        raise Invalid("either model.zoo or model.layers, not both", model["layers"],
                      "model.layers", found_text="both")
    zoo_defaults = SCHEMA.fields["model"].fields["options"].defaults()
    if model["layers"] is not None and options != zoo_defaults:
        raise Invalid("no options with model.layers (options are for model.zoo)", options,
                      "model.options")
    if model["zoo"] == "lenet" and options["width"] != 1:
        raise Invalid("1 for lenet (it has no width option)", options["width"],
                      "model.options.width")
    if None not in (options["num_classes"], data["num_classes"]) \
            and options["num_classes"] != data["num_classes"]:
        raise Invalid(f"data.num_classes ({data['num_classes']}) or null", options["num_classes"],
                      "model.options.num_classes")
    if data["dataset"] in ROOT_REQUIRED and data["root"] is None:
        raise Invalid(f"the folder or file to read {data['dataset']} from", None, "data.root")
    if values["device"]["kind"] == "cuda" and values["device"]["link"] is not None:
        raise Invalid("null on a cuda device (its link is real)", values["device"]["link"],
                      "device.link")
    memory, limit = values["device"]["memory"], values["lms"]["limit"]
    if limit is not None and memory != "auto" and parse_size(limit) > parse_size(memory):
        raise Invalid(f"at most device.memory ({memory})", limit, "lms.limit")
    if solver["nesterov"] and (solver["type"] != "sgd" or solver["momentum"] == 0):
        raise Invalid("false unless solver.type is sgd with momentum > 0", True, "solver.nesterov")
    if schedule["type"] == "step" and schedule["step_size"] is None:
        raise Invalid("an integer >= 1 for a step schedule", None, "solver.schedule.step_size")
    if schedule["type"] == "multistep" and not schedule["milestones"]:
        raise Invalid("at least one milestone for a multistep schedule", [],
                      "solver.schedule.milestones")
    if schedule["min_lr"] > solver["lr"]:
        raise Invalid(f"at most solver.lr ({solver['lr']:g})", schedule["min_lr"],
                      "solver.schedule.min_lr")
    if values["train"]["epochs"] is None and values["train"]["max_iters"] is None:
        raise Invalid("train.epochs or train.max_iters set (both null: the run never ends)", None,
                      "train.epochs")

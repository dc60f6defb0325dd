"""What a plan is made of: the knobs that shape it (``Policy``), its actions (``Action``), each
step's share (``StepPlan``) and the whole (``Plan``, with its totals). The planner that makes them
is ``minilms.plan``; the executor that replays them is ``minilms.lms``.
"""
from dataclasses import dataclass, field

from ..device.pool import align_up
from ..errors import ConfigError
from ..net import Step
from ..sizes import format_bytes

_COPIES = {"swap_in": "h2d", "swap_out": "d2h", "sync": "d2h"}   # "reduce": no device copy


@dataclass(frozen=True)
class Policy:
    """The LMS knobs. ``policy="auto"`` ignores the manual ones and computes them."""
    enabled: bool = True
    policy: str = "manual"
    min_swap_bytes: int = 0
    limit: int | None = None
    start_fraction: float = 0.0
    prefetch: int = 0
    keep_state: bool = False
    reduce_grads: bool = False     # data parallel: gradients home after backward, reduced there
    # steps split along the batch where they do not fit (minilms.lms.substeps): "auto", "off",
    # or the most chunks a step may be split into
    split: object = "auto"
    # activations rebuilt by re-running their forwards instead of kept or swapped
    # (minilms.lms.recompute): "off", "auto", or a tuple of layer types
    recompute: object = "off"
    # when a swap-out's copy is issued (minilms.lms.write_back): "lazy", when the space is
    # wanted; "early", as soon as the blob is last written
    write_back: str = "lazy"

    def __post_init__(self):
        if self.policy not in ("manual", "auto"):
            raise ConfigError("lms.policy", "auto or manual", self.policy)
        if not 0.0 <= self.start_fraction <= 1.0:
            raise ConfigError("lms.start_fraction", "a number in [0, 1]", self.start_fraction)
        if self.prefetch < 0 or self.min_swap_bytes < 0 or (self.limit or 0) < 0:
            raise ConfigError("lms", "prefetch, min_swap_bytes and limit >= 0", self)
        if self.split not in ("auto", "off") and not (
                isinstance(self.split, int) and not isinstance(self.split, bool)
                and self.split >= 1):
            raise ConfigError("lms.split", "auto, off, or a chunk count >= 1", self.split)
        if self.recompute not in ("auto", "off") and not (
                isinstance(self.recompute, tuple)
                and all(isinstance(t, str) and t for t in self.recompute)):
            raise ConfigError("lms.recompute", "auto, off, or a list of layer types",
                              self.recompute)
        if self.write_back not in ("lazy", "early"):
            raise ConfigError("lms.write_back", "lazy or early", self.write_back)

    @property
    def max_chunks(self) -> int | None:
        """The most chunks a step may be split into: None for no cap, 1 for never."""
        if not self.enabled or self.split == "off":
            return 1
        return None if self.split == "auto" else self.split

    def soft_limit(self, capacity: int) -> int:
        return min(capacity, max(self.limit or 0, int(self.start_fraction * capacity)))

    def describe(self) -> str:
        if not self.enabled:
            return "LMS off" + (", gradients reduced on the host" if self.reduce_grads else "")
        limit = "none" if not self.limit else format_bytes(self.limit)
        return (f"LMS {self.policy}: min_swap_bytes {format_bytes(self.min_swap_bytes)}, limit "
                f"{limit}, start_fraction {self.start_fraction:g}, prefetch {self.prefetch}, "
                f"keep_state {str(self.keep_state).lower()}"
                + ("" if self.recompute == "off" else ", recompute " + (
                    self.recompute if isinstance(self.recompute, str)
                    else "[" + ", ".join(self.recompute) + "]"))
                + (", write_back early" if self.write_back == "early" else "")
                + (", gradients reduced on the host" if self.reduce_grads else ""))


@dataclass(frozen=True)
class Action:
    kind: str                 # "alloc", "swap_in", "swap_out", "drop", "sync", "reduce"
    blob: str
    nbytes: int               # the blob's bytes: what a copy moves
    offset: int               # its pool offset (where it goes, or where it was)
    size: int                 # the aligned slot
    for_step: int | None = None   # prefetch: the step the load serves
    why: str = ""                 # evictions: "dead", "furthest next use", "contiguous space",
                                  # "relocation", "soft limit", "end of iteration", "reduce"

    @classmethod
    def make(cls, kind: str, blob: str, nbytes: int, offset: int, size: int,
             for_step: int | None = None, why: str = "") -> "Action":
        """``Action(...)``, twice as fast: a frozen dataclass sets each field through
        ``object.__setattr__``, and the planner makes tens of thousands of actions per plan."""
        action = object.__new__(cls)
        action.__dict__.update(kind=kind, blob=blob, nbytes=nbytes, offset=offset, size=size,
                               for_step=for_step, why=why)
        return action

    @property
    def copies(self) -> str | None:
        """``"h2d"``, ``"d2h"`` or None."""
        return _COPIES.get(self.kind)

    @property
    def places(self) -> bool:
        return self.kind in ("alloc", "swap_in") and self.size > 0

    @property
    def frees(self) -> bool:
        return self.kind in ("swap_out", "drop")


@dataclass
class StepPlan:
    step: Step
    release: list = field(default_factory=list)
    demand: list = field(default_factory=list)
    prefetch: list = field(default_factory=list)
    in_use: int = 0               # pool bytes while the step runs
    # the blobs resident while the step runs: a tuple once listed, until then this step's
    # position in ``_residents``, which lists them on request
    _resident: object = field(default=(), repr=False, compare=False)
    _residents: object = field(default=None, repr=False, compare=False)

    @property
    def actions(self) -> list:
        return self.release + self.demand + self.prefetch

    @property
    def resident(self) -> tuple:
        """The blobs in the pool while the step runs, in the order they were placed."""
        if type(self._resident) is int:
            self._resident = self._residents.listed()[self._resident]
        return self._resident


class Residents:
    """The blobs resident at each step of one plan, listed on first request by replaying its
    actions (each placement enters the pool, each ``swap_out`` or ``drop`` leaves): copying the
    pool's contents at every step as it is planned would make planning quadratic in the depth
    of the net. It holds the plan's lists of actions, not its step plans: no reference cycle."""

    def __init__(self, prologue: list):
        self.prologue = prologue
        self.steps: list[tuple] = []     # each step's (release, demand, prefetch)
        self._listed: list | None = None

    def listed(self) -> list[tuple]:
        if self._listed is None:
            placed = dict.fromkeys(a.blob for a in self.prologue if a.places)
            self._listed = []
            for lists in self.steps:
                for actions in lists:
                    for action in actions:
                        if action.places:
                            placed.setdefault(action.blob)
                        elif action.frees:
                            del placed[action.blob]
                self._listed.append(tuple(placed))
        return self._listed


@dataclass
class Plan:
    policy: Policy
    capacity: int
    blobs: dict                   # name -> BlobInfo
    pinned: dict                  # name -> offset
    prologue: list
    steps: list                   # StepPlan per step
    epilogue: list
    persistent: frozenset = frozenset()   # blobs that outlive the iteration
    host_inputs: tuple = ()               # fresh on the host each iteration
    outputs: tuple = ()                   # read by the host after the iteration
    candidates: list = field(default_factory=list)   # auto: (policy, seconds or None)
    cut_short: list = field(default_factory=list)    # auto: (policy, step) stopped there, slower
                                                     # than the best by then (see auto.auto_plan)
    notes: list = field(default_factory=list)        # what the planner changed, for people
    # split steps' chunks (``minilms.lms.substeps``): name -> (parent, first sample, end)
    chunks: dict = field(default_factory=dict)

    def actions(self):
        """Every per-iteration action in execution order, with its step (len(steps): epilogue)."""
        for index, step_plan in enumerate(self.steps):
            for action in step_plan.actions:
                yield index, action
        for action in self.epilogue:
            yield len(self.steps), action

    def bytes_moved(self, direction: str) -> int:
        return sum(a.nbytes for _, a in self.actions() if a.copies == direction)

    @property
    def peak(self) -> int:
        return max([s.in_use for s in self.steps] + [sum(align_up(self.blobs[b].nbytes)
                                                         for b in self.pinned)])

    @property
    def extent(self) -> int:
        """The pool bytes from offset 0 that any of the plan's blobs ever occupies: what it uses
        of a larger pool."""
        pinned = [offset + align_up(self.blobs[name].nbytes)
                  for name, offset in self.pinned.items()]
        placed = [a.offset + a.size for a in self.prologue if a.places]
        placed += [a.offset + a.size for _, a in self.actions() if a.places]
        return max(pinned + placed, default=0)

    @property
    def pinned_bytes(self) -> int:
        return sum(align_up(self.blobs[name].nbytes) for name in self.pinned)

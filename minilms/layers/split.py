"""Splitting one step of a layer along the batch: what each layer declares, and a reference runner.

The first part of issue 20. A step whose working set does not fit the pool could run as ``k``
sub-steps over consecutive ranges of samples. Blobs are sample-major, so a range of samples is a
contiguous slice ``[n0:n1]`` of every *batch blob*: the bottoms, the tops (unless the rule says they
are whole-step values: a loss, a rate), their gradients, and the saved buffers the rule names.
Everything else is *shared*: parameters, parameter gradients, workspace, statistics, passed whole
to every chunk. The planner does not split yet; ``run_split`` is the reference it will reproduce.

Each layer class declares ``split`` (``Layer.split``; ``None``, the default: never split). A
``SplitRule`` holds one ``Phase`` for training forward, one for backward and one for test forward.
A phase says what kind it is, and how it runs, as data:

    kind     "samples"     every chunk computed on its own (ReLU, pooling, convolution forward)
             "accumulate"  outputs that are sums over the samples (weight gradients, accuracy
                           counts, the loss) are summed over the chunks
             "statistics"  a batch-wide reduction over all chunks first, then a per-chunk pass
                           (batch norm's mean and variance; in backward, its two sums)
    passes   what runs, in order: a method of the layer called on every chunk in order
             (``Pass(name)``), or once for the whole step (``Pass(name, ONCE)``): a once-pass sees
             the shared blobs and the batch blobs named in ``whole``; every other batch blob is
             an empty slice (which gradients are wanted shows, no data does)
    sums     outputs the chunk passes *overwrite* that are sums over the samples
             (``"param_grad.weight"``, ``"work.count"``): the first chunk writes the step's own,
             every later chunk writes a temporary of the same shape, added in after it
             (``kernels.elementwise.accumulate``; in chunk order, so deterministic)
    whole    batch blobs a once-pass reads whole (``"saved.loss"``: SoftmaxWithLoss's per-sample
             losses, 4 bytes a sample)
    regrouped  the outputs a split step gives only within float tolerance (the same terms added
             in another order): ``"top"``, ``"bottom_grad"``, ``"param_grad.<name>"``,
             ``"saved.<name>"``, ``"param.<name>"``; every other output is bit for bit the
             unsplit step's (``exact``: nothing regrouped). Float ``sums`` are regrouped; so is
             anything a BLAS call computes for a chunk, since BLAS picks its kernel, and with it
             the order of a row's dot product, by the matrix shape (one row: gemv)

Extra memory a split step needs beyond the unsplit step's (``split_buffers``): one temporary per
entry of ``sums`` (a parameter gradient's size: used by every chunk after the first), and the
layer's ``split_workspace(phase)`` (BatchNorm's partial sums). A chunk's working set is its slices
of the batch blobs plus the shared blobs; the workspace a layer declared is passed whole (a chunk
could do with less, e.g. a convolution's cpu columns: sizing is the planner's business).

Chunks run in order, first to last, and every pass of a phase finishes on all chunks before the
next pass starts. Dropout draws each chunk's mask from the step's RNG in that order, which draws
the same numbers as one draw for the whole batch (numpy's ``Generator.random`` is sequential), so a
split step drops the elements the unsplit step drops.
"""
import numbers
from dataclasses import dataclass, replace

from ..errors import ShapeError
from ..kernels import families
from .base import BufferSpec, Layer, StepIO

# numba's: imported with the first kernel that runs (``kernels.families``)
(elementwise,) = families("elementwise")

SAMPLES, ACCUMULATE, STATISTICS = "samples", "accumulate", "statistics"
KINDS = (SAMPLES, ACCUMULATE, STATISTICS)
CHUNKS, ONCE = "chunks", "once"
PHASES = ("forward", "backward", "inference")
SUM_ROLES = ("param_grad", "work")   # where a summed output may live
WHOLE_ROLES = ("saved",)             # which batch blobs a once-pass may read whole
OUTPUTS = ("top", "bottom_grad")     # regrouped outputs named by role alone (all of them)
NAMED_OUTPUTS = ("param_grad", "saved", "param")   # ... and by role and name


@dataclass(frozen=True)
class Pass:
    """One pass of a split phase: the layer method ``method(io)``, called on every chunk in order
    (``over=CHUNKS``) or once for the whole step (``over=ONCE``)."""
    method: str
    over: str = CHUNKS

    def __post_init__(self):
        if self.over not in (CHUNKS, ONCE):
            raise ValueError(f"split pass {self.method}: over must be {CHUNKS!r} or {ONCE!r}, "
                             f"found {self.over!r}")


@dataclass(frozen=True)
class Phase:
    """How one phase (training forward, backward, test forward) of a layer splits: see the module
    docstring."""
    kind: str
    passes: tuple[Pass, ...]
    sums: tuple[str, ...] = ()
    whole: tuple[str, ...] = ()
    regrouped: tuple[str, ...] = ()

    @property
    def exact(self) -> bool:
        """Whether a split step gives every output of the unsplit step bit for bit."""
        return not self.regrouped

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"split kind must be one of {KINDS}, found {self.kind!r}")
        if not self.passes or not any(p.over == CHUNKS for p in self.passes):
            raise ValueError("a split phase needs at least one pass over the chunks")
        for names, roles in ((self.sums, SUM_ROLES), (self.whole, WHOLE_ROLES)):
            for name in names:
                if name.split(".", 1)[0] not in roles or "." not in name:
                    raise ValueError(f"split phase: {name!r} must be '<role>.<name>' with role "
                                     f"in {roles}")
        if self.sums and self.kind != ACCUMULATE:
            raise ValueError(f"split phase: sums belong to the {ACCUMULATE!r} kind, not "
                             f"{self.kind!r}")
        for name in self.regrouped:
            role = name.split(".", 1)[0]
            if not (name in OUTPUTS or role in NAMED_OUTPUTS and "." in name):
                raise ValueError(f"split phase: regrouped output {name!r}: expected one of "
                                 f"{OUTPUTS} or '<role>.<name>' with role in {NAMED_OUTPUTS}")


def samples(method: str) -> Phase:
    """The common phase: ``method`` on every chunk, bitwise the unsplit step."""
    return Phase(SAMPLES, (Pass(method),))


@dataclass(frozen=True)
class SplitRule:
    """A layer's declaration. ``backward`` is None for a layer without one (Accuracy);
    ``inference`` (test-mode forward) is None when it splits as ``forward`` does.
    ``batch_saved``: the saved buffers that are sample-major, sliced with the chunk (a max pool's
    argmax, a dropout mask); the others are shared (batch norm's mean). ``batch_tops`` False: the
    tops are whole-step values (a loss, a rate), never sliced."""
    forward: Phase
    backward: Phase | None = None
    inference: Phase | None = None
    batch_saved: frozenset = frozenset()
    batch_tops: bool = True

    def phase(self, phase: str) -> Phase | None:
        if phase not in PHASES:
            raise ValueError(f"split phase must be one of {PHASES}, found {phase!r}")
        if phase == "inference":
            return self.inference or self.forward
        return getattr(self, phase)


SAMPLE_WISE = SplitRule(samples("forward"), samples("backward"))


def rule_of(layer: Layer, phase: str) -> Phase:
    """The layer's phase rule, or a ShapeError saying the layer cannot be split."""
    rule = type(layer).split
    found = None if rule is None else rule.phase(phase)
    if found is None:
        raise ShapeError(layer, f"split ({phase})", "a layer that declares how its step splits "
                         "along the batch (Layer.split)", "none: this layer is never split")
    return found


def chunk_bounds(n: int, chunks) -> list[tuple[int, int]]:
    """``[(n0, n1), ...]`` consecutive sample ranges covering ``0 .. n``. ``chunks`` is a count
    ``k`` (``1 <= k <= n``; sizes differ by at most one, the larger first, as
    ``numpy.array_split``) or a list of positive sizes that sum to ``n``."""
    if isinstance(chunks, numbers.Integral):
        chunks = int(chunks)
        if not 1 <= chunks <= n:
            raise ValueError(f"split: {chunks} chunks of a batch of {n}: expected 1 to {n}")
        base, extra = divmod(n, chunks)
        sizes = [base + (i < extra) for i in range(chunks)]
    else:
        sizes = [int(s) for s in chunks]
        if not sizes or min(sizes) < 1 or sum(sizes) != n:
            raise ValueError(f"split: chunk sizes {sizes} for a batch of {n}: expected positive "
                             "sizes that sum to the batch")
    bounds, start = [], 0
    for size in sizes:
        bounds.append((start, start + size))
        start += size
    return bounds


def split_buffers(layer: Layer, phase: str) -> list[BufferSpec]:
    """The memory a split ``phase`` needs beyond the unsplit step's: a temporary per summed output
    (named as the sum, ``"param_grad.weight"``), then the layer's ``split_workspace``."""
    rule = rule_of(layer, phase)
    shapes = {f"param_grad.{p.name}": BufferSpec(f"param_grad.{p.name}", p.shape)
              for p in layer.params() if p.learnable}
    shapes.update({f"work.{b.name}": BufferSpec(f"work.{b.name}", b.shape, b.dtype)
                   for b in layer.workspace()})
    temps = [shapes[name] for name in rule.sums if name in shapes]
    return temps + list(layer.split_workspace(phase))


def _rows(array, n0, n1):
    return None if array is None else array[n0:n1]


def chunk_io(layer: Layer, phase: str, io: StepIO, n0: int, n1: int, temps: dict,
             first: bool) -> StepIO:
    """The StepIO of samples ``n0 .. n1``: slices of the batch blobs, the shared blobs whole, the
    split workspace in ``work``, and for a chunk after the first the temporaries of the sums."""
    return part_io(layer, phase, _batch_rows(layer, io, lambda a: _rows(a, n0, n1)), (n0, n1),
                   temps, first)


def whole_io(layer: Layer, phase: str, io: StepIO, temps: dict) -> StepIO:
    """The StepIO of a once-pass: the shared blobs whole, the batch blobs the phase names in
    ``whole`` whole, and every other batch blob as an empty slice: zero samples, so the pass sees
    which gradients are wanted but no data (as ``LayerRun`` withholds what backward does not
    declare, a once-pass that reads one fails in the tests)."""
    keep = {name.split(".", 1)[1] for name in rule_of(layer, phase).whole}
    return part_io(layer, phase, _batch_rows(layer, io, lambda a: _rows(a, 0, 0), keep), None,
                   temps, True)


def _batch_rows(layer: Layer, io: StepIO, rows, keep=()) -> StepIO:
    """``io`` with ``rows`` applied to every batch blob (but the saved buffers in ``keep``)."""
    rule = type(layer).split
    tops = rows if rule.batch_tops else (lambda a: a)
    return replace(io, bottom=[rows(b) for b in io.bottom], top=[tops(t) for t in io.top],
                   saved={k: rows(v) if k in rule.batch_saved and k not in keep else v
                          for k, v in io.saved.items()},
                   top_grad=[tops(g) for g in io.top_grad],
                   bottom_grad=[rows(g) for g in io.bottom_grad])


def part_io(layer: Layer, phase: str, io: StepIO, chunk, temps: dict, first: bool) -> StepIO:
    """A sub-step's StepIO from ``io``, whose batch blobs are already the sub-step's rows (a
    chunk's, or empty for a once-pass; the LMS executor hands its chunk blobs): the split
    workspace in ``work``, ``chunk`` (``(n0, n1)`` or None), and for a chunk after the first
    the temporaries of the sums in place of their targets (``add_sums`` adds them in after)."""
    param_grad, work = dict(io.param_grad), {**io.work, **_split_work(layer, phase, temps)}
    if not first:
        for name in rule_of(layer, phase).sums:
            role, key = name.split(".", 1)
            target = param_grad if role == "param_grad" else work
            if target.get(key) is not None:
                target[key] = temps[name]
    return replace(io, param_grad=param_grad, work=work, chunk=chunk)


def add_sums(layer: Layer, phase: str, io: StepIO, temps: dict) -> None:
    """After a chunk other than the first: add each sum's temporary into its target (the
    ``param_grad`` or ``work`` entry of ``io``, the step's own StepIO)."""
    for name in rule_of(layer, phase).sums:
        role, key = name.split(".", 1)
        target = (io.param_grad if role == "param_grad" else io.work).get(key)
        if target is not None:
            elementwise.accumulate(target, temps[name], io.stream)


def _phase_of(io: StepIO) -> str:
    """Which phase ``io`` is for: backward steps carry top gradients."""
    if io.top_grad:
        return "backward"
    return "forward" if io.train else "inference"


def _split_work(layer: Layer, phase: str, temps: dict) -> dict:
    return {b.name: temps[b.name] for b in layer.split_workspace(phase)}


def run_split(layer: Layer, io: StepIO, chunks, phase: str, temps: dict | None = None) -> None:
    """One ``phase`` ("forward", "backward", "inference") of ``layer`` as sub-steps over
    consecutive sample ranges (``chunks``: a count or a list of sizes, see ``chunk_bounds``).
    ``io`` is the unsplit step's StepIO (``train`` False for "inference", top gradients for
    "backward"); ``temps`` holds a device array for every ``split_buffers(layer, phase)`` entry,
    by name, in the dtype its spec gives for the run. Writes what the unsplit step writes."""
    rule = rule_of(layer, phase)
    if _phase_of(io) != phase:
        raise ValueError(f"split: a {_phase_of(io)} StepIO for the {phase} phase (backward needs "
                         "top gradients; inference, train False)")
    temps = temps or {}
    missing = [b.name for b in split_buffers(layer, phase) if b.name not in temps]
    if missing:
        raise ValueError(f"split {layer.name} ({layer.type}) {phase}: temporaries {missing} "
                         "not given (split_buffers lists them)")
    bounds = chunk_bounds(layer.bottom_shapes[0][0], chunks)
    for step in rule.passes:
        method = getattr(layer, step.method)
        if step.over == ONCE:
            method(whole_io(layer, phase, io, temps))
            continue
        for i, (n0, n1) in enumerate(bounds):
            method(chunk_io(layer, phase, io, n0, n1, temps, first=i == 0))
            if i > 0:
                add_sums(layer, phase, io, temps)

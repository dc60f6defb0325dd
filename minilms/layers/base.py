"""The layer interface: shapes, parameters, and what each step reads, writes and keeps.

A layer never allocates device memory. It declares everything it needs, and whoever runs it (the
net's executor, or ``LayerRun`` in tests and notebooks) places those blobs in the pool:

    setup(bottom_shapes) -> top_shapes   shape inference, once per input shape
    params()      learnable parameters (and running statistics), in PyTorch layouts
    saved()       buffers forward writes and backward reads (max-pool argmax, dropout mask, ...)
    workspace()   scratch for one step (im2col columns, ...); bounded, never batch-proportional
    backward_reads  which forward blobs backward needs ("bottom", "top"): what LMS must keep
    backward_rewrites_top_grad  backward may overwrite its tops' gradients (updates, not reads)
    split         how a step splits along the batch (``minilms.layers.split``); None: never
    recompute     whether forward can run again to rebuild the tops bit for bit, and what that
                  re-run reads and leaves alone (``minilms.layers.recompute``)

``forward(io)`` and ``backward(io)`` receive a ``StepIO``: device arrays for every declared blob.
Backward *overwrites* the bottom and parameter gradients; the net sums gradients where a blob feeds
several layers.
"""
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from ..errors import ShapeError
from .recompute import NOT_DECLARED, Recompute

if TYPE_CHECKING:
    from .split import SplitRule

LAYERS: dict[str, type["Layer"]] = {}
FILL_CHUNK = 8192   # float64 draws at a time in ParamSpec.fill: 64 KiB, under malloc's mmap bar


def register(cls):
    """Class decorator: make a layer available to configs under ``cls.type``."""
    if cls.type in LAYERS:
        raise ValueError(f"layer type {cls.type} registered twice")
    LAYERS[cls.type] = cls
    return cls


@dataclass(frozen=True)
class ParamSpec:
    name: str                 # "weight", "bias", "running_mean", ...
    shape: tuple
    init: str = "zeros"       # "he", "xavier", "zeros", "ones"
    fan_in: int = 1
    fan_out: int = 1
    # False: state kept and checkpointed, but no gradient (BN running stats)
    learnable: bool = True

    def initial(self, rng: np.random.Generator, dtype=np.float32) -> np.ndarray:
        """A new array of the initial values (``fill`` writes the same into an array)."""
        out = np.empty(self.shape, dtype)
        self.fill(out, rng)
        return out

    def fill(self, out: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Write the initial values into ``out`` (C-contiguous, this shape) and return it: the
        normal draws in float64, scaled, rounded to ``out``'s dtype, ``FILL_CHUNK`` at a time.
        The generator draws the same sequence in pieces as in one call, so the values do not
        depend on the chunk; no temporary the size of the parameter is made (float64 ones of
        tens of MiB would stay in the C heap as free memory the process still holds)."""
        if tuple(out.shape) != tuple(self.shape) or not out.flags.c_contiguous:
            raise ValueError(f"parameter {self.name}: fill wants a C-contiguous {self.shape}, "
                             f"found {out.shape}")
        if self.init in ("zeros", "ones"):
            out[...] = 0 if self.init == "zeros" else 1
            return out
        if self.init == "he":  # Kaiming normal, fan_in, for ReLU nets
            std = np.sqrt(2.0 / self.fan_in)
        elif self.init == "xavier":  # Glorot uniform, as a normal of the same variance
            std = np.sqrt(2.0 / (self.fan_in + self.fan_out))
        else:
            raise ValueError(f"unknown initialiser {self.init!r} for parameter {self.name}")
        flat = out.reshape(-1)
        for start in range(0, flat.size, FILL_CHUNK):
            part = flat[start:start + FILL_CHUNK]
            part[...] = rng.standard_normal(part.size) * std
        return out


@dataclass(frozen=True)
class BufferSpec:
    """A saved or workspace buffer. ``dtype=None`` (the default) means the run's float dtype
    (float32 in training, float64 in a gradient check): layers size float buffers without knowing
    it; whoever allocates calls ``dtype_in(run_dtype)``. Integer buffers name their dtype."""
    name: str
    shape: tuple
    dtype: np.dtype | None = None

    def dtype_in(self, run_dtype) -> np.dtype:
        return np.dtype(run_dtype if self.dtype is None else self.dtype)

    def nbytes_in(self, run_dtype=np.float32) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype_in(run_dtype).itemsize

    @property
    def nbytes(self) -> int:
        """Bytes in a float32 run, the training dtype."""
        return self.nbytes_in(np.float32)


@dataclass
class StepIO:
    """The device arrays one step works on, by role. Gradients are ``None`` where not wanted."""
    bottom: list
    top: list
    params: dict = field(default_factory=dict)
    saved: dict = field(default_factory=dict)
    work: dict = field(default_factory=dict)
    top_grad: list = field(default_factory=list)
    bottom_grad: list = field(default_factory=list)
    param_grad: dict = field(default_factory=dict)
    train: bool = True
    rng: np.random.Generator | None = None   # host RNG: both devices draw the same numbers
    stream: object = None                     # the compute stream kernels launch on
    chunk: tuple[int, int] | None = None      # a split step's samples (n0, n1); None: the batch
    # A forward run again to rebuild its tops (``recompute.rerun_forward``): saved statistics and
    # masks are read, not made; running statistics and the RNG are left alone.
    recompute: bool = False
    # Bottoms whose gradient backward adds into (it holds another reader's already) instead of
    # overwriting it: only where the layer's ``adds_bottom_grad`` says it can.
    adds: frozenset = frozenset()


class Layer:
    type: ClassVar[str] = ""
    bottoms: ClassVar[tuple[int, int]] = (1, 1)   # how many bottoms: (at least, at most)
    tops: ClassVar[int] = 1
    backward_reads: ClassVar[frozenset] = frozenset({"bottom"})
    # backward may overwrite its tops' gradients (a fused ReLU masks them in place)
    backward_rewrites_top_grad: ClassVar[bool] = False
    has_backward: ClassVar[bool] = True
    is_loss: ClassVar[bool] = False
    split: ClassVar["SplitRule | None"] = None     # None: a step of this layer is never split
    device_kind: str | None = None    # set by setup: the device the layer is sized for
    # set by setup where backward can add its bottom's gradient into the one already there
    # (``StepIO.adds``): a blob read by two layers then needs no partial gradient, written and
    # added (``Net``; a 1x1 convolution's GEMM on the cpu device, beta = 1)
    adds_bottom_grad: bool = False
    # Every layer type states its own (tests/layers/test_recompute.py checks): the default refuses.
    recompute: ClassVar[Recompute] = NOT_DECLARED

    def __init__(self, name: str, bottom: list[str], top: list[str]):
        self.name, self.bottom, self.top = name, list(bottom), list(top)
        low, high = self.bottoms
        if not low <= len(self.bottom) <= high:
            count = f"{low}" if low == high else f"{low} to {high}"
            raise ShapeError(self, "bottoms", f"{count} bottom blob(s)", len(self.bottom))
        if len(self.top) != self.tops:
            raise ShapeError(self, "tops", f"{self.tops} top blob(s)", len(self.top))
        self.bottom_shapes: list[tuple] = []
        self.top_shapes: list[tuple] = []

    def setup(self, bottom_shapes: list[tuple], device_kind: str | None = None) -> list[tuple]:
        """Shapes for ``bottom_shapes``. ``device_kind`` (``"cpu"``, ``"cuda"``, or None: either)
        is the device the layer will run on, where its workspace depends on the engine that runs
        there; a layer set up for one device kind may fail with a clear error on another."""
        self.device_kind = device_kind
        self.bottom_shapes = [tuple(s) for s in bottom_shapes]
        self.top_shapes = [tuple(s) for s in self.infer(self.bottom_shapes)]
        return self.top_shapes

    def infer(self, bottom_shapes: list[tuple]) -> list[tuple]:
        raise NotImplementedError

    def params(self) -> list[ParamSpec]:
        return []

    def param_blob(self, name: str) -> str:
        """The net's blob of this layer's parameter ``name`` (a ``ParamSpec.name``):
        ``<layer>.<name>``. A layer that runs other layers' parameters as its own
        (``StackedConvolution``) keeps their blobs, and so their names in checkpoints."""
        return f"{self.name}.{name}"

    def saved(self) -> list[BufferSpec]:
        return []

    def workspace(self) -> list[BufferSpec]:
        return []

    def split_workspace(self, phase: str) -> list[BufferSpec]:
        """Scratch a split ``phase`` needs beyond ``workspace()``, shared by its chunks (batch
        norm's partial sums); see ``minilms.layers.split``."""
        return []

    def flops(self) -> int:
        """Floating-point operations of one forward pass at the set-up shapes, for the planner's
        cost model (backward counts twice this). Layers that are GEMMs say; the rest are
        memory-bound and the model charges them for the bytes they touch."""
        return 0

    def forward(self, io: StepIO) -> None:
        raise NotImplementedError

    def backward(self, io: StepIO) -> None:
        raise NotImplementedError

    # -- helpers for subclasses ------------------------------------------------------------------
    def expect_rank(self, index: int, shape: tuple, ranks: tuple[int, ...]) -> None:
        if len(shape) not in ranks:
            want = " or ".join(f"{r}-d" for r in ranks)
            raise ShapeError(self, f"bottom {index} ({self.bottom[index]})", f"a {want} shape",
                             shape)

    def expect_logits_and_labels(self, logits: tuple, labels: tuple) -> None:
        """Bottoms of a classifier head: logits ``[N, K]`` (or ``[N, K, 1, 1]``), labels ``[N]``."""
        self.expect_rank(0, logits, (2, 4))
        if len(logits) == 4 and logits[2:] != (1, 1):
            raise ShapeError(self, f"bottom 0 ({self.bottom[0]})", "[N, K] or [N, K, 1, 1]",
                             logits)
        if logits[0] < 1 or logits[1] < 1:
            raise ShapeError(self, f"bottom 0 ({self.bottom[0]})",
                             "at least one sample and one class", logits)
        if tuple(labels) != (logits[0],):
            raise ShapeError(self, f"bottom 1 ({self.bottom[1]})", f"labels [{logits[0]}]", labels)

    def __repr__(self) -> str:
        return f"<{self.type} {self.name}: {self.bottom} -> {self.top}>"

"""Dropout: any shape to the same shape, inverted dropout with drop probability ``ratio`` (Caffe's
name; PyTorch's ``p`` is accepted too), default 0.5.

Training forward::

    mask = rand(shape) >= p            (uint8, drawn on the host from ``io.rng``)
    top  = bottom * mask / (1 - p)     (p = 1: all zeros)

The mask comes from the step's host RNG (``kernels.elementwise.dropout_mask``), so the ``cpu`` and
``cuda`` devices drop exactly the same elements, and a runner that reseeds the RNG for every forward
(``LayerRun`` does) replays the same mask. It is copied into a saved uint8 buffer for backward::

    dbottom = dtop * mask / (1 - p)

A recompute (``io.recompute``, issue 21) reuses the saved mask and draws nothing from ``io.rng``:
the same top bit for bit, and every later draw of the step's RNG stream is the one it was.

Test forward (``io.train`` False) is the identity: a copy, no mask drawn. Backward reads no forward
blob, only the saved mask (a quarter of a float32 activation).
"""
import numbers

import numpy as np

from ..kernels import families, on_cpu
from .base import BufferSpec, Layer, ShapeError, register
from .flatten import copy_flat
from .recompute import Recompute
from .split import SplitRule, samples

# numba's: imported with the first kernel that runs (``kernels.families``)
(elementwise,) = families("elementwise")


class MaskStaging:
    """Where masks are drawn on the host before they are copied to a ``cuda`` device: page-locked
    buffers, so that a copy is asynchronous on the step's stream (from pageable memory CUDA
    stages the bytes and the host waits), reused from step to step.

    The host issues an iteration while the device may still run the last one (``submit``), and
    a split step draws a mask per chunk: a buffer whose copy the device has not made yet cannot
    be redrawn. ``take`` hands out the buffers in turn and adds one rather than wait for a copy
    still pending, up to ``MAX_BUFFERS``; only then does the host wait, for the oldest copy.
    ``pinned(size)`` and ``event()`` make the buffers and the events that say when their copies
    are done (numba's by default)."""

    MAX_BUFFERS = 8

    def __init__(self, pinned=None, event=None):
        self._pinned, self._event = pinned, event
        self.buffers, self.copied = [], []   # a buffer and the event after its last copy (or None)
        self.turn, self.size, self.waits = 0, 0, 0

    def _factories(self):
        if self._pinned is None:
            from numba import config, cuda
            self._pinned = lambda size: cuda.pinned_array(size, np.uint8)
            # an event that only orders keeps no time (the simulator's takes no arguments)
            self._event = cuda.event if config.ENABLE_CUDASIM else \
                (lambda: cuda.event(timing=False))
        return self._pinned, self._event

    def take(self, shape) -> np.ndarray:
        pinned, _ = self._factories()
        size = int(np.prod(shape))
        if size > self.size:              # a larger mask: every buffer anew (copies pending from
            for event in self.copied:     # the old ones must not see them freed)
                if event is not None:
                    event.synchronize()
            self.buffers, self.copied, self.turn, self.size = [], [], 0, size
        if self.buffers and not _done(self.copied[self.turn]):
            if len(self.buffers) < self.MAX_BUFFERS:      # still copying: one more buffer
                self.buffers.insert(self.turn, pinned(self.size))
                self.copied.insert(self.turn, None)
            else:
                self.waits += 1
                self.copied[self.turn].synchronize()
        elif not self.buffers:
            self.buffers, self.copied = [pinned(self.size)], [None]
        self.current = self.turn
        self.turn = (self.turn + 1) % len(self.buffers)
        return self.buffers[self.current][:size].reshape(shape)

    def copy(self, host: np.ndarray, dst, stream=None) -> None:
        """Copies ``host`` (the buffer ``take`` gave last) to ``dst`` on ``stream`` and records
        when that is done."""
        _, event = self._factories()
        dst.copy_to_device(host, stream=stream or 0)
        if self.copied[self.current] is None:
            self.copied[self.current] = event()
        self.copied[self.current].record(stream or 0)


def _done(event) -> bool:
    """Whether the copy before ``event`` is done (no event: none was made; the simulator's events,
    which have no ``query``, follow copies that ran when they were issued)."""
    return event is None or not hasattr(event, "query") or event.query()


def _address(array) -> int:
    """Where ``array``'s data starts: a numpy array, a CUDA device array, or the simulator's (which
    wraps a numpy array and has no ``__cuda_array_interface__``)."""
    iface = None if on_cpu(array) else getattr(array, "__cuda_array_interface__", None)
    return (iface or array.__array_interface__)["data"][0]


def _same_memory(a, b) -> bool:
    """True for an in-place step (top named as its bottom): its identity copy is skipped."""
    return on_cpu(a) == on_cpu(b) and _address(a) == _address(b)


@register
class Dropout(Layer):
    type = "Dropout"
    backward_reads = frozenset()
    # Chunks draw their masks from the step's RNG in order: the numbers one draw for the whole
    # batch gives (Generator.random is sequential), so a split step drops the same elements.
    split = SplitRule(samples("forward"), samples("backward"), batch_saved=frozenset({"mask"}))
    recompute = Recompute.rerun("training: the saved mask again, no RNG draw; test mode: a copy",
                                saved_reads={"mask"}, untouched=("rng",))

    def __init__(self, name, bottom, top, ratio=None, p=None):
        super().__init__(name, bottom, top)
        if ratio is not None and p is not None:
            raise ShapeError(self, "ratio", "ratio or p, not both", f"ratio={ratio!r}, p={p!r}")
        value = 0.5 if ratio is None and p is None else ratio if p is None else p
        if isinstance(value, bool) or not isinstance(value, numbers.Real) \
                or not 0.0 <= value <= 1.0:
            raise ShapeError(self, "ratio", "a probability in [0, 1]", repr(value))
        self.ratio = float(value)
        self._staging = MaskStaging()   # cuda: the page-locked buffer masks are drawn into

    def infer(self, bottom_shapes):
        shape = bottom_shapes[0]
        if len(shape) < 1:
            raise ShapeError(self, f"bottom 0 ({self.bottom[0]})", "at least a 1-d shape", shape)
        return [shape]

    def saved(self):
        return [BufferSpec("mask", self.bottom_shapes[0], np.dtype(np.uint8))]

    def forward(self, io):
        x, y = io.bottom[0], io.top[0]
        if not io.train:
            if not _same_memory(x, y):
                copy_flat(x, y, io.stream)
            return
        if io.recompute:
            elementwise.dropout_forward(x, io.saved["mask"], self.ratio, y, io.stream)
            return
        if io.rng is None:
            raise ShapeError(self, "forward", "a host RNG in training (StepIO.rng)", None)
        mask = io.saved["mask"]
        if on_cpu(mask):                  # drawn into the saved buffer itself
            elementwise.dropout_mask(io.rng, tuple(x.shape), self.ratio, out=mask)
        else:
            drawn = elementwise.dropout_mask(io.rng, tuple(x.shape), self.ratio,
                                             out=self._staging.take(tuple(x.shape)))
            self._staging.copy(drawn, mask, io.stream)
        elementwise.dropout_forward(x, mask, self.ratio, y, io.stream)

    def backward(self, io):
        dx = io.bottom_grad[0]
        if dx is None:
            return
        if not io.train:   # a test-mode forward is the identity
            if not _same_memory(io.top_grad[0], dx):
                copy_flat(io.top_grad[0], dx, io.stream)
            return
        elementwise.dropout_backward(io.top_grad[0], io.saved["mask"], self.ratio, dx, io.stream)

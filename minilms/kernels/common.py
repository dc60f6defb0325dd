"""What every kernel family shares to launch a kernel: a 1-D grid (``grid_1d``) or one over the
planes of NCHW (``grid_planes``), the launch itself
on an optional stream (``launch``, the one way a launcher starts a CUDA kernel, which
``counting_launches`` counts), checked views
(``view``, ``flat``: a reshape that never copies; ``span``: a range of the first axis; on CUDA
each made once and kept, ``derived``), and the block reductions kernels call
(``block_sum`` / ``block_max``: deterministic shared-memory trees inside one CUDA block;
``warp_sums``: the same per warp)."""
import weakref
from collections import Counter
from contextlib import contextmanager

from ..lazy_cuda import Deferred, cuda, load
from .registry import THREADS_1D, on_cpu

__all__ = ["grid_1d", "grid_planes", "launch", "launcher", "counting_launches", "view", "span",
           "derived", "flat", "block_sum", "warp_sums", "block_max"]

_LAUNCHER: list = []    # [prepared_launch, or None for numba's own], found at the first launch


def launcher():
    """``prepared_launch`` on a real GPU; None (numba's own dispatch) in the simulator or without
    numba-cuda's ``cuda.core``. Found at the first launch, which is also when numba.cuda is
    imported and every declared kernel's globals bound (``minilms.lazy_cuda``): a run on the cpu
    device never needs it."""
    if not _LAUNCHER:
        import numba
        load()
        found = None
        if not numba.config.ENABLE_CUDASIM:     # the simulator: numba's own dispatch
            try:
                from .prepared_launch import prepared_launch as found
            except ImportError:     # numba without numba-cuda (no `cuda` extra)
                pass
        _LAUNCHER.append(found)
    return _LAUNCHER[0]


def grid_1d(n: int, threads: int = THREADS_1D) -> tuple[int, int]:
    """(blocks, threads) covering ``n`` elements with one thread each. A small ``n`` gets a
    smaller block (whole warps): no idle threads, and far fewer for the simulator, which runs
    every CUDA thread as a Python thread."""
    threads = min(threads, max(32, -(-n // 32) * 32))
    return max(1, (n + threads - 1) // threads), threads


def grid_planes(planes: int, size: int, threads: int = THREADS_1D):
    """``((blocks along a plane, planes), threads)`` for a kernel over ``planes`` rows of ``size``
    elements, NCHW's ``(sample, channel)`` planes: the kernel takes its plane from
    ``blockIdx.y`` (a grid-stride loop past 65535) and its element from x. No element's index is
    then divided to find its channel: a 64-bit division is a software routine of tens of SASS
    instructions, several times a memory-bound kernel's own work per element. A short plane gets
    a smaller block (whole warps)."""
    threads = min(threads, max(32, -(-size // 32) * 32))
    return (max(1, -(-size // threads)), max(1, min(planes, 65535))), threads


_COUNTERS: list = []     # the Counters of the ``counting_launches`` blocks now open
_SKIPPING: list = []     # one entry per open ``counting_launches(run=False)``


def _skip(*args):
    """What a launch returns while kernels are only counted: takes the arguments, runs nothing."""


def launch(kernel, blocks, threads, stream=None):
    """``kernel[blocks, threads]``, on ``stream`` when one is given. On a real GPU through
    ``prepared_launch`` (numba's dispatch once per kind of arguments, not at every launch)."""
    if _COUNTERS:
        name = getattr(getattr(kernel, "py_func", kernel), "__name__", str(kernel))
        for counter in _COUNTERS:
            counter[name] += 1
        if _SKIPPING:
            return _skip
    prepared = _LAUNCHER[0] if _LAUNCHER else launcher()     # the first: loads numba.cuda
    if type(kernel) is Deferred:        # declared before numba.cuda was imported
        kernel = kernel.resolve()
    if prepared is not None:
        return prepared(kernel, blocks, threads, stream)
    return kernel[blocks, threads] if stream is None else kernel[blocks, threads, stream]


@contextmanager
def counting_launches(run: bool = True):
    """``with counting_launches() as launches:`` counts, by kernel name, every CUDA kernel
    launched inside (a ``collections.Counter``): how many a step or an iteration makes.
    ``run=False`` counts without running them (results are garbage): a full-size schedule's
    launches counted in seconds under the simulator."""
    counter = Counter()
    _COUNTERS.append(counter)
    if not run:
        _SKIPPING.append(counter)
    try:
        yield counter
    finally:
        _COUNTERS.remove(counter)
        if not run:
            _SKIPPING.remove(counter)


def view(array, *shape):
    """``array`` reshaped without a copy; refuses non-contiguous arrays, whose reshape would copy
    (for numpy silently, so the kernel's writes would be lost). On CUDA made once per array and
    shape (``derived``)."""
    if on_cpu(array):
        if not array.flags.c_contiguous:
            raise ValueError("minilms kernels need C-contiguous arrays")
        return array.reshape(*shape)
    return derived(array, shape, lambda: _reshaped(array, shape))


def _reshaped(array, shape):
    if not array.is_c_contiguous():
        raise ValueError("minilms kernels need C-contiguous arrays")
    return array.reshape(*shape)


def span(array, start: int, stop: int):
    """``array[start:stop]`` (along the first axis); ``array`` itself when that is all of it. On
    CUDA made once per array and range (``derived``)."""
    if start == 0 and stop == array.shape[0]:
        return array
    if on_cpu(array):
        return array[start:stop]
    return derived(array, (slice, start, stop), lambda: array[start:stop])


# id(CUDA array) -> {key: a view of it}; an entry goes when its array is collected
_DERIVED: dict = {}


def derived(array, key, make):
    """``make()``, a view of the CUDA array ``array``, made once per ``key`` while the array lives.
    Each numba device-array view (a slice, a reshape) costs tens of microseconds of host time
    (docs/kernels.md), and the launchers of a training iteration make the same views of the same
    arrays every iteration: a blob's view lives as long as its place in the pool. A view aliases
    fixed memory and its shape never changes, so a kept one is always right."""
    views = _DERIVED.get(id(array))
    if views is None:
        views = _DERIVED[id(array)] = {}
        weakref.finalize(array, _DERIVED.pop, id(array), None)
    found = views.get(key)
    if found is None:
        found = views[key] = make()
    return found


def flat(*arrays):
    """The arrays viewed flat (``view``), after checking they have one size."""
    n = arrays[0].size
    for a in arrays[1:]:
        if a.size != n:
            raise ValueError(f"size mismatch: {a.size} != {n}")
    return [view(a, n) for a in arrays]


@cuda.jit(device=True, inline="always")  # IR-inlined: compile_ptx needs no GPU
def block_sum(buf, t):
    """Sum of ``buf`` (a shared array whose length is a power of two, one slot per thread of the
    block, already filled) by a fixed-order tree: run to run bit-identical, unlike float atomics.
    Every thread of the block must call it; every thread gets the total, and ``buf`` may be
    refilled as soon as it returns."""
    cuda.syncthreads()
    s = buf.size // 2
    while s > 0:
        if t < s:
            buf[t] += buf[t + s]
        cuda.syncthreads()
        s //= 2
    total = buf[0]
    cuda.syncthreads()
    return total


@cuda.jit(device=True, inline="always")  # IR-inlined: compile_ptx needs no GPU
def warp_sums(buf, t):
    """Like ``block_sum`` for each 32-slot segment of ``buf`` (one warp's slots) at once: every
    thread gets its own warp's total by a fixed-order tree. Shared memory and block barriers
    rather than shuffles, which the simulator lacks; every thread of the block must call it."""
    cuda.syncthreads()
    lane = t % 32
    s = 16
    while s > 0:
        if lane < s:
            buf[t] += buf[t + s]
        cuda.syncthreads()
        s //= 2
    total = buf[t - lane]
    cuda.syncthreads()
    return total


@cuda.jit(device=True, inline="always")  # IR-inlined: compile_ptx needs no GPU
def block_max(buf, t):
    """Like ``block_sum`` with max (NaN propagates from any slot)."""
    cuda.syncthreads()
    s = buf.size // 2
    while s > 0:
        if t < s:
            other = buf[t + s]
            if other > buf[t] or other != other:
                buf[t] = other
        cuda.syncthreads()
        s //= 2
    total = buf[0]
    cuda.syncthreads()
    return total

"""The conventions every kernel family follows, and the registry of CUDA kernels.

A kernel family (one module in this package) keeps each CUDA kernel next to its CPU counterpart.
Launchers take arrays and dispatch on where they live: a ``numpy.ndarray`` is on the ``cpu``
device (a view into its arena), anything else is a CUDA device array (a real GPU's, or the
simulator's).

``cuda_kernel`` registers a kernel's Python function with the signatures it is compiled for, so that
``scripts/kernel_report.py`` can compile every kernel to PTX for sm_80/sm_90 on a machine without a
GPU. Compilation for launches stays lazy: importing a kernel module never needs a GPU, nor
imports numba.cuda (``minilms.lazy_cuda``: a run on the cpu device never does). Compiled
kernels are cached on disk (``cuda.jit(cache=True)``: numba's index and data files in the
module's ``__pycache__``, or ``$NUMBA_CACHE_DIR``), so a second process on the same GPU loads
them instead of compiling. Numba keys the cache on the kernel module's own source file: an edit
to a device function in another module (``common.block_sum``) does not invalidate it; clear the
cache after one.

``shared`` compiles one piece of index math for both targets (minitorch's idea): write it once as
plain Python, call the ``.cpu`` version from ``njit`` code and the ``.cuda`` version from kernels.
Numba resolves only plain globals inside compiled code, so bind each version to a module-level
name first (``window_cuda = window.cuda``) and call that.

Device functions are always ``inline="always"``: an out-of-line device function makes
``compile_ptx`` ask the (absent) GPU for its compute capability, which fails on a machine without
one. Launchers cast scalars to the arrays' dtype and require C-contiguous arrays, so what runs is
the specialisation the PTX report compiled.
"""
from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..lazy_cuda import cuda

__all__ = ["KernelSpec", "KERNELS", "cuda_kernel", "shared", "on_cpu", "THREADS_1D", "cpu_variant"]

THREADS_1D = 256


@dataclass(frozen=True)
class KernelSpec:
    name: str            # "<module>.<function>"
    py_func: Callable    # the undecorated Python function, for compile_ptx
    signatures: tuple    # numba signature strings it must compile for
    block: tuple         # threads per block the launchers use: the report's occupancy needs it
    dispatcher: object = None   # what launches it: ``cuda.jit(py_func, cache=True)``


KERNELS: dict[str, KernelSpec] = {}


def cuda_kernel(*signatures: str, block=THREADS_1D):
    """Decorator: make ``fn`` a lazily compiled CUDA kernel and register it for the PTX report.

    Each signature is a numba signature string, e.g. ``"void(float32[::1], float32)"``; list one per
    dtype the launchers use, so the report covers what really runs. ``block`` is the block shape the
    launchers use (an int or a tuple).
    """
    block = (block,) if isinstance(block, int) else tuple(block)
    if not signatures:
        raise ValueError("cuda_kernel needs at least one signature for the PTX report")

    def register(fn):
        name = f"{fn.__module__.rsplit('.', 1)[-1]}.{fn.__name__}"
        if name in KERNELS:
            raise ValueError(f"CUDA kernel {name} registered twice")
        # numba's until numba.cuda is imported, a stand-in (minilms.lazy_cuda); the simulator
        # ignores the cache, and so does a kernel without a source file (a notebook cell)
        dispatcher = cuda.jit(fn, cache=True)
        KERNELS[name] = KernelSpec(name, fn, tuple(signatures), block, dispatcher)
        return dispatcher

    return register


class _SharedFunction:
    """One Python function compiled for the CPU (``.cpu``) and as a CUDA device function
    (``.cuda``)."""

    def __init__(self, fn):
        from numba import njit  # a family's, when it is imported: not a layer's (lazy.py)
        self.py_func = fn
        self.cpu = njit(inline="always", cache=False)(fn)
        self.cuda = cuda.jit(device=True, inline="always")(fn)
        self.__doc__ = fn.__doc__
        self.__name__ = fn.__name__

    def __call__(self, *args):
        return self.py_func(*args)


def shared(fn) -> _SharedFunction:
    return _SharedFunction(fn)


def on_cpu(array) -> bool:
    """True when ``array`` lives on the ``cpu`` device (plain numpy), False for a CUDA array."""
    return isinstance(array, np.ndarray)


def cpu_variant(fn, variant: str, parallel: bool, **options):
    """``fn`` compiled for the cpu with ``njit(parallel=..., cache=True, nogil=True)`` under a
    name of its own, ``<name>_<variant>``. Numba's disk cache knows a function by its qualified
    name and file: two compilations of one function (serial and parallel, or closures over
    different constants) would load each other's machine code from it. Renamed, each variant is
    cached apart, and a warm start compiles nothing. ``options`` go to ``njit`` (``fastmath``)."""
    import types

    from numba import njit
    copy = types.FunctionType(fn.__code__, fn.__globals__, f"{fn.__name__}_{variant}",
                              fn.__defaults__, fn.__closure__)
    copy.__qualname__ = f"{fn.__qualname__}_{variant}".replace("<locals>.", "")
    copy.__module__ = fn.__module__
    return njit(parallel=parallel, cache=True, nogil=True, **options)(copy)

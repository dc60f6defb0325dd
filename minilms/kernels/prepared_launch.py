"""Launching a compiled CUDA kernel without numba's per-call dispatch: what ``common.launch`` does
on a real GPU.

numba types every argument of every launch (a ``types.Array`` built anew for each device array),
looks the overload up, wraps each array again and builds a launch configuration: measured on an
H100's host, about 60 us a launch before the kernel is queued (docs/benchmarks.md, "CUDA").
A training iteration makes hundreds of launches, so that host time, not the GPU, set the pace.

Here the first launch of a kernel with arguments of a given kind (each array's dtype, rank and
contiguity; each scalar's type) goes through numba, which compiles the kernel or loads it from the
disk cache; that overload's compiled function and one converter per argument are then kept, and
later launches of that kind only convert the arguments (an array becomes numba's flattened
descriptor: no meminfo, no parent, size, itemsize, pointer, shape, strides, exactly as numba's own
``_Kernel._prepare_args`` lays it out) and queue the kernel through ``cuda.core.launch``, as numba
does. Anything that is not a numba device array or a plain scalar takes numba's path every time.
"""
import ctypes

import numba
import numpy as np
from cuda.core import LaunchConfig
from cuda.core import launch as queue
from numba.cuda import types

if numba.config.ENABLE_CUDASIM:     # no such arrays or streams there: common.launch keeps numba's
    DeviceNDArray = _to_core_stream = None
else:
    from numba.cuda.cudadrv.devicearray import DeviceNDArray
    from numba.cuda.cudadrv.driver import _to_core_stream

__all__ = ["prepared_launch", "PREPARED", "clear"]

# (dispatcher, argument kinds) -> (kernel handle, argument converters)
PREPARED: dict = {}
_CONFIGS: dict = {}        # (grid, block) -> LaunchConfig
_STREAMS: dict = {}        # numba stream (None: the default) -> cuda.core's, as numba converts it
_SCALARS = (int, float, bool, np.integer, np.floating, np.bool_)


def _kind(arg):
    """What numba's typing of ``arg`` depends on, cheaply; None: not handled here."""
    if type(arg) is DeviceNDArray:
        return arg.dtype, arg.ndim, arg.is_c_contiguous(), arg.is_f_contiguous()
    if isinstance(arg, _SCALARS):
        return type(arg)
    return None


def _array(arg, out):
    out += (0, 0, arg.size, arg.dtype.itemsize, arg.device_ctypes_pointer.value or 0)
    out += arg.shape
    out += arg.strides


def _converter(numba_type):
    """How an argument of ``numba_type`` enters the kernel's parameter list (numba's layout)."""
    if isinstance(numba_type, types.Array):
        return _array
    if isinstance(numba_type, types.Integer):
        c_type = getattr(ctypes, f"c_{numba_type}")
        return lambda arg, out: out.append(c_type(arg))
    if numba_type == types.float32:
        return lambda arg, out: out.append(ctypes.c_float(arg))
    if numba_type == types.float64:
        return lambda arg, out: out.append(ctypes.c_double(arg))
    if numba_type == types.boolean:
        return lambda arg, out: out.append(bool(arg))
    return None


def _prepare(dispatcher, args):
    """After numba has launched ``dispatcher`` on ``args`` once: its compiled overload for them,
    or None where this module does not know how to pass one of them."""
    argtypes = tuple(dispatcher.typeof_pyval(a) for a in args)
    overload = dispatcher.overloads.get(argtypes)
    converters = [_converter(t) for t in argtypes]
    if overload is None or overload.debug or None in converters or dispatcher.extensions:
        return None
    return overload._codelibrary.get_cufunc().kernel, converters


def prepared_launch(dispatcher, blocks, threads, stream):
    """``dispatcher[blocks, threads, stream]``, but called with the arguments it launches with
    numba's dispatch only the first time for their kind (see the module's doc)."""
    def run(*args):
        kinds = tuple(_kind(a) for a in args)
        key = (dispatcher, kinds)
        entry = PREPARED.get(key)
        if entry is None:
            dispatcher[blocks, threads, stream or 0](*args)
            if None not in kinds:
                PREPARED[key] = _prepare(dispatcher, args) or False
            return
        if entry is False:
            dispatcher[blocks, threads, stream or 0](*args)
            return
        kernel, converters = entry
        params = []
        for convert, arg in zip(converters, args):
            convert(arg, params)
        config = _CONFIGS.get((blocks, threads))
        if config is None:
            config = _CONFIGS[blocks, threads] = LaunchConfig(grid=blocks, block=threads)
        core_stream = _STREAMS.get(stream)
        if core_stream is None:
            core_stream = _STREAMS[stream] = _to_core_stream(stream or 0)
        queue(core_stream, config, kernel, *params)
    return run


def clear() -> None:
    """Forget every prepared kernel: their handles belong to the CUDA context they were loaded in,
    so a process that closes its context (``cuda.close()``) and makes another calls this."""
    PREPARED.clear()
    _STREAMS.clear()

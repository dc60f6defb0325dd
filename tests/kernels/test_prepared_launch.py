"""The prepared launch path (``kernels.prepared_launch``, what ``common.launch`` uses on a GPU):
its argument layout is numba's. On a GPU every CUDA test launches through it (the CUDA tier ran on
an H100: docs/benchmarks.md); without one, the parts that need no GPU are checked here in a process
without the simulator (the module is for real device arrays, which the simulator does not have)."""
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numba

CHECK = textwrap.dedent("""
    import ctypes
    import numba
    import numpy as np
    from numba.cuda import types
    from minilms.kernels import common, prepared_launch as p

    assert not numba.config.ENABLE_CUDASIM and common.launcher() is p.prepared_launch

    # scalars as numba passes them: a ctypes value of the kernel's parameter type
    for numba_type, value, c_type in ((types.uint32, 7, ctypes.c_uint32),
                                      (types.int64, -3, ctypes.c_int64),
                                      (types.float32, 0.5, ctypes.c_float),
                                      (types.float64, 0.25, ctypes.c_double)):
        out = []
        p._converter(numba_type)(value, out)
        assert len(out) == 1 and type(out[0]) is c_type and out[0].value == value, out
    out = []
    p._converter(types.boolean)(np.bool_(True), out)
    assert out == [True]
    assert p._converter(types.UniTuple(types.int64, 2)) is None   # left to numba

    # an array: no meminfo, no parent, size, itemsize, pointer, shape, strides in bytes
    class Pointer:
        value = 4096
    class Array:
        size, dtype, shape, strides = 24, np.dtype(np.float32), (2, 3, 4), (48, 16, 4)
        device_ctypes_pointer = Pointer()
    out = []
    p._converter(types.Array(types.float32, 3, "C"))(Array(), out)
    assert out == [0, 0, 24, 4, 4096, 2, 3, 4, 48, 16, 4], out

    # what keys a prepared kernel: scalars by type; anything unknown is not prepared
    assert p._kind(np.float32(1)) is np.float32 and p._kind(3) is int
    assert p._kind(np.zeros(3)) is None and p._kind("x") is None
    print("ok")
""")


def test_arguments_are_laid_out_as_numba_lays_them_out(tmp_path):
    root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="0",
               PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
    result = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True,
                            env=env, cwd=tmp_path)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-2000:]


def test_the_simulator_keeps_numbas_own_launch():
    from minilms.kernels import common
    # in the simulator, or where numba-cuda (cuda.core) is missing: numba's own dispatch
    assert (common.launcher() is not None) != bool(numba.config.ENABLE_CUDASIM)

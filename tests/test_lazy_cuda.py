"""``minilms.lazy_cuda``: numba.cuda is imported when CUDA is first used, never by a run on the cpu
device or by planning, and the kernels declared before it work once it is.

Whether numba.cuda is imported is per process, so each check runs in a fresh interpreter."""
import ctypes.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run_python(program: str, simulator: bool = True, **env) -> dict:
    """Run ``program`` in a fresh interpreter; it prints one JSON object last."""
    environment = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    if simulator:
        environment["NUMBA_ENABLE_CUDASIM"] = "1"
    environment["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT),
                                                              environment.get("PYTHONPATH")]))
    environment.update(env)
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(program)], capture_output=True,
                          text=True, env=environment, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_planning_and_a_cpu_step_never_import_numba_cuda():
    found = run_python("""
        import json, sys
        import numpy as np
        from minilms.commands import plan
        plan.main(["configs/quickstart.yaml", "device.kind=cpu", "--summary"])
        planned = "numba.cuda" in sys.modules
        from minilms.device import make_device
        from minilms.lazy_cuda import loaded
        from minilms.lms import LmsExecutor, Policy
        from minilms.net import Net
        from minilms.solver import SGD
        from tests.test_lms import TINY
        rng = np.random.default_rng(0)
        inputs = {"data": rng.standard_normal((2, 1, 6, 6)).astype(np.float32),
                  "label": np.array([0, 2], np.int32)}
        net = Net(TINY, {k: (v.shape, v.dtype) for k, v in inputs.items()})
        with make_device("cpu", 1 << 20) as device:     # LMS on: a pool smaller than the net
            loss = LmsExecutor(net, device, SGD(0.1), Policy()).iterate(inputs)["loss"]
        print(json.dumps({"planned": planned, "trained": bool(np.isfinite(loss)),
                          "imported": "numba.cuda" in sys.modules, "loaded": loaded()}))
    """, simulator=False)
    assert found == {"planned": False, "trained": True, "imported": False, "loaded": False}


def test_declared_kernels_are_bound_to_numba_at_the_first_use():
    found = run_python("""
        import json, sys
        from minilms import lazy_cuda
        from minilms.kernels import common, elementwise, registry
        before = [type(elementwise.relu_forward_cuda).__name__, elementwise.cuda is lazy_cuda.cuda,
                  type(common.block_sum).__name__, "numba.cuda" in sys.modules]
        spec = registry.KERNELS["elementwise.relu_forward_cuda"]
        import numpy as np
        from numba import cuda
        x = cuda.to_device(np.array([-1.0, 2.0, -3.0, 4.0], np.float32))
        y = cuda.to_device(np.zeros(4, np.float32))
        elementwise.relu_forward(x, y)           # a launch loads numba.cuda and binds
        after = [elementwise.cuda is cuda, common.cuda is cuda,
                 elementwise.relu_forward_cuda is spec.dispatcher.resolve(),
                 type(common.block_sum).__name__ != "Deferred", lazy_cuda.loaded()]
        print(json.dumps({"before": before, "after": after, "y": y.copy_to_host().tolist()}))
    """)
    assert found["before"] == ["Deferred", True, "Deferred", False]
    assert found["after"] == [True, True, True, True, True]
    assert found["y"] == [0.0, 2.0, 0.0, 4.0]


def test_a_kernel_calling_a_deferred_device_function_from_a_closure():
    """A kernel made by a factory after loading, whose device function was deferred and is held
    in a closure cell, and one declared before: both run with the real device function."""
    found = run_python("""
        import json
        import numpy as np
        from minilms.lazy_cuda import Deferred, cuda, load

        @cuda.jit(device=True)
        def twice(v):
            return 2 * v

        def factory(helper):
            def kernel(x):
                i = cuda.grid(1)
                if i < x.size:
                    x[i] = helper(x[i]) + 1
            return cuda.jit(kernel)

        early = factory(twice)
        deferred = [type(twice) is Deferred, type(early) is Deferred]
        real = load()
        late = factory(twice)                    # twice is real by now, and so is its cell
        x = real.to_device(np.arange(4, dtype=np.float32))
        early[1, 32](x)
        late[1, 32](x)
        print(json.dumps({"deferred": deferred, "x": x.copy_to_host().tolist(),
                          "cuda": cuda.jit is not None and type(late) is not Deferred}))
    """)
    assert found["deferred"] == [True, True]
    assert found["x"] == [2 * (2 * v + 1) + 1 for v in range(4)]
    assert found["cuda"]


def test_a_kernel_without_a_source_file_compiles_without_numbas_cache():
    """numba's disk cache needs a source file: a kernel defined by ``exec`` (a notebook cell)
    asked for with cache=True gets a dispatcher without it, once numba.cuda loads."""
    found = run_python("""
        import json
        from minilms.lazy_cuda import cuda, load
        namespace = {"cuda": cuda}
        exec("def cell_kernel(x):\\n    x[cuda.grid(1)] = 1\\n", namespace)
        deferred = cuda.jit(namespace["cell_kernel"], cache=True)
        load()
        print(json.dumps({"cached": deferred.resolve()._cache.__class__.__name__}))
    """, simulator=False)
    assert found["cached"] == "NullCache"


def test_probes_of_the_stand_ins_load_nothing():
    found = run_python("""
        import copy, inspect, json, sys
        from minilms.lazy_cuda import cuda, loaded
        from minilms.kernels import elementwise
        inspect.unwrap(elementwise.relu_forward_cuda)
        hasattr(cuda, "__path__")
        print(json.dumps([loaded(), "numba.cuda" in sys.modules, repr(cuda)]))
    """)
    assert found == [False, False, "<numba.cuda, not imported yet>"]


# a library that loads everywhere stands in for a driver (the C library; msvcrt on Windows)
LOADABLE = ctypes.util.find_library("c") or "msvcrt"


@pytest.mark.parametrize("driver, present", [("/nonexistent/libcuda.so", False), (LOADABLE, True)])
def test_driver_present_loads_where_numba_looks(driver, present):
    """Without a driver library, ``real_gpu_available`` says no without importing numba.cuda."""
    found = run_python("""
        import json, sys
        from minilms.device import driver_present, real_gpu_available
        print(json.dumps([driver_present(), real_gpu_available() if not driver_present() else None,
                          "numba.cuda" in sys.modules]))
    """, simulator=False, NUMBA_CUDA_DRIVER=driver)
    assert found[0] is present
    if not present:
        assert found[1:] == [False, False]


def test_any_launch_binds_the_declared_kernels_first():
    """A kernel made with numba's own ``cuda.jit`` (a family that imported numba.cuda itself)
    compiles with the globals it finds: ``common.launch`` loads and binds every declared kernel
    and device function before it launches anything."""
    found = run_python("""
        import json
        import numpy as np
        from numba import cuda
        from minilms import lazy_cuda
        from minilms.kernels import common

        @cuda.jit
        def ones(x):
            i = cuda.grid(1)
            if i < x.size:
                x[i] = 1
        x = cuda.to_device(np.zeros(3, np.float32))
        before = lazy_cuda.loaded()
        common.launch(ones, 1, 32)(x)
        print(json.dumps([before, lazy_cuda.loaded(), type(common.block_sum).__name__,
                          x.copy_to_host().tolist()]))
    """)
    assert found[:2] == [False, True]
    assert found[2] != "Deferred" and found[3] == [1.0, 1.0, 1.0]

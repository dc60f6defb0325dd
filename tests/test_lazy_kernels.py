"""Planning without numba (``minilms.lazy``): the layers call the kernel families through lazy
modules and read what planning asks from modules that compile nothing (``kernels.shapes``,
``kernels.direct.rules``), so ``python -m minilms.plan`` never imports numba or llvmlite (on the
``cpu`` device, nor for ``cuda``: the weight gradients' split-K rule is ``shapes.split_k``), and
plans as it did with them; the rules' host vector width is LLVM's."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from minilms.kernels import families
from minilms.lazy import LazyModule

ROOT = Path(__file__).resolve().parent.parent

PLAN_WITHOUT_NUMBA = """
import sys, runpy
sys.argv = ["minilms.plan"] + {args!r}
try:
    runpy.run_module("minilms.plan", run_name="__main__")
except SystemExit as exit:
    assert not exit.code, exit.code
print("NUMBA", sorted(m for m in sys.modules if m.split(".")[0] in ("numba", "llvmlite")))
"""


def run_python(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


@pytest.mark.parametrize("config, overrides", [
    ("configs/resnet152.yaml", ["data.batch_size=4", "data.image_size=64"]),
    ("configs/googlenet.yaml", ["data.batch_size=2", "data.image_size=112"]),
    ("configs/lenet_mnist.yaml", []),
])
def test_planning_on_the_cpu_device_imports_no_numba(config, overrides):
    """Every kind of layer the zoo uses is set up (convolutions take their engine's paths:
    Winograd's, the row windows, the bands, 1x1s, the direct kernels; batch norm, pooling,
    concat, dropout, the loss), the least pool searched and ``auto`` weighed, and neither numba
    nor llvmlite is imported."""
    out = run_python(PLAN_WITHOUT_NUMBA.format(
        args=[config, "device.kind=cpu", "device.memory=1GiB", "--summary"] + overrides))
    assert "least pool for LMS" in out
    assert out.strip().splitlines()[-1] == "NUMBA []"


def test_planning_for_cuda_imports_no_numba():
    """A ``cuda`` net's convolutions size their weight gradients' partial sums (split-K) as they
    are set up: from ``shapes.split_k``, not from the kernel's module."""
    out = run_python(PLAN_WITHOUT_NUMBA.format(
        args=["configs/googlenet.yaml", "data.batch_size=2", "data.image_size=112",
              "device.kind=cuda", "device.memory=1GiB", "--summary"]))
    assert "least pool for LMS" in out
    assert out.strip().splitlines()[-1] == "NUMBA []"


def test_the_plan_is_the_one_made_with_the_kernels_loaded():
    """The same summary, figure for figure, when every kernel family was imported first (the
    workspaces come from the rules either way, and the host's lanes agree)."""
    args = ["configs/resnet152.yaml", "data.batch_size=4", "data.image_size=64",
            "device.kind=cpu", "device.memory=1GiB", "--summary"]
    lazy = run_python(PLAN_WITHOUT_NUMBA.format(args=args))
    loaded = run_python("import minilms.kernels.direct.conv, minilms.kernels.pooling\n"
                        + PLAN_WITHOUT_NUMBA.format(args=args))

    def figures(out):      # less the process's own resident memory, which numba changes
        return [line for line in out.splitlines()
                if not line.lstrip().startswith(("+ the process", "NUMBA", "note: the host"))]
    assert figures(lazy) == figures(loaded)
    assert loaded.strip().splitlines()[-1] != "NUMBA []"


def test_the_rules_read_the_hosts_lanes_as_llvm_does():
    """``rules.host_lanes()`` before the kernels are imported (the processor's flags) and after
    (LLVM's ``vector_ir.VL``) agree: a plan made before any kernel runs takes the paths the
    kernels then take."""
    out = run_python(
        "import json, sys\n"
        "from minilms.kernels.direct import rules\n"
        "before = rules.host_lanes()\n"
        "assert 'llvmlite' not in sys.modules\n"
        "from minilms.kernels.direct import vector_ir\n"
        "print(json.dumps([before, rules.host_lanes(), vector_ir.host_vector_lanes()]))\n")
    before, after, llvm = json.loads(out.strip().splitlines()[-1])
    assert before == after == llvm and llvm in (8, 16)


def test_a_lazy_module_imports_at_its_first_name_only():
    module = LazyModule("json.tool")
    assert "not imported yet" in repr(module)
    with pytest.raises(AttributeError):
        module.__wrapped__                   # probes (inspect, copy) import nothing
    assert "not imported yet" in repr(module)
    assert module.main is sys.modules["json.tool"].main
    assert "(imported)" in repr(module)


def test_families_are_lazy_and_a_bad_name_fails_at_first_use():
    elementwise, missing = families("elementwise", "no_such_family")
    assert isinstance(elementwise, LazyModule) and callable(elementwise.fill)
    with pytest.raises(ModuleNotFoundError, match="no_such_family"):
        missing.anything

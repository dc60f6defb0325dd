"""The PTX report: its parser and occupancy arithmetic, and the real report over every kernel.

The real report needs ``numba.cuda.compile_ptx``, which the simulator replaces, so it runs as a
subprocess with ``NUMBA_ENABLE_CUDASIM`` removed from its environment.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import numba
import pytest

from minilms.kernels import ptx
from minilms.kernels.ptx import KernelReport, occupancy, parse_ptxas, short_signature

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "kernel_report.py"

SAMPLE = """\
ptxas info    : 8 bytes gmem, 8 bytes cmem[4]
ptxas info    : Function properties for _ZN6helperEf
    24 bytes stack frame, 8 bytes spill stores, 4 bytes spill loads
ptxas info    : Compiling entry function '_ZN7minilms7kernels4gemm7gemm_nnE' for 'sm_80'
ptxas info    : Function properties for _ZN7minilms7kernels4gemm7gemm_nnE
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 64 registers, used 1 barriers, 4352 bytes smem, 576 bytes cmem[0]
ptxas info    : Compile time = 94.740 ms
"""


def without_simulator() -> dict:
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


# --- parser, occupancy, formatting ---------------------------------------------------------------

def test_parse_ptxas_sample():
    functions = parse_ptxas(SAMPLE)
    assert set(functions) == {"_ZN6helperEf", "_ZN7minilms7kernels4gemm7gemm_nnE"}
    entry = functions["_ZN7minilms7kernels4gemm7gemm_nnE"]
    assert entry.entry and (entry.registers, entry.smem, entry.barriers) == (64, 4352, 1)
    assert (entry.stack, entry.spill_stores, entry.spill_loads) == (0, 0, 0)
    helper = functions["_ZN6helperEf"]
    assert not helper.entry
    assert (helper.stack, helper.spill_stores, helper.spill_loads) == (24, 8, 4)


def test_parse_ptxas_without_smem_or_barriers():
    text = ("ptxas info    : Compiling entry function 'k' for 'sm_90'\n"
            "ptxas info    : Function properties for k\n"
            "    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
            "ptxas info    : Used 10 registers, 412 bytes cmem[0]\n")
    assert parse_ptxas(text)["k"] == ptx.FunctionResources("k", True, registers=10)


@pytest.mark.parametrize("threads, registers, smem, arch, expected, limiter", [
    (256, 32, 0, "sm_80", 1.0, "warps"),
    (256, 128, 0, "sm_80", 0.25, "registers"),
    (256, 64, 4352, "sm_90", 0.5, "registers"),
    (32, 16, 0, "sm_80", 0.5, "blocks"),                   # 32 blocks of one warp
    (32, 80, 0, "sm_80", 24 / 64, "registers"),            # 6 warps per sub-partition, not 25/SM
    (256, 32, 48 * 1024, "sm_80", 24 / 64, "shared memory"),   # 3 blocks of 49 KiB in 164 KiB
    (256, 32, 48 * 1024, "sm_90", 32 / 64, "shared memory"),   # 4 in 228 KiB
    (1024, 64, 0, "sm_80", 0.5, "registers"),
    (1024, 65, 0, "sm_80", 0.0, "registers"),              # cannot launch: > 64 K registers/block
    (128, 256, 0, "sm_80", 0.0, "registers"),              # over 255 per thread
    (2048, 16, 0, "sm_80", 0.0, "warps"),                  # over 1024 threads per block
])
def test_occupancy(threads, registers, smem, arch, expected, limiter):
    result = occupancy(threads, registers, smem, arch)
    assert result.fraction == pytest.approx(expected)
    assert result.limiter == limiter


def test_short_signature():
    assert short_signature("void(float32[:, ::1], float32[:, ::1], float32[:, ::1], float32, "
                           "float32)") == "f32[:,::1]*3,f32*2"
    assert short_signature("void(float64[:, :, ::1], float64[:, ::1], int64, boolean)") \
        == "f64[:,:,::1],f64[:,::1],i64,b"


def test_problems_name_the_kernel():
    fine = KernelReport("gemm.gemm_nn", "void(float32[::1])", "sm_80", 256, registers=32)
    spills = KernelReport("a.spiller", "void(float32[::1])", "sm_90", 256, spill_stores=8)
    broken = KernelReport("b.broken", "void(float32[::1])", "sm_80", 256, error="compile_ptx: X")
    assert ptx.problems([fine], {}) == []
    found = ptx.problems([fine, spills, broken], {"c": "ImportError: no"}, check=True)
    assert len(found) == 3
    assert "minilms.kernels.c" in found[0]
    assert "a.spiller" in found[1] and "sm_90" in found[1] and "spills" in found[1]
    assert "b.broken" in found[2] and "compile_ptx: X" in found[2]
    assert len(ptx.problems([spills, broken], {}, check=False)) == 1  # spills only fail --check


@pytest.mark.skipif(not numba.config.ENABLE_CUDASIM, reason="only under the simulator")
def test_refuses_to_run_under_the_simulator():
    kernels, _ = ptx.discover_kernels()
    spec = kernels["gemm.gemm_nn"]
    with pytest.raises(RuntimeError, match="NUMBA_ENABLE_CUDASIM"):
        ptx.compile_kernel(spec, spec.signatures[0])


def test_ptxas_is_found():
    assert os.access(ptx.ptxas_path(), os.X_OK)


# --- the real thing, in a process without the simulator ------------------------------------------

def test_every_kernel_compiles_for_both_arches_without_spills():
    jobs = str(max(1, min(4, os.cpu_count() or 1)))
    run = subprocess.run([sys.executable, str(SCRIPT), "--check", "--json", "--jobs", jobs],
                         capture_output=True, text=True, env=without_simulator(), cwd=ROOT,
                         timeout=900)
    assert run.returncode == 0, f"kernel_report --check failed:\n{run.stderr}"
    report = json.loads(run.stdout)

    # The subprocess found the kernels on its own (pkgutil); it must be all of them.
    kernels, failures = ptx.discover_kernels()
    assert not failures and report["import_failures"] == {}
    assert set(report["kernels"]) == set(kernels)
    assert {"gemm.gemm_nn", "gemm.gemm_tt", "im2col.im2col_kernel", "im2col.col2im_kernel"} \
        <= set(report["kernels"])

    seen = {(r["kernel"], r["signature"], r["arch"]): r for r in report["results"]}
    for name, spec in kernels.items():
        for signature in spec.signatures:
            for arch in ("sm_80", "sm_90"):
                result = seen.get((name, signature, arch))
                assert result is not None, f"{name} [{signature}] missing for {arch}"
                assert not result["error"] and result["spills"] == 0, result
                assert 0 < result["registers"] <= 255 and result["occupancy"] > 0, result


def test_a_kernel_that_does_not_compile_fails_the_report():
    program = f"""
import runpy, sys
from minilms.kernels.registry import cuda_kernel

def broken(a):
    a[0] = "not a number"

broken.__module__ = "minilms.kernels.broken"
cuda_kernel("void(float32[::1])")(broken)
main = runpy.run_path({str(SCRIPT)!r})["main"]
sys.exit(main(["--check", "--kernel", "broken.broken", "--arch", "sm_80"]))
"""
    run = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                         env=without_simulator(), cwd=ROOT, timeout=300)
    assert run.returncode == 1, run.stdout + run.stderr
    assert "broken.broken" in run.stderr and "failed" in run.stderr, run.stderr
    assert "FAILED" in run.stdout


def test_every_kernel_is_cached_on_disk():
    """Outside the simulator every registered kernel's dispatcher has numba's file cache, where
    a compiled kernel is written and a later process reads it (on a GPU; here the cache is
    checked to be in place and its directory writable, since nothing compiles without one)."""
    program = """
import json, os
from minilms.kernels import ptx
from numba.cuda.dispatcher import CUDACache
kernels, failures = ptx.discover_kernels()
found = {}
for name, spec in kernels.items():
    cache = getattr(spec.dispatcher, "_cache", None)
    found[name] = [isinstance(cache, CUDACache), os.access(cache._cache_path, os.W_OK)
                   if isinstance(cache, CUDACache) else False]
print(json.dumps(found))
"""
    run = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                         env=without_simulator(), cwd=ROOT, timeout=300)
    assert run.returncode == 0, run.stderr
    found = json.loads(run.stdout)
    assert set(found) == set(ptx.discover_kernels()[0]), found
    assert all(cached for cached, _ in found.values()), found
    assert all(writable for _, writable in found.values()), found

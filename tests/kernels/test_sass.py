"""The SASS instruction mix (``minilms.kernels.sass``): the loop finder on a listing written here,
and the GEMM's inner loop: at least 70% FFMA on sm_90 with registers for two blocks per SM.

Reading SASS needs ``nvdisasm``, which CI does not have: the GEMM's figures are then read from a
golden record (tests/golden/gemm_sass.json, written by ``scripts/kernel_report.py
--write-gemm-sass``) that names the digest of the kernel source it was made from, so a kernel
changed without a new record fails here. Where nvdisasm is found, the live test recompiles the
kernels and must reproduce the record."""
import json
import subprocess
import sys

import pytest

from minilms.kernels import gemm, sass

from .test_ptx import ROOT, SCRIPT, without_simulator

RECORD = ROOT / "tests" / "golden" / "gemm_sass.json"
GEMMS = ("gemm.gemm_nn", "gemm.gemm_nt", "gemm.gemm_tn", "gemm.gemm_tt")

LISTING = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;
.L_x_0:
        /*0010*/                   FFMA R2, R3, R4, R2 ;
        /*0020*/                   LDS R3, [R5] ;
        /*0030*/              @!P0 BRA `(.L_x_0) ;
.L_x_1:
        /*0040*/                   FFMA R2, R3, R4, R2 ;
        /*0050*/                   FFMA R6, R3, R4, R6 ;
        /*0060*/                   FFMA R7, R3, R4, R7 ;
        /*0070*/                   IADD3 R8, R8, 0x1, RZ ;
        /*0080*/                   ISETP.GE.AND P0, PT, R8, 0x10, PT ;
        /*0090*/               @P0 BRA `(.L_x_1) ;
        /*00a0*/                   BRA `(.L_x_2) ;
.L_x_2:
        /*00b0*/                   FFMA R9, R3, R4, R9 ;
        /*00c0*/                   EXIT ;
"""


def test_the_loop_with_the_most_ffma_is_the_inner_loop():
    """Two loops closed by backward branches; a forward branch and straight-line FFMA after
    them are no loop. Predicated instructions count by their opcode."""
    loop = sass.inner_loop(LISTING)
    assert (loop.ffma, loop.instructions) == (3, 6)
    assert loop.opcodes == {"FFMA": 3, "IADD3": 1, "ISETP": 1, "BRA": 1}
    assert loop.describe() == "50% (3/6)"
    assert sass.inner_loop(LISTING.replace("FFMA", "FADD")) is None


def test_the_gemm_record_is_of_todays_kernel_and_meets_the_goal():
    """The record was made from today's kernel source and tile, and says: every variant's inner
    loop at least 70% FFMA, 512 of them (8 steps of k, 8x8 outputs per thread), no more than
    128 registers (two blocks of 256 threads on an SM)."""
    record = json.loads(RECORD.read_text())
    assert record["source_digest"] == gemm.source_digest(), \
        "the GEMM changed: rewrite tests/golden/gemm_sass.json (kernel_report --write-gemm-sass)"
    assert record["arch"] == "sm_90" and set(record["kernels"]) == set(GEMMS)
    for name, row in record["kernels"].items():
        assert row["ffma"] == gemm.BK * gemm.TM * gemm.TN, (name, row)
        assert row["ffma"] / row["instructions"] >= 0.70, (name, row)
        assert row["registers"] <= 128, (name, row)


@pytest.mark.skipif(sass.nvdisasm_path() is None,
                    reason="no nvdisasm (scripts/get_nvdisasm.sh): the golden record stands in")
def test_the_live_sass_reproduces_the_record():
    run = subprocess.run([sys.executable, str(SCRIPT), "--json", "--arch", "sm_90", "--kernel",
                          *GEMMS], capture_output=True, text=True, env=without_simulator(),
                         cwd=ROOT, timeout=600)
    assert run.returncode == 0, run.stderr
    live = {r["kernel"]: {"registers": r["registers"], "ffma": r["loop_ffma"],
                          "instructions": r["loop_instructions"]}
            for r in json.loads(run.stdout)["results"]}
    assert live == json.loads(RECORD.read_text())["kernels"]


def test_the_cuda_cost_model_takes_its_constants_from_the_kernels():
    """``policy: auto`` on cuda decides on the kernels' own figures, marked predicted: FLOP/s is
    the FP32 peak times the share the convolutions reached on a GPU, below the ceiling of the
    GEMM's FFMA share (which is the least in the record, rounded down); memory the HBM's rate
    times the share the memory-bound layers reached, a step's work the larger of the two (a
    roofline); a step costs its launches' host time and the executor's."""
    from minilms.device.link import parse_link
    from minilms.lms import cost
    record = json.loads(RECORD.read_text())["kernels"].values()
    least = min(row["ffma"] / row["instructions"] for row in record)
    assert gemm.INNER_LOOP_FFMA_SHARE == int(least * 100) / 100
    model = cost.CostModel.for_device("cuda")
    assert model.flops_per_second == cost.GPU_FP32_PEAK * cost.CONV_SHARE_OF_PEAK  # measured
    assert model.flops_per_second < cost.GPU_FP32_PEAK * gemm.INNER_LOOP_FFMA_SHARE  # ceiling
    assert model.step_seconds_fixed == \
        cost.LAUNCHES_PER_STEP * cost.LAUNCH_SECONDS + cost.HOST_STEP_SECONDS
    assert model.memory_bytes_per_second == cost.GPU_MEMORY * cost.MEMORY_SHARE_OF_PEAK  # measured
    assert model.roofline and not cost.CostModel.for_device("cpu").roofline
    assert "predicted" in model.describe()
    link = parse_link("pcie3")
    assert cost.CostModel.for_device("cuda", link).copy_bytes_per_second == link.bytes_per_second

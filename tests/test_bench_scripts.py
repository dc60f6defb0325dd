"""Smoke runs of bench_vs_torch, bench_startup and bench_mpi at tiny size: they run and print
what they promise (tables, ratios, goal lines). Their numbers are never asserted (no absolute
times in CI)."""
import re
import runpy
import sys
import weakref

import pytest

from .test_scripts import SCRIPTS, run_script


def test_bench_vs_torch_smoke(capsys):
    pytest.importorskip("torch", reason="PyTorch not installed: it is bench_vs_torch's baseline")
    assert run_script("bench_vs_torch.py", "--smoke", "--profile") == 0
    out = capsys.readouterr().out
    assert re.search(r"model +batch +row +images/s +ms/iter +vs torch", out)
    for model in ("lenet", "resnet18"):
        rows = [line for line in out.splitlines() if line.startswith(model) and "x" in line[-8:]]
        assert len(rows) == 3, rows           # PyTorch, LMS off, LMS on
        assert any("PyTorch" in row for row in rows) and any("LMS off" in row for row in rows)
        assert re.search(rf"ratio minilms/torch images/s, {model} batch 4 \(LMS off\): "
                         rf"[\d.]+x \(goal 1\.0x: (met|not met)\)", out)
        assert re.search(rf"^{model} +[\d.]+ +[\d.]+ +[\d.]+ +[\d.e+-]+ +[\d.e+-]+ +[\d.e+-]+ "
                         rf"+bit for bit$", out, re.M), "loss agreement row, LMS on = off"
    assert "loss agreement, 2 SGD steps from the same initial weights" in out
    assert out.count("top 15 by total time") == 2 and "ncalls  tottime" in out


def test_bench_vs_torch_without_torch_exits_0(capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)      # import torch raises ImportError
    assert run_script("bench_vs_torch.py", "--smoke") == 0
    out = capsys.readouterr().out
    assert "bench_vs_torch: skipped, PyTorch is the baseline and it is not installed" in out
    assert len(out.strip().splitlines()) == 1


@pytest.mark.slow     # compiles every kernel of the quickstart into an empty cache: 1.5 minutes
def test_bench_startup_smoke(capsys):
    assert run_script("bench_startup.py", "--smoke") == 0
    out = capsys.readouterr().out
    assert re.search(r"cold t\(1\) s +warm t\(1\) s +warm t\(2\) s +one step s +import only s "
                     r"+to 1st step s", out)
    best = re.search(r"^best +([\d.]+) +([\d.]+) +- +- +- +([\d.]+)$", out, re.M)
    assert best and 0 < float(best.group(3)) < float(best.group(2)), out  # before its end
    assert "compiled in every process, warm or not, on first call (cache=False)" in out
    assert re.search(r"goal: time to the first step under 5 s warm: [\d.]+ s from launch to the "
                     r"first iteration's start \((met|not met); the whole warm t\(1\) process", out)


def test_bench_startup_warm_only_smoke(capsys):
    """The cache the user has (CI's quickstart run filled it), no cold run: its columns say so."""
    assert run_script("bench_startup.py", "--smoke", "--warm-only") == 0
    out = capsys.readouterr().out
    best = re.search(r"^best +- +([\d.]+) +- +- +- +([\d.]+)$", out, re.M)
    assert best and 0 < float(best.group(2)) < float(best.group(1)), out
    assert re.search(r"cold - s, warm [\d.]+ s; .* compiling with an empty cache costs not "
                     r"measured \(--warm-only\)", out)
    assert re.search(r"goal: time to the first step under 5 s warm: [\d.]+ s", out)


def test_bench_startup_lists_uncached_kernels():
    found = runpy.run_path(str(SCRIPTS / "bench_startup.py"))["jit_caching"]()
    assert found["cached"] and all(": " in name for kind in found.values() for name in kind)
    assert not set(found["cached"]) & set(found["uncached"])


def test_bench_mpi_smoke(capsys):
    pytest.importorskip("mpi4py", reason="mpi4py not installed: bench_mpi needs MPI (mpi extra)")
    assert run_script("bench_mpi.py", "--smoke") == 0
    out = capsys.readouterr().out
    assert re.search(r"row +ranks +threads/rank +batch in all +images/s +ratio +wait ms/it", out)
    for row in ("1 rank, 2 threads", "1 rank, 1 thread"):
        assert re.search(rf"^{row} +1 +[12] +\d+ +[\d.]+ +[\d.]+x +-$", out, re.M), row
    for row in ("2 ranks, 1 thread each", "2 ranks, overlap off"):
        assert re.search(rf"^{row} +2 +1 +\d+ +[\d.]+ +[\d.]+x +[\d.]+$", out, re.M), row
    assert re.search(r"ratio 2 ranks / 1 rank images/s: [\d.]+x against 1 rank with 2 threads",
                     out)
    assert "load average" in out


def test_bench_host_memory_smoke(capsys):
    """The smoke run measures in this process, after a warm-up run: the figure is printed, every
    blob with a home had it once built, and the peak growth is near the figure less its kernels,
    which the warm-up paid (loosely: a tiny net, where a few MiB of the allocator's own
    keep-or-give-back choices show). What the process
    keeps once a run is freed is printed, not asserted: in CI's process, after ~2,000 tests, the
    allocator once kept 10 MiB of a 15 MiB run, though no object of the run stayed alive."""
    assert run_script("bench_host_memory.py", "--smoke") == 0
    out = capsys.readouterr().out
    assert "process baseline (resident after the imports" in out
    for mode in ("LMS auto", "LMS off"):
        row = re.search(rf"^{mode} +([\d.]+ +){{6}}([\d.]+)x +[\d.-]+ +- +(\d+)/(\d+)/(\d+)$",
                        out, re.M)
        assert row, out
        ratio = float(row.group(2))
        built, after, blobs = (int(row.group(i)) for i in (3, 4, 5))
        assert 0.7 <= ratio <= 1.6, out
        assert built == after < blobs
    assert re.search(r"figure: [\d.]+ \w+ \(pinned 0 B, pageable [\d.]+ \w+: [\d.]+ \w+ blob homes "
                     r"of \d+ blobs, [\d.]+ \w+ pool \(host RAM on cpu\), [\d.]+ \w+ batches x1, "
                     r"[\d.]+ MiB kernels \(Numba's JIT and the cpu kernels, once\)\)", out)
    assert re.search(r"goal: peak growth within 10% of the plan's figure, LMS auto in [\d.]+ MiB: "
                     r"[\d.]+x \((met|not met)\)", out)
    assert "ratio: peak / figure less kernels (paid by the warm-up)" in out


def test_bench_fullsize_smoke(capsys):
    """Each contender in a process of its own, at tiny size: the table's rows, the SGEMM rate of
    this run, the OpenBLAS kernels it ran (and the core type the environment forced, where it
    did), and a verdict line per minilms row (numbers never asserted)."""
    assert run_script("bench_fullsize.py", "--smoke", "--no-torch", "--rounds", "2") == 0
    out = capsys.readouterr().out
    assert re.search(r"numpy SGEMM \d+ GFLOP/s \(this run\)", out)
    assert re.search(r"in each of 2 rounds, taken in turn; minilms' BLAS: (mkl|openblas) "
                     r"\(OpenBLAS kernels \w[\w ]*(, OPENBLAS_CORETYPE=\w+ set)?\);", out), out
    for row in ("LMS off", "LMS on"):
        assert re.search(rf"^resnet50 32 b2 +{row} +[\d.]+ +[\d.]+ +- +\d+ +\d+% +[\d.]+ \w?i?B "
                         rf"+[\d.]+ \w?i?B +[\d.]+\*?$", out, re.M), out
        assert re.search(rf"^resnet50 32 b2, {row}: \d+% of SGEMM \(goal 65%: (met|not met)\); "
                         r"peak RSS over", out, re.M), out


def test_bench_fullsize_interleaved_smoke(capsys):
    """``--interleave``: the contenders' processes alive at once, taking turns; the same rows
    (numbers never asserted)."""
    assert run_script("bench_fullsize.py", "--smoke", "--no-torch", "--interleave",
                      "--rounds", "3") == 0
    out = capsys.readouterr().out
    assert re.search(r"median of 3 turns of 1 iterations, the contenders in rotation", out), out
    assert re.search(r"^resnet50 32 b2: numpy SGEMM \d+ GFLOP/s, the median of its turns$", out,
                     re.M), out
    for row in ("LMS off", "LMS on"):
        assert re.search(rf"^resnet50 32 b2 +{row} +[\d.]+ +[\d.]+ +- +\d+ +\d+% +[\d.]+ \w?i?B "
                         rf"+[\d.]+ \w?i?B +[\d.]+\*?$", out, re.M), out


LAYER_ROW = (r"^(\w+) +(\d+) +[\dx]+ +\d+x\d+/\d +(pointwise|winograd|windows|bands|im2col|"
             r"direct [a-zW+]+) +[\d.]+ +\d+ +[\d.]+ +\d+")


def test_bench_layers_smoke(capsys):
    """After the full-size smoke (its kernels compiled): one row per distinct convolution of the
    net, the rows' counts adding up to the net's convolutions, and the totals line."""
    assert run_script("bench_layers.py", "--smoke", "--no-torch") == 0
    out = capsys.readouterr().out
    head = re.search(r"^bench_layers: resnet50 32x32 batch 2, (\d+) distinct convolutions, \d+ "
                     r"threads, best of 1 in each of 1 rounds, hot; PyTorch: none \(--no-torch\)$",
                     out, re.M)
    assert head, out
    rows = re.findall(LAYER_ROW + r"$", out, re.M)
    assert len(rows) == int(head.group(1)) > 10, out
    assert len({name for name, _, _ in rows}) == len(rows)
    layers = sum(int(count) for _, count, _ in rows)
    assert layers == 53, rows                     # ResNet-50's convolutions, projections too
    assert {"pointwise"} <= {path for _, _, path in rows}
    assert re.search(rf"^the net's convolutions \({layers} layers\): minilms forward [\d.]+ ms "
                     r"\(\d+% of SGEMM\), backward [\d.]+ ms \(\d+%\) \(numpy's SGEMM \d+ "
                     r"GFLOP/s in this run\)$", out, re.M), out


def test_bench_layers_cold_smoke(capsys):
    assert run_script("bench_layers.py", "--smoke", "--no-torch", "--cold") == 0
    out = capsys.readouterr().out
    assert re.search(r"^bench_layers: resnet50 32x32 batch 2, \d+ distinct convolutions, .* "
                     r"rounds, cold; PyTorch: none \(--no-torch\)$", out, re.M), out
    assert len(re.findall(LAYER_ROW + r"$", out, re.M)) > 10, out


def test_bench_layers_against_torch_smoke(capsys):
    pytest.importorskip("torch", reason="PyTorch not installed: it is bench_layers' baseline")
    assert run_script("bench_layers.py", "--smoke") == 0
    out = capsys.readouterr().out
    rows = re.findall(LAYER_ROW + r" +[\d.]+ +[\d.]+ +[\d.]+ +[\d.]+$", out, re.M)
    assert len(rows) > 10, out
    assert re.search(r"; PyTorch forward [\d.]+ ms \(\d+%\), backward [\d.]+ ms \(\d+%\); ratio "
                     r"forward [\d.]+x, backward [\d.]+x", out), out


def test_bench_layers_bad_net_exits_2(capsys):
    assert run_script("bench_layers.py", "--net", "resnet50:224") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["bench_layers: --net: expected model:size:batch, found 'resnet50:224'"]


def test_bench_blas_smoke(capsys):
    """MKL against OpenBLAS: a row per product shape and per net, ratios printed (never
    asserted), and the library chosen before the run chosen again after it."""
    from minilms.kernels import mkl
    if not mkl.available():
        pytest.skip("MKL not installed: bench_blas compares it with OpenBLAS (the test extra "
                    "brings it)")
    before = mkl.chosen()
    assert run_script("bench_blas.py", "--smoke") == 0
    out = capsys.readouterr().out
    assert re.search(r"^forward +\d+ x \d+ x \d+ +\d+ +\d+ +[\d.]+x$", out, re.M), out
    assert re.search(r"^weight grad +\d+ x \d+ x \d+ ", out, re.M), out
    assert re.search(r"MKL/OpenBLAS on resnet50's products: [\d.]+-[\d.]+x, median [\d.]+x", out)
    assert re.search(r"^resnet50 32 b2 +[\d.]+ +[\d.]+ +[\d.]+x$", out, re.M), out
    assert mkl.chosen() == before


def test_bench_blas_row_blocks_smoke(capsys):
    """``--row-blocks``: a row per product shape (whole and blocks timed, the ratio printed, never
    asserted) and a row per net and LMS setting; MKL's blocks switched back on after."""
    from minilms.kernels import mkl
    if not mkl.available():
        pytest.skip("MKL not installed: the blocks are MKL's (the test extra brings it)")
    before = mkl.chosen()
    assert run_script("bench_blas.py", "--row-blocks", "--smoke") == 0
    out = capsys.readouterr().out
    assert re.search(r"^ +256 x 64 x 392 +[\d.]+ +[\d.]+ +[\d.]+x$", out, re.M), out
    for lms in ("off", "on"):
        assert re.search(rf"^resnet50 32 b2 +{lms} +[\d.]+ +[\d.]+ +[\d.]+x$", out, re.M), out
    assert mkl.ROW_BLOCKS is True and mkl.chosen() == before


# a training row of bench_windows.print_training: seconds both ways, the paired ratio, and that
# ratio with the net without the path built first and second
PAIRED_ROW = r" +[\d.]+ +[\d.]+ +[\d.]+x +\([\d.]+x, [\d.]+x\)$"


def test_bench_windows_smoke(capsys):
    """Each path a row per layer shape and pass, the windows' ratios and the engine's choice;
    then a row per net, its iterations with the windows and without (numbers never asserted)."""
    assert run_script("bench_windows.py", "--smoke") == 0
    out = capsys.readouterr().out
    for label in ("forward", "backward"):
        assert re.search(rf"^res2a_2 +2x4x8x8 3x3/1 +{label} +[\d.]+ +[\d.]+ +[\d.]+ +[\d.]+x "
                         r"+[\d.]+x +(yes|no)$", out, re.M), out
    assert re.search(rf"^resnet50 32 b2 +\d+{PAIRED_ROW}", out, re.M), out


def test_bench_bands_smoke(capsys):
    """A row per stem shape and pass (forward, dW): each path's ms, the bands' ratio to the best
    other and the engine's choice (a 56x56 plane: taken); then a row per net, its iterations with
    the bands and without (numbers never asserted)."""
    assert run_script("bench_bands.py", "--smoke") == 0
    out = capsys.readouterr().out
    for label in ("forward", "dW"):
        assert re.search(rf"^conv1 +2x3x112x112 7x7/2 +{label} +[\d.]+ +[\d.]+ +[\d.]+ "
                         r"+[\d.]+x +yes$", out, re.M), out
    assert re.search(rf"^resnet50 112 b2 +1{PAIRED_ROW}", out, re.M), out


def test_bench_pooling_smoke(capsys):
    """A row per max pool: each forward's ms that can run it, the two passes' ratio where they
    apply (a dash on a 2x2 plane, where they do not); then a row per net, the two passes on and
    off alternating, and the switch set back (numbers never asserted)."""
    from minilms.kernels import pooling_planes
    assert run_script("bench_pooling.py", "--smoke") == 0
    out = capsys.readouterr().out
    assert re.search(r"^pool_4a +2x480x8x8 +3/2/0 +[\d.]+ +- +[\d.]+ +[\d.]+x$", out, re.M), out
    assert re.search(r"^inc3a_pool +2x192x8x8 +3/1/1 +[\d.]+ +[\d.]+ +[\d.]+ +[\d.]+x$", out,
                     re.M), out
    assert re.search(r"^inc5a_pool +2x832x2x2 +3/1/1 +[\d.]+ +[\d.]+ +- +-$", out, re.M), out
    assert re.search(r"^googlenet 64 b2 +9 +[\d.]+ +[\d.]+ +[\d.]+x$", out, re.M), out
    assert pooling_planes.ENABLED


def test_bench_slotted_smoke(capsys):
    """A row per short-plane layer and pass, per sample against in slots and whether the layer
    takes them; then a row per net, slots and none alternating (numbers never asserted)."""
    assert run_script("bench_slotted.py", "--smoke") == 0
    out = capsys.readouterr().out
    for weight, label in (("1x1", "forward"), ("1x1", "dx"), ("3x3", "forward")):
        assert re.search(rf"^\S+ +2x\d+x\d+x\d+ +\d+x\d+x{weight} +{label} +2 +[\d.]+ +[\d.]+ "
                         r"+[\d.]+x +no$", out, re.M), (weight, label, out)
    assert re.search(rf"^resnet50 64 b2 +0{PAIRED_ROW}", out, re.M), out


def test_bench_pointwise_smoke(capsys):
    """A row per 1x1 layer shape that goes sample by sample: both ways' ms and the same bits;
    then a row per net, the switch alternating, with those layers' share (numbers never
    asserted)."""
    assert run_script("bench_pointwise.py", "--smoke") == 0
    out = capsys.readouterr().out
    assert re.search(r"^res2b_1 +2x256x28x28 +64x256x1x1 +[\d.]+ +[\d.]+ +[\d.]+x +yes$", out,
                     re.M), out
    assert re.search(r"^resnet50 112 b2 +3 +[\d.]+ +[\d.]+ +[\d.]+x +[1-9][\d.]* +[1-9][\d.]*$",
                     out, re.M), out


def test_bench_winograd_smoke(capsys):
    """A row per 3x3 stride-1 layer shape and pass: each path's ms, the rule's m, its ratio to
    the best other path, the engine's choice and the forward's error; then a row per net,
    Winograd's and none alternating (numbers never asserted)."""
    assert run_script("bench_winograd.py", "--smoke") == 0
    out = capsys.readouterr().out
    for label in ("forward", "backward"):
        assert re.search(rf"^res2a_2 +2x\d+x16x16 +\d+ {label} +[\d.]+ +[\d.]+ +[\d.]+ "
                         r"+[\d.]+ +[24] +[\d.]+x +no +\d\.\de-\d+$", out, re.M), out
    assert re.search(rf"^resnet50 64 b2 +0{PAIRED_ROW}", out, re.M), out


def test_bench_winograd_groups_smoke(capsys):
    """``--groups``: a row per small-plane shape, tile size and pass (a sample a block and groups
    alternating, ms and ratio), then a row per net (the smoke net's few channels take no
    Winograd: its layers' part says so)."""
    assert run_script("bench_winograd.py", "--smoke", "--groups") == 0
    out = capsys.readouterr().out
    for m in (2, 4):
        for label in ("forward", "backward"):
            assert re.search(rf"^res2a_2 +8x\d+x8x8 +\d+ +{m} +2 {label} +[\d.]+ +[\d.]+ "
                             r"+[\d.]+x$", out, re.M), out
    assert re.search(r"^resnet50 32 b8 +[\d.]+ +[\d.]+ +[\d.]+x  none takes Winograd$", out,
                     re.M), out


def test_bench_fullsize_marks_a_peak_that_compiled(tmp_path, monkeypatch):
    """A process that compiled kernels (a cache miss: here a kernel of a module the cache has
    never seen) is counted, and its RSS/plan figure is marked, its verdict says so: its peak holds
    the compiler's memory, a first run's and not a run's."""
    fullsize = runpy.run_path(str(SCRIPTS / "bench_fullsize.py"))
    source = tmp_path / "fresh_kernel.py"
    source.write_text("from numba import njit\n\n\n@njit(cache=True)\ndef twice(x):\n"
                      "    return 2 * x\n")
    monkeypatch.syspath_prepend(str(tmp_path))

    class Referent:
        pass
    dead = weakref.proxy(Referent())    # gc's objects hold such proxies in a long test session
    assert dead is not None
    before = fullsize["kernels_compiled"]()
    import fresh_kernel
    assert fresh_kernel.twice(3) == 6
    assert fullsize["kernels_compiled"]() == before + 1
    row = {"seconds": 1.0, "flops": 1e9, "rss": 3 * 2**20, "baseline": 2**20, "host": 2**21}
    format_row = fullsize["format_row"]
    assert format_row("case", "LMS off", dict(row, compiled=0), None, 1e9, 2).endswith(" 1.00")
    assert format_row("case", "LMS off", dict(row, compiled=4), None, 1e9, 2).endswith(" 1.00*")


def test_bench_fullsize_says_why_pytorch_does_not_run(tmp_path):
    """An interpreter without torch, and one with torch where minilms does not import (the
    PyTorch worker builds its net with minilms' zoo): each named, with what to do."""
    import argparse
    fullsize = runpy.run_path(str(SCRIPTS / "bench_fullsize.py"))
    pick = fullsize["torch_python"]
    fakes = {"no_torch": "No module named 'torch'", "no_numba": "No module named 'numba'"}
    for name, message in fakes.items():
        fake = tmp_path / name
        fake.write_text(f"#!/bin/sh\necho \"ModuleNotFoundError: {message}\" >&2\nexit 1\n")
        fake.chmod(0o755)
        python, why = pick(argparse.Namespace(no_torch=False, torch_python=str(fake)))
        assert python is None
        if name == "no_torch":
            assert why == "--torch-python PATH, or pip install torch"
        else:
            assert str(fake) in why and "numba" in why and "pip install -e ." in why
    assert pick(argparse.Namespace(no_torch=True, torch_python=None)) == (None, "--no-torch")


@pytest.mark.slow       # about 2 minutes in the simulator
@pytest.mark.cuda
def test_bench_cuda_smoke():
    """Its kernel sections under the simulator (tiny GEMM tiles, a few launches), in a process of
    its own: the smoke run shrinks the GEMM's tile constants for the whole process. The training
    section needs a GPU to finish in reasonable time (its figures: docs/benchmarks.md, "CUDA")."""
    import subprocess
    from pathlib import Path
    script = Path(__file__).resolve().parent.parent / "scripts" / "bench_cuda.py"
    result = subprocess.run([sys.executable, str(script), "--smoke", "--no-torch", "--only",
                             "env", "gemm", "launch"], capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    out = result.stdout
    assert re.search(r"^env: gpu .+, numba [\d.]+", out, re.M)
    for variant in ("nn", "nt", "tn", "tt"):     # against numpy: every element right
        match = re.search(rf"^gemm {variant} n=64: [\d.]+ TFLOP/s, rel err ([\d.e+-]+)", out, re.M)
        assert match and float(match.group(1)) < 1e-5, out
    assert len(re.findall(r"^launch: .+: [\d.]+ us$", out, re.M)) == 5, out


def test_bench_updates_smoke(capsys):
    """A row per size (the workers' us, the serial kernel's, their ratio, the same bits: asserted,
    the two compute each element alike), then a row per net, the two rules alternating."""
    assert run_script("bench_updates.py", "--smoke") == 0
    out = capsys.readouterr().out
    for size in (256, 262144):
        assert re.search(rf"^ +{size} +[\d.]+ +[\d.]+ +[\d.]+x  yes$", out, re.M), out
    assert re.search(r"^resnet50 32 b2 +[\d.]+ +[\d.]+ +[\d.]+x  [\d.]+ / [\d.]+, [\d.]+ / [\d.]+$",
                     out, re.M), out


def test_bench_direct_smoke(capsys):
    """A row per shape: forward, weight and input gradient, direct and im2col + GEMM with their
    ratios, and the paths the engine chose; the header names the host's lanes and mask way
    (numbers never asserted)."""
    assert run_script("bench_direct.py", "--smoke") == 0
    out = capsys.readouterr().out
    assert re.search(r"^bench_direct: \d+ threads, (8|16) lanes, (no )?mask registers", out,
                     re.M), out
    cell = r" +[\d.]+ +[\d.]+ +[\d.]+x"
    for label in ("smoke 3x3", "smoke 5x5 s2"):
        assert re.search(rf"^{label}{cell}{cell}{cell}  fwd (direct|gemm), dW (direct|gemm), "
                         rf"dx (direct|lanes|gemm)$", out, re.M), out


def test_bench_siblings_smoke(capsys):
    """A row per group of GoogLeNet's sibling 1x1 convolutions: both ways' ms, their ratio and
    the stacked way's error against the members' (float32 rounding, asserted small: a wrong
    weight or gradient shows), then the sum (times never asserted)."""
    assert run_script("bench_siblings.py", "--smoke") == 0
    out = capsys.readouterr().out
    rows = re.findall(r"^(inc\w+)\+\S+ +2x\d+x\d+x\d+ +[\d+]+ +[\d.]+ +[\d.]+ +[\d.]+x +"
                      r"([\d.e+-]+)$", out, re.M)
    assert [name for name, _ in rows] == [f"inc{block}_1x1" for block in
                                          ("3a", "3b", "4a", "4b", "4c", "4d", "4e", "5a", "5b")]
    assert all(float(error) < 1e-4 for _, error in rows), rows
    assert re.search(r"^googlenet 64 b2: the groups apart [\d.]+ ms, stacked [\d.]+ ms, [\d.]+x; "
                     r"at most -?[\d.]+ ms an iteration saved$", out, re.M), out

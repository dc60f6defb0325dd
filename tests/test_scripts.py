"""Smoke runs of the benchmark scripts at tiny size: they run and report what they promise.
Their numbers are never asserted (no absolute times in CI)."""
import re
import runpy
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"


def run_script(name, *args):
    argv = sys.argv
    sys.argv = [name, *args]
    try:
        with pytest.raises(SystemExit) as finished:
            runpy.run_path(str(SCRIPTS / name), run_name="__main__")
    finally:
        sys.argv = argv
    return finished.value.code


def test_bench_copy_prints_ratios_against_copyto(capsys):
    assert run_script("bench_copy.py", "--sizes", "64KiB", "1MiB", "--repeat", "2") == 0
    out = capsys.readouterr().out
    assert "h2d ratio" in out and "d2h ratio" in out
    assert "worst throughput ratio against numpy.copyto" in out
    assert len([line for line in out.splitlines() if "KiB" in line or "MiB" in line]) >= 2


@pytest.mark.parametrize("switch,named", [("help", "a waiting thread helps"),
                                          ("streaming", "streaming stores"),
                                          ("threads", "copies on the copy threads")])
def test_bench_copy_iteration_alternates_the_switch_and_sets_it_back(capsys, switch, named):
    from minilms.device import cpu_streams, streaming
    assert run_script("bench_copy.py", "--iteration", "resnet18:32:2", "--pairs", "1",
                      "--switch", switch) == 0
    out = capsys.readouterr().out
    assert f"{named}: " in out and "median of the pairs' ratios" in out
    assert streaming.ENABLED and cpu_streams.HELP_WHILE_WAITING
    assert cpu_streams.COPY_THREADS is None


def test_bench_copy_bad_size_exits_2(capsys):
    assert run_script("bench_copy.py", "--sizes", "-1") == 2
    assert "--sizes: expected a size like" in capsys.readouterr().err


def test_bench_copy_overlap_smoke_prints_each_way_and_the_share_saved(capsys):
    assert run_script("bench_copy_overlap.py", "--smoke") == 0
    out = capsys.readouterr().out
    ways = re.findall(r"^  (gemm|gemm, then copy|copy riding, \d+ rows on thread 0) +[\d.]+ ms$",
                      out, re.M)
    assert ways[:2] == ["gemm", "gemm, then copy"] and len(ways) >= 3, out
    assert re.search(r"riding, at its best split, saves (-?[\d.]+|nan) of it$", out, re.M), out


@pytest.mark.parametrize("args,named", [
    (("--copy", "-1"), "--copy: expected a size like"),
    (("--copy", "8"), "--copy: expected at least 64 bytes, found 8 bytes"),
    (("--gemm", "1", "8", "8"), "--gemm: expected M, K and N of at least 2, found [1, 8, 8]"),
    (("--gemm", "8", "8", "8", "--rows", "9"), "--rows: expected rows from 0 to M (8), found [9]"),
    (("--repeat", "0"), "--repeat: expected at least 1, found 0")])
def test_bench_copy_overlap_bad_input_exits_2(capsys, args, named):
    assert run_script("bench_copy_overlap.py", *args) == 2
    assert named in capsys.readouterr().err


def test_bench_kernels_prints_ratios_against_torch(capsys):
    pytest.importorskip("torch", reason="PyTorch not installed: it is bench_kernels' baseline")
    assert run_script("bench_kernels.py", "--only", "gemm", "bn", "conv", "--repeat", "1",
                      "--rounds", "2", "--settle", "0", "--warmup", "0") == 0
    out = capsys.readouterr().out
    assert "ratio = torch time / minilms time" in out and "each of 2 alternating rounds" in out
    rows = [line for line in out.splitlines() if line.startswith(("gemm ", "bn ", "conv "))]
    assert len(rows) == 20 and all(float(row.split()[-1].split()[0]) > 0 for row in rows
                                  if "<" not in row)
    assert "cases meet their goal" in out


def test_bench_lms_smoke(capsys):
    assert run_script("bench_lms.py", "--smoke") == 0
    out = capsys.readouterr().out
    for variation in ("Off", "Default", "Tuned", "Auto", "prefetch 2"):
        assert variation in out
    assert out.count("x ") >= 20            # a ratio against Off on every row
    assert "goal: with prefetch, LMS on a model that fits" in out
    assert "goal: under the cap with link pcie3" in out


def test_bench_capacity_smoke(capsys, tmp_path):
    assert run_script("bench_capacity.py", "--smoke", "--png", str(tmp_path / "c.png")) == 0
    out = capsys.readouterr().out
    assert "LMS off needs" in out and "LMS least pool" in out and "GoogLeNet" in out
    assert "Off      out of memory: out of device memory at step" in out   # scenario B, LMS off
    assert out.count("Default  trains") == 2 and (tmp_path / "c.png").stat().st_size > 10_000
    assert "split floor" in out and re.search(r"split pool .*: +[1-9]\d* steps split", out)


def test_bench_recompute_smoke(capsys, tmp_path):
    """The three sections at toy size: swap only against swap + recompute, predicted and
    measured (weights bit for bit), and the checkpointing curve with its picture."""
    assert run_script("bench_recompute.py", "--smoke", "--images", str(tmp_path)) == 0
    out = capsys.readouterr().out
    assert "== predicted for a GPU" in out and "== measured on the cpu device" in out
    assert re.search(r"resnet18: \d+% fewer bytes moved, step [\d.]+x faster .* \(predicted\)",
                     out)
    assert "bit for bit" in out and "DIFFER" not in out
    assert re.search(r"N=\s+9 \(19 candidate blobs\): keep everything", out)
    assert "goal: O(sqrt(N)) activation memory" in out
    assert (tmp_path / "recompute_curve.png").stat().st_size > 10_000


@pytest.mark.cuda
def test_launch_count_smoke(capsys):
    """Before and after at two batch sizes: before grows with the batch, after does not."""
    assert run_script("launch_count.py", "--smoke") == 0
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines() if line.startswith("resnet18/16")]
    assert len(rows) == 2 and "syncs:" in out
    (before_2, after_2), (before_4, after_4) = [(int(r[4]), int(r[5])) for r in rows]
    assert before_4 > before_2 > after_2 == after_4


def test_bench_lms_cost_takes_lms_on_apart(capsys):
    assert run_script("bench_lms_cost.py", "--smoke") == 0
    out = capsys.readouterr().out
    moved = re.search(r"moved an iteration: ([\d.]+ \w+) in, ([\d.]+ \w+) out", out)
    assert moved and "actions an iteration:" in out
    assert re.search(r"LMS on\s+iteration\s+[\d.]+ ms\s+steps\s+[\d.]+ ms\s+copies", out)
    assert "LMS on over LMS off:" in out
    from minilms.device import cpu_streams, streaming
    assert cpu_streams.COPY_THREADS is None and streaming.copy.__module__ == streaming.__name__


def test_bench_lms_cost_bad_pairs_exits_2(capsys):
    assert run_script("bench_lms_cost.py", "--pairs", "0") == 2
    assert "--pool-fraction and --pairs: expected at least 1" in capsys.readouterr().err


@pytest.mark.parametrize("script,flag", [("bench_fullsize.py", "--cases"),
                                         ("bench_lms_cost.py", "--case"),
                                         ("bench_copy.py", "--iteration"),
                                         ("bench_windows.py", "--models")])
def test_a_bad_case_exits_2_naming_the_flag(capsys, script, flag):
    assert run_script(script, flag, "resnet50:224") == 2
    assert capsys.readouterr().err.strip() == (f"{script[:-3]}: {flag}: expected "
                                               "model:size:batch, found 'resnet50:224'")


def test_bench_pages_smoke(capsys):
    assert run_script("bench_pages.py", "--smoke") == 0
    out = capsys.readouterr().out
    assert re.search(r"this machine's host reclaims huge pages: (yes|no)", out)
    assert re.search(r"^numpy +[\d.]+ +[\d.]+ +1\.00x$", out, re.M), out
    assert re.search(r"^small pages +[\d.]+ +[\d.]+ +[\d.]+x$", out, re.M), out
    assert run_script("bench_pages.py", "--rounds", "0") == 2

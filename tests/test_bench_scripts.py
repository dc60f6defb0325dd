"""Smoke runs of bench_vs_torch, bench_startup and bench_mpi at tiny size: they run and print
what they promise (tables, ratios, goal lines). Their numbers are never asserted (no absolute
times in CI)."""
import re
import runpy
import sys

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


def test_bench_startup_smoke(capsys):
    assert run_script("bench_startup.py", "--smoke") == 0
    out = capsys.readouterr().out
    assert re.search(r"cold t\(1\) s +warm t\(1\) s +warm t\(2\) s +one step s +import only s", out)
    assert re.search(r"^best +[\d.]+ +[\d.]+ +- +- +-$", out, re.M)
    assert "compiled in every process, warm or not, on first call (cache=False)" in out
    assert re.search(r"goal: time to the first step under 5 s warm: [\d.]+ s \((met|not met)\)",
                     out)


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

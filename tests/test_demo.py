"""The memory-core demo: activations bigger than the pool pass through it and come back intact."""
import subprocess
import sys

from minilms.demo import main


def test_demo_swaps_and_reads_back_exactly(capsys):
    assert main(["--memory", "64KiB", "--layers", "6", "--activation", "16KiB"]) == 0
    out = capsys.readouterr().out
    assert "equals the host-only computation: yes" in out
    moved_line = next(line for line in out.splitlines() if line.startswith("moved"))
    assert "moved 0 B in" not in moved_line and "0 B out" not in moved_line  # it really swapped
    assert "peak pool use 64.00 KiB of 64.00 KiB" in out


def test_demo_out_of_memory_names_the_step_and_what_to_change():
    run = subprocess.run([sys.executable, "-m", "minilms.demo", "--memory", "20KiB",
                          "--activation", "16KiB"], capture_output=True, text=True)
    assert run.returncode == 2
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in run.stderr
    assert "step 'forward 1' needs 32.00 KiB" in lines[0] and "give --memory at least" in lines[0]


def test_demo_bad_size_is_one_line_and_exit_2():
    run = subprocess.run([sys.executable, "-m", "minilms.demo", "--memory", "3 parsecs"],
                         capture_output=True, text=True)
    assert run.returncode == 2
    assert run.stderr.strip() == ("minilms.demo: device.memory: expected a size like '512MiB' or "
                                  "'2GiB', or 'auto', found '3 parsecs'")

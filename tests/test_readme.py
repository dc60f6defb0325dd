"""The README stays true: its Python example runs, and its commands name files that exist."""
import re
from pathlib import Path

README = (Path(__file__).resolve().parent.parent / "README.md").read_text()


def test_the_python_example_runs(capsys):
    (code,) = re.findall(r"```python\n(.*?)```", README, re.S)
    exec(compile(code, "README.md", "exec"), {})
    policy, losses = capsys.readouterr().out.splitlines()[-2:]
    assert "prefetch 2" in policy
    values = [float(v) for v in losses.strip("[]").split(",")]
    assert len(values) == 5 and values[-1] < values[0]


def test_the_commands_name_real_files():
    root = Path(__file__).resolve().parent.parent
    for config in set(re.findall(r"(configs/\w+\.yaml)", README)):
        assert (root / config).exists(), config
    assert "python -m pip install -e . && python -m minilms.train configs/quickstart.yaml" in README
    ci = (root / ".ci" / "run").read_text()
    assert 'python -m pip install -e ".[test]" && python -m pytest' in README
    assert 'python -m pip install -e ".[test]" && python -m pytest' in ci

"""The teaching notebooks (notebooks/*.ipynb): each runs top to bottom, headless, without a cell
error and within two minutes; each is stored without outputs, so the repository holds only what
people wrote and a diff shows only that."""
import os
import time
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat", reason="nbformat not installed (the test extra)")
nbclient = pytest.importorskip("nbclient", reason="nbclient not installed (the test extra)")
pytest.importorskip("ipykernel", reason="ipykernel not installed (the test extra)")

NOTEBOOKS_DIR = Path(__file__).resolve().parent.parent / "notebooks"
NOTEBOOKS = sorted(NOTEBOOKS_DIR.glob("*.ipynb"))
BUDGET_SECONDS = 120      # the whole notebook, not each cell


def test_there_are_notebooks():
    assert len(NOTEBOOKS) >= 4, f"expected the teaching notebooks in {NOTEBOOKS_DIR}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_stored_without_outputs(path):
    notebook = nbformat.read(path, as_version=4)
    nbformat.validate(notebook)
    dirty = [i for i, cell in enumerate(notebook.cells) if cell.cell_type == "code"
             and (cell.get("outputs") or cell.get("execution_count") is not None)]
    assert not dirty, (f"{path.name}: cells {dirty} hold outputs or execution counts; strip them "
                       "before committing (see notebooks/README.md)")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_runs_top_to_bottom(path):
    """Executed as a reader would run it, in a fresh ``python3`` kernel started in notebooks/.
    The kernel does not inherit the test session's simulator switch (``NUMBA_ENABLE_CUDASIM``,
    set by conftest.py): a notebook that needs it sets it itself, as a laptop user would."""
    notebook = nbformat.read(path, as_version=4)
    deadline = time.monotonic() + BUDGET_SECONDS
    client = nbclient.NotebookClient(
        notebook, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOKS_DIR)}},
        # Each cell gets what is left of the notebook's budget.
        timeout_func=lambda cell: max(1, int(deadline - time.monotonic())))
    environment = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    began = time.monotonic()
    try:
        client.execute(env=environment)
    except nbclient.exceptions.CellTimeoutError:
        pytest.fail(f"{path.name} ran past {BUDGET_SECONDS} s: shrink it")
    except nbclient.exceptions.CellExecutionError as error:
        pytest.fail(f"{path.name}: a cell raised:\n{error}")
    elapsed = time.monotonic() - began
    errors = [output for cell in notebook.cells if cell.cell_type == "code"
              for output in cell.get("outputs", []) if output.output_type == "error"]
    assert not errors, f"{path.name}: {errors[0]['ename']}: {errors[0]['evalue']}"
    assert elapsed < BUDGET_SECONDS, f"{path.name} took {elapsed:.0f} s: shrink it"

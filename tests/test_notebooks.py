"""Every notebook in notebooks/ runs without error, within a minute, and is committed
with its outputs cleared."""

import time
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

FOLDER = Path(__file__).resolve().parents[1] / "notebooks"
NOTEBOOKS = sorted(FOLDER.glob("*.ipynb"))
LIMIT_S = 60


def test_there_are_notebooks():
    assert NOTEBOOKS, f"no notebooks in {FOLDER}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda path: path.name)
def test_notebook_is_committed_without_outputs(path):
    notebook = nbformat.read(path, as_version=4)
    nbformat.validate(notebook)
    for cell in notebook.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, (
                f"{path.name}: clear the outputs before committing (see notebooks/README.md)"
            )
    assert notebook.cells[0].cell_type == "markdown"
    assert "Question" in notebook.cells[0].source


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda path: path.name)
def test_notebook_runs_within_a_minute(path):
    notebook = nbformat.read(path, as_version=4)
    client = NotebookClient(
        notebook,
        timeout=2 * LIMIT_S,  # per cell; the whole run is checked against LIMIT_S below
        kernel_name="python3",
        resources={"metadata": {"path": str(FOLDER)}},
    )
    start = time.perf_counter()
    client.execute()  # raises CellExecutionError, with the traceback, on any error
    elapsed = time.perf_counter() - start
    assert elapsed < LIMIT_S, f"{path.name} took {elapsed:.0f} s; keep notebooks under a minute"
    images = sum(
        "image/png" in output.get("data", {})
        for cell in notebook.cells
        if cell.cell_type == "code"
        for output in cell.outputs
    )
    assert images >= 1, f"{path.name} shows no plot"

"""Every ``examples/*.ipynb`` runs top to bottom on CPU (nbclient), and is stored without outputs.

The notebooks are written for Colab/Kaggle TPU runtimes, but nothing in them needs a TPU: here
they run in a fresh IPython kernel on this interpreter, with ``MPLBACKEND=Agg``. A failure names
the notebook, the cell (its number and id) and the error.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import sys

import pytest

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples"
NOTEBOOKS = sorted(EXAMPLES.glob("*.ipynb"))
CELL_TIMEOUT_S = 300  # per cell; each takes well under 20 s on a 2-core CPU


def _ids(path: pathlib.Path) -> str:
    return path.name


def test_examples_exist():
    assert {p.name for p in NOTEBOOKS} >= {"quickstart.ipynb", "checking_numerics.ipynb"}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids)
def test_stored_without_outputs(path):
    """Outputs make diffs large and go stale: clear them before committing (Jupyter: Edit ->
    Clear All Outputs; or ``python scripts/clear_notebooks.py``)."""
    nb = json.loads(path.read_text())
    dirty = [
        f"cell {i} ({cell.get('id', '?')})"
        for i, cell in enumerate(nb["cells"])
        if cell["cell_type"] == "code" and (cell.get("outputs") or cell.get("execution_count"))
    ]
    assert not dirty, f"{path.name}: stored with outputs in {', '.join(dirty)}; clear them"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids)
def test_runs_top_to_bottom(path, tmp_path, monkeypatch):
    nbclient = pytest.importorskip("nbclient")
    nbformat = pytest.importorskip("nbformat")
    pytest.importorskip("ipykernel")

    # A kernelspec for this interpreter: the installed "python3" one runs whatever `python` is
    # on PATH, which need not be the interpreter tpu-inductor is installed in.
    spec = tmp_path / "jupyter" / "kernels" / "tpu-inductor-test"
    spec.mkdir(parents=True)
    argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    (spec / "kernel.json").write_text(
        json.dumps({"argv": argv, "display_name": "tpu-inductor test", "language": "python"})
    )
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    # the kernel imports this checkout's package, whatever an editable install points at
    paths = [str(EXAMPLES.parent), *filter(None, [os.environ.get("PYTHONPATH")])]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(paths))
    monkeypatch.setenv("MPLBACKEND", "Agg")
    monkeypatch.setenv("PYDEVD_DISABLE_FILE_VALIDATION", "1")  # debugpy's frozen-modules notice

    nb = nbformat.read(path, as_version=4)
    current: dict = {}

    def on_cell_start(cell, cell_index, **_):
        current.update(cell=cell, index=cell_index)

    client = nbclient.NotebookClient(
        nb,
        timeout=CELL_TIMEOUT_S,
        kernel_name="tpu-inductor-test",
        resources={"metadata": {"path": str(EXAMPLES)}},
        on_cell_start=on_cell_start,
    )
    try:
        client.execute()
        failure = None
    except Exception as e:
        if "cell" not in current:
            raise
        failure = _describe(path, current["index"], current["cell"], e)
    if failure is not None:  # outside the except block: no chained nbclient traceback
        pytest.fail(failure, pytrace=False)


def _describe(path: pathlib.Path, index: int, cell, error: Exception) -> str:
    """Which cell failed, its first lines, and the error with the kernel's traceback."""
    outputs = [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]
    if isinstance(error, TimeoutError):  # nbclient's CellTimeoutError
        what, trace = f"no result within {CELL_TIMEOUT_S} s (the per-cell timeout)", ""
    elif outputs:
        what = f"{outputs[0]['ename']}: {outputs[0]['evalue']}"
        trace = re.sub(r"\x1b\[[0-9;]*m", "", "\n".join(outputs[0].get("traceback", [])))
    else:  # e.g. the kernel died
        what, trace = f"{type(error).__name__}: {error}", ""
    source = "\n".join("    " + line for line in cell.source.splitlines()[:12])
    return (
        f"{path.name}: cell {index} (id {cell.get('id', '?')!r}) failed: {what}\n"
        f"{source}\n{trace[-4000:]}"
    )

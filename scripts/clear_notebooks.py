"""Clear the outputs of examples/*.ipynb in place (what tests/examples/test_notebooks.py asks before
a commit), with nbformat, which the test extra installs: ``python scripts/clear_notebooks.py``.
(``jupyter nbconvert --clear-output`` does the same where nbconvert is installed.)"""

from __future__ import annotations

import pathlib
import sys

import nbformat

EXAMPLES = pathlib.Path(__file__).resolve().parent.parent / "examples"


def clear(path: pathlib.Path) -> bool:
    """Clear one notebook's outputs and execution counts; returns whether it changed."""
    nb = nbformat.read(path, as_version=4)
    changed = False
    for cell in nb.cells:
        if cell.cell_type == "code" and (cell.get("outputs") or cell.get("execution_count")):
            cell.outputs, cell.execution_count, changed = [], None, True
    if changed:
        nbformat.write(nb, path)
    return changed


def main(argv: list[str]) -> int:
    paths = [pathlib.Path(p) for p in argv] or sorted(EXAMPLES.glob("*.ipynb"))
    for path in paths:
        if clear(path):
            print(f"cleared {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

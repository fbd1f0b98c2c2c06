"""Where benchmarks write: ``benchmarks/results/local/`` unless told ``--results DIR``.

``benchmarks/results/`` holds the committed figures the docs show; a run that a doc tells you to
try writes to the git-ignored ``local/`` folder beside them, so trying it never rewrites a
tracked file. ``--results benchmarks/results`` updates the committed figures (then
``python -m benchmarks.docs`` rewrites the docs' generated blocks from them).
"""

from __future__ import annotations

import argparse
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"  # the committed figures
LOCAL = RESULTS / "local"  # the default: git-ignored


def add_results_option(
    parser: argparse.ArgumentParser, *aliases: str, dest: str = "results"
) -> None:
    """``--results DIR`` (default ``benchmarks/results/local``) on ``parser``; ``aliases`` are
    older spellings of the flag a benchmark still accepts (``--out-dir``)."""
    parser.add_argument(
        "--results",
        *aliases,
        dest=dest,
        type=Path,
        default=LOCAL,
        help="folder for the results (default benchmarks/results/local, git-ignored; "
        "benchmarks/results holds the committed figures the docs show)",
    )

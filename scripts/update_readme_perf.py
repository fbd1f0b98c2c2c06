"""Rewrite README.md's performance block from a benchmark results file.

The block between ``<!-- perf:start -->`` and ``<!-- perf:end -->`` holds the tables, the plot
and the machine of one ``python -m benchmarks.run`` result, so README numbers always come from
the suite, never by hand. ``python -m benchmarks.run --readme`` does the same at the end of a run.

Usage::

    python scripts/update_readme_perf.py                        # newest benchmarks/results/*.json
    python scripts/update_readme_perf.py benchmarks/results/cpu-quick.json
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.report import write_readme  # noqa: E402


def newest_result(folder: Path = ROOT / "benchmarks" / "results") -> Path:
    """The most recently written results JSON in ``folder``."""
    found = sorted(
        (p for p in folder.glob("*.json") if _is_run_result(p)),
        key=lambda p: p.stat().st_mtime,
    )
    if not found:
        raise SystemExit(f"no results in {folder}: run python -m benchmarks.run --quick first")
    return found[-1]


def _is_run_result(path: Path) -> bool:
    """Whether ``path`` is a ``benchmarks.run`` result (not transfers, sharding, dynamic or the
    TPU-program benchmarks' files, which other scripts render)."""
    import json

    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and ("percall" in data or "models" in data)


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("results", nargs="?", type=Path, help="a results JSON (default: the newest)")
    p.add_argument("--readme", type=Path, default=ROOT / "README.md")
    args = p.parse_args(argv)
    path = args.results or newest_result()
    write_readme(path, args.readme)
    print(f"updated {args.readme} from {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

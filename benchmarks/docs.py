"""Rewrite docs/performance.md's generated blocks from the committed results:
``python -m benchmarks.docs``.

Each block sits between ``<!-- NAME:start -->`` and ``<!-- NAME:end -->`` and names the command
and date of the run it shows; tests/test_docs.py fails when a block differs from what
:func:`blocks` renders, so the page's figures are never typed by hand. A benchmark run writes
to ``benchmarks/results/local/``; ``--results benchmarks/results`` replaces the committed files
this reads.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from benchmarks import paths

PAGE = paths.ROOT / "docs" / "performance.md"


def _rel(path: Path, base: Path) -> str:
    """``path`` relative to ``base`` (the page's folder), so links and plots render on GitHub."""
    return Path(os.path.relpath(path.resolve(), base.resolve())).as_posix()


def perf_block(results_dir: Path = paths.RESULTS, page: Path = PAGE) -> str:
    """The CPU block: ``benchmarks.run``'s ``cpu-quick.json`` and ``transfers.json``."""
    from benchmarks import report

    json_path = results_dir / "cpu-quick.json"
    results = json.loads(json_path.read_text())
    png = json_path.with_name(results["plot"]) if results.get("plot") else None
    moved = results_dir / "transfers.json"
    transfers = json.loads(moved.read_text()) if moved.exists() else None
    base = page.parent
    return report.readme_block(
        results,
        _rel(json_path, base),
        _rel(png, base) if png and png.exists() else None,
        transfers,
    )


def tpu_block(name: str, results_dir: Path = paths.RESULTS, page: Path = PAGE) -> str:
    """The block of ``benchmarks.tpu_programs``'s ``NAME.json`` (with ``tpu-levers.json``'s
    table in the ``tpu-programs`` block)."""
    from benchmarks import tpu_programs

    json_path = results_dir / f"{name}.json"
    data = json.loads(json_path.read_text())
    markers = (f"<!-- {name}:start -->", f"<!-- {name}:end -->")
    levers_path = results_dir / "tpu-levers.json"
    levers = None
    if name == "tpu-programs" and levers_path.exists():
        levers = json.loads(levers_path.read_text())
    png = json_path.with_suffix(".png")
    base = page.parent
    rel_png = _rel(png, base) if png.exists() else None
    return tpu_programs.readme_block(data, levers, _rel(json_path, base), rel_png, markers)


def blocks(results_dir: Path = paths.RESULTS, page: Path = PAGE) -> list[str]:
    """Every generated block of the page, in page order."""
    return [
        perf_block(results_dir, page),
        tpu_block("tpu-programs", results_dir, page),
        tpu_block("tpu-programs-small", results_dir, page),
    ]


def replace_block(text: str, block: str) -> str:
    """``text`` with the block named by ``block``'s first line replaced by ``block``.

    Raises:
        ValueError: the page has no such block (add its two marker lines first).
    """
    start = block.split("\n", 1)[0]
    end = start.replace(":start -->", ":end -->")
    if start not in text or end not in text:
        raise ValueError(f"no {start} ... {end} block in the page: add the two marker lines")
    head, rest = text.split(start, 1)
    _, tail = rest.split(end, 1)
    return head + block + tail


def write(results_dir: Path = paths.RESULTS, page: Path = PAGE) -> None:
    """Rewrite every generated block of ``page`` from the results in ``results_dir``."""
    text = page.read_text()
    for block in blocks(results_dir, page):
        text = replace_block(text, block)
    page.write_text(text)


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--results", type=Path, default=paths.RESULTS, help="the results to show")
    p.add_argument("--page", type=Path, default=PAGE)
    args = p.parse_args(argv)
    write(args.results, args.page)
    print(f"updated {args.page} from {args.results}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

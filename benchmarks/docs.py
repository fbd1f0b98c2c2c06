"""Rewrite the docs' generated blocks (docs/performance.md, docs/training.md's bytes per step)
from the committed results: ``python -m benchmarks.docs``.

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
TRAINING = paths.ROOT / "docs" / "training.md"
# The training loop's variants (benchmarks.training_loop.VARIANTS), as docs/training.md names them.
LOOP_VARIANTS = {
    "loop": "`loop`: the loop above in float32, no checkpointing, one micro-batch",
    "loop-eager-clip": "`loop`, `clip_grad_norm_` eager between the compiled calls",
    "loop-no-keep": "`loop` without `keep_on_device`",
    "loop-accumulate-2": "`loop`, two micro-batches per step",
    "loop-checkpointing": "`loop` + `gradient_checkpointing_enable()`",
    "loop-bf16": "`loop` + bf16 autocast",
}


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


def training_loop_block(results_dir: Path = paths.RESULTS) -> str:
    """docs/training.md's bytes per step of the training loop's variants, from
    ``benchmarks.training_loop``'s results (the bytes are exact; its times are left out)."""
    from benchmarks.training_loop import _fmt

    record = json.loads((results_dir / "training_loop.json").read_text())
    lines = [
        "<!-- training-loop:start -->",
        f"`{record['command']}`, {record['date']} (written by `python -m benchmarks.docs`):",
        "",
        "| variant | host->device | device->host | saved activations |",
        "| --- | --- | --- | --- |",
    ]
    for r in record["results"]:
        name = LOOP_VARIANTS.get(r["workload"], f"`{r['workload']}`")
        lines.append(
            f"| {name} | {_fmt(r['h2d_per_step'])} | {_fmt(r['d2h_per_step'])} | "
            f"{_fmt(r['saved_activation_bytes'])} |"
        )
    lines.append("<!-- training-loop:end -->")
    return "\n".join(lines)


def blocks(results_dir: Path = paths.RESULTS, page: Path = PAGE) -> list[str]:
    """Every generated block of docs/performance.md, in page order."""
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
    """Rewrite every generated block of ``page`` and of docs/training.md from the results in
    ``results_dir``."""
    text = page.read_text()
    for block in blocks(results_dir, page):
        text = replace_block(text, block)
    page.write_text(text)
    TRAINING.write_text(replace_block(TRAINING.read_text(), training_loop_block(results_dir)))


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

"""Rewrite the docs' generated blocks (docs/performance.md, docs/training.md's bytes per step)
from the committed results: ``python -m benchmarks.docs``.

Each block sits between ``<!-- NAME:start -->`` and ``<!-- NAME:end -->`` and names the command
and date of the run it shows; tests/docs/test_docs.py fails when a block differs from what
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
PLANNING = paths.ROOT / "docs" / "planning.md"
# What the issue cites of vLLM-TPU and the best TPU decode kernel (no row of ours is the same
# run): the fraction of the HBM limit each reached, by model and slice.
PUBLISHED_DECODE = {
    "llama-3.1-70b-v6e-8": (
        0.5,
        64,
        "vLLM-TPU, Llama-3.3-70B on v6e-8 at concurrency 64: about half the HBM limit",
    ),
}
KERNEL_FRACTION = (0.86, "Ragged Paged Attention, Llama-3-8B on TPU7x: 86% of HBM bandwidth")
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


def decode_cpu_block(results_dir: Path = paths.RESULTS) -> str:
    """docs/performance.md's decode block: ``benchmarks.decode``'s table (ms/token of eager,
    ours and hand-written JAX, one run)."""
    from benchmarks.decode import table

    record = json.loads((results_dir / "decode.json").read_text())
    return f"<!-- decode:start -->\n{table(record)}<!-- decode:end -->"


def _tps(x: float) -> str:
    return f"{x:,.0f}"


def decode_minimum_block(results_dir: Path = paths.RESULTS) -> str:
    """docs/planning.md's decode table: HBM traffic against the minimum per row."""
    record = json.loads((results_dir / "serving.json").read_text())["decode"]
    lines = [
        "<!-- decode-minimum:start -->",
        f"`{record['command']}` (written by `python -m benchmarks.docs`):",
        "",
        "| target | batch | context | HBM traffic | minimum | x minimum | tokens/s/chip: HBM "
        "limit | roofline | predicted |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in record["rows"]:
        rates = r["rates"]
        lines.append(
            f"| {r['target']} | {r['batch']} | {r['context']:,} | "
            f"{r['hbm_traffic'] / 2**20:,.1f} MiB | {r['minimum'] / 2**20:,.1f} MiB | "
            f"{r['x_minimum']:.3f} | {_tps(rates['limit'])} | {_tps(rates['roofline'])} | "
            f"{_tps(rates['predicted'])} |"
        )
    lines.append("<!-- decode-minimum:end -->")
    return "\n".join(lines)


def _limit_at(plan: dict, batch: int) -> float | None:
    """Decode tokens/s per chip at the HBM limit for ``batch``, from the line through the
    plan's probes (the minimum grows linearly with the batch)."""
    points = []
    for p in plan["probes"]:
        if p["rates"].get("limit"):
            chips = plan["data"] * plan["model"]
            # limit = batch / (minimum / bandwidth) / chips: the minimum in bandwidth-seconds
            points.append((p["size"], p["size"] / p["rates"]["limit"] / chips))
    if len(points) < 2:
        return None
    (b1, t1), (b2, t2) = sorted(points)[:1] + sorted(points)[-1:]
    seconds = t1 + (t2 - t1) * (batch - b1) / (b2 - b1)
    return batch / seconds / (plan["data"] * plan["model"])


def serving_block(results_dir: Path = paths.RESULTS) -> str:
    """docs/planning.md's serving table: ``benchmarks.serving``'s plans, beside what was
    published of vLLM-TPU and the best TPU decode kernel."""
    record = json.loads((results_dir / "serving.json").read_text())
    lines = [
        "<!-- serving:start -->",
        "| model, target | plan | batch | KV cache / chip | step peak / chip | x minimum | "
        "decode tok/s/chip: HBM limit | roofline | predicted | prefill tok/s/chip: compute | "
        "predicted | published, as a share of our HBM limit | compile here |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|",
    ]
    for row_id, row in record["rows"].items():
        for plan in row["plans"]:
            name = "one chip" if plan["data"] == plan["model"] == 1 else plan["plan"]
            if plan["batch"] is None:
                lines.append(f"| {row_id} | {name} | none | {plan['note']} |||||||||")
                continue
            d, p = plan["decode"], plan["prefill"]
            published = f"kernel: {KERNEL_FRACTION[1]} = {_tps(KERNEL_FRACTION[0] * d['limit'])}"
            if row_id in PUBLISHED_DECODE:
                share, batch, text = PUBLISHED_DECODE[row_id]
                at = _limit_at(plan, batch)
                if at is not None:
                    line = "the line through our probes"
                    if batch > plan["batch"]:
                        line += f"; batch {batch} does not fit at this context"
                    published = (
                        f"{text}: about {_tps(share * at)} of our {_tps(at)} at batch {batch} "
                        f"({line})"
                    )
            lines.append(
                f"| {row_id} | {name} | {plan['batch']} | {plan['kv_bytes'] / 2**30:.2f} GiB | "
                f"{plan['peak_bytes'] / 2**30:.2f} GiB | {plan['x_minimum']:.2f} | "
                f"{_tps(d['limit'])} | {_tps(d['roofline'])} | {_tps(d['predicted'])} | "
                f"{_tps(p.get('compute', 0))} | {_tps(p.get('predicted', 0))} | {published} | "
                f"{sum(q['seconds'] for q in plan['probes']) + plan['prefill_seconds']:.0f} s |"
            )
    lines.append("<!-- serving:end -->")
    return "\n".join(lines)


def blocks(results_dir: Path = paths.RESULTS, page: Path = PAGE) -> list[str]:
    """Every generated block of docs/performance.md, in page order."""
    out = [
        perf_block(results_dir, page),
        tpu_block("tpu-programs", results_dir, page),
        tpu_block("tpu-programs-small", results_dir, page),
    ]
    if (results_dir / "decode.json").exists():
        out.append(decode_cpu_block(results_dir))
    return out


def planning_blocks(results_dir: Path = paths.RESULTS) -> list[str]:
    """docs/planning.md's decode and serving blocks (where their results exist)."""
    path = results_dir / "serving.json"
    record = json.loads(path.read_text()) if path.exists() else {}
    out = []
    if "decode" in record:
        out.append(decode_minimum_block(results_dir))
    if record.get("rows"):
        out.append(serving_block(results_dir))
    return out


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
    planning = PLANNING.read_text()
    for block in planning_blocks(results_dir):
        planning = replace_block(planning, block)
    PLANNING.write_text(planning)


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

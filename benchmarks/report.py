"""Turn a results JSON of ``python -m benchmarks.run`` into tables, a plot and the block of
docs/performance.md.

Every ratio is ``ours / theirs`` of a time (or of a memory peak): below 1 ours is faster
(smaller), above 1 ours is slower (larger).
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

START, END = "<!-- perf:start -->", "<!-- perf:end -->"

# Dense bf16 peak FLOP/s of one JAX device, by device_kind substring (first match wins; more
# specific names first). TPU v2/v3 expose each core as a device; v4 and later, each chip.
PEAK_FLOPS = (
    ("TPU v6 lite", 918e12),
    ("TPU v6", 918e12),
    ("TPU v5 lite", 197e12),
    ("TPU v5e", 197e12),
    ("TPU v5p", 459e12),
    ("TPU v5", 459e12),
    ("TPU v4", 275e12),
    ("TPU v3", 61.5e12),
    ("TPU v2", 22.5e12),
    ("H200", 989e12),
    ("H100", 989e12),
    ("A100", 312e12),
    ("L4", 121e12),
    ("A10", 125e12),
    ("V100", 125e12),
    ("T4", 65e12),
)


def peak_flops(device_kind: str) -> float | None:
    """The assumed dense bf16 peak FLOP/s of one device of this kind, or ``None`` if unknown."""
    for name, peak in PEAK_FLOPS:
        if name.lower() in device_kind.lower():
            return peak
    return None


def _ok(x: Any) -> bool:
    return isinstance(x, int | float) and math.isfinite(x)


def _num(x: Any, fmt: str = "{:.1f}") -> str:
    return fmt.format(x) if _ok(x) else "-"


def _ratio(a: Any, b: Any) -> float | None:
    return a / b if _ok(a) and _ok(b) and b > 0 else None


def _err(entry: Any) -> str | None:
    if isinstance(entry, dict) and "skipped" in entry:
        return f"skipped ({entry['skipped']})"
    if isinstance(entry, dict) and "error" in entry:
        return entry["error"].splitlines()[-1][:60] if entry["error"] else "error"
    return None


def _agree(check: dict | None, ref: dict | None, rtol: float = 1e-3) -> str:
    """``"yes"`` when two checksums agree to ``rtol`` (relative to the reference abs-sum)."""
    if not check or not ref or check.get("shape") != ref.get("shape"):
        return "-" if not check or not ref else "NO (shape)"
    scale = max(abs(ref["abs_sum"]), 1e-12)
    same = (
        abs(check["sum"] - ref["sum"]) <= rtol * scale
        and abs(check["abs_sum"] - ref["abs_sum"]) <= rtol * scale
    )
    return "yes" if same else "NO"


def derive(results: dict[str, Any]) -> dict[str, Any]:
    """Add the ratios (and MFU where it applies) to ``results`` in place; returns it."""
    pc = results.get("percall", {})
    per_size: dict[str, dict[str, Any]] = {}
    for contender, rows in pc.items():
        if isinstance(rows, list):
            for row in rows:
                per_size.setdefault(row["size"], {})[contender] = row
    ratios = {}
    for size, by in per_size.items():
        ours = by.get("tpu", {}).get("us")
        ratios[size] = {
            f"tpu/{c}": _ratio(ours, by.get(c, {}).get("us"))
            for c in ("jax", "eager", "inductor", "torchax")
        }
        paired = by.get("tpu", {}).get("paired")
        if paired:
            # Both sides in one process, interleaved: steadier than the two processes' times.
            ratios[size]["tpu/jax separate processes"] = ratios[size]["tpu/jax"]
            ratios[size]["tpu/jax"] = paired["tpu/dlpack"]
            ratios[size]["tpu/jax-numpy"] = paired["tpu/numpy"]
    results.setdefault("derived", {})["percall"] = ratios

    models = {}
    for key, by in results.get("models", {}).items():
        ours = by.get("tpu", {})
        eager = by.get("eager", {})
        models[key] = {
            "tpu/eager": _ratio(ours.get("ms"), eager.get("ms")),
            "tpu/inductor": _ratio(ours.get("ms"), by.get("inductor", {}).get("ms")),
            "tpu/torchax": _ratio(ours.get("ms"), by.get("torchax", {}).get("ms")),
            "rss tpu/eager": _ratio(ours.get("peak_rss_mib"), eager.get("peak_rss_mib")),
            "agrees with eager": _agree(ours.get("check"), eager.get("check")),
        }
    results["derived"]["models"] = models

    comp = {}
    for item, by in results.get("compile", {}).items():
        cold, warm = by.get("cold", {}), by.get("warm", {})
        comp[item] = {
            "cold/warm": _ratio(cold.get("first_result_s"), warm.get("first_result_s")),
        }
    results["derived"]["compile"] = comp

    machine = results.get("machine", {})
    llama = results.get("models", {}).get("llama/train", {}).get("tpu", {})
    if machine.get("jax_backend", "cpu") != "cpu" and _ok(llama.get("ms")):
        kind = machine.get("jax_device_kind", "")
        peak = peak_flops(kind)
        flops = llama.get("info", {}).get("train_flops")
        results["derived"]["mfu"] = {
            "model": "llama/train",
            "device_kind": kind,
            "peak_flops_assumed": peak,
            "peak_basis": "dense bf16 peak of one device (vendor spec); the step runs float32",
            "step_flops": flops,
            "achieved_flops": flops / (llama["ms"] / 1e3) if flops else None,
            "mfu": flops / (llama["ms"] / 1e3) / peak if flops and peak else None,
        }
    return results


def tables(results: dict[str, Any]) -> str:
    """The results as Markdown tables (what ``benchmarks.run`` prints; performance.md shows)."""
    derive(results)
    out = []
    pc = results.get("percall", {})
    if pc:
        contenders = [c for c in ("tpu", "jax", "eager", "inductor", "torchax") if c in pc]
        sizes = list(results["derived"]["percall"])
        out.append(
            "Per-call time of `Linear(d,4d) -> GELU -> Linear(4d,d)`, inference, µs/call "
            "(median of repeats, each contender in its own process); ratios are ours/theirs "
            "(below 1: ours faster). The two hand-JAX ratios are measured in one process, ours "
            "and hand-written `jax.jit` taking turns (median of per-round ratios): hand-JAX "
            'crosses by DLPack in and out; "numpy I/O" crosses by zero-copy numpy views as '
            "the backend does, so that ratio is everything the backend and Dynamo add.\n"
        )
        head = ["batch x d"] + [_LABEL[c] for c in contenders]
        head += ["ours/hand-JAX", "ours/hand-JAX numpy I/O", "ours/eager", "ours/inductor"]
        out.append(_row(head))
        out.append(_row(["---"] * len(head)))
        for size in sizes:
            cells = [size]
            for c in contenders:
                rows = pc[c]
                if not isinstance(rows, list):
                    cells.append(_err(rows) or "-")
                    continue
                row = next((r for r in rows if r["size"] == size), {})
                cells.append(_num(row.get("us")))
            r = results["derived"]["percall"][size]
            cells += [
                _num(r.get(f"tpu/{c}"), "{:.2f}x")
                for c in ("jax", "jax-numpy", "eager", "inductor")
            ]
            out.append(_row(cells))
        out.extend(_slower_notes(results, "percall"))
        skipped = {c: v for c, v in pc.items() if not isinstance(v, list)}
        for c, v in skipped.items():
            out.append(f"\n{_LABEL.get(c, c)}: {(_err(v) or 'skipped')}")
        out.append("")

    models = results.get("models", {})
    if models:
        out.append(
            "Models: median step time in ms (inference under `no_grad`; a training step is "
            "forward, backward and AdamW), first call in s (compile included), peak RSS in MiB "
            "(each run in its own process).\n"
        )
        head = [
            "model / step",
            "ours ms",
            "eager ms",
            "inductor ms",
            "ours/eager",
            "ours/inductor",
            "ours first s",
            "inductor first s",
            "ours MiB",
            "eager MiB",
            "MiB ours/eager",
            "agrees",
        ]
        out.append(_row(head))
        out.append(_row(["---"] * len(head)))
        for key, by in models.items():
            d = results["derived"]["models"].get(key, {})

            def cell(c, f, fmt="{:.1f}", by=by):
                return _err(by.get(c)) or _num(by.get(c, {}).get(f), fmt)

            out.append(
                _row(
                    [
                        key,
                        cell("tpu", "ms"),
                        cell("eager", "ms"),
                        cell("inductor", "ms"),
                        _num(d.get("tpu/eager"), "{:.2f}x"),
                        _num(d.get("tpu/inductor"), "{:.2f}x"),
                        cell("tpu", "first_call_s"),
                        cell("inductor", "first_call_s"),
                        cell("tpu", "peak_rss_mib", "{:.0f}"),
                        cell("eager", "peak_rss_mib", "{:.0f}"),
                        _num(d.get("rss tpu/eager"), "{:.2f}x"),
                        d.get("agrees with eager", "-"),
                    ]
                )
            )
        out.extend(_slower_notes(results, "models"))
        if any("torchax" in by for by in models.values()):
            tx = {k: by["torchax"] for k, by in models.items() if "torchax" in by}
            out.append(
                "\ntorchax: "
                + ", ".join(f"{k} {_err(v) or _num(v.get('ms')) + ' ms'}" for k, v in tx.items())
            )
        out.append("")

    comp = results.get("compile", {})
    if comp:
        out.append(
            'Compile time of `backend="tpu"`: from `torch.compile` to the first result '
            "(Dynamo, AOTAutograd, lowering, XLA), cold (empty persistent cache) and warm (the "
            "same `cache_dir`, a new process); imports (torch._dynamo, JAX, tpu-inductor) are "
            "timed apart, and the last column is the warm process's whole time to its first "
            "result.\n"
        )
        head = ["graph", "cold s", "warm s", "cold/warm", "imports s", "warm from start s"]
        out.append(_row(head))
        out.append(_row(["---"] * len(head)))
        for item, by in comp.items():
            cold, warm = by.get("cold", {}), by.get("warm", {})
            out.append(
                _row(
                    [
                        item,
                        _err(cold) or _num(cold.get("first_result_s"), "{:.2f}"),
                        _err(warm) or _num(warm.get("first_result_s"), "{:.2f}"),
                        _num(results["derived"]["compile"][item].get("cold/warm"), "{:.1f}x"),
                        _num(warm.get("import_s"), "{:.2f}"),
                        _num(warm.get("since_start_s"), "{:.2f}"),
                    ]
                )
            )
        out.append("")

    mfu = results.get("derived", {}).get("mfu")
    if mfu:
        peak = mfu.get("peak_flops_assumed")
        out.append(
            f"MFU, {mfu['model']} on {mfu['device_kind']}: "
            + (f"{mfu['mfu'] * 100:.1f}%" if _ok(mfu.get("mfu")) else "- (unknown peak)")
            + f" ({_num((mfu.get('achieved_flops') or 0) / 1e12, '{:.2f}')} TFLOP/s achieved"
            + (f" of an assumed {peak / 1e12:.0f} TFLOP/s, {mfu['peak_basis']})" if peak else ")")
        )
        out.append("")
    return "\n".join(out).rstrip() + "\n"


_LABEL = {
    "tpu": "ours",
    "jax": "hand-JAX",
    "eager": "eager",
    "inductor": "inductor",
    "torchax": "torchax",
}


# Why a contender beats us where it does, from measurements outside the suite (each names the
# command that shows it). Keyed by the part of the run; shown only where the run finds us slower.
_WHY = {
    "percall": (
        "at small sizes the call is fixed costs: Dynamo's guards (~13 us, every backend pays "
        "them), XLA's executable dispatch and the numpy views in and out (~25-30 us on this "
        "CPU), where eager calls torch's kernels with no guards at all and inductor calls its "
        "generated C++ directly (`python -m benchmarks.profile_overhead`)"
    ),
    "resnet": (
        "XLA:CPU's convolution path: a `jax.profiler` trace of the training step shows ~25 ms "
        "of layout transposes around convolutions, ~30 ms of convolutions (`python -m "
        "benchmarks.convs`: within ~5% of oneDNN summed over a forward, slower on the 8x8 and "
        "4x4 maps) and ~10 ms of max pooling with indices (a variadic reduce-window) per step; "
        "inference lost its worst cost, YNNPACK re-laying-out every weight per call "
        "(`devices.CPU_INFERENCE_OPTIONS`)"
    ),
}


def _slower_notes(results: dict[str, Any], part: str) -> list[str]:
    """Lines naming where eager or inductor beats us in ``part`` ("percall" or "models"), each
    with the measured why."""
    derived = results.get("derived", {})
    notes = []
    slower = []
    for size, r in derived.get("percall", {}).items() if part == "percall" else ():
        for c in ("eager", "inductor"):
            if _ok(r.get(f"tpu/{c}")) and r[f"tpu/{c}"] > 1:
                slower.append(f"{c} at {size} ({r[f'tpu/{c}']:.2f}x)")
    if slower:
        notes.append(f"\nPer call, faster than ours: {', '.join(slower)}: {_WHY['percall']}.")
    for key, d in derived.get("models", {}).items() if part == "models" else ():
        beaten = [
            f"{c} ({d[f'tpu/{c}']:.2f}x)"
            for c in ("eager", "inductor")
            if _ok(d.get(f"tpu/{c}")) and d[f"tpu/{c}"] > 1
        ]
        if beaten:
            why = _WHY.get(key.split("/")[0], "not investigated yet")
            notes.append(f"\n{key}: faster than ours: {', '.join(beaten)}: {why}.")
    return notes


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def machine_line(results: dict[str, Any]) -> str:
    """One line naming the machine a result came from."""
    m = results.get("machine", {})
    v = m.get("versions", {})
    load = m.get("load_avg")
    load_s = f", load avg {load[0]:.1f} at start" if load else ""
    threads = results.get("threads")
    limit = f" (each contender limited to {threads} thread(s))" if threads else ""
    return (
        f"{m.get('cpu_count', '?')} CPUs{limit} ({m.get('cpu', '?')}, {m.get('platform', '?')}), "
        f"JAX device {m.get('jax_device', '?')}; torch {v.get('torch')}, jax {v.get('jax')}, "
        f"transformers {v.get('transformers')}{load_s}; "
        f"{'--quick' if results.get('quick') else 'full'} run of {results.get('date', '?')}"
    )


def plot(results: dict[str, Any], path: Path) -> bool:
    """Write a PNG of the per-call times, model time ratios and compile times.

    Returns ``False`` (and writes nothing) when matplotlib is not installed
    (``pip install -e '.[bench]'``).
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import matplotlib.ticker
    except ImportError:
        return False
    derive(results)
    fig, axes = plt.subplots(1, 3, figsize=(17, 4.8))
    ax = axes[0]
    pc = {c: v for c, v in results.get("percall", {}).items() if isinstance(v, list)}
    sizes = list(results["derived"].get("percall", {}))
    width = 0.8 / max(len(pc), 1)
    for i, (c, rows) in enumerate(pc.items()):
        by = {r["size"]: r["us"] for r in rows}
        xs = [j + i * width for j in range(len(sizes))]
        ax.bar(xs, [by.get(s, 0) for s in sizes], width, label=_LABEL.get(c, c))
    ax.set_xticks([j + width * (len(pc) - 1) / 2 for j in range(len(sizes))], sizes)
    ax.set_yscale("log")
    ax.set_ylabel("µs per call (log)")
    ax.set_title("MLP per-call time (batch x d)")
    ax.legend(fontsize=8)

    ax = axes[1]
    dm = results["derived"].get("models", {})
    keys = list(dm)
    for i, (label, field) in enumerate(
        (("ours/eager", "tpu/eager"), ("ours/inductor", "tpu/inductor"))
    ):
        vals = [dm[k].get(field) or 0 for k in keys]
        ax.barh([j + i * 0.4 for j in range(len(keys))], vals, 0.4, label=label)
    ax.axvline(1.0, color="k", lw=0.8)
    ax.set_yticks([j + 0.2 for j in range(len(keys))], keys)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
    ax.xaxis.set_minor_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
    ax.set_xlabel("time ratio (below 1: ours faster)")
    ax.set_title("Models: step time, ours / theirs")
    ax.legend(fontsize=8)

    ax = axes[2]
    comp = results.get("compile", {})
    items = list(comp)
    for i, phase in enumerate(("cold", "warm")):
        vals = [comp[k].get(phase, {}).get("first_result_s") or 0 for k in items]
        ax.bar([j + i * 0.4 for j in range(len(items))], vals, 0.4, label=phase)
    ax.set_xticks([j + 0.2 for j in range(len(items))], items, fontsize=8)
    ax.set_ylabel("s to first result")
    ax.set_title("Compile: cold vs warm persistent cache")
    ax.legend(fontsize=8)

    fig.suptitle(machine_line(results), fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def readme_block(
    results: dict[str, Any], json_path: str, png_path: str | None, transfers: dict | None = None
) -> str:
    """docs/performance.md's block (between the markers), from one results file (and the
    bytes-per-step results of ``python -m benchmarks.transfers`` when given)."""
    lines = [
        START,
        f"<!-- Written by python -m benchmarks.docs from {json_path}; do not edit by hand. -->",
        "",
        f"Machine: {machine_line(results)}.",
        "",
        f"Command: `{results.get('command', 'python -m benchmarks.run')}`"
        + (f" ({results['wall_s'] / 60:.0f} minutes)." if _ok(results.get("wall_s")) else "."),
        "",
        tables(results).rstrip(),
        "",
    ]
    if transfers:
        lines += [transfers_table(transfers), ""]
    if png_path:
        lines += [f"![benchmark plot]({png_path})", ""]
    lines.append(END)
    return "\n".join(lines)


def transfers_table(record: dict[str, Any]) -> str:
    """The bytes-per-step table from ``python -m benchmarks.transfers``'s results file."""
    m = record.get("machine", {})
    load = m.get("load_avg")
    lines = [
        "Bytes crossing host <-> device per step, counted where an accelerator would copy "
        f"(`{record.get('command', 'python -m benchmarks.transfers')}`, {m.get('cpu_count', '?')}"
        f" CPUs, load avg {load[0]:.1f} at start, {record.get('date', '?')}). The Llama is "
        "hidden 256, 4 layers, vocab 1024; `keep` is `tpu_inductor.keep_on_device(model, opt)`"
        "; decode is greedy static-cache `generate()`, 16 prompt + 16 new tokens. Bytes are "
        "exact and the same in every run; times are this run's, on a shared machine (on an "
        "accelerator the bytes are what the host link carries per step)."
        if load
        else "Bytes crossing host <-> device per step (`python -m benchmarks.transfers`).",
        "",
        "| workload | time | host->device | device->host | ratio |",
        "| --- | --- | --- | --- | --- |",
    ]
    for r in record.get("results", []):
        w = r["workload"]
        if w.startswith("train"):
            ratio = (r["h2d_per_step"] + r["d2h_per_step"]) / r["param_bytes"]
            lines.append(
                _row(
                    [
                        f"Llama {w} step",
                        f"{r['ms_per_step']:.0f} ms",
                        _bytes(r["h2d_per_step"]),
                        _bytes(r["d2h_per_step"]),
                        f"{ratio:.2g}x params ({_bytes(r['param_bytes'])})",
                    ]
                )
            )
        elif w.startswith("decode"):
            lines.append(
                _row(
                    [
                        f"{w}, per token over a generate / per decode step"
                        + (f" (`{r['command']}`, {r['date']})" if r.get("command") else ""),
                        f"{r['ms_per_token']:.1f} ms/token",
                        _bytes(r["h2d_per_token"]),
                        _bytes(r["d2h_per_token"]),
                        f"{r['x_cache_per_token']:.3f}x / {r['x_cache_per_decode_step']:.3f}x "
                        f"the KV cache ({_bytes(r['cache_bytes'])})",
                    ]
                )
            )
        elif w == "mlp":
            lines.append(
                _row(
                    [
                        "MLP 1x64 inference call",
                        "-",
                        _bytes(r["h2d_per_call"]),
                        _bytes(r["d2h_per_call"]),
                        f"input {r['input_bytes']} B, output {r['output_bytes']} B",
                    ]
                )
            )
    return "\n".join(lines)


def _bytes(n: float) -> str:
    if n >= 1e6:
        return f"{n / 1e6:.1f} MB"
    if n >= 1e4:
        return f"{n / 1e3:.1f} KB"
    return f"{n:.0f} B"


def update_readme(readme: Path, block: str) -> None:
    """Replace the text between the perf markers of ``readme`` with ``block``.

    Raises:
        ValueError: if the markers are missing or out of order.
    """
    text = readme.read_text()
    pattern = re.compile(re.escape(START) + r".*?" + re.escape(END), re.S)
    if not pattern.search(text):
        raise ValueError(f"{readme}: no {START} ... {END} block to replace")
    readme.write_text(pattern.sub(lambda _: block, text, count=1))


def write_readme(json_path: Path, readme: Path) -> None:
    """Rewrite ``readme``'s performance block from the results file ``json_path``.

    Paths in the block are relative to the page's folder, so the plot renders on GitHub.
    """
    import json
    import os

    results = json.loads(Path(json_path).read_text())
    base = readme.resolve().parent
    rel = lambda p: Path(os.path.relpath(Path(p).resolve(), base)).as_posix()  # noqa: E731
    png = Path(json_path).with_name(results["plot"]) if results.get("plot") else None
    moved = Path(json_path).with_name("transfers.json")
    transfers = json.loads(moved.read_text()) if moved.exists() else None
    if isinstance(transfers, list):  # an older results file, without the run's machine
        transfers = {"results": transfers}
    block = readme_block(
        results, rel(json_path), rel(png) if png and png.exists() else None, transfers
    )
    update_readme(readme, block)

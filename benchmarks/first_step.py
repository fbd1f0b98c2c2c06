"""Time to the first training steps, by stage, by depth, cold and after a restart.

``JAX_PLATFORMS=cpu python -m benchmarks.first_step [--layers 4 16 32] [--paths step split]
[--hidden 64] [--name first_step] [--results DIR] [--docs]``

A transformers Llama (hidden ``H``, intermediate ``2H``, 4 heads, 2 KV heads, vocab 128, no KV
cache: a training model), batch 2 x 8, AdamW, ``options={"scan_layers": True, "cache_dir": D}``,
trained two steps on each path:

- ``step``: ``tpu_inductor.compile_step`` (forward, backward and AdamW as one program);
- ``split``: ``torch.compile(model)``, ``loss.backward()``, ``torch.compile(opt.step)`` (three
  programs).

Each depth and path runs twice, each run a new Python process: *cold* with an empty ``cache_dir``
``D``, then *warm* with the same ``D`` (a restart). Per run: the two steps' wall seconds (from the
first call to the second's result; imports and building the model excluded), the seconds by
stage as ``tpu_inductor.report()`` splits them (Dynamo, AOTAutograd, our lowering with JAX's
trace, XLA's compiles, the load of saved programs), and the losses (a warm run must give the
cold run's to the bit). The ratios the issue asks for are computed within the run: 32 layers
over 4 layers cold, per path; warm over cold at the deepest depth.

Results: ``<name>.json`` (with the machine and its load average) and ``<name>.md`` in
``--results`` (default ``benchmarks/results/local``, git-ignored; ``benchmarks/results`` holds
the committed figures); ``--docs`` also writes that table into docs/compile-time.md's
generated block (:func:`write_docs`).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

from benchmarks.suite import machine_info, write_record

RESULTS = pathlib.Path(__file__).parent / "results" / "local"  # git-ignored (--results)
DOCS = pathlib.Path(__file__).parent.parent / "docs" / "compile-time.md"
MARKERS = ("<!-- first_step:start -->", "<!-- first_step:end -->")
STAGES = ("dynamo", "aot", "lower", "xla", "load")


def child(path: str, layers: int, hidden: int, cache_dir: str) -> dict:
    """One run, in this process: build, then two timed steps (see the module docstring)."""
    import torch

    import tpu_inductor
    from benchmarks.scan_layers import llama
    from tests.helpers import lm_losses

    torch.manual_seed(0)
    model = llama(layers, hidden, use_cache=False).train()
    ids = torch.randint(0, 128, (2, 8), generator=torch.Generator().manual_seed(1))
    options = {"scan_layers": True, "cache_dir": cache_dir}
    losses, seconds = [], []
    start = time.perf_counter()
    for loss in lm_losses(model, path, ids, options, lr=1e-3):
        losses.append(loss)
        seconds.append(time.perf_counter() - start)
    report = tpu_inductor.report(print_table=False)
    return {
        "first_step_s": seconds[0],
        "two_steps_s": seconds[1],
        "stages": report.stage_seconds(),
        "losses": [repr(x) for x in losses],
        "loaded": tpu_inductor.runtime.cache.STATS.exports_loaded,
        "graphs": len(report.graphs),
    }


def run(path: str, layers: int, hidden: int, cache_dir: str) -> dict:
    """One run in a new process (a cold start, or a restart when ``cache_dir`` is filled)."""
    cmd = [sys.executable, "-m", "benchmarks.first_step", "--child", path, str(layers)]
    cmd += ["--hidden", str(hidden), "--cache-dir", cache_dir]
    env = {**os.environ, "JAX_PLATFORMS": os.environ.get("JAX_PLATFORMS", "cpu")}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=3600)
    if proc.returncode != 0:
        raise RuntimeError(f"{path} at {layers} layers failed:\n{proc.stderr[-3000:]}")
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    return json.loads(line.removeprefix("RESULT "))


def ratios(rows: list[dict]) -> dict:
    """The ratios the issue asks for, from this run's rows: per path, the deepest depth's cold
    two steps over the shallowest's, and the deepest depth's warm over cold."""
    out = {}
    for path in sorted({r["path"] for r in rows}):
        mine = [r for r in rows if r["path"] == path]
        lo, hi = min(r["layers"] for r in mine), max(r["layers"] for r in mine)

        def at(layers, start, rs=mine):
            return next(r for r in rs if r["layers"] == layers and r["start"] == start)

        out[path] = {
            f"cold {hi} / cold {lo} layers": at(hi, "cold")["two_steps_s"]
            / at(lo, "cold")["two_steps_s"],
            f"warm / cold at {hi} layers": at(hi, "warm")["two_steps_s"]
            / at(hi, "cold")["two_steps_s"],
        }
    return out


def table(record: dict) -> str:
    """The results as the Markdown table docs/compile-time.md shows (generated, never typed)."""
    m = record["machine"]
    lines = [
        f"`{record['command']}`, {record['date']}, {m['cpus_usable']} CPUs, load average "
        f"{m['load_avg'][0]:.2f} at the start, {m['jax_device']}.",
        "",
        "| path | layers | start | two steps s | first step s | "
        + " | ".join(f"{s} s" for s in STAGES)
        + " | same losses |",
        "|---|---:|---|---:|---:|" + "---:|" * len(STAGES) + "---|",
    ]
    for r in record["results"]["rows"]:
        same = "-" if r["start"] == "cold" else ("yes" if r["same_losses"] else "NO")
        lines.append(
            f"| {r['path']} | {r['layers']} | {r['start']} | {r['two_steps_s']:.1f} | "
            f"{r['first_step_s']:.1f} | "
            + " | ".join(f"{r['stages'][s]:.1f}" for s in STAGES)
            + f" | {same} |"
        )
    lines += ["", "| path | ratio | value |", "|---|---|---:|"]
    for path, values in record["results"]["ratios"].items():
        for name, value in values.items():
            lines.append(f"| {path} | {name} | {value:.2f}x |")
    return "\n".join(lines) + "\n"


def write_docs(table_md: str, docs: pathlib.Path = DOCS) -> None:
    """Replace the text between ``docs``' first_step markers with ``table_md``."""
    text = docs.read_text()
    if MARKERS[0] not in text or MARKERS[1] not in text:
        raise SystemExit(f"{docs}: no {MARKERS[0]} ... {MARKERS[1]} block to rewrite")
    head, rest = text.split(MARKERS[0], 1)
    _, tail = rest.split(MARKERS[1], 1)
    docs.write_text(f"{head}{MARKERS[0]}\n{table_md}{MARKERS[1]}{tail}")


def main(argv: list[str] | None = None) -> None:
    """Run the depths and paths asked for (see the module docstring)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--layers", type=int, nargs="+", default=[4, 16, 32])
    p.add_argument("--paths", nargs="+", default=["step", "split"], choices=["step", "split"])
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--name", default="first_step")
    p.add_argument("--docs", action="store_true", help="also write docs/compile-time.md's table")
    p.add_argument("--results", default=str(RESULTS), help="folder for <name>.json and .md")
    p.add_argument("--child", nargs=2, metavar=("PATH", "LAYERS"), help=argparse.SUPPRESS)
    p.add_argument("--cache-dir", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        result = child(args.child[0], int(args.child[1]), args.hidden, args.cache_dir)
        print("RESULT " + json.dumps(result), flush=True)
        return
    machine = machine_info()
    rows = []
    for path in args.paths:
        for layers in args.layers:
            with tempfile.TemporaryDirectory(prefix="first_step-") as cache_dir:
                cold = run(path, layers, args.hidden, cache_dir)
                warm = run(path, layers, args.hidden, cache_dir)
            for start, r in (("cold", cold), ("warm", warm)):
                rows.append({"path": path, "layers": layers, "start": start, **r})
            rows[-1]["same_losses"] = warm["losses"] == cold["losses"]
            print(
                f"{path:<6} {layers:>3} layers: cold {cold['two_steps_s']:.1f} s, "
                f"warm {warm['two_steps_s']:.1f} s, same losses {rows[-1]['same_losses']}",
                flush=True,
            )
    results = {"rows": rows, "ratios": ratios(rows)}
    folder = pathlib.Path(args.results)
    folder.mkdir(parents=True, exist_ok=True)
    out = folder / f"{args.name}.json"
    write_record(out, "benchmarks.first_step", argv, machine, results)
    record = json.loads(out.read_text())
    (folder / f"{args.name}.md").write_text(table(record))
    if args.docs:
        write_docs(table(record))
    print(table(record))


if __name__ == "__main__":
    main()

"""Each lever of issue 22, before and after: ``python -m benchmarks.tpu_levers``.

Runs ``benchmarks.tpu_programs`` (the version in this checkout) against the backend as it was at
each lever's commit: for every step of :data:`LEVERS`, the commit's ``tpu_inductor`` is
extracted (``git archive``) into a scratch folder beside this checkout's ``benchmarks/``, and the
Llama training step is compiled for the target there, in float32 and bfloat16. The hand-written
rows are compiled once and reused (``--hand-from``). Writes
``benchmarks/results/tpu-levers.json`` (every run's results, in lever order) and prints the
table of ratios ours / hand after each lever.

``--issue 30`` measures issue 30's levers instead (:data:`ISSUE30`): each is a switch of this
checkout's backend, compiled off and on per workload (``benchmarks/results/tpu-levers-30.json``).

Levers are cumulative, in the order they were committed. Takes a while: each float32 step is a
few minutes of TPU compile on a CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks import paths
from benchmarks.tpu_workloads import RATIO_KEYS, RESULTS, ROOT, derive, totals

# (label, commit of branch issue22, contender, internal switches): each lever on top of the ones
# before it. d7dfeef is the backend before any of them (main + compile_step, which a split step
# does not use).
LEVERS = [
    ("before: model + opt.step compiled apart (3 programs)", "d7dfeef", "ours-3prog", {}),
    ("min-cut rematerialization partitioner", "b7d9123", "ours-3prog", {}),
    ("whole step as ONE program (compile_step)", "b7d9123", "ours-1prog", {}),
    ("GQA grouped, no K/V repeat; bf16 attention operands", "b138086", "ours-1prog", {}),
    ("loss backward: one-hot compare, no scatter", "8e0bf87", "ours-1prog", {}),
    ("attention backward from saved out + logsumexp", "3dead21", "ours-1prog", {}),
    ("attention over token-major views (layout copies)", "0c578f8", "ours-1prog", {}),
    ("loss forward: masked sum, no gather (log-softmax fused)", "f9622d7", "ours-1prog", {}),
    ("after: all lowering levers, split into 3 programs", "HEAD", "ours-3prog", {}),
]
WORKLOADS = "train-f32,train-bf16"

# Issue 30's levers (``--issue 30``): each is a knob of this checkout's backend, measured off
# (before) and on (after) per workload and contender, on this checkout (no snapshots).
# (label, switches that turn it off, [(workload, contender), ...]).
ISSUE30 = [
    (
        "half-precision products on a TPU return their own dtype (no layout copies)",
        {"tpu_half_dots": False},
        [
            ("infer-bf16", "ours-3prog"),
            ("train-bf16", "ours-3prog"),
            ("train-bf16", "ours-1prog"),
            ("vit-train-bf16", "ours-3prog"),
        ],
    ),
    (
        "products over [..., K] activations without flattening them (lowering/leading_dims.py)",
        {"leading_dims_platforms": []},
        [
            ("vit-train-f32", "ours-1prog"),
            ("vit-train-bf16", "ours-1prog"),
            ("vit-train-bf16", "ours-3prog"),
        ],
    ),
    (
        "log-softmax saved as its row statistics in a split step (capture/saved.py)",
        {"split_log_softmax": False},
        [
            ("train-f32", "ours-3prog"),
            ("train-bf16", "ours-3prog"),
            ("bert-train-bf16", "ours-3prog"),
        ],
    ),
    (
        "zero tangents are constants of the backward program (runtime/signatures.py)",
        {"zero_tangents": False},
        [
            ("train-f32", "ours-3prog"),
            ("train-bf16", "ours-3prog"),
            ("bert-train-bf16", "ours-3prog"),
        ],
    ),
]


# The benchmarks import the backend's modules by their paths. A commit from before the stage
# folders (issue 31: tpu_inductor/core, lowering, ...) runs with the benchmarks of the last
# commit before the move, which import the flat layout it has.
FLAT_LAYOUT_BENCHMARKS = "648ce78"


def _extract(commit: str, path: str, into: Path) -> None:
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", commit, path], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)


def snapshot(commit: str, into: Path) -> Path:
    """The backend at ``commit`` with this checkout's benchmarks (for a commit from before the
    stage folders, those of :data:`FLAT_LAYOUT_BENCHMARKS`), in ``into``."""
    into.mkdir(parents=True)
    _extract(commit, "tpu_inductor", into)
    if (into / "tpu_inductor" / "core").is_dir():
        shutil.copytree(ROOT / "benchmarks", into / "benchmarks")
    else:
        _extract(FLAT_LAYOUT_BENCHMARKS, "benchmarks", into)
    return into


def run(folder: Path, name: str, contender: str, levers: dict, hand: Path, out: Path, args):
    """``benchmarks.tpu_programs`` in ``folder`` for the hand rows and ``contender``."""
    cmd = [
        sys.executable,
        "-m",
        "benchmarks.tpu_programs",
        "--only",
        args.only,
        "--contenders",
        f"hand,{contender}",
        "--target",
        args.target,
        "--out-dir",
        str(out),
        "--name",
        name,
    ]
    if hand.exists():
        cmd += ["--hand-from", str(hand)]
    if levers:
        cmd += ["--levers", json.dumps(levers)]
    env = {**os.environ, "PYTHONPATH": str(folder), "JAX_PLATFORMS": "cpu"}
    subprocess.run(cmd, cwd=folder, env=env, check=True)
    return json.loads((out / f"{name}.json").read_text())


def _complete(path: Path, only: str, contender: str) -> bool:
    """Whether ``path`` holds ``contender``'s rows for every workload of ``only``."""
    if not path.exists():
        return False
    rows = json.loads(path.read_text())["rows"]
    return all(contender in rows.get(w, {}) for w in only.split(","))


def table(steps: list[dict]) -> str:
    """Markdown: per lever and workload, ours / hand for bytes, FLOPs, HBM peak, compile."""
    workloads = list(steps[0]["rows"]) if steps else []
    head = "| lever | " + " | ".join(f"{w}: bytes, FLOPs, HBM, compile" for w in workloads)
    lines = [head + " |", "|---" * (1 + len(workloads)) + "|"]
    for step in steps:
        cells = []
        for w in workloads:
            r = step["derived"].get(w, {}).get(step["contender"])
            cells.append(", ".join(f"{r[k]:.2f}x" for k in RATIO_KEYS) if r else "failed")
        lines.append(f"| {step['label']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def issue30(args, scratch: Path, out: Path) -> list[dict]:
    """Each lever of :data:`ISSUE30` off and on, per (workload, contender); written to
    ``tpu-levers-30.json`` after each run (a run already in ``scratch`` is reused)."""
    # The hand-written rows: from --hand-from, else the last full run's (same sizes and target).
    hand = Path(args.hand_from) if args.hand_from else RESULTS / "tpu-programs.json"
    entries = []
    for i, (label, off, cases) in enumerate(ISSUE30):
        for workload, contender in cases:
            pair = {}
            for state, levers in (("before", off), ("after", {})):
                name = f"i30-{i}-{workload}-{contender}-{state}"
                print(f"[{name}] {label}", file=sys.stderr, flush=True)
                done = scratch / f"{name}.json"
                if not _complete(done, workload, contender):
                    a = argparse.Namespace(**{**vars(args), "only": workload})
                    run(ROOT, name, contender, levers, hand, scratch, a)
                data = json.loads(done.read_text())
                data["derived"] = derive(data["rows"])
                res = data["rows"][workload]
                pair[state] = {
                    "ratios": data["derived"].get(workload, {}).get(contender),
                    "totals": totals(res[contender]),
                    "hand": totals(res["hand"]) if "hand" in res else None,
                    "conditions": data["conditions"],
                }
            entries.append(
                {
                    "label": label,
                    "switches_off": off,
                    "workload": workload,
                    "contender": contender,
                    **pair,
                }  # fmt: skip
            )
            (out / "tpu-levers-30.json").write_text(
                json.dumps({"target": args.target, "levers": entries}, indent=1) + "\n"
            )
    return entries


def table30(entries: list[dict]) -> str:
    """Markdown: per lever, workload and contender, ours / hand before and after."""
    lines = [
        "| lever | workload, contender | before: bytes, FLOPs, HBM, compile | after | "
        "bytes MB before -> after | top-level copies |",
        "|---|---|---|---|---|---|",
    ]
    for e in entries:
        b, a = e["before"], e["after"]
        fmt = lambda r: ", ".join(f"{r[k]:.2f}x" for k in RATIO_KEYS) if r else "-"  # noqa: E731
        lines.append(
            f"| {e['label']} | {e['workload']}, {e['contender']} | {fmt(b['ratios'])} | "
            f"{fmt(a['ratios'])} | {b['totals']['bytes'] / 1e6:,.0f} -> "
            f"{a['totals']['bytes'] / 1e6:,.0f} | {b['totals']['copies']} -> "
            f"{a['totals']['copies']} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--issue",
        type=int,
        default=22,
        help="22: the Llama levers, each at its commit; 30: issue 30's switches, off and on",
    )
    p.add_argument("--target", default="v5e:2x2")
    p.add_argument("--only", default=WORKLOADS)
    p.add_argument("--hand-from", default="", help="hand-written rows from an earlier run")
    paths.add_results_option(p, "--out-dir", dest="out_dir")
    p.add_argument("--keep", action="store_true", help="keep the scratch folders")
    p.add_argument(
        "--scratch",
        default="",
        help="scratch folder, kept; a lever whose results are already there is not run again "
        "(resumes an interrupted run)",
    )
    args = p.parse_args(argv)
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if args.scratch:
        scratch, args.keep = Path(args.scratch), True
        scratch.mkdir(parents=True, exist_ok=True)
    else:
        scratch = Path(tempfile.mkdtemp(prefix="tpu-levers-"))
    if args.issue == 30:
        try:
            print(table30(issue30(args, scratch, out)))
        finally:
            if not args.keep:
                shutil.rmtree(scratch, ignore_errors=True)
        return 0
    hand = Path(args.hand_from) if args.hand_from else scratch / "hand.json"
    steps = []
    try:
        for i, (label, commit, contender, levers) in enumerate(LEVERS):
            print(f"[{i}] {label} ({commit}, {contender})", file=sys.stderr, flush=True)
            done = scratch / f"lever{i}.json"
            if _complete(done, args.only, contender):
                data = json.loads(done.read_text())
            else:
                shutil.rmtree(scratch / f"lever{i}", ignore_errors=True)
                folder = snapshot(commit, scratch / f"lever{i}")
                data = run(folder, f"lever{i}", contender, levers, hand, scratch, args)
            if not hand.exists():
                hand.write_text(json.dumps(data))
            data["derived"] = derive(data["rows"])
            steps.append(
                {
                    "label": label,
                    "commit": commit,
                    "contender": contender,
                    "levers": levers,
                    "rows": data["rows"],
                    "derived": data["derived"],
                    "totals": {
                        w: {c: totals(r) for c, r in by.items() if "error" not in r}
                        for w, by in data["rows"].items()
                    },
                    "conditions": data["conditions"],
                }
            )
            (out / "tpu-levers.json").write_text(
                json.dumps({"target": args.target, "steps": steps}, indent=1) + "\n"
            )
    finally:
        if not args.keep:
            shutil.rmtree(scratch, ignore_errors=True)
    print(table(steps))
    return 0


if __name__ == "__main__":
    sys.exit(main())

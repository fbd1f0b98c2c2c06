"""The benchmark suite: ``python -m benchmarks.run [--quick] [--results DIR]``.

Measures, side by side in one run, and reports as ratios (ours / theirs):

- per-call overhead of a small MLP at batch x d of 1x64, 32x512 and 256x1024: ours
  (``backend="tpu"``), a hand-written ``jax.jit`` of the same math, torch eager, inductor, and
  torchax when it imports;
- models (a ResNet-18-style CNN, a BERT-base-shaped encoder, a GPT-2-small-shaped decoder, a
  small Llama-style decoder): inference and one training step, ours against eager and inductor,
  with each run's peak resident memory;
- compile time: the first result cold and warm (persistent cache, a new process);
- on a GPU/TPU, the model FLOP utilization of the Llama training step.

Every contender of every item runs in a subprocess of its own (``benchmarks.suite``), so JAX's and
torch's thread pools never share a process and memory peaks don't mix. Progress goes to stderr;
the tables to stdout; ``<name>.json`` and ``<name>.png`` are written to ``--results`` (default
the git-ignored ``benchmarks/results/local``); with ``--results benchmarks/results``,
``python -m benchmarks.docs`` then rewrites docs/performance.md from them.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path
from typing import Any

from benchmarks import paths, report, suite

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_SIZES = ((1, 64), (32, 512), (256, 1024))
COMPILE_ITEMS = ("mlp", "llama/infer", "llama/train")


def _parse_sizes(text: str) -> list[tuple[int, int]]:
    sizes = []
    for part in text.split(","):
        b, d = part.lower().split("x")
        sizes.append((int(b), int(d)))
    return sizes


def _csv(text: str) -> list[str]:
    return [p.strip() for p in text.split(",") if p.strip()]


class Runner:
    """Runs suite tasks in subprocesses (or in-process), passing their progress through."""

    def __init__(
        self, *, in_process: bool, timeout_s: float, inductor_cache: str, threads: int | None
    ):
        self.in_process = in_process
        self.on_done = None  # called after every task (the run saves its partial results)
        self.timeout_s = timeout_s
        self.env = dict(os.environ)
        # Each run starts from cold compiler caches, except where a task asks for a warm one.
        self.env.pop("TPU_INDUCTOR_CACHE_DIR", None)
        self.env["TORCHINDUCTOR_CACHE_DIR"] = inductor_cache
        if threads:
            self.env["BENCH_THREADS"] = str(threads)  # suite.main pins XLA's pool
            self.env["OMP_NUM_THREADS"] = str(threads)
        self.env["PYTHONPATH"] = os.pathsep.join(
            [str(ROOT)] + ([self.env["PYTHONPATH"]] if self.env.get("PYTHONPATH") else [])
        )

    def __call__(self, task: dict[str, Any]) -> Any:
        """The task's result, or ``{"error": message}`` when it failed or timed out."""
        try:
            return self._run(task)
        finally:
            if self.on_done is not None:
                self.on_done()

    def _run(self, task: dict[str, Any]) -> Any:
        if self.in_process:
            try:
                return suite.run_task(task)
            except Exception as e:  # one failing contender must not stop the suite
                return {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
        with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
            out_path = f.name
        cmd = [sys.executable, "-m", "benchmarks.suite", json.dumps(task), out_path]
        proc = subprocess.Popen(
            cmd,
            cwd=ROOT,
            env=self.env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        tail: list[str] = []

        def pump():
            for line in proc.stderr:
                if line.startswith("[bench]"):
                    sys.stderr.write("  " + line)
                    sys.stderr.flush()
                else:
                    tail.append(line)
                    del tail[:-40]

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        try:
            proc.wait(timeout=self.timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            reader.join(5)
            os.unlink(out_path)
            return {"error": f"timed out after {self.timeout_s:.0f}s"}
        reader.join(5)
        try:
            if proc.returncode != 0:
                return {
                    "error": _error_line(tail) or f"exit code {proc.returncode}",
                    "stderr_tail": "".join(tail),
                }
            with open(out_path) as f:
                return json.load(f)
        finally:
            os.unlink(out_path)


def _best_round(rounds: list[Any]) -> Any:
    """Per size, the round with the lowest median: load from other processes only ever adds
    time, so the quietest round is the closest to the code's own cost. Keeps every round's
    median in ``us_rounds``."""
    ok = [r for r in rounds if isinstance(r, list)]
    if not ok:
        return rounds[-1]
    best = []
    for i in range(len(ok[0])):
        candidates = [r[i] for r in ok]
        pick = dict(min(candidates, key=lambda x: x["us"]))
        pick["us_rounds"] = [x["us"] for x in candidates]
        best.append(pick)
    return best


def _error_line(lines: list[str]) -> str:
    """The last ``SomeError: message`` line of a traceback (JAX appends notes after it)."""
    pattern = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit)\b")
    for line in reversed(lines):
        if pattern.match(line):
            return line.strip()
    return "".join(lines[-3:]).strip()


def _progress(msg: str) -> None:
    print(f"[run] {msg}", file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Run the selected parts of the suite and return the results dict (not yet written)."""
    quick = args.quick
    only = set(_csv(args.only))
    contenders = _csv(args.contenders)
    start = time.perf_counter()
    inductor_cache = tempfile.mkdtemp(prefix="bench-inductor-")
    runner = Runner(
        in_process=args.in_process,
        timeout_s=args.timeout,
        inductor_cache=inductor_cache,
        threads=args.threads,
    )
    results: dict[str, Any] = {
        "name": args.name,
        "quick": quick,
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "command": "python -m benchmarks.run " + " ".join(args.argv),
        "threads": args.threads,
        "rounds": args.rounds,
        "ratio_convention": "ours / theirs of a time or memory peak: below 1, ours is better",
    }
    results["machine"] = runner({"kind": "machine"})
    _progress(f"machine: {report.machine_line(results)}")
    if not args.name:
        backend = results["machine"].get("jax_backend", "unknown")
        args.name = f"{backend}-{'quick' if quick else 'full'}"
    results["name"] = args.name
    args.out_dir.mkdir(parents=True, exist_ok=True)
    partial = args.out_dir / f"{args.name}.partial.json"

    def save_partial():
        partial.write_text(json.dumps(results, indent=1) + "\n")

    runner.on_done = save_partial

    if "torchax" in contenders:
        ok, why = suite.torchax_available()
        if not ok:
            contenders = [c for c in contenders if c != "torchax"]
            results["torchax"] = f"skipped: import torchax failed: {why}"
            _progress(results["torchax"])

    target = args.target_s if args.target_s else (0.15 if quick else 0.5)
    repeats = args.repeats if args.repeats else (5 if quick else 7)
    try:
        if "percall" in only:
            sizes = _parse_sizes(args.sizes)
            results["percall"] = {}
            rounds: dict[str, list] = {}
            for r in range(args.rounds):
                for c in [c for c in suite.PERCALL_CONTENDERS if c in contenders]:
                    _progress(
                        f"per-call overhead: {c}, round {r + 1}/{args.rounds} "
                        f"({time.perf_counter() - start:.0f}s)"
                    )
                    task = {
                        "kind": "percall",
                        "contender": c,
                        "sizes": sizes,
                        "target_s": target,
                        "repeats": repeats,
                    }
                    rounds.setdefault(c, []).append(runner(task))
                    results["percall"][c] = _best_round(rounds[c])
        if "models" in only:
            results["models"] = {}
            m_target = args.target_s if args.target_s else (0.5 if quick else 2.0)
            m_repeats = args.repeats if args.repeats else (3 if quick else 5)
            for model in _csv(args.models):
                for mode in ("infer", "train"):
                    key = f"{model}/{mode}"
                    results["models"][key] = {}
                    for c in [c for c in suite.MODEL_CONTENDERS if c in contenders]:
                        if c == "torchax" and mode == "train":
                            continue
                        if c == "inductor" and mode == "train" and quick:
                            # Inductor's C++ compile of forward + backward + AdamW takes
                            # minutes per model on a 2-core CPU: full runs only.
                            results["models"][key][c] = {"skipped": "--quick"}
                            continue
                        _progress(f"model {key}: {c} ({time.perf_counter() - start:.0f}s)")
                        task = {
                            "kind": "model",
                            "contender": c,
                            "model": model,
                            "mode": mode,
                            "quick": quick,
                            "target_s": m_target,
                            "repeats": m_repeats,
                        }
                        results["models"][key][c] = runner(task)

        if "compile" in only:
            results["compile"] = {}
            for item in _csv(args.compile_items):
                cache_dir = tempfile.mkdtemp(prefix="bench-jaxcache-")
                try:
                    results["compile"][item] = {}
                    for phase in ("cold", "warm"):
                        _progress(f"compile {item}: {phase} ({time.perf_counter() - start:.0f}s)")
                        task = {
                            "kind": "compile",
                            "item": item,
                            "cache_dir": cache_dir,
                            "quick": quick,
                        }
                        results["compile"][item][phase] = runner(task)
                finally:
                    shutil.rmtree(cache_dir, ignore_errors=True)
    finally:
        shutil.rmtree(inductor_cache, ignore_errors=True)
    results["wall_s"] = time.perf_counter() - start
    if hasattr(os, "getloadavg"):
        results["load_avg_end"] = list(os.getloadavg())
    report.derive(results)
    return results


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; returns the exit code (1 if any task failed)."""
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.run",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="shallower models, shorter timing: minutes on a 2-core CPU",
    )
    p.add_argument(
        "--only",
        default="percall,models,compile",
        help="comma-separated parts: percall, models, compile",
    )
    p.add_argument("--contenders", default=",".join(suite.PERCALL_CONTENDERS))
    p.add_argument(
        "--sizes",
        default=",".join(f"{b}x{d}" for b, d in DEFAULT_SIZES),
        help="per-call sizes, batch x d (default 1x64,32x512,256x1024)",
    )
    p.add_argument("--models", default=",".join(suite.MODELS))
    p.add_argument("--compile-items", default=",".join(COMPILE_ITEMS))
    p.add_argument(
        "--target-s",
        type=float,
        default=None,
        help="wall time of one timed batch (default 0.15 per-call, 0.5 models quick)",
    )
    p.add_argument("--repeats", type=int, default=None, help="timed batches (median reported)")
    p.add_argument(
        "--name",
        default=None,
        help="results name (default <jax backend>-quick or <jax backend>-full)",
    )
    paths.add_results_option(p, "--out-dir", dest="out_dir")
    p.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="run the per-call contenders this many times, interleaved, and keep each size's "
        "quietest round (steadier ratios on a loaded machine)",
    )
    p.add_argument("--timeout", type=float, default=900, help="seconds per subprocess")
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="limit every contender to N CPU threads (OMP_NUM_THREADS and CPU affinity): "
        "steadier numbers on a shared machine; default: each library's own default",
    )
    p.add_argument(
        "--in-process",
        action="store_true",
        help="run every task in this process (tests only: thread pools then mix)",
    )
    p.add_argument("--no-plot", action="store_true")
    args = p.parse_args(argv)
    args.argv = argv
    results = run(args)
    (args.out_dir / f"{args.name}.partial.json").unlink(missing_ok=True)
    json_path = args.out_dir / f"{args.name}.json"
    png_path = args.out_dir / f"{args.name}.png"
    if not args.no_plot:
        if report.plot(results, png_path):
            results["plot"] = png_path.name
        else:
            _progress("matplotlib not installed (pip install -e '.[bench]'): no plot")
    json_path.write_text(json.dumps(results, indent=1) + "\n")
    print(f"\n{report.machine_line(results)}\n")
    print(report.tables(results))
    _progress(f"wrote {json_path}" + (f" and {png_path}" if "plot" in results else ""))
    return 1 if _failures(results) else 0


def _failures(results: dict[str, Any]) -> list[str]:
    bad = []

    def walk(x, path):
        if isinstance(x, dict):
            if "error" in x:
                bad.append(path)
            for k, v in x.items():
                walk(v, f"{path}/{k}")

    for part in ("percall", "models", "compile"):
        walk(results.get(part, {}), part)
    return bad


if __name__ == "__main__":
    raise SystemExit(main())

"""Every model of the suite compiled for TPU targets, without a TPU (docs/models.md's TPU column).

``python -m benchmarks.tpu_models`` (needs libtpu: ``pip install -e '.[tpu]'``; run with
``JAX_PLATFORMS=cpu``) compiles each model of the suite (``tests/models/``, the MoE and
flex-attention cases) with ``options={"target": ...}``: its inference forward, or, for a model the
suite trains, a training step (forward, backward, compiled AdamW). Nothing runs. Per model and
target it records each program (role, compiled or the error, HBM peak per chip, FLOPs, bytes
accessed, compile seconds), whether every output has eager's shape and dtype, and the wall time
of the whole run. Each model compiles in a process of its own (a crash of the TPU compiler is a
row, not the end). Results go to ``tpu_models.json`` in ``--results`` (default the git-ignored
``benchmarks/results/local``; ``--results benchmarks/results`` updates the committed file) after
each model (a partial run leaves a partial table); ``python scripts/gen_models_doc.py`` renders
the column from the committed file.

Options: ``--targets v5e,v6e``, ``--models a,b`` (only those), ``--skip a,b:v6e``, ``--slow``
(also the suite's slow models), ``--resume`` (keep rows already in the JSON), ``--json``
(the file itself).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
import traceback

import torch

from benchmarks import paths

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def suite_cases(slow: bool = False) -> list:
    """Every model case of the suite (the same list as docs/models.md's)."""
    sys.path.insert(0, ROOT)
    from tests.lowerings import test_flex_attention, test_grouped
    from tests.models import test_diffusers, test_transformers

    cases = [*test_transformers.MODELS, *test_diffusers.MODELS]
    cases += [*test_grouped.model_cases(), *test_flex_attention.model_cases()]
    return [c for c in cases if slow or not c.slow]


def run_case(case, target: str) -> dict:
    """Compile one case for one target; a JSON-able row."""
    import tpu_inductor
    from tests.models import test_transformers
    from tests.models.harness import run_target

    row = {"model": case.name, "library": case.library, "target": target, "train": case.train}
    try:
        test_transformers._requires(case.library)
    except BaseException as e:  # pytest.skip: the library is not installed
        row["error"] = f"skipped: {e}"
        return row
    torch._dynamo.reset()
    tpu_inductor.reset()
    try:
        result = run_target(case, target, train=case.train)
    except Exception as e:  # noqa: BLE001  (the table records every failure and goes on)
        traceback.print_exc()
        row["error"] = f"{type(e).__name__}: {str(e).strip().splitlines()[0][:200]}"
        return row
    row["seconds"] = round(result.seconds, 2)
    row["shapes_match"] = result.shapes_match
    row["programs"] = [
        {
            "name": p.name,
            "role": p.role,
            "compiled": p.compiled,
            "error": p.error,
            "peak_bytes": p.peak_bytes,
            "fits": p.fits,
            "flops": p.flops,
            "bytes_accessed": p.bytes_accessed,
            "compile_s": round(p.compile_seconds, 2),
        }
        for p in result.programs
    ]
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", default="v5e,v6e")
    parser.add_argument("--models", default="")
    parser.add_argument("--skip", default="", help="model:target pairs (or models) to leave out")
    parser.add_argument("--slow", action="store_true")
    parser.add_argument("--resume", action="store_true")
    paths.add_results_option(parser)
    parser.add_argument(
        "--json", default=None, help="the results file (default RESULTS/tpu_models.json)"
    )
    parser.add_argument("--worker", default="", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.json = args.json or str(args.results / "tpu_models.json")
    targets = [t for t in args.targets.split(",") if t]
    only = {m for m in args.models.split(",") if m}
    skip = {m for m in args.skip.split(",") if m}
    rows: list[dict] = []
    if args.resume and os.path.exists(args.json):
        rows = [r for r in json.load(open(args.json))["rows"] if r["model"] not in only]
    done = {(r["model"], r["target"]) for r in rows}
    start = time.time()
    if args.worker:  # one model, in a process of its own (see _isolated)
        case = next(c for c in suite_cases(True) if c.name == args.worker)
        out = [run_case(case, t) for t in targets]
        with open(args.json, "w") as f:
            json.dump(out, f)
        return 0
    for case in suite_cases(args.slow):
        if only and case.name not in only:
            continue
        todo = [
            t
            for t in targets
            if (case.name, t) not in done and not {case.name, f"{case.name}:{t}"} & skip
        ]
        if todo:
            print(f"[tpu_models] {case.name} for {', '.join(todo)}", file=sys.stderr, flush=True)
            rows += _isolated(case, todo)
            _write(args.json, rows, time.time() - start)
    return 0


def _isolated(case, targets: list[str]) -> list[dict]:
    """Rows for ``case`` from a process of its own, so that a crash of the TPU compiler
    (libtpu 0.0.42.1 overflowed a stack on timm's ResNet backward until issue 30.4) is one
    row saying so, not the end of the sweep."""
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "rows.json")
        cmd = [sys.executable, "-m", "benchmarks.tpu_models", "--worker", case.name]
        cmd += ["--targets", ",".join(targets), "--json", out]
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        sys.stderr.write(proc.stderr[-2000:])
        if proc.returncode == 0 and os.path.exists(out):
            return json.load(open(out))
    crash = [ln for ln in proc.stderr.splitlines() if "SIGSEGV" in ln or "PC: @" in ln]
    why = f"crashed (exit {proc.returncode}): " + " ".join(crash)[:240]
    base = {"model": case.name, "library": case.library, "train": case.train, "error": why}
    return [{**base, "target": t} for t in targets]


def _write(path: str, rows: list[dict], elapsed: float) -> None:
    import importlib.metadata as md

    import jax

    meta = {
        "command": "JAX_PLATFORMS=cpu python -m benchmarks.tpu_models",
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, no TPU",
        "load_avg_at_end": round(os.getloadavg()[0], 1),
        "versions": f"torch {torch.__version__}, jax {jax.__version__}, "
        f"libtpu {md.version('libtpu')}",
        "date": time.strftime("%Y-%m-%d"),
        "elapsed_s": round(elapsed),
    }
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    raise SystemExit(main())

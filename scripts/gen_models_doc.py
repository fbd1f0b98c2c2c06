"""Write docs/models.md: every real model of the test suite, compiled against CPU eager.

The model list is the suite's own (``MODELS`` in ``tests/models/test_transformers.py`` and
``tests/models/test_diffusers.py``, ``model_cases()`` of ``tests/lowering/test_grouped.py`` and
``tests/lowering/test_flex_attention.py``, plus the generation models of
``tests/models/test_generation.py``), so the report and the tests can't disagree about what is
covered. For each model it records the Dynamo graphs and graph breaks, the backend's compiled
graphs, the ops that fell back to torch eager, the first-call (compile) time, the steady-state time
of an inference forward compiled and eager, the largest absolute error and whether the forward and
the training step match eager.

Usage::

    python scripts/gen_models_doc.py                  # every model, writes docs/models.md
    python scripts/gen_models_doc.py --only llama t5  # a subset, printed, docs left alone
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
import traceback
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import jax  # noqa: E402
import torch  # noqa: E402

from tests.lowering import test_flex_attention, test_grouped  # noqa: E402
from tests.models import test_diffusers, test_generation, test_transformers  # noqa: E402
from tests.models.harness import ModelCase, compare, run_forward, run_training  # noqa: E402

OUT = ROOT / "docs" / "models.md"
TIMING_CALLS = 5


def _first_line(e: BaseException) -> str:
    text = f"{type(e).__name__}: {e}".strip().splitlines()
    return text[0][:160] if text else type(e).__name__


def _versions() -> str:
    names = ("transformers", "timm", "diffusers")
    parts = [f"torch {torch.__version__}", f"jax {jax.__version__}"]
    for name in names:
        try:
            parts.append(f"{name} {__import__(name).__version__}")
        except ImportError:
            parts.append(f"{name} not installed")
    return ", ".join(parts)


def model_row(case: ModelCase) -> dict:
    """Run one model's forward (timed) and, if the suite trains it, its training step."""
    row = {"case": case}
    try:
        result, actual, expected = run_forward(case, timing=TIMING_CALLS)
        row["forward"] = result
        try:
            compare(actual, expected, case, "forward")
            row["forward_status"] = "pass"
        except AssertionError as e:
            row["forward_status"] = f"MISMATCH ({_first_line(e)})"
    except Exception as e:  # noqa: BLE001  (the report records every failure and goes on)
        row["forward_status"] = f"ERROR ({_first_line(e)})"
        traceback.print_exc()
    if case.train:
        try:
            row["training"] = run_training(case)
            row["training_status"] = "pass"
        except AssertionError as e:
            row["training_status"] = f"MISMATCH ({_first_line(e)})"
        except Exception as e:  # noqa: BLE001
            row["training_status"] = f"ERROR ({_first_line(e)})"
            traceback.print_exc()
    else:
        row["training_status"] = "-"
    return row


def generation_row(model_type: str) -> dict:
    """Greedy ``generate()`` with a static cache: tokens vs eager and what got compiled."""
    model = test_generation._model(model_type)
    prompt = test_generation._prompt(0)
    expected = test_generation._generate(model, prompt, sample=False)
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    model.forward = torch.compile(model.forward, backend="tpu")
    start = time.perf_counter()
    with test_generation._Compiles() as first:
        actual = test_generation._generate(model, prompt, sample=False)
    first_s = time.perf_counter() - start
    start = time.perf_counter()
    with test_generation._Compiles() as second:
        test_generation._generate(model, test_generation._prompt(1), sample=False)
    second_s = time.perf_counter() - start
    start = time.perf_counter()
    eager_model = test_generation._model(model_type)
    test_generation._generate(eager_model, test_generation._prompt(1), sample=False)
    eager_s = time.perf_counter() - start
    return {
        "model": model_type,
        "match": torch.equal(actual, expected),
        "first": first,
        "second": second,
        "first_s": first_s,
        "second_s": second_s,
        "eager_s": eager_s,
    }


DYNAMIC_RESULTS = ROOT / "benchmarks" / "results" / "dynamic.json"


def dynamic_cells(path: Path = DYNAMIC_RESULTS) -> dict[str, str]:
    """Model name -> the *dynamic* column from the ``benchmarks.dynamic`` sweep's results:
    ``"0 islands, 1 exe/size, 2.5 s/size"`` (``"n islands"`` counts the fallback ops)."""
    import json
    import statistics

    if not path.exists():
        return {}
    cells = {}
    for r in json.loads(path.read_text()):
        if r.get("error"):
            cells[r["model"]] = "error"
            continue
        exes = sorted(set(r["executables_per_size"]))
        later = r["first_call_s"][1:] or r["first_call_s"]
        cell = (
            f"{len(r['fallback_ops'])} islands, {'/'.join(map(str, exes))} exe/size, "
            f"{statistics.median(later):.1f} s/size"
        )
        if r["dynamo_graphs"] != 1 or r["rebuilt"] or not r["match"]:
            cell += f" ({r['dynamo_graphs']} graphs, {r['rebuilt']} rebuilt, match {r['match']})"
        cells[r["model"]] = cell
    return cells


TPU_RESULTS = ROOT / "benchmarks" / "results" / "tpu_models.json"


def tpu_cells(path: Path = TPU_RESULTS) -> dict[str, str]:
    """Model name -> the *TPU compile* column from ``python -m benchmarks.tpu_models``: per
    target, what compiled (``train``: forward, backward and AdamW; ``fwd``: inference), the
    largest program's HBM peak per chip and the whole compile-only run's seconds, or the
    failure."""
    import json

    if not path.exists():
        return {}
    cells: dict[str, list[str]] = {}
    for r in json.loads(path.read_text())["rows"]:
        if "skipped" in r.get("error", ""):
            continue
        if r.get("error"):
            cell = f"{r['target']} ERROR {r['error'][:80]}"
        else:
            bad = [p for p in r["programs"] if not (p["compiled"] and p["fits"])]
            what = "train" if r["train"] else "fwd"
            if bad:
                cell = f"{r['target']} FAILS {bad[0]['role']}: {(bad[0]['error'] or '')[:80]}"
            else:
                peak = max(p["peak_bytes"] for p in r["programs"]) / 1e6
                cell = f"{r['target']} {what} {peak:.1f} MB {r['seconds']:.0f} s"
            if not r.get("shapes_match", True):
                cell += " (shapes differ)"
        cells.setdefault(r["model"], []).append(cell.replace("|", "/").replace("\n", " "))
    return {k: "; ".join(v) for k, v in cells.items()}


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f}"


def render(rows: list[dict], gen_rows: list[dict], elapsed: float) -> str:
    fwd_pass = sum(r["forward_status"] == "pass" for r in rows)
    trained = [r for r in rows if r["case"].train]
    train_pass = sum(r["training_status"] == "pass" for r in trained)
    fallback_models = [r for r in rows if "forward" in r and r["forward"].fallback_ops]
    lines = [
        "# Real models",
        "",
        "Generated by `scripts/gen_models_doc.py` from the model tables of `tests/models/` "
        "(`test_transformers.py`, `test_diffusers.py`, `test_generation.py`). Do not edit by hand: "
        "run `python scripts/gen_models_doc.py`.",
        "",
        "The same models under `dynamic=True` (several sequence lengths, batch sizes, "
        "resolutions): [dynamic.md](dynamic.md).",
        "",
        "Every model is built from a tiny random config (hidden size 32, two layers, a vocabulary "
        "of 128, batch 2 x 8 tokens, 32-pixel images, 64 for timm's ResNet), never downloaded, "
        'and runs through `torch.compile(model, backend="tpu")` against CPU eager. The forward is '
        "an inference call "
        "(`eval()`, `no_grad`); training is two steps of loss, backward and AdamW, comparing the "
        "loss, every gradient and every parameter.",
        "",
        f"- Environment: {_versions()}; JAX device `{jax.devices()[0].platform}`; "
        f"{platform.machine()} with {_cpu_count()} CPU cores (shared with other jobs, so times "
        "are indicative); torch eager runs with one intra-op thread.",
        f"- **Forward: {fwd_pass}/{len(rows)} models match eager**; "
        f"**training: {train_pass}/{len(trained)}**; "
        f"{len(fallback_models)} model(s) run some ops in torch eager (fallback).",
        f"- Report generated in {elapsed:.0f} s.",
        "",
        "## Forward and training",
        "",
        "Columns: *graphs* = graphs Dynamo captured / graphs the backend compiled (including eager-"
        "fallback islands); *breaks* = Dynamo graph breaks; *compile* = first compiled call "
        "(Dynamo + AOTAutograd + lowering + XLA), seconds; *compiled* / *eager* = steady-state "
        f"inference forward, best of {TIMING_CALLS}, ms; *speedup* = eager / compiled; *max err* = "
        "largest absolute difference of the compared outputs; *tol* = the test's atol/rtol; "
        "*(slow)* = the test runs only with `TPU_INDUCTOR_SLOW=1`; *dynamic* = under "
        "`dynamic=True` (from `benchmarks/results/dynamic.json`, [dynamic.md](dynamic.md)): eager "
        "islands, executables per new size, median first-call seconds per new size after the "
        "first, or `-` where the sweep did not run the model; *TPU compile* = compiled for TPU "
        "targets without a TPU (`JAX_PLATFORMS=cpu python -m benchmarks.tpu_models`, "
        "`benchmarks/results/tpu_models.json`): per target what compiled (`train`: forward, "
        "backward and AdamW; `fwd`: the inference forward), the largest program's HBM peak per "
        "chip, the seconds of the whole compile-only run, or what failed.",
        "",
        "| model | library | graphs | breaks | fallback ops | compile s | compiled ms | eager ms "
        "| speedup | max err | tol | forward | training | dynamic | TPU compile |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- "
        "| --- |",
    ]
    dynamic = dynamic_cells()
    tpu = tpu_cells()
    for r in rows:
        case: ModelCase = r["case"]
        f = r.get("forward")
        tol = f"{case.atol:g}/{case.rtol:g}"
        if f is None:
            cells = ["-"] * 8
        else:
            fallback = ", ".join(f"`{op}`" for op in sorted(f.fallback_ops)) or "none"
            speedup = f.eager_s / f.compiled_s if f.compiled_s else float("nan")
            cells = [
                f"{f.dynamo_graphs} / {f.backend_graphs}",
                str(f.graph_breaks),
                fallback,
                f"{f.compile_s:.1f}",
                _ms(f.compiled_s),
                _ms(f.eager_s),
                f"{speedup:.2f}x",
                f"{f.max_abs_err:.1e}",
            ]
        name = f"{case.name} (slow)" if case.slow else case.name
        training = r["training_status"]
        if case.train_slow and training != "-":
            training += " (slow)"
        lines.append(
            f"| {name} | {case.library} | "
            + " | ".join(cells)
            + f" | {tol} | {r['forward_status']} | {training} | {dynamic.get(case.name, '-')}"
            + f" | {tpu.get(case.name, '-')} |"
        )
    loose = [r["case"] for r in rows if r["case"].reason]
    if loose:
        lines += ["", "Looser tolerances:", ""]
        lines += [f"- **{c.name}** ({c.atol:g}/{c.rtol:g}): {c.reason}" for c in loose]
    trained_rows = [r for r in trained if "training" in r]
    if trained_rows:
        lines += [
            "",
            "## Training step",
            "",
            "Two steps; *graphs* counts the forward and backward graphs; *max grad err* is the "
            "largest absolute gradient difference over both steps.",
            "",
            "| model | graphs | breaks | fallback ops | first step s | max grad err | status |",
            "| --- | --- | --- | --- | --- | --- | --- |",
        ]
        for r in trained_rows:
            t = r["training"]
            fallback = ", ".join(f"`{op}`" for op in sorted(t.fallback_ops)) or "none"
            lines.append(
                f"| {r['case'].name} | {t.dynamo_graphs} / {t.backend_graphs} | {t.graph_breaks} "
                f"| {fallback} | {t.compile_s:.1f} | {t.max_abs_err:.1e} | {r['training_status']} |"
            )
    if gen_rows:
        lines += [
            "",
            "## Generation",
            "",
            f"`model.generate()` greedy, {test_generation.NEW_TOKENS} new tokens, batch 2 with a "
            'left-padded row, `cache_implementation="static"`, with `model.forward` compiled. '
            "*first* = the first `generate()` call, *again* = a second one with another prompt "
            "of the same shape; counts are Dynamo frames / Dynamo graphs / backend graphs / JAX "
            "traces compiled during that call.",
            "",
            "| model | tokens match eager | first: compiled | first s | again: compiled | again s "
            "| eager s |",
            "| --- | --- | --- | --- | --- | --- | --- |",
        ]
        for g in gen_rows:
            counts = lambda c: f"{c.frames} / {c.graphs} / {c.backend_graphs} / {c.traces}"
            lines.append(
                f"| {g['model']} | {'yes' if g['match'] else 'NO'} | {counts(g['first'])} "
                f"| {g['first_s']:.1f} | {counts(g['second'])} | {g['second_s']:.2f} "
                f"| {g['eager_s']:.2f} |"
            )
    return "\n".join(lines) + "\n"


def _cpu_count() -> int:
    import os

    return os.cpu_count() or 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", help="model names to run (output is printed)")
    args = parser.parse_args()
    cases = test_transformers.MODELS + test_diffusers.MODELS
    cases += test_grouped.model_cases() + test_flex_attention.model_cases()
    if args.only:
        cases = [c for c in cases if c.name in args.only]
    # Like tests/models/conftest.py: tiny models gain nothing from intra-op threads, and on a
    # small shared machine OpenMP barriers would dominate the eager baseline.
    torch.set_num_threads(1)
    start = time.perf_counter()
    rows = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for case in cases:
            print(f"{case.name} ...", file=sys.stderr, flush=True)
            rows.append(model_row(case))
            print(
                f"  forward {rows[-1]['forward_status']}, training {rows[-1]['training_status']}",
                file=sys.stderr,
                flush=True,
            )
        gen_rows = [] if args.only else [generation_row(m) for m in ("llama", "qwen2")]
    text = render(rows, gen_rows, time.perf_counter() - start)
    if args.only:
        print(text)
    else:
        OUT.parent.mkdir(exist_ok=True)
        OUT.write_text(text)
        print(f"wrote {OUT.relative_to(ROOT)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

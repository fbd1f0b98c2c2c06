"""Write docs/ops.md: operator coverage from the lowering registry and the conformance data.

Sources: the lowering table (``tpu_inductor.lowering.lowerings.LOWERINGS``), the decomposition table
(``tpu_inductor.capture.aot.decomposition_table()``),
``tpu_inductor/lowering/lowerings/unsupported.py``,
the OpInfo expectation file ``tests/conformance/expected_failures.py`` (kept current by
``tests/conformance/test_opinfo.py``: an entry not listed there passes), and the per-sample
results of the all-samples sweep, ``tests/conformance/all_samples.json`` (written by
``scripts/opinfo_all_samples.py --merge``).

Usage::

    python scripts/gen_ops_doc.py            # writes docs/ops.md
    python scripts/gen_ops_doc.py --check    # exits 1 if docs/ops.md is out of date
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "conformance")]  # this checkout's package

import core_aten  # noqa: E402
import opinfo_harness as H  # noqa: E402
import torch  # noqa: E402

from tpu_inductor.lowering.lowerings import LOWERINGS  # noqa: E402

OUT = ROOT / "docs" / "ops.md"


def _aten_lowered() -> int:
    """ATen overloads in the table (its other rows: higher-order ops, our own functions)."""
    return sum(1 for op in LOWERINGS if isinstance(op, torch._ops.OpOverload))


DTYPE_NAMES = list(H.DTYPES)
KIND_ORDER = (
    "lowered",
    "decomposed",
    "decomposed by tracing",
    "functionalized",
    "unsupported",
    "missing",
)


def entry_status(reason: str | None) -> str:
    """The status class of an OpInfo cell: pass, capture (aot_eager fails too) or fail."""
    if reason is None:
        return "pass"
    return "capture" if reason.startswith("capture:") else "fail"


def by_design(reason: str) -> bool:
    """Whether a failure is refused on purpose (tpu_inductor/lowering/lowerings/unsupported.py)."""
    return reason.startswith("by design:")


def opinfo_rows(op_db) -> list[tuple[str, dict[str, str | None]]]:
    """``(entry, {dtype: None (n/a) | "pass" | "skip: ..." | reason})`` for every op_db entry."""
    failures = H.load_table(H.EXPECTED_FAILURES_FILE, "EXPECTED_FAILURES")
    skipped = H.load_table(H.EXPECTED_FAILURES_FILE, "SKIPPED")
    rows = []
    for op in op_db:
        key = H.entry_key(op)
        supported = op.supported_dtypes("cpu")
        cells: dict[str, str | None] = {}
        for name, dtype in H.DTYPES.items():
            if dtype not in supported:
                cells[name] = None
            elif key in skipped and name in skipped[key][0]:
                cells[name] = "skip: " + skipped[key][1]
            else:
                row = H.expected_failure(failures, key, name)
                cells[name] = "pass" if row is None else f"{row[0]}: {row[1]}"
        rows.append((key, cells))
    return rows


def rates(rows) -> dict[str, dict[str, int]]:
    """Per dtype: entries run, skipped, capture failures, passes and by-design failures."""
    out = {}
    for name in DTYPE_NAMES:
        c = {"entries": 0, "skip": 0, "capture": 0, "pass": 0, "fail": 0, "by_design": 0}
        for _, cells in rows:
            cell = cells[name]
            if cell is None:
                continue
            c["entries"] += 1
            if cell.startswith("skip: "):
                c["skip"] += 1
            elif cell == "pass":
                c["pass"] += 1
            elif cell.startswith("capture:"):
                c["capture"] += 1
            else:
                c["fail"] += 1
                c["by_design"] += by_design(cell)
        c["capturable"] = c["entries"] - c["skip"] - c["capture"]
        out[name] = c
    return out


def pct(n: int, d: int) -> str:
    """``n/d (xx.x%)``."""
    return f"{n}/{d} ({100.0 * n / d:.1f}%)" if d else f"{n}/0"


def md_escape(text: str) -> str:
    """Text safe inside a Markdown table cell."""
    return text.replace("|", "\\|").replace("\n", " ")


def table(header: Iterable[str], rows: Iterable[Iterable[str]]) -> list[str]:
    """A Markdown table."""
    header = list(header)
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(md_escape(c) for c in row) + " |" for row in rows]
    return lines


def render() -> str:
    """The whole of docs/ops.md."""
    core = core_aten.core_aten_overloads()
    core_status = {str(op): core_aten.coverage(op) for op in core}
    kinds: dict[str, int] = {}
    for status in core_status.values():
        kind = "missing" if status is None else status.split(":")[0].split(" (")[0]
        kind = "functionalized" if kind.startswith("functionalized") else kind
        kinds[kind] = kinds.get(kind, 0) + 1
    covered = sum(s is not None for s in core_status.values())
    rows = opinfo_rows(H.load_op_db())
    stats = rates(rows)

    out = [
        "# Operator coverage",
        "",
        "Generated by `scripts/gen_ops_doc.py` from the lowering table",
        "(`tpu_inductor/lowering/lowerings/`), the decomposition table (`tpu_inductor/capture/aot.py`),",  # noqa: E501
        "`tpu_inductor/lowering/lowerings/unsupported.py` and the",
        "OpInfo conformance expectations (`tests/conformance/expected_failures.py`). Do not edit",
        "by hand: run `python scripts/gen_ops_doc.py` after regenerating the expectations with",
        "`TPU_INDUCTOR_REGEN_XFAIL=1 pytest tests/conformance/test_opinfo.py`.",
        "",
        "## Headline",
        "",
        f"- **Core ATen overloads accounted for: {covered}/{len(core)}** ("
        + ", ".join(f"{kinds[k]} {k}" for k in KIND_ORDER if k in kinds)
        + f"); {_aten_lowered()} ATen overloads have a lowering in all.",
    ]
    f32 = stats["float32"]
    out.append(
        f"- **OpInfo float32: {pct(f32['pass'], f32['capturable'])} pass** among the "
        f'{f32["capturable"]} entries that Dynamo + AOTAutograd capture (`backend="aot_eager"`)'
        f"; {f32['entries']} op_db entries support float32, {f32['capture']} fail with aot_eager "
        f"too, {f32['skip']} have no sample that runs in eager. {f32['by_design']} of the "
        "failures are ops unsupported on purpose (data-dependent shapes, `.item()`)."
    )
    for name in DTYPE_NAMES[1:]:
        s = stats[name]
        out.append(
            f"- OpInfo {name}: {pct(s['pass'], s['capturable'])} pass "
            f"({s['entries']} entries, {s['capture']} capture failures, {s['skip']} skipped)."
        )
    samples = samples_headline()
    if samples:
        out.append(samples)
    out += [
        "",
        "OpInfo runs the first sample of each entry per dtype by default "
        "(`TPU_INDUCTOR_OPINFO_SAMPLES=all` runs every sample), through "
        '`torch.compile(fn, backend="tpu", fullgraph=True, dynamic=False)` against CPU eager.',
        "",
        "## Core ATen overloads",
        "",
        "Lowered: a JAX lowering in `tpu_inductor/lowering/lowerings/`. Decomposed: AOTAutograd rewrites",  # noqa: E501
        "it into other",
        "ops. Decomposed by tracing: a CompositeImplicitAutograd op, never seen by a backend.",
        "Functionalized: an `out=` overload replaced by its functional form. Unsupported: on",
        "purpose, see `tpu_inductor/lowering/lowerings/unsupported.py` (the error message says what to do).",  # noqa: E501
        "",
    ]
    out += table(
        ["overload", "status"],
        (
            [name, "**missing**" if status is None else status]
            for name, status in sorted(core_status.items())
        ),
    )
    out += [
        "",
        "## OpInfo entries",
        "",
        "`pass`; `fail` (see the causes below); `capture` (fails with `aot_eager` too, so not",
        "counted against tpu-inductor); `skip` (no sample runs in eager); `-` (the OpInfo does",
        "not support the dtype on CPU).",
        "",
    ]

    def cell(c):
        if c is None:
            return "-"
        if c.startswith("skip: "):
            return "skip"
        return entry_status(None if c == "pass" else c)

    out += table(["entry", *DTYPE_NAMES], ([key, *map(cell, c.values())] for key, c in rows))
    out += ["", "## Failure causes", ""]
    out += [
        "From `tests/conformance/expected_failures.py`: `capture` (Dynamo/AOTAutograd cannot",
        "capture it), `by design` (refused with a fix, see `lowerings/unsupported.py`), `dtype`",
        "(no JAX dtype), `gap` (could be lowered, not yet).",
        "",
    ]
    failing = []
    for key, cells in rows:
        bad = [n for n, c in cells.items() if c not in (None, "pass") and not c.startswith("skip")]
        if bad:
            kind, cause = cells[bad[0]].split(": ", 1)
            failing.append([key, ", ".join(bad), kind, cause])
    out += table(["entry", "dtypes", "kind", "cause"], failing)
    out += all_samples_section()
    return "\n".join(out) + "\n"


def sample_counts(results: dict, dtype_names) -> dict[str, int]:
    """Sums over the sweep's (entry, dtype) cells of ``dtype_names``: entries, samples run,
    passed, silent, error and capture."""
    c = {"entries": 0, "run": 0, "pass": 0, "silent": 0, "error": 0, "capture": 0}
    for per in results.values():
        for name in dtype_names:
            cell = per.get(name)
            if cell is None or "skip" in cell:
                continue
            c["entries"] += 1
            c["run"] += cell["run"]
            c["pass"] += cell["pass"]
            for k in ("silent", "error", "capture"):
                c[k] += len(cell.get(k, ()))
    return c


def samples_headline() -> str | None:
    """The Headline's line for the all-samples sweep (see :func:`all_samples_section`)."""
    import json

    if not H.ALL_SAMPLES_FILE.exists():
        return None
    data = json.loads(H.ALL_SAMPLES_FILE.read_text())
    c = sample_counts(data["results"], DTYPE_NAMES)
    return (
        f"- **Every OpInfo sample** (the first {data['samples_per_entry']} per entry and dtype, "
        f"float32/bfloat16/int64/bool): {pct(c['pass'], c['run'] - c['capture'])} pass, "
        f"**{c['silent']} silent mismatches**, {c['error']} clear errors, {c['capture']} that "
        "`aot_eager` "
        'can\'t capture either (docs/ops.md, section "Every sample, not just the first").'
    )


def all_samples_section() -> list[str]:
    """Per-sample pass rates of the all-samples sweep, silent mismatches and clear errors."""
    import json

    out = ["", "## Every sample, not just the first", ""]
    if not H.ALL_SAMPLES_FILE.exists():
        return out + ["Not run yet: `python scripts/opinfo_all_samples.py` (see its docstring)."]
    data = json.loads(H.ALL_SAMPLES_FILE.read_text())
    results = data["results"]
    silent_causes = H.load_table(H.EXPECTED_FAILURES_FILE, "SILENT_MISMATCHES")
    sample_causes = H.load_table(H.EXPECTED_FAILURES_FILE, "SAMPLE_FAILURES")
    failures = H.load_table(H.EXPECTED_FAILURES_FILE, "EXPECTED_FAILURES")
    n = data["samples_per_entry"]
    swept, total = data.get("pairs_swept"), data.get("pairs_total")
    if swept is not None and total is not None and swept < total:
        out += [
            f"**Partial run: {swept} of {total} (entry, dtype) pairs swept so far** (the sweep "
            "takes hours on a 2-core machine; `python scripts/opinfo_all_samples.py` resumes "
            "it, `--merge` updates these figures). The figures below cover the swept pairs only.",
            "",
        ]
    out += [
        f"`scripts/opinfo_all_samples.py` compiled the first {n} samples of every op_db entry "
        "and dtype (each sample on its own, "
        '`torch.compile(fn, backend="tpu", fullgraph=True, dynamic=False)`, '
        '`fallback="error"`) and compared each with CPU eager '
        f"(torch {data['torch']}). A sample is a *silent mismatch* when the compiled function "
        "ran and gave wrong values, dtype, shape or structure; a *clear error* when it raised; "
        "*capture* when `aot_eager` raises on it too. The pass rate counts every sample but "
        "the capture failures. `tests/conformance/test_opinfo_all_samples.py` (slow) holds new "
        "runs to these results.",
        "",
    ]
    rows = []
    for name in DTYPE_NAMES:
        c = sample_counts(results, (name,))
        counted = c["run"] - c["capture"]
        rows.append(
            [
                name,
                str(c["entries"]),
                str(c["run"]),
                pct(c["pass"], counted),
                str(c["silent"]),
                str(c["error"]),
                str(c["capture"]),
            ]
        )
    out += table(
        ["dtype", "entries", "samples", "pass (of samples)", "silent", "errors", "capture"],
        rows,
    )
    silent = [
        (key, name, idx, reason)
        for key, per in sorted(results.items())
        for name, cell in per.items()
        for idx, reason in cell.get("silent", ())
    ]
    out += ["", f"### Silent mismatches: {len(silent)}", ""]
    if silent:
        out += table(
            ["entry", "dtype", "sample", "what differs", "cause"],
            (
                [k, d, str(i), r, silent_causes.get(k, ((), "**no cause recorded**"))[1]]
                for k, d, i, r in silent
            ),
        )
    else:
        out += ["None: every sample that ran either matched eager or raised a clear error."]
    out += [
        "",
        "Outside OpInfo, the scalar-operand matrix (`tests/lowering/test_scalar_operands.py`, "
        "every pointwise binary and ternary op with Python and 0-d operands on either side, "
        "every dtype) knows one class of silent mismatch, kept apart by the test: **complex "
        "results with an infinite or NaN part** (`(inf + 1j) * True`, `(x + nan j) ** 0`, "
        "`addcmul` with a complex 0-d operand and infinities; finite complex results are "
        "checked as numbers). torch's CPU kernels follow C99 Annex G's special values there; "
        "XLA computes complex arithmetic with the textbook formulas and folds `x * (1 + 0j)` "
        "to `x`. Matching them would put several selects into every complex multiply, divide "
        "and power for values no model produces on purpose; left as documented.",
    ]
    errors: dict[str, dict] = {}
    for key, per in sorted(results.items()):
        for name, cell in per.items():
            for _idx, reason in cell.get("error", ()):
                row = errors.setdefault(key, {"dtypes": [], "samples": 0, "reason": reason})
                if name not in row["dtypes"]:
                    row["dtypes"].append(name)
                row["samples"] += 1
    out += ["", f"### Clear errors: {sum(r['samples'] for r in errors.values())} samples", ""]

    def cause(key, name):
        row = H.expected_failure(failures, key, name)
        if row is not None:
            return f"{row[0]}: {row[1]}"
        if key in sample_causes:
            return sample_causes[key][1]
        return "**not listed**"

    out += table(
        ["entry", "dtypes", "samples", "first error", "cause"],
        (
            [k, ", ".join(r["dtypes"]), str(r["samples"]), r["reason"], cause(k, r["dtypes"][0])]
            for k, r in errors.items()
        ),
    )
    return out


def main(argv: list[str] | None = None) -> int:
    """Write docs/ops.md (or, with ``--check``, compare it); returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if docs/ops.md is stale")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        current = OUT.read_text() if OUT.exists() else ""
        if current != text:
            print(f"{OUT} is out of date: run python scripts/gen_ops_doc.py", file=sys.stderr)
            return 1
        return 0
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(text)
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""OpInfo conformance beyond the first sample (slow; issue 23).

``test_opinfo.py`` compares the first sample of every op_db entry and dtype. This test compares
the first ``TPU_INDUCTOR_OPINFO_SAMPLES`` (default here: 5; ``all`` for every one) of float32,
bfloat16, int64 and bool, each sample compiled on its own, and sorts every failure:

- a **silent mismatch** (the compiled function ran and gave wrong values, dtype, shape or
  structure) fails the test unless ``expected_failures.SILENT_MISMATCHES`` lists the entry with
  the cause and why it cannot be fixed (the goal is an empty table);
- a **clear error** fails the test unless the entry's first sample already fails
  (``EXPECTED_FAILURES``), ``expected_failures.SAMPLE_FAILURES`` lists it with its cause, or
  ``backend="aot_eager"`` fails on the same sample (Dynamo/AOTAutograd cannot capture it).

``scripts/opinfo_all_samples.py`` runs the same sweep resumably and records the per-sample
results that docs/ops.md reports (``scripts/gen_ops_doc.py``).
"""

from __future__ import annotations

import os

import pytest
import torch

pytest.importorskip("expecttest", reason="op_db needs expecttest: pip install 'tpu-inductor[test]'")

import opinfo_harness as H  # noqa: E402

RAW = os.environ.get("TPU_INDUCTOR_OPINFO_SAMPLES", "5").strip().lower()
SAMPLES = None if RAW == "all" else int(RAW)
OP_DB = H.load_op_db()
CASES = H.cases(OP_DB)
EXPECTED = H.load_table(H.EXPECTED_FAILURES_FILE, "EXPECTED_FAILURES")
SAMPLE_FAILURES = H.load_table(H.EXPECTED_FAILURES_FILE, "SAMPLE_FAILURES")
SILENT = H.load_table(H.EXPECTED_FAILURES_FILE, "SILENT_MISMATCHES")
TOLERANCES = H.load_table(H.TOLERANCES_FILE, "TOLERANCES")


@pytest.fixture(scope="module", autouse=True)
def _recompile_limits():
    with torch._dynamo.config.patch(recompile_limit=64, accumulated_recompile_limit=100_000):
        yield


def test_sample_tables_name_real_entries():
    """Every row of SAMPLE_FAILURES / SILENT_MISMATCHES names an entry and dtype that run, and
    says why."""
    known = {(H.entry_key(op), d) for op, d in CASES}
    for name, table in (("SAMPLE_FAILURES", SAMPLE_FAILURES), ("SILENT_MISMATCHES", SILENT)):
        for key, (dtypes, cause) in table.items():
            stale = [d for d in dtypes if (key, d) not in known]
            assert not stale, f"{name}: {key}{stale} does not run"
            assert cause.strip() and not cause.startswith("TODO"), f"{name}: {key} needs a cause"


@pytest.mark.slow
@pytest.mark.parametrize(
    ("op", "dtype_name"), CASES, ids=[f"{H.entry_key(op)}-{d}" for op, d in CASES]
)
def test_opinfo_samples(op, dtype_name):
    """The entry's first samples in one dtype: no silent mismatch, no unlisted error."""
    key = H.entry_key(op)
    tol = H.tolerance(key, dtype_name, TOLERANCES)
    results = H.run_samples(op, dtype_name, samples=SAMPLES, tol=tol)
    if isinstance(results, H.Outcome):
        pytest.skip(results.reason)
    silent = [r for r in results if r.status == "silent"]
    if silent and not (key in SILENT and dtype_name in SILENT[key][0]):
        pytest.fail(
            f"{key} [{dtype_name}]: silent mismatch on sample(s) "
            + "; ".join(f"#{r.index}: {r.reason}" for r in silent),
            pytrace=False,
        )
    errors = [r for r in results if r.status == "error"]
    listed = H.expected_failure(EXPECTED, key, dtype_name) is not None or (
        key in SAMPLE_FAILURES and dtype_name in SAMPLE_FAILURES[key][0]
    )
    if errors and not listed:
        ref = H.run_samples(op, dtype_name, backend="aot_eager", samples=SAMPLES, tol=tol)
        captured = {r.index for r in ref if r.status == "error"} if isinstance(ref, list) else set()
        ours = [r for r in errors if r.index not in captured]
        if ours:
            pytest.fail(
                f"{key} [{dtype_name}]: sample(s) raise where eager runs: "
                + "; ".join(f"#{r.index}: {r.reason}" for r in ours),
                pytrace=False,
            )

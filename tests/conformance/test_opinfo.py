"""OpInfo conformance: every ``op_db`` entry compiled with ``backend="tpu"`` against CPU eager.

For each entry and each of float32, bfloat16, int64 and bool that the OpInfo supports on CPU,
the op runs through ``torch.compile(fn, backend="tpu", fullgraph=True, dynamic=False)`` on its
first sample(s) and must match eager: structure, shapes and dtypes exactly, values within the
dtype's tolerance (overrides in ``tolerances.py``). Random ops get a statistical check instead.

Known failures are data in ``expected_failures.py``; an entry listed there that passes fails
the test, so the table cannot go stale. The int64 and bool cases are marked ``slow`` (run them,
and regenerate the table, with ``TPU_INDUCTOR_SLOW=1``). Environment variables:

- ``TPU_INDUCTOR_OPINFO_SAMPLES``: samples per entry and dtype, an integer or ``all`` (default 1).
- ``TPU_INDUCTOR_REGEN_XFAIL=1``: record the results of the entries that ran and rewrite
  ``expected_failures.py`` (entries that did not run keep their rows). Failing entries are
  rerun with ``backend="aot_eager"``; those that fail there too get the reason prefix
  ``capture:`` (Dynamo/AOTAutograd cannot handle them, so they do not count against us).

The table describes the default run (one sample per entry and dtype); more samples can find
more failures, which then show up as new failures.
"""

from __future__ import annotations

import os

import pytest
import torch

pytest.importorskip("expecttest", reason="op_db needs expecttest: pip install 'tpu-inductor[test]'")

import opinfo_harness as H  # noqa: E402  (tests/conformance is on sys.path under pytest)

REGEN = os.environ.get("TPU_INDUCTOR_REGEN_XFAIL") == "1"
SAMPLES = H.samples_per_entry()
OP_DB = H.load_op_db()
CASES = H.cases(OP_DB)
EXPECTED = H.load_table(H.EXPECTED_FAILURES_FILE, "EXPECTED_FAILURES")
TOLERANCES = H.load_table(H.TOLERANCES_FILE, "TOLERANCES")

# (key, dtype) -> Outcome, filled while the module runs; written out when REGEN is set.
RESULTS: dict[tuple[str, str], H.Outcome] = {}


@pytest.fixture(scope="module", autouse=True)
def _conformance_session():
    with torch._dynamo.config.patch(recompile_limit=64, accumulated_recompile_limit=100_000):
        yield
    if REGEN and RESULTS:
        path = H.write_expectations(RESULTS)
        print(f"\nwrote {path} ({len(RESULTS)} results)")


def test_expected_failures_name_real_entries():
    """Every row of expected_failures.py names an op_db entry and a dtype it supports."""
    known = {(H.entry_key(op), d) for op, d in CASES}
    stale = [
        f"{key}[{d}]" for key, row in EXPECTED.items() for d in row[1] if (key, d) not in known
    ]
    assert not stale, f"expected_failures.py lists entries that do not run: {stale}"
    kinds = {key: row[0] for key, row in EXPECTED.items() if row[0] not in H.KINDS}
    assert not kinds, f"expected_failures.py: kinds must be one of {H.KINDS}: {kinds}"
    placeholders = [key for key, row in EXPECTED.items() if row[2].startswith("TODO")]
    assert not placeholders, f"expected_failures.py: write the cause of {placeholders}"


def test_tolerance_overrides_have_reasons():
    """Every row of tolerances.py is (atol, rtol, reason) for a real entry and dtype."""
    known = {(H.entry_key(op), d) for op, d in CASES}
    for key, per in TOLERANCES.items():
        for d, row in per.items():
            assert (key, d) in known, f"tolerances.py: {key}[{d}] does not run"
            atol, rtol, reason = row
            assert atol >= 0 and rtol >= 0 and reason.strip(), f"tolerances.py: {key}[{d}]"


SLOW_DTYPES = ("int64", "bool")  # the default run checks float32 and bfloat16 (~11 -> ~7 min)


@pytest.mark.parametrize(
    ("op", "dtype_name"),
    [pytest.param(op, d, marks=[pytest.mark.slow] if d in SLOW_DTYPES else []) for op, d in CASES],
    ids=[f"{H.entry_key(op)}-{d}" for op, d in CASES],
)
def test_opinfo(op, dtype_name):
    """One OpInfo entry in one dtype against eager, held to expected_failures.py."""
    key = H.entry_key(op)
    tol = H.tolerance(key, dtype_name, TOLERANCES)
    outcome = H.run_entry(op, dtype_name, samples=SAMPLES, tol=tol)
    if REGEN:
        if outcome.status == "fail":
            reference = H.run_entry(op, dtype_name, backend="aot_eager", samples=SAMPLES, tol=tol)
            if reference.status == "fail":
                outcome = H.Outcome("fail", "capture: " + reference.reason)
        RESULTS[(key, dtype_name)] = outcome
    if outcome.status == "skip":
        pytest.skip(outcome.reason)
    expected = H.expected_failure(EXPECTED, key, dtype_name)
    if REGEN:
        return
    if expected is None:
        if outcome.status == "fail":
            pytest.fail(
                f"{key} [{dtype_name}]: {outcome.reason}\n(a new failure; if it is expected, "
                "add it with its cause to tests/conformance/expected_failures.py, or regenerate "
                "the table with TPU_INDUCTOR_REGEN_XFAIL=1 and write the cause)",
                pytrace=False,
            )
        return
    if outcome.status == "pass":
        pytest.fail(
            f"{key} [{dtype_name}] passes now: remove it from "
            f"tests/conformance/expected_failures.py (it was listed as {expected[0]!r}: "
            f"{expected[1]})",
            pytrace=False,
        )
    kind, cause = expected
    problem = H.kind_problem(kind, outcome.reason)
    if problem is not None:
        pytest.fail(
            f"{key} [{dtype_name}] is listed as {kind!r} ({cause}), but {problem}: "
            f"{outcome.reason}",
            pytrace=False,
        )
    pytest.xfail(f"{kind}: {cause} (error: {outcome.reason})")

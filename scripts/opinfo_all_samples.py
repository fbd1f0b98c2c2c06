"""Run OpInfo samples beyond the first through ``backend="tpu"`` and record each one's outcome.

The conformance test (``tests/conformance/test_opinfo.py``) compares the first sample per op_db
entry and dtype; this sweep compares the first ``--samples`` (default 5, or ``all``) of
float32, bfloat16, int64 and bool, and records per sample: ``pass``, ``silent`` (ran, wrong
values / dtype / shape: no error), ``error`` (raised) or ``capture`` (raised, and
``backend="aot_eager"`` raises on that sample too, so Dynamo/AOTAutograd cannot capture it).

The run is long (hours on 2 cores): it appends one JSON line per (entry, dtype) to ``--partial``
and skips the pairs already there, so it can be stopped, resumed and split into shards
(``--shard 0/2`` and ``--shard 1/2`` in two processes). ``--merge`` then writes the results
file that ``scripts/gen_ops_doc.py`` reports in docs/ops.md and that the slow test
``tests/conformance/test_opinfo_all_samples.py`` holds new results to.

Usage::

    nohup python scripts/opinfo_all_samples.py --shard 0/2 > /tmp/s0.log 2>&1 &
    nohup python scripts/opinfo_all_samples.py --shard 1/2 > /tmp/s1.log 2>&1 &
    python scripts/opinfo_all_samples.py --merge     # writes tests/conformance/all_samples.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "conformance")]  # this checkout's package

import opinfo_harness as H  # noqa: E402

PARTIAL = Path("/tmp/tpu_inductor_all_samples.jsonl")


def run_pair(op, dtype_name: str, samples: int | None, tolerances: dict) -> dict:
    """One (entry, dtype)'s record: every compared sample as ``[index, status, reason]``."""
    key = H.entry_key(op)
    tol = H.tolerance(key, dtype_name, tolerances)
    start = time.perf_counter()
    results = H.run_samples(op, dtype_name, samples=samples, tol=tol)
    record: dict = {"entry": key, "dtype": dtype_name}
    if isinstance(results, H.Outcome):
        record["skip"] = results.reason
    else:
        errors = [r.index for r in results if r.status == "error"]
        if errors:
            # Which of them Dynamo/AOTAutograd cannot capture either (aot_eager on the same
            # samples: the sample order is deterministic under the harness's manual_seed(0)).
            ref = H.run_samples(op, dtype_name, backend="aot_eager", samples=samples, tol=tol)
            ref = [] if isinstance(ref, H.Outcome) else ref
            ref_error = {r.index for r in ref if r.status == "error"}
            results = [
                H.SampleOutcome(r.index, "capture", r.reason)
                if r.status == "error" and r.index in ref_error
                else r
                for r in results
            ]
        record["samples"] = [[r.index, r.status, r.reason] for r in results]
    record["seconds"] = round(time.perf_counter() - start, 2)
    return record


def sweep(samples: int | None, shard: tuple[int, int], partial: Path, only: set[str]) -> None:
    """Run every (entry, dtype) of this shard that ``partial`` does not hold yet."""
    done = set()
    if partial.exists():
        for line in partial.read_text().splitlines():
            if line.strip():
                r = json.loads(line)
                done.add((r["entry"], r["dtype"]))
    tolerances = H.load_table(H.TOLERANCES_FILE, "TOLERANCES")
    import torch

    cases = H.cases(H.load_op_db())
    i, n = shard
    with torch._dynamo.config.patch(recompile_limit=64, accumulated_recompile_limit=100_000):
        for k, (op, dtype_name) in enumerate(cases):
            key = H.entry_key(op)
            if k % n != i or (key, dtype_name) in done or (only and key not in only):
                continue
            record = run_pair(op, dtype_name, samples, tolerances)
            with partial.open("a") as f:
                f.write(json.dumps(record) + "\n")
            bad = [s for s in record.get("samples", []) if s[1] != "pass"]
            print(f"[{k}/{len(cases)}] {key} {dtype_name} {record['seconds']}s bad={bad}")
            sys.stdout.flush()


def merge(partials: list[Path], samples: int | None, out: Path) -> None:
    """Write the results file from the partial files (later lines win)."""
    import torch

    records = {}
    for p in partials:
        for line in p.read_text().splitlines():
            if line.strip():
                r = json.loads(line)
                records[(r["entry"], r["dtype"])] = r
    results: dict[str, dict[str, dict]] = {}
    for (key, dtype_name), r in sorted(records.items()):
        if "skip" in r:
            cell = {"skip": r["skip"]}
        else:
            cell = {"run": len(r["samples"]), "pass": sum(s[1] == "pass" for s in r["samples"])}
            for status in ("silent", "error", "capture"):
                found = [[s[0], s[2]] for s in r["samples"] if s[1] == status]
                if found:
                    cell[status] = found
        results.setdefault(key, {})[dtype_name] = cell
    data = {
        "samples_per_entry": "all" if samples is None else samples,
        "pairs_swept": len(records),
        "pairs_total": len(H.cases(H.load_op_db())),
        "torch": torch.__version__.split("+")[0],
        "results": results,
    }
    out.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    print(f"wrote {out} ({len(records)} (entry, dtype) pairs)")


def main(argv: list[str] | None = None) -> int:
    """Command line: sweep a shard, or merge partial results."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", default="5", help="samples per entry and dtype, or 'all'")
    parser.add_argument("--shard", default="0/1", help="i/n: run every n-th pair from the i-th")
    parser.add_argument("--partial", type=Path, default=PARTIAL, help="JSON lines, appended")
    parser.add_argument("--only", action="append", default=[], help="run only these entries")
    parser.add_argument("--merge", nargs="*", type=Path, help="partial files to merge")
    parser.add_argument("--out", type=Path, default=H.ALL_SAMPLES_FILE)
    args = parser.parse_args(argv)
    samples = None if args.samples == "all" else int(args.samples)
    if args.merge is not None:
        merge(args.merge or [args.partial], samples, args.out)
        return 0
    i, n = (int(x) for x in args.shard.split("/"))
    sweep(samples, (i, n), args.partial, set(args.only))
    return 0


if __name__ == "__main__":
    sys.exit(main())

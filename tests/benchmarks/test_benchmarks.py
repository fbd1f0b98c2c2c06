"""Smoke tests of the benchmark suite (``benchmarks/``): it runs, and reports what it measured.

Speed is never asserted here: the numbers only have to exist, be positive and come from
outputs that match eager.
"""

from __future__ import annotations

import importlib.util
import json
import math

import pytest

from benchmarks import report, run


@pytest.mark.slow  # 183 s under load (--durations, 2-core VM): the suite's whole per-call run
def test_percall_runs_in_process_and_writes_results(tmp_path):
    rc = run.main(
        [
            "--only", "percall",
            "--sizes", "1x8",
            "--contenders", "tpu,jax,eager",
            "--in-process",
            "--target-s", "0.002",
            "--repeats", "2",
            "--out-dir", str(tmp_path),
            "--name", "smoke",
        ]
    )  # fmt: skip
    assert rc == 0
    data = json.loads((tmp_path / "smoke.json").read_text())
    assert data["machine"]["cpu_count"] >= 1
    assert data["machine"]["versions"]["torch"]
    for contender in ("tpu", "jax", "eager"):
        rows = data["percall"][contender]
        assert [r["size"] for r in rows] == ["1x8"]
        for r in rows:
            assert math.isfinite(r["us"]) and r["us"] > 0
            assert r["max_abs_err"] < 1e-5, (contender, r)
    for key in ("tpu/jax", "tpu/jax-numpy"):  # from the same-process interleaved pairing
        ratio = data["derived"]["percall"]["1x8"][key]
        assert math.isfinite(ratio) and ratio > 0
    paired = data["percall"]["tpu"][0]["paired"]
    assert paired["dlpack_max_abs_err"] < 1e-5 and paired["numpy_max_abs_err"] < 1e-5
    table = report.tables(data)
    assert "| 1x8 |" in table and "ours/hand-JAX numpy I/O" in table
    if importlib.util.find_spec("matplotlib"):
        assert (tmp_path / "smoke.png").stat().st_size > 0


def _fake_results() -> dict:
    model = {"ms": 100.0, "peak_rss_mib": 900.0, "check": {"sum": 1.0, "abs_sum": 2.0, "shape": []}}
    return {
        "quick": True,
        "date": "2026-01-01T00:00:00+00:00",
        "machine": {"cpu_count": 8, "jax_backend": "tpu", "jax_device_kind": "TPU v4",
                    "jax_device": "tpu (TPU v4)", "versions": {"torch": "2.13.0"}},
        "percall": {"tpu": [{"size": "1x64", "us": 50.0}], "jax": [{"size": "1x64", "us": 25.0}]},
        "models": {
            "llama/train": {
                "tpu": {**model, "ms": 10.0, "info": {"train_flops": 275e12 * 0.01 * 0.5}},
                "eager": model,
                "inductor": {"error": "RuntimeError: boom"},
            }
        },
        "compile": {"mlp": {"cold": {"first_result_s": 4.0}, "warm": {"first_result_s": 1.0}}},
    }  # fmt: skip


def test_ratios_and_mfu_are_derived():
    data = report.derive(_fake_results())
    assert data["derived"]["percall"]["1x64"]["tpu/jax"] == pytest.approx(2.0)
    assert data["derived"]["models"]["llama/train"]["tpu/eager"] == pytest.approx(0.1)
    assert data["derived"]["models"]["llama/train"]["agrees with eager"] == "yes"
    assert data["derived"]["compile"]["mlp"]["cold/warm"] == pytest.approx(4.0)
    mfu = data["derived"]["mfu"]
    assert mfu["peak_flops_assumed"] == 275e12
    assert mfu["mfu"] == pytest.approx(0.5)
    text = report.tables(data)
    assert "RuntimeError: boom" in text and "MFU" in text and "50.0%" in text


def test_no_mfu_on_cpu():
    data = _fake_results()
    data["machine"]["jax_backend"] = "cpu"
    assert "mfu" not in report.derive(data)["derived"]


def test_readme_block_is_replaced_between_markers(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(f"# x\n\nbefore\n{report.START}\nold numbers\n{report.END}\nafter\n")
    results = tmp_path / "r.json"
    results.write_text(json.dumps(_fake_results()))
    report.write_readme(results, readme)
    text = readme.read_text()
    assert "old numbers" not in text
    assert text.startswith("# x\n\nbefore\n") and text.endswith(f"{report.END}\nafter\n")
    assert "r.json" in text and "| 1x64 |" in text and "TPU v4" in text
    report.write_readme(results, readme)  # idempotent: one block, rewritten
    assert readme.read_text() == text


def test_readme_without_markers_is_an_error(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("# no markers\n")
    with pytest.raises(ValueError, match="perf:start"):
        report.update_readme(readme, "block")


def test_best_round_keeps_the_quietest_round_per_size():
    rounds = [
        [{"size": "1x8", "us": 30.0}, {"size": "2x16", "us": 10.0}],
        {"error": "timed out"},
        [{"size": "1x8", "us": 20.0}, {"size": "2x16", "us": 15.0}],
    ]
    best = run._best_round(rounds)
    assert [r["us"] for r in best] == [20.0, 10.0]
    assert best[0]["us_rounds"] == [30.0, 20.0]
    assert run._best_round([{"error": "x"}]) == {"error": "x"}


def test_first_step_ratios_table_and_docs_block(tmp_path):
    """benchmarks.first_step's ratios are this run's deepest over shallowest (cold) and warm
    over cold, its table says when a restart's losses differ, and --docs rewrites only the
    block between its markers."""
    from benchmarks import first_step

    stages = dict.fromkeys(first_step.STAGES, 1.0)
    rows = [
        {
            "path": "step",
            "layers": n,
            "start": start,
            "two_steps_s": s,
            "first_step_s": s / 2,
            "stages": stages,
            "same_losses": same,
        }
        for n, start, s, same in [
            (4, "cold", 10.0, None),
            (4, "warm", 2.0, True),
            (32, "cold", 30.0, None),
            (32, "warm", 3.0, False),
        ]
    ]
    got = first_step.ratios(rows)["step"]
    assert got == {"cold 32 / cold 4 layers": 3.0, "warm / cold at 32 layers": 0.1}
    record = {
        "command": "python -m benchmarks.first_step",
        "date": "d",
        "machine": {"cpus_usable": 2, "load_avg": [0.5], "jax_device": "cpu"},
        "results": {"rows": rows, "ratios": {"step": got}},
    }
    md = first_step.table(record)
    assert "| step | 32 | warm | 3.0 |" in md and md.rstrip().endswith("| 0.10x |")
    assert md.count("| NO |") == 1 and md.count("| yes |") == 1
    docs = tmp_path / "d.md"
    docs.write_text(f"head\n{first_step.MARKERS[0]}\nold\n{first_step.MARKERS[1]}\ntail\n")
    first_step.write_docs(md, docs)
    assert docs.read_text() == f"head\n{first_step.MARKERS[0]}\n{md}{first_step.MARKERS[1]}\ntail\n"

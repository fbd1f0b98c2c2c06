"""Smoke test of ``python -m benchmarks.sharding``: it runs at its smallest settings and reports.

As in tests/benchmarks/test_benchmarks.py, speed is never asserted: the numbers only have to exist,
be positive and come from training that matches eager. One subprocess per device count (1 and 2),
a tiny Llama, one step per plan, both device counts at once (~25 s).
"""

from __future__ import annotations

import importlib.util
import json
import math

from benchmarks import sharding


def test_sharding_benchmark_runs_at_1_and_2_devices(tmp_path):
    argv = [
        "--devices", "1,2", "--plans", "fsdp,tp", "--tiny", "--steps", "1", "--warmup", "0",
        "--jobs", "2", "--out-dir", str(tmp_path), "--name", "smoke", "--json-only",
    ]  # fmt: skip
    assert sharding.main(argv) == 0
    data = json.loads((tmp_path / "smoke.json").read_text())
    assert data["command"] == "python -m benchmarks.sharding " + " ".join(argv)
    assert data["date"] and data["machine"]["cpu_count"] >= 1
    rows = {(r["devices"], r["plan"]): r for r in data["results"]}
    assert set(rows) == {(1, "fsdp"), (1, "tp"), (2, "fsdp"), (2, "tp")}
    assert "skipped" in rows[1, "tp"]  # no 'model' axis on one device
    for key in ((1, "fsdp"), (2, "fsdp"), (2, "tp")):
        r = rows[key]
        assert math.isfinite(r["ms_per_step"]) and r["ms_per_step"] > 0, r
        assert r["max_abs_loss_err"] < 1e-4, r
        assert len(r["resident_bytes_per_device"]) == key[0], r
        assert r["resident_bytes_max_device"] > 0
    assert rows[2, "tp"]["mesh"] == {"data": 1, "model": 2}
    one, two = (rows[n, "fsdp"]["resident_bytes_max_device"] for n in (1, 2))
    assert two < one, "fsdp on 2 devices keeps less on each than on 1"
    # What stays on the devices is the parameters and AdamW's two moments (3x the parameter
    # bytes over all devices, sharded), not every step's outputs: JAX's cached host copy of a
    # sharded output kept its residency entry alive (boundary.jax_to_host).
    r = rows[2, "fsdp"]
    assert r["resident_bytes_total"] < 3.3 * r["param_bytes"], r
    table = sharding.table(data["results"])
    assert "| 2 | tp | data=1 x model=2 |" in table and "| 1 | tp | tp needs" in table
    if importlib.util.find_spec("matplotlib"):
        assert data["plot"] == "smoke.png" and (tmp_path / "smoke.png").stat().st_size > 0

"""A whole training step compiled for a TPU target as ONE program (``tpu_inductor.compile_step``
with ``options={"target": ...}``), and the benchmark that compares our programs with the same
models written by hand in JAX (``benchmarks/tpu_programs.py --small``)."""

from __future__ import annotations

import json

import pytest
import torch

import tpu_inductor
from tests.helpers import lm_train_step, tiny_llama

pytestmark = pytest.mark.tpu_compile


def test_compile_step_is_one_program_with_donated_state():
    model = tiny_llama()
    ids = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(0))
    opt = torch.optim.AdamW(model.parameters())

    step = tpu_inductor.compile_step(
        lm_train_step(model, opt), opt, options={"target": "v5e"}, fullgraph=True
    )
    step(ids)  # the optimizer state is made before the trace: the steady program at once
    step(ids)  # the same program again
    report = tpu_inductor.tpu_report(print_table=False)
    assert not report.failed
    assert len(report.programs) == 1, [p.name for p in report.programs]
    steady = report.programs[-1]
    # parameters, both AdamW moments and the step counters are updated in place: donated
    param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    assert steady.donated_bytes >= 3 * param_bytes
    assert steady.memory["alias"] >= 3 * param_bytes
    # one program holds the forward, the backward and the update: at least the matmul FLOPs of
    # a forward and two backward matmuls per linear layer
    tokens = ids.numel()
    linear = sum(
        2.0 * m.in_features * m.out_features * tokens
        for m in model.modules()
        if isinstance(m, torch.nn.Linear)
    )
    assert steady.total_matmul_flops >= 3 * linear


def test_benchmark_small_runs_and_reports_ratios(tmp_path):
    from benchmarks import tpu_programs

    rc = tpu_programs.main(
        [
            "--small",
            "--only", "train-f32,vit-train-bf16",
            "--contenders", "hand,ours-3prog,ours-1prog",
            "--in-process",
            "--out-dir", str(tmp_path),
            "--name", "smoke",
        ]
    )  # fmt: skip
    assert rc == 0
    data = json.loads((tmp_path / "smoke.json").read_text())
    for workload in ("train-f32", "vit-train-bf16"):
        rows = data["rows"][workload]
        assert set(rows) == {"hand", "ours-3prog", "ours-1prog"}, rows
        assert len(rows["hand"]["programs"]) == 1
        assert len(rows["ours-3prog"]["programs"]) == 3
        assert len(rows["ours-1prog"]["programs"]) == 1
        for contender in ("ours-3prog", "ours-1prog"):
            ratios = data["derived"][workload][contender]
            for key in ("bytes", "flops", "hbm_peak", "compile_cpu_s"):
                assert 0 < ratios[key] < 100, (workload, contender, key, ratios)
    assert (tmp_path / "smoke.png").stat().st_size > 0

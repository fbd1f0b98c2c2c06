"""``benchmarks/plan_real_sizes.py`` at a size CI affords: a tiny Llama-3.1-shaped model (its
config with small widths, 4 layers) with fsdp x tp on a v5p slice, compiled as one step with
``scan_layers``, read as the README's real-size table reads it."""

from __future__ import annotations

import re

import pytest

pytest.importorskip("transformers")

from benchmarks import plan_real_sizes as prs  # noqa: E402
from tpu_inductor.tpu import targets

TINY = dict(
    prs.LLAMA_3_1_8B,
    hidden_size=128,
    intermediate_size=256,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=512,
)


def test_tiny_llama_fsdp_x_tp_plan():
    row = prs.Row("tiny", "tiny", "llama", TINY, "v5p-8", {"data": 2, "model": 2}, "fsdp x tp",
                  4, 256)  # fmt: skip
    r = prs.plan_one(row, None)
    assert "failed" not in r, r
    assert r["fits"] and 0 < r["step_peak_bytes"] < r["usable_bytes"]
    # one program, the training step (graphs are numbered process-wide: earlier tests count)
    assert [re.sub(r"^graph\d+-", "", p) for p in r["programs"]] == ["training-step#0"]
    assert r["devices"] == r["chips"] == 4
    # the step's matmuls, counted per layer through the scan, are at least the model's FLOPs
    # (6 x matmul params x tokens + causal attention; the hardware adds the recomputed forward
    # and the masked half of attention) and at most twice them
    per_device = sum(r["matmul_flops"].values()) / 4
    assert r["model_flops"] / 4 < per_device < 2 * r["model_flops"] / 4
    # each device does its share of the global program's matmuls (a compute term of the whole
    # program's FLOPs on one device overstated it 4x here)
    assert r["compute_s"] == pytest.approx(per_device / targets.CHIPS["v5p"].bf16_flops)
    assert 0 < r["mfu_ceiling"] < r["hw_mfu_ceiling"] < 1
    assert r["tokens"] == 4 * 256
    assert r["tokens_per_s_per_chip"] == pytest.approx(1024 / r["roofline_s"] / 4)
    assert r["ici_s"] > 0  # fsdp's gathers and tp's all-reduces
    record = {"id": "tiny", "row": vars(row), "layers": 4, "full_depth": 4, **r}
    assert "| tiny | v5p-8 (4) | fsdp x tp | 4 | 4 x 256 | yes |" in prs.table([record])

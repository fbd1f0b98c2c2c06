"""``benchmarks/plan_real_sizes.py`` at a size CI affords: a tiny Llama-3.1-shaped model (its
config with small widths, 4 layers) with fsdp x tp on a v5p slice, compiled as one step with
``scan_layers``, read as the README's real-size table reads it."""

from __future__ import annotations

import re

import pytest

pytest.importorskip("transformers")

from benchmarks import plan_real_sizes as prs  # noqa: E402
from tpu_inductor.tpu import targets

pytestmark = pytest.mark.tpu_compile

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
    # AdamW's moments are sharded as their parameters (fsdp x tp), not by the batch axis only
    parts = dict(r["peak_parts"])
    assert parts["optimizer state and buffers"] == pytest.approx(2 * parts["parameters"], rel=0.01)
    record = {"id": "tiny", "row": vars(row), "layers": 4, "full_depth": 4, **r}
    assert "| tiny | v5p-8 (4) | fsdp x tp | 4 | 4 x 256 | yes |" in prs.table([record])


# Qwen3-30B-A3B's config with small widths: 2 layers, 8 experts (2 per token)
TINY_MOE = dict(
    prs.QWEN3_30B_A3B,
    hidden_size=128,
    intermediate_size=256,
    moe_intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    num_experts=8,
    num_experts_per_tok=2,
    vocab_size=512,
)


@pytest.mark.parametrize("form", ["2d_3d", "2d_2d", "3d_2d"])
def test_bf16_grouped_mm_compiles_at_highest_precision(form):
    """A bfloat16 ``torch._grouped_mm`` (forward and backward) compiles for v5p under the default
    "highest" matmul precision: libtpu's Mosaic ragged-dot kernel refused bfloat16 operands at
    ``Precision.HIGHEST`` ("Bad lhs type"), which refused every bfloat16 MoE training step
    (each form's forward or backward holds the ragged-M product that the kernel refused)."""
    import torch

    from tpu_inductor.tpu import programs

    g, m, k, n = 8, 256, 128, 128
    shapes = {"2d_3d": ((m, k), (g, k, n)), "2d_2d": ((k, m), (m, n)), "3d_2d": ((g, n, k), (k, m))}
    sa, sb = shapes[form]
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(sa, generator=gen).to(torch.bfloat16).requires_grad_()
    b = torch.randn(sb, generator=gen).to(torch.bfloat16).requires_grad_()
    offs = torch.arange(1, g + 1, dtype=torch.int32) * (m // g)
    before = len(programs.PROGRAMS)
    fn = torch.compile(
        lambda a, b: torch._grouped_mm(a, b, offs=offs), backend="tpu", options={"target": "v5p"}
    )
    out = fn(a, b)
    out.float().sum().backward()
    expected = torch._grouped_mm(a.detach(), b.detach(), offs=offs)
    assert out.shape == expected.shape and out.dtype == torch.bfloat16
    new = programs.PROGRAMS[before:]
    assert {p.role for p in new} == {"forward", "backward"}
    assert all(p.compiled for p in new), [p.error for p in new]


def test_tiny_qwen3_moe_fsdp_plan():
    """A Qwen3-MoE training step (bfloat16, meta model, AdamW, full checkpointing, scan_layers)
    compiles for v5p with fsdp, read as the real-size table reads it."""
    row = prs.Row("tiny-moe", "tiny-moe", "qwen3_moe", TINY_MOE, "v5p-8", {"data": 4}, "fsdp",
                  4, 128)  # fmt: skip
    r = prs.plan_one(row, None)
    assert "failed" not in r, r
    assert r["error"] is None
    assert r["fits"] and 0 < r["step_peak_bytes"] < r["usable_bytes"]
    assert [re.sub(r"^graph\d+-", "", p) for p in r["programs"]] == ["training-step#0"]
    assert r["devices"] == r["chips"] == 4
    # the experts' ragged dots are in the jaxpr's matmul count: at least the model's FLOPs
    # (6 x the matmul parameters a token passes through x tokens + causal attention)
    per_device = sum(r["matmul_flops"].values()) / 4
    assert r["model_flops"] / 4 < per_device < 3 * r["model_flops"] / 4
    assert 0 < r["mfu_ceiling"] < r["hw_mfu_ceiling"] <= 1
    assert r["tokens_per_s_per_chip"] == pytest.approx(4 * 128 / r["roofline_s"] / 4)

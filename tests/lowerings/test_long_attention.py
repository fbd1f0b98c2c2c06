"""SDPA's long-sequence forms (``lowerings/long_attention.py``), run on the CPU against eager.

On a TPU, SDPA over 1024+ query rows takes splash attention (no mask tensor, or a boolean one
shared by the heads) or the blockwise form (any other mask), forward and backward. Here the
same lowerings run on the CPU: splash in Pallas interpret mode, the blockwise form by adding the
CPU to its platforms, both with ``long_attention_min_length`` lowered so that small shapes take
them. Every case is compared with eager's output and gradients."""

from __future__ import annotations

import logging

import pytest
import torch
import torch.nn.functional as F

import tpu_inductor
from tpu_inductor.lowering.lowerings import long_attention

B, H, HKV, L, E = 2, 4, 2, 256, 32


@pytest.fixture
def form(request, monkeypatch, caplog):
    """``"splash"`` (interpret mode) or ``"blockwise"`` on the CPU, at 256 query rows."""
    monkeypatch.setattr(long_attention, "CHUNKS", (128,))
    if request.param == "splash":
        knobs = {"splash_attention": "interpret"}
    else:
        knobs = {"long_attention_platforms": ("tpu", "cpu"), "splash_attention": "off"}
    caplog.set_level(logging.DEBUG, logger="tpu_inductor")
    tpu_inductor.reset()
    torch._dynamo.reset()
    with tpu_inductor.config.patch(long_attention_min_length=256, **knobs):
        yield request.param
    tpu_inductor.reset()
    torch._dynamo.reset()


def sdpa(q, k, v, mask, causal):
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, is_causal=causal, enable_gqa=True
    )


def _mask(kind: str):
    if kind == "bool":  # shared by the heads, one per sequence (as transformers makes it)
        m = torch.rand(B, 1, L, L) > 0.3
        m[1, :, :3] = False  # rows that see nothing: 0 out, no gradient
        return m
    if kind == "float":  # a bias per head
        return torch.randn(1, H, L, L)
    return None


CASES = [  # (mask, is_causal, the form it takes on splash's side)
    (None, True, "splash"),
    (None, False, "splash"),
    ("bool", False, "splash"),
    ("float", False, "blockwise"),
]


@pytest.mark.parametrize("form", ["splash", "blockwise"], indirect=True)
@pytest.mark.parametrize("mask_kind, causal, on_splash", CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_long_sdpa_matches_eager(form, mask_kind, causal, on_splash, dtype, caplog):
    torch.manual_seed(0)
    q = torch.randn(B, H, L, E, dtype=dtype, requires_grad=True)
    k = torch.randn(B, HKV, L, E, dtype=dtype, requires_grad=True)
    v = torch.randn(B, HKV, L, E, dtype=dtype, requires_grad=True)
    mask = _mask(mask_kind)
    out = torch.compile(sdpa, backend="tpu")(q, k, v, mask, causal)
    grad = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), grad)
    ref = sdpa(q, k, v, mask, causal)
    ref_grads = torch.autograd.grad(ref, (q, k, v), grad)
    tol = dict(atol=2e-2, rtol=2e-2) if dtype == torch.bfloat16 else dict(atol=1e-5, rtol=1e-5)
    assert out.dtype == ref.dtype and out.shape == ref.shape
    torch.testing.assert_close(out.nan_to_num(), ref.nan_to_num(), **tol)
    for g, r in zip(grads, ref_grads, strict=True):
        assert g.dtype == r.dtype and g.shape == r.shape
        torch.testing.assert_close(g.nan_to_num(), r.nan_to_num(), **tol)
    expect = on_splash if form == "splash" else "blockwise"
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("sdpa:")]
    assert said and all(f"sdpa: {expect} attention" in m for m in said), said


def test_short_sequences_and_the_cpu_keep_the_dense_form(caplog):
    """Below long_attention_min_length, or on a platform outside long_attention_platforms, SDPA
    keeps its dense form."""
    caplog.set_level(logging.DEBUG, logger="tpu_inductor")
    tpu_inductor.reset()
    torch._dynamo.reset()
    q = torch.randn(1, 2, 2048, 16)
    out = torch.compile(sdpa, backend="tpu")(q, q, q, None, True)
    torch.testing.assert_close(out, sdpa(q, q, q, None, True), atol=1e-5, rtol=1e-5)
    assert not [r for r in caplog.records if r.getMessage().startswith("sdpa:")]
    assert long_attention.plan("cpu", q, q, q, None, 0.0) is None
    assert long_attention.plan("tpu", q[:, :, :512], q, q, None, 0.0) is None  # too short

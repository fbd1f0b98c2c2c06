"""flex_attention's TPU path, splash attention, run in Pallas interpret mode on CPU.

``tpu_inductor.config.patch(splash_attention="interpret")`` forces the kernel
(``interpret=True``) on any device. Every splash case runs forward and backward (with a
logsumexp gradient) and is compared with the float64 dense reference of
``tests/lowerings/test_flex_attention.py`` and with torch's eager flex forward; the DEBUG log of
the lowering says which path each call took. Sizes are the smallest splash takes with more than
one block per axis (sequence 256 in blocks of 128).
"""

from __future__ import annotations

import logging

import jax.numpy as jnp
import numpy as np
import pytest
import torch
from torch.nn.attention.flex_attention import (
    BlockMask,
    create_block_mask,
    flex_attention,
    noop_mask,
)

import tpu_inductor
from tests.helpers import compiled
from tests.lowerings.test_flex_attention import dense_reference
from tpu_inductor.lowering.lowerings import splash_attention

pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")

B, H, S, D = 2, 4, 256, 64
TOL = {"atol": 2e-5, "rtol": 1e-4}
BF16_TOL = {"atol": 3e-2, "rtol": 3e-2}


@pytest.fixture
def interpret():
    with tpu_inductor.config.patch(splash_attention="interpret"):
        yield


@pytest.fixture
def decisions(caplog):
    """The lowering's path decisions logged so far (one per flex_attention(_backward) traced)."""
    caplog.set_level(logging.DEBUG, logger="tpu_inductor")
    return lambda: [r.getMessage() for r in caplog.records if "flex_attention" in r.getMessage()]


def causal(b, h, q, kv):
    return q >= kv


def sliding_window(b, h, q, kv):
    return (q >= kv) & (q - kv <= 40)


def per_head_empty_rows(b, h, q, kv):
    # head h: rows below 64 * h see nothing (row 0 always); heads 2 and 3 a whole q block
    return (q >= 64 * h) & (kv < q)


def soft_cap(score, b, h, q, kv):
    return 20.0 * torch.tanh(score / 20.0)


# per-batch documents: batch 0 splits at 100, batch 1 at 30 and 200
DOCS = torch.tensor([[0] * 100 + [1] * 156, [0] * 30 + [1] * 170 + [2] * 56])


def documents(b, h, q, kv):
    return (DOCS[b, q] == DOCS[b, kv]) & (q >= kv)


class Case:
    """One flex call; ``batch``/``heads``: the block mask's (None: one for all, as flex's
    default; a mask_mod that reads b or h needs its own, or its blocks are head 0's)."""

    def __init__(self, name, mask, expect, score=None, kv_heads=H, dtype=torch.float32, **bm):
        self.name, self.mask, self.expect, self.score = name, mask, expect, score
        self.kv_heads, self.dtype = kv_heads, dtype
        self.batch, self.heads = bm.get("batch"), bm.get("heads")


def close(actual, expected, tol, what):
    torch.testing.assert_close(actual, expected, **tol, msg=lambda e: f"{what}: {e}")


def run_splash(cases, decisions):
    """All cases in one compiled graph: out and lse, backward through both; each must have
    taken splash (forward and backward) with its ``expect``ed mask form, and match the float64
    reference (values and the grads of q, k, v) and torch's eager forward."""
    torch.manual_seed(0)
    inputs, calls = [], []
    for c in cases:
        shapes = (B, H, S, D), (B, c.kv_heads, S, D), (B, c.kv_heads, S, D)
        inputs += [torch.randn(*s, dtype=c.dtype, requires_grad=True) for s in shapes]
        bm = create_block_mask(c.mask, c.batch, c.heads, S, S, device="cpu")
        calls.append((c.score, bm, c.kv_heads != H))

    def fn(*qkv):
        return [
            flex_attention(
                *qkv[3 * i : 3 * i + 3],
                score_mod=score,
                block_mask=bm,
                enable_gqa=gqa,
                return_lse=True,
            )
            for i, (score, bm, gqa) in enumerate(calls)
        ]

    results = compiled(fn)(*inputs)
    weights = [(torch.randn(B, H, S, D).double(), torch.randn(B, H, S).double()) for _ in cases]
    loss = sum(
        (o.double() * w).sum() + (lse.double() * wl).sum()
        for (o, lse), (w, wl) in zip(results, weights, strict=True)
    )
    loss.backward()

    logged = decisions()
    for c in cases:
        for kind in ("flex_attention: splash", "flex_attention backward: splash"):
            assert any(m.startswith(kind) and c.expect in m for m in logged), (c.name, logged)
    assert not any("dense" in m for m in logged), logged

    for i, (c, (out, lse), (w, wl)) in enumerate(zip(cases, results, weights, strict=True)):
        tol = TOL if c.dtype == torch.float32 else BF16_TOL
        qkv = inputs[3 * i : 3 * i + 3]
        ref_qkv = [t.detach().double().requires_grad_() for t in qkv]
        ref_out, ref_lse = dense_reference(*ref_qkv, c.score, c.mask)
        ((ref_out * w).sum() + (ref_lse * wl).sum()).backward()
        assert out.dtype == c.dtype and lse.dtype == torch.float32, c.name
        close(out.double(), ref_out.detach(), tol, f"{c.name}: out")
        close(lse.double(), ref_lse.detach(), tol, f"{c.name}: lse")
        for name, got, ref in zip("qkv", qkv, ref_qkv, strict=True):
            close(got.grad.double(), ref.grad, tol, f"{c.name}: grad of {name}")
        eager_out, eager_lse = flex_attention(
            *(t.detach() for t in qkv),
            score_mod=c.score,
            block_mask=calls[i][1],
            enable_gqa=calls[i][2],
            return_lse=True,
        )
        close(out, eager_out, tol, f"{c.name}: vs eager")
        close(lse, eager_lse, tol, f"{c.name}: lse vs eager")
    return results


def test_static_masks_causal_sliding_window_and_empty_rows(interpret, decisions):
    run_splash(
        [
            Case("causal", causal, "static causal mask"),
            Case("sliding_window_gqa_softcap", sliding_window, "static local(40, 0)", soft_cap, 2),
            Case("per_head_empty_rows", per_head_empty_rows, "numpy mask", heads=H),
        ],
        decisions,
    )


def test_dynamic_document_mask_gqa_and_bfloat16(interpret, decisions):
    # DOCS is a graph input, so mask_mod is known only per call: the dense visibility is built
    # in the graph and splash gets it as an array, one kernel per batch element
    run_splash(
        [
            Case("documents_gqa", documents, "dynamic mask", kv_heads=2, batch=B),
            Case("causal_bf16_mqa", causal, "static causal", soft_cap, 1, torch.bfloat16),
        ],
        decisions,
    )


def test_dense_path_is_chosen_on_cpu_by_default(decisions):
    assert tpu_inductor.config.get("splash_attention") == "auto"
    q, k, v = (torch.randn(1, 2, S, D) for _ in range(3))
    bm = create_block_mask(causal, None, None, S, S, device="cpu")
    out = compiled(lambda q, k, v: flex_attention(q, k, v, block_mask=bm))(q, k, v)
    ref, _ = dense_reference(q, k, v, mask_mod=causal)
    torch.testing.assert_close(out.double(), ref, **TOL)
    logged = decisions()
    assert logged and all("dense" in m for m in logged), logged


def alibi(score, b, h, q, kv):
    return score + (kv - q).to(score.dtype) * 0.1


def test_what_splash_cannot_take_falls_back_to_dense(interpret, decisions):
    q, k, v = (torch.randn(1, 2, S, D) for _ in range(3))
    bm = create_block_mask(causal, None, None, S, S, device="cpu")
    out = compiled(lambda q, k, v: flex_attention(q, k, v, score_mod=alibi, block_mask=bm))(q, k, v)
    ref, _ = dense_reference(q, k, v, alibi, causal)
    torch.testing.assert_close(out.double(), ref, **TOL)
    assert any("dense: score_mod is neither" in m for m in decisions()), decisions()

    short = [t[:, :, :24] for t in (q, k, v)]  # not a multiple of 128
    out = compiled(lambda q, k, v: flex_attention(q, k, v))(*short)
    torch.testing.assert_close(out.double(), dense_reference(*short)[0], **TOL)
    assert any("not multiples of 128" in m for m in decisions()), decisions()


def test_block_tensors_are_honoured_or_flagged(interpret, decisions):
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, S, D) for _ in range(3))
    # no block_mask: flex's one-block mask over a noop mask_mod is a static full mask
    out = compiled(lambda q, k, v: flex_attention(q, k, v))(q, k, v)
    torch.testing.assert_close(out.double(), dense_reference(q, k, v)[0], **TOL)
    assert any("splash attention (static full mask" in m for m in decisions()), decisions()
    diag = torch.tensor([[0, 1], [1, 0]]).view(1, 1, 2, 2).int()
    one = torch.ones(1, 1, 2, dtype=torch.int32)
    # only the two diagonal 128-blocks, as partial blocks: with mask_mod=noop_mask the blocks
    # are the whole mask, so splash gets the dense visibility (dynamic form): exact
    blocks = BlockMask.from_kv_blocks(one, diag, BLOCK_SIZE=128, mask_mod=noop_mask)
    torch._dynamo.reset()
    out = compiled(lambda q, k, v: flex_attention(q, k, v, block_mask=blocks))(q, k, v)
    ref, _ = dense_reference(q, k, v, mask_mod=lambda b, h, m, n: m // 128 == n // 128)
    torch.testing.assert_close(out.double(), ref, **TOL)
    assert any("splash attention (dynamic mask" in m for m in decisions()), decisions()
    # the same blocks with a causal mask_mod drop the causal block below the diagonal, which the
    # static causal kernel would attend to: the graph's check of the block tensors gives NaN
    torch._dynamo.reset()
    bad = BlockMask.from_kv_blocks(one, diag, BLOCK_SIZE=128, mask_mod=causal)
    out = compiled(lambda q, k, v: flex_attention(q, k, v, block_mask=bad))(q, k, v)
    assert any("block tensors checked in graph" in m for m in decisions()), decisions()
    assert torch.isnan(out).all()


def block_matrix(num, indices):
    dense = torch.zeros(num.shape[-1], indices.shape[-1], dtype=torch.bool)
    for row in range(num.shape[-1]):
        dense[row, indices[0, 0, row, : num[0, 0, row]]] = True
    return dense


def test_blocks_of_one_head_under_a_per_head_mask_are_read_as_the_kernels_read_them(
    interpret, decisions
):
    # create_block_mask(H=None) builds head 0's blocks; heads 2 and 3 see less than head 0, so
    # a block full for head 0 is not for them. Torch's kernels (and the dense lowering) read the
    # blocks as they are: such a call takes the dynamic form, not the static one's NaN.
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, H, S, D) for _ in range(3))
    bm = create_block_mask(per_head_empty_rows, None, None, S, S, device="cpu")
    partial = block_matrix(bm.kv_num_blocks, bm.kv_indices)
    full = block_matrix(bm.full_kv_num_blocks, bm.full_kv_indices)

    def as_read(b, h, m, n):
        return (partial[m // 128, n // 128] & per_head_empty_rows(b, h, m, n)) | full[
            m // 128, n // 128
        ]

    out = compiled(lambda q, k, v: flex_attention(q, k, v, block_mask=bm))(q, k, v)
    torch.testing.assert_close(out.double(), dense_reference(q, k, v, None, as_read)[0], **TOL)
    assert any("splash attention (dynamic mask" in m for m in decisions()), decisions()


def test_block_check_rule():
    # _blocks_agree on concrete tensors: 2 x 2 blocks of 128 over a causal mask_mod
    from tpu_inductor.lowering.lowerings.flex_attention import _block_layout, _blocks_agree

    static = np.tril(np.ones((S, S), np.bool_))[None]

    def agree(num, idx, full_num=None, full_idx=None):
        t = lambda x: None if x is None else jnp.asarray(x, jnp.int32).reshape(1, 1, *np.shape(x))
        bm = (S, S, t(num), t(idx), t(full_num), t(full_idx), 128, 128, causal)
        return bool(_blocks_agree(bm, static, *_block_layout(bm, S, S)))

    assert agree([1, 1], [[0, 1], [1, 0]], [0, 1], [[1, 0], [0, 1]])  # create_block_mask's
    assert agree([1, 2], [[0, 1], [0, 1]])  # the full block listed as partial: same result
    assert agree([2, 2], [[0, 1], [0, 1]])  # an empty block listed as partial: nothing seen
    assert not agree([1, 1], [[0, 1], [1, 0]])  # block (1, 0) dropped
    assert not agree([1, 1], [[0, 1], [1, 0]], [1, 1], [[1, 0], [0, 1]])  # (0, 1) called full


def test_platform_dependent_picks_dense_when_lowering_for_cpu(monkeypatch, decisions):
    # a lowering that does not know its platform, on a host with a TPU: both branches are traced
    # (splash with interpret=False included) and XLA lowers only the one for its platform
    monkeypatch.setattr(splash_attention, "mode", lambda platform: ("platform_dependent", ""))
    q, k, v = (torch.randn(1, 2, S, D) for _ in range(3))
    bm = create_block_mask(causal, None, None, S, S, device="cpu")
    out = compiled(lambda q, k, v: flex_attention(q, k, v, block_mask=bm))(q, k, v)
    torch.testing.assert_close(out.double(), dense_reference(q, k, v, mask_mod=causal)[0], **TOL)
    assert any("platform_dependent)" in m for m in decisions()), decisions()

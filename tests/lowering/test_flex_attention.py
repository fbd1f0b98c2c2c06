"""FlexAttention (``torch.nn.attention.flex_attention``) compiled with backend="tpu".

Every case runs forward and backward through the backend (torch has no CPU backward for flex
attention) and is compared with a dense float64 reference built from the same score_mod /
mask_mod definitions: softmax of the masked, modified scores, evaluated on broadcast index grids.
"""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from torch.nn.attention.flex_attention import (
    BlockMask,
    create_block_mask,
    flex_attention,
    noop_mask,
)

import tpu_inductor
from tests.helpers import compiled, tiny_llama
from tpu_inductor.lowering.lowerings import LOWERINGS

B, H, S, D = 2, 4, 24, 8
TOL = {"atol": 2e-5, "rtol": 1e-4}


def dense_reference(q, k, v, score_mod=None, mask_mod=None, scale=None):
    """``(out, lse)`` in float64: the mods called once on broadcast ``[B, H, M, N]`` grids."""
    q, k, v = q.double(), k.double(), v.double()
    if k.size(1) != q.size(1):
        k = k.repeat_interleave(q.size(1) // k.size(1), dim=1)
        v = v.repeat_interleave(q.size(1) // v.size(1), dim=1)
    Bq, Hq, M, N = q.size(0), q.size(1), q.size(2), k.size(2)
    b = torch.arange(Bq).view(-1, 1, 1, 1)
    h = torch.arange(Hq).view(1, -1, 1, 1)
    m = torch.arange(M).view(1, 1, -1, 1)
    n = torch.arange(N).view(1, 1, 1, -1)
    scores = q @ k.transpose(-1, -2) * (scale if scale is not None else q.size(-1) ** -0.5)
    if score_mod is not None:
        scores = score_mod(scores, b, h, m, n)
    if mask_mod is not None:
        keep = torch.broadcast_to(mask_mod(b, h, m, n), scores.shape)
        scores = scores.masked_fill(~keep, -math.inf)
    lse = torch.logsumexp(scores, dim=-1)
    probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # fully masked rows: 0
    return probs @ v, lse


def leaves(*shapes, dtype=torch.float32):
    return [torch.randn(*s, dtype=dtype, requires_grad=True) for s in shapes]


class Case:
    """One flex attention call: ``make_score(*params)`` / ``make_mask(*params)`` build the mods
    from the tensors they capture (``params``: learnable ones get grads)."""

    def __init__(self, name, make_score=None, make_mask=None, params=(), kv_heads=H):
        self.name, self.make_score, self.make_mask = name, make_score, make_mask
        self.params, self.kv_heads = params, kv_heads


def run_cases(*cases, dtype=torch.float32, block=8):
    """Compile all cases' flex attentions (out and lse) in one graph, backprop through all;
    compare values and the grads of q, k, v and every case's params with the float64
    reference. Returns the outputs."""
    torch.manual_seed(0)
    inputs, calls = [], []
    for c in cases:
        q, k, v = leaves((B, H, S, D), (B, c.kv_heads, S, D), (B, c.kv_heads, S, D), dtype=dtype)
        mask = c.make_mask(*c.params) if c.make_mask else None
        block_mask = (
            create_block_mask(mask, B, None, S, S, device="cpu", BLOCK_SIZE=block) if mask else None
        )
        score = c.make_score(*c.params) if c.make_score else None
        inputs += [q, k, v]
        calls.append((score, block_mask, c.kv_heads != H))

    def fn(*qkv):
        return [
            flex_attention(
                *qkv[3 * i : 3 * i + 3],
                score_mod=score,
                block_mask=block_mask,
                enable_gqa=gqa,
                return_lse=True,
            )
            for i, (score, block_mask, gqa) in enumerate(calls)
        ]

    with warnings.catch_warnings():
        warnings.simplefilter("error", tpu_inductor.FallbackWarning)
        results = compiled(fn)(*inputs)
    loss, ref_loss, refs = 0.0, 0.0, []
    for i, (c, (out, lse)) in enumerate(zip(cases, results, strict=True)):
        assert out.dtype == dtype and lse.dtype == torch.float32, c.name
        w_out, w_lse = torch.randn_like(out, dtype=torch.float64), torch.randn(B, H, S).double()
        loss = loss + (out.double() * w_out).sum() + (lse.double() * w_lse).sum()
        ref_leaves = [t.detach().double().requires_grad_() for t in inputs[3 * i : 3 * i + 3]]
        ref_params = [
            p.detach().double().requires_grad_() if p.is_floating_point() else p for p in c.params
        ]
        ref_out, ref_lse = dense_reference(
            *ref_leaves,
            c.make_score(*ref_params) if c.make_score else None,
            c.make_mask(*ref_params) if c.make_mask else None,
        )
        ref_loss = ref_loss + (ref_out * w_out).sum() + (ref_lse * w_lse).sum()
        got_leaves = inputs[3 * i : 3 * i + 3]
        refs.append((c, out, lse, ref_out, ref_lse, got_leaves, ref_leaves, ref_params))
    loss.backward()
    ref_loss.backward()
    tol = TOL if dtype == torch.float32 else {"atol": 3e-2, "rtol": 3e-2}
    for c, out, lse, ref_out, ref_lse, got_leaves, ref_leaves, ref_params in refs:
        torch.testing.assert_close(out.double(), ref_out.detach(), **tol, msg=f"{c.name}: out")
        torch.testing.assert_close(lse.double(), ref_lse.detach(), **tol, msg=f"{c.name}: lse")
        names = ["q", "k", "v"] + [f"param {j}" for j in range(len(c.params))]
        for name, got, ref in zip(
            names, (*got_leaves, *c.params), (*ref_leaves, *ref_params), strict=True
        ):
            if not got.is_floating_point():  # document ids
                continue
            assert got.grad is not None, f"{c.name}: no grad for {name}"
            torch.testing.assert_close(
                got.grad.double(), ref.grad, **tol, msg=f"{c.name}: grad of {name}"
            )
    return [out for out, _ in results]


def causal(b, h, q, kv):
    return q >= kv


def sliding_window(b, h, q, kv):
    return (q >= kv) & (q - kv <= 5)


def prefix_lm(b, h, q, kv):
    return (kv < 7) | (q >= kv)


def soft_cap(score, b, h, q, kv):
    return 3.0 * torch.tanh(score / 3.0)


def alibi(score, b, h, q, kv):
    slope = torch.exp2(-(h + 1).to(torch.float32) * 8.0 / H)
    return score + slope.to(score.dtype) * (kv - q).to(score.dtype)


def document_mask(doc):
    return lambda b, h, q, kv: (doc[q] == doc[kv]) & (q >= kv)


DOCS = torch.tensor([0] * 5 + [1] * 9 + [2] * 3 + [3] * 7)


def empty_rows(b, h, q, kv):
    return (q >= 4) & (kv < q)  # rows 0-3 see nothing: torch gives out 0, lse -inf, grad 0


def test_masks():
    outs = run_cases(
        Case("causal", None, lambda: causal),
        Case("sliding_window", None, lambda: sliding_window),
        Case("prefix_lm", None, lambda: prefix_lm),
        Case("document", None, document_mask, params=(DOCS,)),
        Case("empty_rows", None, lambda: empty_rows),
    )
    assert (outs[-1][:, :, :4] == 0).all()


def test_score_mods():
    # a captured [H, S, S] bias and a relative-position table indexed by q - kv, both learnable
    bias = torch.randn(H, S, S, requires_grad=True)
    rel = torch.randn(2 * S - 1, requires_grad=True)

    def biased(bias, rel):
        return lambda s, b, h, q, kv: s + bias[h, q, kv] + rel[q - kv + S - 1]

    run_cases(
        Case("softcap_no_block_mask", lambda: soft_cap),
        Case("alibi_prefix_lm", lambda: alibi, lambda: prefix_lm),
        Case("learnable_bias", biased, lambda bias, rel: causal, params=(bias, rel)),
        Case("gqa_softcap_window", lambda: soft_cap, lambda: sliding_window, kv_heads=2),
    )


def test_bfloat16_matches_reference_and_eager_flex():
    (out,) = run_cases(Case("bf16", lambda: soft_cap, lambda: causal), dtype=torch.bfloat16)
    # torch's eager CPU flex (forward only, no grad) computes the same way: f32 scores.
    torch.manual_seed(0)
    q, k, v = (t.detach() for t in leaves((B, H, S, D), (B, H, S, D), (B, H, S, D)))
    q, k, v = q.bfloat16(), k.bfloat16(), v.bfloat16()
    bm = create_block_mask(causal, B, None, S, S, device="cpu", BLOCK_SIZE=8)
    eager = flex_attention(q, k, v, score_mod=soft_cap, block_mask=bm)
    torch.testing.assert_close(out.detach(), eager, atol=1e-2, rtol=1e-2)


def test_block_sparse_tensors_are_honoured():
    # A BlockMask given only by its blocks (mask_mod is noop): block-causal at 8 x 8 blocks,
    # the diagonal blocks "partial" with a causal mask_mod, the ones below it "full".
    torch.manual_seed(0)
    nb = S // 8
    rows = torch.arange(nb)
    kv_num = (rows + 0).view(1, 1, nb).int()  # full blocks below the diagonal
    full_idx = torch.arange(nb).expand(nb, nb).contiguous().view(1, 1, nb, nb).int()
    part_num = torch.ones(1, 1, nb, dtype=torch.int32)
    part_idx = torch.arange(nb).view(nb, 1).expand(nb, nb).contiguous().view(1, 1, nb, nb).int()
    bm = BlockMask.from_kv_blocks(
        part_num, part_idx, kv_num, full_idx, BLOCK_SIZE=8, mask_mod=causal
    )
    q, k, v = leaves((B, H, S, D), (B, H, S, D), (B, H, S, D))
    out = compiled(lambda q, k, v: flex_attention(q, k, v, block_mask=bm))(q, k, v)
    ref, _ = dense_reference(q, k, v, mask_mod=causal)
    torch.testing.assert_close(out.double(), ref, **TOL)
    # the same blocks with a noop mask_mod: whole diagonal blocks are visible, as the kernels
    # read them (torch's dense CPU path would ignore the blocks and attend everywhere)
    bm_blocks = BlockMask.from_kv_blocks(
        part_num, part_idx, kv_num, full_idx, BLOCK_SIZE=8, mask_mod=noop_mask
    )
    torch._dynamo.reset()
    out = compiled(lambda q, k, v: flex_attention(q, k, v, block_mask=bm_blocks))(q, k, v)
    ref, _ = dense_reference(q, k, v, mask_mod=lambda b, h, m, n: m // 8 >= n // 8)
    torch.testing.assert_close(out.double(), ref, **TOL)


def capped(cap):
    return lambda s, b, h, m, n: cap * torch.tanh(s / cap)


def test_score_mods_differing_only_in_a_constant_do_not_share_a_cache_entry():
    # same graph code, same shapes: only the score_mod subgraph's constant differs
    q, k, v = (t.detach() for t in leaves((1, 2, 16, 8), (1, 2, 16, 8), (1, 2, 16, 8)))
    outs = []
    for cap in (0.1, 50.0):
        torch._dynamo.reset()
        score = capped(cap)
        outs.append(
            compiled(lambda q, k, v, s=score: flex_attention(q, k, v, score_mod=s))(q, k, v)
        )
        ref, _ = dense_reference(q, k, v, score_mod=score)
        torch.testing.assert_close(outs[-1].double(), ref, **TOL)
    assert not torch.allclose(outs[0], outs[1])


def test_score_mod_op_without_lowering_names_it(monkeypatch):
    monkeypatch.delitem(LOWERINGS, torch.ops.aten.tanh.default)
    q, k, v = leaves((1, 2, 16, 8), (1, 2, 16, 8), (1, 2, 16, 8))
    with pytest.raises(tpu_inductor.TpuInductorError, match=r"score_mod[\s\S]*(aten|prims)\.tanh"):
        compiled(lambda q, k, v: flex_attention(q, k, v, score_mod=soft_cap))(q, k, v)


def test_eager_cpu_backward_is_still_refused():
    # the relaxed device check applies only while Dynamo traces
    q, k, v = leaves((1, 2, 16, 8), (1, 2, 16, 8), (1, 2, 16, 8))
    with pytest.raises(NotImplementedError, match="backward on CPU"):
        flex_attention(q, k, v)


def test_transformers_llama_flex_attention_matches_eager():
    flex = tiny_llama("flex_attention", vocab_size=64)
    eager = tiny_llama("eager", vocab_size=64)
    eager.load_state_dict(flex.state_dict())
    ids = torch.randint(0, 64, (2, 12))
    attention_mask = torch.ones_like(ids)
    attention_mask[1, 9:] = 0  # right padding
    labels = ids.masked_fill(attention_mask == 0, -100)
    with warnings.catch_warnings():
        warnings.simplefilter("error", tpu_inductor.FallbackWarning)
        out = torch.compile(flex, backend="tpu")(
            input_ids=ids, attention_mask=attention_mask, labels=labels
        )
        out.loss.backward()
    ref = eager(input_ids=ids, attention_mask=attention_mask, labels=labels)
    ref.loss.backward()
    keep = attention_mask.bool()
    torch.testing.assert_close(out.logits[keep], ref.logits[keep], **TOL)
    torch.testing.assert_close(out.loss, ref.loss, **TOL)
    for (name, p), (_, r) in zip(flex.named_parameters(), eager.named_parameters(), strict=True):
        torch.testing.assert_close(p.grad, r.grad, **TOL, msg=f"grad of {name}")


def model_cases() -> list:
    """transformers models with ``attn_implementation="flex_attention"`` for docs/models.md:
    forward only there (torch's eager flex has no CPU backward, so the harness's eager training
    reference cannot run; training is checked against eager attention above)."""
    import functools

    from tests.models.test_transformers import DECODER, T, hf, text

    # NOTE: Dynamo breaks these graphs in transformers' mask code, not in ours: it calls
    # create_block_mask(_compile=True), which warns (warnings.warn ends a graph) and nests a
    # torch.compile (4 breaks with transformers 5.25, torch 2.13); a padding mask adds
    # `if not fast_all(attention_mask)` (masking_utils.flex_attention_mask), a branch on a value.
    # No op falls back, and the attention itself stays in one compiled graph.
    def causal_text(config, train):
        return {k: v for k, v in text(config, train).items() if k != "attention_mask"}

    build = functools.partial(hf, auto="AutoModelForCausalLM", inputs=causal_text)
    return [T("llama (flex_attention)", build("llama", attn="flex_attention", **DECODER))]


def test_flex_attention_model_rows_run_without_fallback():
    """The docs/models.md rows: compiled forward against eager, no op falls back (the graph
    breaks are transformers' mask code, see model_cases).

    NOTE: the reference is the same weights under eager SDPA (the same causal attention):
    torch 2.13's eager flex_attention on the CPU reads uninitialized memory for every batch row
    after the first (two eager calls on the same input differed by 0.25 in the logits of row
    1), so it cannot be the reference."""
    pytest.importorskip("transformers")
    from tests.models.harness import compare, run_forward, select_outputs

    for case in model_cases():
        result, actual, _ = run_forward(case)
        torch.manual_seed(0)
        model, kwargs = case.build(False)
        model.eval().config._attn_implementation = "sdpa"
        with torch.no_grad():
            expected = select_outputs(model(**kwargs), case.outputs)
        compare(actual, expected, case, "forward")
        assert result.fallback_ops == set(), f"{case.name}: {sorted(result.fallback_ops)}"

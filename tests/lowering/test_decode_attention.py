"""Attention of a decode step over a KV cache, run on the CPU against eager.

Two rules of ``docs/planning.md`` (Decode steps and serving plans): SDPA reads grouped K/V heads
before transformers' ``repeat_kv`` (``lowering/grouped_kv.py``, every platform), and few queries
over a long cache run as a loop over key chunks with a running softmax
(``long_attention.key_chunks_forward``, TPUs; here the CPU is added to its platforms)."""

from __future__ import annotations

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import tpu_inductor
from tpu_inductor.lowering import grouped_kv

transformers = pytest.importorskip("transformers")
aten = torch.ops.aten


def _repeat_kv(x, n):  # transformers' repeat_kv, as sdpa_attention.py writes it
    b, h, s, d = x.shape
    return x[:, :, None, :, :].expand(b, h, n, s, d).reshape(b, h * n, s, d)


def _attend(q, k, v, mask):
    k, v = _repeat_kv(k, q.shape[1] // k.shape[1]), _repeat_kv(v, q.shape[1] // v.shape[1])
    return aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, attn_mask=mask)[0]


def test_sdpa_reads_the_heads_before_the_repeat():
    q, k, v = torch.randn(2, 8, 1, 16), torch.randn(2, 2, 32, 16), torch.randn(2, 2, 32, 16)
    mask = torch.zeros(2, 1, 1, 32)
    gm = make_fx(_attend)(q, k, v, mask)
    expected = gm(q, k, v, mask)
    assert grouped_kv.read_kv_heads(gm) == 2
    targets = {n.target for n in gm.graph.nodes}
    assert aten.expand.default not in targets and aten.clone.default not in targets
    torch.testing.assert_close(gm(q, k, v, mask), expected, rtol=0, atol=1e-6)
    assert grouped_kv.read_kv_heads(gm) == 0  # nothing left to rewire


def test_a_repeat_something_else_reads_stays():
    def f(q, k, v):
        kr = _repeat_kv(k, 4)
        out = aten._scaled_dot_product_flash_attention_for_cpu(q, kr, _repeat_kv(v, 4))[0]
        return out, kr.sum()

    q, k, v = torch.randn(1, 8, 1, 16), torch.randn(1, 2, 8, 16), torch.randn(1, 2, 8, 16)
    gm = make_fx(f)(q, k, v)
    expected = gm(q, k, v)
    assert grouped_kv.read_kv_heads(gm) == 2
    assert aten.expand.default in {n.target for n in gm.graph.nodes}  # kr is still read
    torch.testing.assert_close(gm(q, k, v), expected, rtol=0, atol=1e-6)


def test_only_one_of_key_and_value_repeated_is_left_alone():
    """A cast between the cache and its repeat (autocast) hides one repeat: K and V must keep
    the same heads, so neither is rewired."""

    def f(q, k, v):
        kr = _repeat_kv(k.to(torch.bfloat16), 2)
        vr = _repeat_kv(v, 2).to(torch.bfloat16)
        return aten._scaled_dot_product_flash_attention_for_cpu(q, kr, vr)[0]

    q = torch.randn(1, 4, 3, 8, dtype=torch.bfloat16)
    k, v = torch.randn(1, 2, 8, 8), torch.randn(1, 2, 8, 8)
    gm = make_fx(f)(q, k, v)
    assert grouped_kv.read_kv_heads(gm) == 0


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decode_over_key_chunks_matches_eager(batch, dtype, monkeypatch):
    """A GQA Llama's decode steps over a 64-position cache, the attention in 16-key chunks."""
    from tpu_inductor.lowering.lowerings import long_attention

    calls = []
    real = long_attention.key_chunks_forward

    def spy(*args):
        calls.append(args[-1])
        return real(*args)

    monkeypatch.setattr(long_attention, "key_chunks_forward", spy)
    config = transformers.LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=128,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).to(dtype).eval()
    prompt = torch.randint(0, 128, (batch, 5))

    def run(forward):
        cache = transformers.StaticCache(config=config, max_cache_len=64)
        cache.early_initialization(batch, 2, 16, dtype, "cpu")
        logits = [forward(input_ids=prompt, cache=cache).logits[:, -1]]
        ids = logits[-1].argmax(-1, keepdim=True)
        for _ in range(3):
            logits.append(forward(input_ids=ids, cache=cache).logits[:, -1])
            ids = logits[-1].argmax(-1, keepdim=True)
        return torch.stack(logits), cache

    with torch.no_grad():
        expected, want = run(model)
        tpu_inductor.reset()
        torch._dynamo.reset()
        with tpu_inductor.config.patch(
            long_attention_platforms=("tpu", "cpu"), decode_key_chunk=16
        ):
            compiled = torch.compile(model, backend="tpu")
            actual, got = run(compiled)
    # every attention of the prefill and the decode step, 16 keys doubled while two trips remain
    assert len(calls) == 2 * 2 and set(calls) == {32}
    tol = {"atol": 2e-5, "rtol": 1e-5} if dtype == torch.float32 else {"atol": 5e-2, "rtol": 2e-2}
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    torch.testing.assert_close(actual, expected, **tol)
    for a, b in zip(got.layers, want.layers, strict=True):
        torch.testing.assert_close(a.keys, b.keys, **tol)
        torch.testing.assert_close(a.values, b.values, **tol)


def test_key_chunks_match_the_dense_form_with_masked_rows():
    """The running softmax against attention.py's dense form: a boolean mask whose first row
    sees nothing (0 and a logsumexp of -inf, as torch's kernels give) and a float bias."""
    import jax.numpy as jnp
    import numpy as np

    from tpu_inductor.lowering.lowerings import attention, long_attention

    rng = np.random.default_rng(0)
    q = jnp.asarray(rng.standard_normal((2, 2, 3, 1, 8)), jnp.float32)  # [B, kv, g, L, E]
    k = jnp.asarray(rng.standard_normal((2, 2, 64, 8)), jnp.float32)
    v = jnp.asarray(rng.standard_normal((2, 2, 64, 8)), jnp.float32)
    seen = rng.random((2, 1, 1, 1, 64)) > 0.3
    seen[0] = False
    bias = jnp.asarray(rng.standard_normal((2, 1, 1, 1, 64)), jnp.float32)
    dot = attention._matmul(None, "cpu", jnp.float32, jnp.float32)
    for mask in (jnp.asarray(seen), bias):
        out, lse = long_attention.key_chunks_forward(q, k, v, mask, 0.3, dot, 16)
        flat_q = q.reshape(2, 6, 1, 8)
        flat_mask = jnp.broadcast_to(mask, (2, 2, 3, 1, 64)).reshape(2, 6, 1, 64)
        ref, ref_lse = attention.attention(flat_q, k, v, flat_mask, False, 0.3, None, "cpu")
        np.testing.assert_allclose(out.reshape(2, 6, 1, 8), ref, atol=1e-5)
        np.testing.assert_allclose(lse.reshape(2, 6, 1), ref_lse, atol=1e-5)

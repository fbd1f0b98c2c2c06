"""One-token decode of the transformers Llama written by hand in JAX, with a static KV cache: the
reference ``benchmarks.decode`` measures our compiled decode step against.

What a JAX user would write for ``LlamaForCausalLM`` with a ``transformers.StaticCache``: the
parameters of :func:`benchmarks.hand_llama.params_from_torch` (same torch weights, same layout),
a KV cache of one ``(keys, values)`` pair of ``[batch, kv_heads, max_len, head_dim]`` arrays per
layer (HF's layout), written at the current position with ``lax.dynamic_update_slice``, and
attention over the whole static cache with a mask of the filled positions (``<= pos``). Grouped-
query attention never repeats the K/V heads: the queries are grouped as ``[batch, kv_heads,
heads // kv_heads, head_dim]`` (HF's ``repeat_kv`` gives query head ``h`` the K/V head
``h // group``); scores and softmax in float32. RMSNorm and RoPE as in ``hand_llama``.

:func:`jitted_decode_step` is ONE jitted function per token: embed, the layers, the cache
update, the logits and the greedy ``argmax``, with the cache and the position donated, so only
the ``[batch]`` token ids come back. The prefill runs ``hand_llama.forward`` on the prompt and
writes its keys and values into the static cache (:func:`jitted_prefill`).

``tests/benchmarks/test_decode_benchmark.py`` checks it against the transformers model on CPU:
logits of several decode steps from the same weights.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from benchmarks.hand_llama import LlamaSizes, Params, _linear, _rms_norm, forward

Cache = list  # one (keys, values) pair of [batch, kv_heads, max_len, head_dim] per layer


def empty_cache(sizes: LlamaSizes, batch: int, max_len: int, dtype) -> Cache:
    """Zeroed keys and values for every layer (as ``StaticCache.early_initialization``)."""
    shape = (batch, sizes.kv_heads, max_len, sizes.head_dim)
    return [(jnp.zeros(shape, dtype), jnp.zeros(shape, dtype)) for _ in range(sizes.layers)]


def _rope_at(sizes: LlamaSizes, pos, dtype):
    # cos/sin [hd] at one (traced) position, computed in float32 as HF's rotary embedding does.
    hd = sizes.head_dim
    inv_freq = 1.0 / (sizes.rope_theta ** (np.arange(0, hd, 2, dtype=np.float32) / hd))
    freqs = pos.astype(jnp.float32) * jnp.asarray(inv_freq)
    emb = jnp.concatenate([freqs, freqs])
    return jnp.cos(emb).astype(dtype), jnp.sin(emb).astype(dtype)


def _rotate(x, cos, sin):
    # x [b, heads, hd]; cos/sin [hd]
    half = x.shape[-1] // 2
    return x * cos + jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1) * sin


def decode_step(sizes: LlamaSizes, params: Params, cache: Cache, ids, pos):
    """One token for every sequence: ``ids`` ``[batch]`` at position ``pos`` (a 0-d int32, the
    number of tokens already in the cache). Returns the logits ``[batch, vocab]`` (parameters'
    dtype) and the cache with this token's keys and values written at ``pos``."""
    b = ids.shape[0]
    hd, kv = sizes.head_dim, sizes.kv_heads
    group = sizes.heads // kv
    dtype = params["embed"].dtype
    max_len = cache[0][0].shape[2]
    x = jnp.take(params["embed"], ids, axis=0)  # [b, d]
    cos, sin = _rope_at(sizes, pos, dtype)
    filled = jnp.arange(max_len) <= pos  # [max_len]: the mask of the filled positions
    scale = jnp.float32(hd**-0.5)
    new_cache = []
    for layer, (keys, values) in zip(params["layers"], cache, strict=True):
        h = _rms_norm(x, layer["ln1"], sizes.rms_eps)
        q = _rotate(_linear(h, layer["q"]).reshape(b, sizes.heads, hd), cos, sin)
        k = _rotate(_linear(h, layer["k"]).reshape(b, kv, hd), cos, sin)
        v = _linear(h, layer["v"]).reshape(b, kv, hd)
        at = (0, 0, pos, 0)
        keys = lax.dynamic_update_slice(keys, k[:, :, None, :], at)
        values = lax.dynamic_update_slice(values, v[:, :, None, :], at)
        new_cache.append((keys, values))
        qg = q.reshape(b, kv, group, hd)
        scores = jnp.einsum("bkgd,bktd->bkgt", qg, keys, preferred_element_type=jnp.float32)
        scores = jnp.where(filled, scores * scale, -jnp.inf)
        probs = jax.nn.softmax(scores, axis=-1).astype(dtype)
        attn = jnp.einsum("bkgt,bktd->bkgd", probs, values).reshape(b, sizes.heads * hd)
        x = x + _linear(attn, layer["o"])
        h = _rms_norm(x, layer["ln2"], sizes.rms_eps)
        x = x + _linear(
            jax.nn.silu(_linear(h, layer["gate"])) * _linear(h, layer["up"]), layer["down"]
        )
    x = _rms_norm(x, params["norm"], sizes.rms_eps)
    return _linear(x, params["lm_head"]), new_cache


def jitted_decode_step(sizes: LlamaSizes, *, return_logits: bool = False):
    """``step(params, cache, ids, pos) -> (next_ids, cache, pos + 1)``: :func:`decode_step` and
    the greedy ``argmax`` (int32 ids) in one jitted function, cache and position donated, float32
    matmuls at HIGHEST. With ``return_logits`` it returns ``(logits, cache, pos + 1)`` instead
    (for checking; the benchmark times the ids-only step)."""

    def step(params, cache, ids, pos):
        with jax.default_matmul_precision("highest"):
            logits, cache = decode_step(sizes, params, cache, ids, pos)
        out = logits if return_logits else jnp.argmax(logits, axis=-1).astype(jnp.int32)
        return out, cache, pos + 1

    return jax.jit(step, donate_argnums=(1, 3))


def jitted_prefill(sizes: LlamaSizes):
    """``prefill(params, cache, ids) -> (last_logits, cache, pos)``: ``hand_llama.forward`` over
    the prompt ``ids`` ``[batch, prompt]``, its keys and values written at positions
    ``0..prompt-1`` of the (donated) static cache; ``pos`` is ``prompt`` as a 0-d int32."""

    def prefill(params, cache, ids):
        with jax.default_matmul_precision("highest"):
            logits, kv = forward(sizes, params, ids, return_cache=True)
        cache = [
            (
                lax.dynamic_update_slice(keys, k.astype(keys.dtype), (0, 0, 0, 0)),
                lax.dynamic_update_slice(values, v.astype(values.dtype), (0, 0, 0, 0)),
            )
            for (keys, values), (k, v) in zip(cache, kv, strict=True)
        ]
        return logits[:, -1], cache, jnp.int32(ids.shape[1])

    return jax.jit(prefill, donate_argnums=(1,))

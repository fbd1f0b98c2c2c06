"""Scaled dot-product attention over long sequences on a TPU, without a ``[heads, L, S]`` buffer.

Two forms, chosen per call by :func:`plan` (the CPU and GPU keep ``attention.py``'s dense form
and eager's numbers):

- **splash**: no mask tensor (causal or not) or a boolean one shared by the heads,
  float32/bfloat16, both lengths multiples of 128: the splash Pallas kernel
  (``splash_attention.py``) forward and backward, scores tiled in the TensorCore's VMEM. A
  Pallas call is a custom call XLA's SPMD partitioner cannot split (it would gather q, k, v
  onto every device), so under a mesh it runs in ``jax.shard_map``: the batch split as the
  graph's inputs are, the heads over ``model`` where the mesh has it.
- **blockwise**: any other mask (a float bias, a per-head mask), or lengths splash can't take:
  queries in chunks of ``CHUNKS`` rows, each chunk's ``[heads, chunk, S]`` scores made, used
  and dropped (``lax.map`` forward; the backward a ``lax.scan`` adding each chunk's key/value
  gradients), plain XLA ops that GSPMD partitions.

Both return torch's ``(out, logsumexp)`` (natural log), so either backward takes either
forward's residuals. Below ``long_attention_min_length`` query rows (a knob) the dense form
is kept: its scores are small and XLA fuses them.

A third form is for the other shape, few queries over many keys (a decode step over a KV
cache, inference only): **key chunks** (:func:`key_chunks_forward`), a ``lax.scan`` over
``decode_key_chunk`` key positions at a time with a running softmax, so each chunk's scores
stay on chip and K and V are read once. The dense form's scores for a large batch over a long
cache do not fit on chip, and XLA then reads the cache twice (once for the row max, once
again to exponentiate).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

from tpu_inductor.core import config
from tpu_inductor.lowering import mesh_scope
from tpu_inductor.lowering.lowerings import splash_attention as splash

# Query rows per chunk of the blockwise form, the first that divides the query length.
CHUNKS = (512, 256, 128)


def plan(platform, q, k, v, attn_mask, dropout_p) -> str | None:
    """``"splash"``, ``"blockwise"`` or ``None`` (the dense form) for an SDPA call's
    ``[B, H, L, E]`` inputs on ``platform``."""
    platforms = config.get("long_attention_platforms")
    if platform not in platforms and config.get("splash_attention") != "interpret":
        return None
    if (
        q.ndim != 4
        or k.ndim != 4
        or dropout_p
        or q.shape[2] < config.get("long_attention_min_length")
    ):
        return None
    if q.shape[1] % k.shape[1]:
        return None
    how, _ = splash.mode("tpu" if platform in platforms else platform)
    if how is not None and splash.shape_reason(q, k, v) is None and _splash_mask_ok(attn_mask):
        return "splash"
    if any(q.shape[2] % c == 0 for c in CHUNKS):
        return "blockwise"
    return None


_TRIP_SCORES = 4 << 20  # bytes of float32 scores per trip of the key-chunk loop, at most


def key_chunk(platform, q, k, dropout_p, is_causal: bool) -> int:
    """Key positions per step of :func:`key_chunks_forward` for an SDPA call's ``[B, H, L,
    E]`` inputs, or 0 for the other forms: on the long-attention platforms, for at most 16 query
    rows over at least two chunks of keys (the knob ``decode_key_chunk`` is the smallest chunk;
    it doubles while a trip's scores stay under 4 MiB and two trips are left).

    NOTE: used from two chunks up, not only where the dense form's scores spill: under tp the
    dense form's small per-device cache made XLA stage the updated cache in VMEM and write it
    back whole (1.66x the minimum traffic). The price is the loop's trips: on one v5e chip at
    batch 64 over 2,048 positions, where the dense form also reads the cache once, the
    compiler's estimate of the step is 12% longer (``python -m benchmarks.serving --decode``
    with ``TPU_INDUCTOR_DECODE_KEY_CHUNK`` raised past the context: the dense form)."""
    chunk = config.get("decode_key_chunk")
    if platform not in config.get("long_attention_platforms"):
        return 0
    if q.ndim != 4 or k.ndim != 4 or dropout_p or is_causal or q.shape[1] % k.shape[1]:
        return 0
    B, H, L, S = q.shape[0], q.shape[1], q.shape[2], k.shape[2]
    if L > 16 or S % chunk or S < 2 * chunk:
        return 0
    # larger chunks, fewer loop trips, while a trip's float32 scores stay small
    while S % (4 * chunk) == 0 and B * H * L * 2 * chunk * 4 <= _TRIP_SCORES:
        chunk *= 2
    return chunk


def key_chunks_forward(q, k, v, mask, scale: float, dot, chunk: int):
    """``(out, lse)`` of attention of grouped queries ``[..., kv_heads, group, L, E]`` over
    ``[..., kv_heads, S, E]`` keys and values, ``chunk`` key positions at a time with a running
    max and sum (flash-decoding's recurrence). ``mask`` broadcasts to the grouped scores (bool,
    or a float bias); ``dot(subscripts, a, b)`` multiplies with float32 accumulation. Rows that
    see nothing give 0 and a logsumexp of -inf, as torch's kernels do. ``out`` is float32."""
    S = k.shape[-2]
    rows = q.shape[:-1]  # [..., kv_heads, group, L]

    def step(carry, i):
        m, z, acc = carry
        kc = lax.dynamic_slice_in_dim(k, i * chunk, chunk, axis=k.ndim - 2)
        vc = lax.dynamic_slice_in_dim(v, i * chunk, chunk, axis=v.ndim - 2)
        s = dot("...hgle,...hse->...hgls", q, kc) * scale
        if mask is not None:
            mc = mask
            if mask.shape[-1] == S:
                mc = lax.dynamic_slice_in_dim(mask, i * chunk, chunk, axis=mask.ndim - 1)
            s = jnp.where(mc, s, -jnp.inf) if mc.dtype == jnp.bool_ else s + mc.astype(s.dtype)
        m_new = jnp.maximum(m, jnp.max(s, axis=-1, keepdims=True))
        shift = jnp.where(jnp.isfinite(m_new), m_new, 0)
        p = jnp.exp(s - shift)
        keep = jnp.exp(m - shift)  # 0 while nothing was seen (m = -inf)
        z = z * keep + jnp.sum(p, axis=-1, keepdims=True)
        acc = acc * keep + dot("...hgls,...hse->...hgle", p.astype(v.dtype), vc)
        return (m_new, z, acc), None

    init = (
        jnp.full((*rows, 1), -jnp.inf, jnp.float32),
        jnp.zeros((*rows, 1), jnp.float32),
        jnp.zeros((*rows, v.shape[-1]), jnp.float32),
    )
    (m, z, acc), _ = lax.scan(step, init, jnp.arange(S // chunk))
    out = acc / jnp.where(z == 0, 1, z)
    lse = jnp.where(z == 0, -jnp.inf, m + jnp.log(jnp.where(z == 0, 1, z)))
    return out, lse[..., 0]


# --- splash ---------------------------------------------------------------------------------------


def _splash_mask_ok(attn_mask) -> bool:
    """Splash takes no mask, or a boolean one shared by the heads (``[..., 1, L, S]``, as
    transformers builds a causal or padding mask): one copy per batch element, never per
    head."""
    if attn_mask is None:
        return True
    return attn_mask.dtype == jnp.bool_ and (attn_mask.ndim < 3 or attn_mask.shape[-3] == 1)


def _batch_mask(attn_mask, B: int, M: int, N: int):
    """The boolean mask as ``[Bm, 1, M, N]``, ``Bm`` 1 or ``B``."""
    m = attn_mask.reshape((1,) * (4 - attn_mask.ndim) + attn_mask.shape)
    return jnp.broadcast_to(m, (m.shape[0] if m.shape[0] == B else 1, 1, M, N))


def _on_mesh(fn, B: int, H: int, Hkv: int, specs: str, n_out: int):
    """``fn(*arrays, heads=local)`` in ``shard_map`` when the trace has a mesh: the batch split
    as the graph's inputs are (where it divides), heads over ``model`` (where both head counts
    divide). ``specs`` names each argument: ``a`` a ``[B, H, ...]`` array, ``m`` a ``[Bm, 1,
    M, N]`` mask (its batch split only when ``Bm == B``: :func:`_mask_spec`)."""
    scope = mesh_scope.current()
    if scope is None:
        return functools.partial(fn, heads=H)
    mesh = scope.mesh
    batch = scope.batch if B % mesh_scope.axis_size(mesh, scope.batch) == 0 else None
    model = "model" if "model" in mesh.axis_names else None
    if model and (H % mesh.shape[model] or Hkv % mesh.shape[model]):
        model = None
    local = H // mesh_scope.axis_size(mesh, model)

    def wrapped(*arrays):
        in_specs = tuple(
            P(batch, model) if kind == "a" else P(batch if a.shape[0] == B else None)
            for kind, a in zip(specs, arrays, strict=True)
        )
        mapped = jax.shard_map(
            functools.partial(fn, heads=local),
            mesh=mesh,
            in_specs=in_specs,
            out_specs=(P(batch, model),) * n_out,
            check_vma=False,
        )
        return mapped(*arrays)

    return wrapped


def _sizes(M: int, N: int):
    return splash.block_sizes(M, N, interpret=config.get("splash_attention") == "interpret")


def _splash_mask(mask, M: int, N: int, heads: int, is_causal: bool):
    """``(mask, make_kernel)`` for splash: the static causal or full mask, or the user's
    ``[Bm, 1, M, N]`` boolean array (splash finds its empty blocks per call)."""
    interpret = config.get("splash_attention") == "interpret"
    make = functools.partial(
        splash.make_kernel, sizes=_sizes(M, N), soft_cap=None, interpret=interpret
    )
    if mask is not None:
        return mask, make
    sm = splash._mask_module()
    one = sm.CausalMask((M, N)) if is_causal else sm.FullMask((M, N))
    return sm.MultiHeadMask([one] * heads), make


def splash_forward(q, k, v, attn_mask, is_causal: bool, scale: float):
    """``(out, lse)`` of splash attention over ``[B, H, L, E]`` inputs. Rows a mask hides
    entirely give 0 and a logsumexp of -inf, as torch's kernels do."""
    B, H, M, _ = q.shape
    Hkv, N = k.shape[1], k.shape[2]

    def run(q, k, v, *mask, heads):
        m = mask[0] if mask else None
        out, lse = splash.forward(_splash_mask(m, M, N, heads, is_causal), q, k, v, scale)
        if m is not None:
            empty = ~jnp.any(m, axis=-1)  # [Bm, 1, M]
            out = jnp.where(empty[..., None], jnp.zeros((), out.dtype), out)
            lse = jnp.where(empty, -jnp.inf, lse)
        return out, lse

    if attn_mask is None:
        return _on_mesh(run, B, H, Hkv, "aaa", 2)(q, k, v)
    return _on_mesh(run, B, H, Hkv, "aaam", 2)(q, k, v, _batch_mask(attn_mask, B, M, N))


def splash_backward(dout, q, k, v, out, lse, attn_mask, is_causal: bool, scale: float):
    """``(dq, dk, dv)`` (float32) of :func:`splash_forward` from its ``out`` and ``lse``."""
    B, H, M, _ = q.shape
    Hkv, N = k.shape[1], k.shape[2]

    def run(dout, q, k, v, out, lse, *mask, heads):
        m = mask[0] if mask else None
        empty = None if m is None else ~jnp.any(m, axis=-1)
        sm = _splash_mask(m, M, N, heads, is_causal)
        return splash.backward(sm, q, k, v, out, lse, dout, None, empty, scale)

    args = (dout, q, k, v, out, lse)
    if attn_mask is None:
        return _on_mesh(run, B, H, Hkv, "aaaaaa", 3)(*args)
    mask = _batch_mask(attn_mask, B, M, N)
    return _on_mesh(run, B, H, Hkv, "aaaaaam", 3)(*args, mask)


# --- blockwise ------------------------------------------------------------------------------------


def _chunk(L: int) -> int:
    return next(c for c in CHUNKS if L % c == 0)


def _chunk_mask(attn_mask, is_causal: bool, i, c: int, L: int, S: int):
    """The mask of query rows ``[i*c, (i+1)*c)``: the user's mask rows (it broadcasts over the
    rest), or the causal rule as a boolean ``[c, S]``; ``None`` where there is neither."""
    if is_causal:
        rows = i * c + jnp.arange(c)[:, None]
        return rows >= jnp.arange(S)[None, :]
    if attn_mask is None:
        return None
    if attn_mask.ndim >= 2 and attn_mask.shape[-2] == L:
        return lax.dynamic_slice_in_dim(attn_mask, i * c, c, axis=attn_mask.ndim - 2)
    return attn_mask


def _rows(x, c: int):
    """``[B, H, L, ...]`` -> ``[L // c, B, H, c, ...]``."""
    B, H, L = x.shape[:3]
    x = x.reshape(B, H, L // c, c, *x.shape[3:])
    return jnp.moveaxis(x, 2, 0)


def _unrows(x):
    """:func:`_rows`'s inverse."""
    x = jnp.moveaxis(x, 0, 2)
    return x.reshape(*x.shape[:2], x.shape[2] * x.shape[3], *x.shape[4:])


def blockwise_forward(attention, q, k, v, attn_mask, is_causal: bool, scale, precision, platform):
    """``(out, lse)`` of ``attention`` (``attention.py``'s dense form) with the queries in
    chunks (see the module docstring)."""
    L, S = q.shape[2], k.shape[2]
    c = _chunk(L)

    def one(args):
        i, qc = args
        mask = _chunk_mask(attn_mask, is_causal, i, c, L, S)
        return attention(qc, k, v, mask, False, scale, precision, platform)

    out, lse = lax.map(one, (jnp.arange(L // c), _rows(q, c)))
    return _unrows(out), _unrows(lse)


def blockwise_backward(
    attention_backward, dout, q, k, v, out, lse, attn_mask, is_causal, scale, precision, platform
):
    """``(dq, dk, dv)`` of :func:`blockwise_forward` from its ``out`` and ``lse`` by
    ``attention_backward`` (``attention.py``'s): a scan over the query chunks, each recomputing
    its probabilities from ``lse`` and adding its key/value gradients to a float32 sum."""
    L, S = q.shape[2], k.shape[2]
    c = _chunk(L)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale

    def step(carry, args):
        dk, dv = carry
        i, do_c, q_c, o_c, lse_c = args
        mask = _chunk_mask(attn_mask, is_causal, i, c, L, S)
        dq_c, dk_c, dv_c = attention_backward(
            do_c, q_c, k, v, o_c, lse_c, mask, False, scale, precision, platform
        )
        return (dk + dk_c.astype(jnp.float32), dv + dv_c.astype(jnp.float32)), dq_c

    zeros = (jnp.zeros(k.shape, jnp.float32), jnp.zeros(v.shape, jnp.float32))
    xs = (jnp.arange(L // c), *(_rows(t, c) for t in (dout, q, out, lse)))
    (dk, dv), dq = lax.scan(step, zeros, xs)
    return _unrows(dq), dk, dv


def describe(form: str, q, k) -> str:
    """One line for the log: which form, at what shape."""
    B, H, L, E = q.shape
    return f"sdpa: {form} attention over [{B}, {H}, {L}, {E}] queries, {k.shape[1]} kv heads"


__all__ = [
    "CHUNKS",
    "blockwise_backward",
    "blockwise_forward",
    "describe",
    "plan",
    "splash_backward",
    "splash_forward",
]

"""Attention: scaled dot-product attention (forward and backward, grouped-query heads, masks,
causal) and ``nn.TransformerEncoderLayer``'s fused fast path. Split from ``nn.py`` (which was
904 lines); the layer norm the fast path applies is ``nn.layer_norm``.

Half-precision inputs compute the softmax in float32, like torch's CPU kernels.
"""

from __future__ import annotations

import logging
import math
import operator

import jax
import jax.numpy as jnp
import torch
from jax import lax

from tpu_inductor.core import config
from tpu_inductor.lowering.lowerings import long_attention
from tpu_inductor.lowering.lowerings.nn import layer_norm
from tpu_inductor.lowering.lowerings.registry import (
    accumulate_in,
    lowers,
    matmul_precision,
    upcast,
)

aten = torch.ops.aten
log = logging.getLogger("tpu_inductor")


# --- 1. scaled dot-product attention --------------------------------------------------------------


def fused_softmax(ctx, query, reads_lse: bool) -> bool:
    """Whether attention is lowered in the fused-softmax form (:func:`attention`): on the
    platforms of the knob ``fused_softmax_platforms``, for bfloat16 queries, where nothing reads the
    logsumexp (inference).

    NOTE: the form is left out where it moves more bytes than torch's: a training forward,
    which saves the logsumexp for the backward, and float32, whose products ask for
    ``Precision.HIGHEST`` and are not fused either way (measured: ``python -m
    benchmarks.tpu_programs --layers 1 --contenders ours-1prog,ours-3prog``).
    """
    return (
        ctx.platform in config.get("fused_softmax_platforms")
        and jnp.dtype(query.dtype) == jnp.bfloat16
        and not reads_lse
    )


def _reads_second_output(node) -> bool:
    """Whether anything reads a multi-output node's second output (or the whole tuple)."""
    users = getattr(node, "users", ())
    return not all(u.target is operator.getitem and u.args[1] == 0 for u in users)


def attention(
    q, k, v, attn_mask=None, is_causal=False, scale=None, precision=None, platform=None, fused=False
):
    """Scaled dot-product attention (math form) returning output and float32 logsumexp.

    Two forms, the same numbers up to rounding (``platform`` is the device it compiles for):

    - **torch's form**: the matmuls run over ``[..., L, heads, E]``
      views: attention code makes its ``[.., H, L, E]`` tensors as
      ``linear(x).view(.., L, H, E).transpose(1, 2)``, so XLA cancels that transpose against this
      one, and the output transposed back by the caller cancels too. The (unnormalized)
      probabilities go back to the input dtype for ``P @ V`` and the output is divided by the
      row sums after it, as torch's CPU flash kernel computes (bfloat16: mean error against
      torch's kernel 3e-5).
    - **the fused-softmax form** (``fused``, :func:`_fused_softmax`): ``[..., kv_heads, group,
      L, E]`` and the probabilities normalized before ``P @ V``, as
      ``jax.nn.dot_product_attention`` computes. In this form XLA:TPU makes the scores, row max,
      exponentials and row sums one fusion and the normalization part of ``P @ V``'s; torch's
      form costs a second pass over the float32 scores. :func:`fused_softmax` says where it is
      used.

    Grouped-query attention (fewer key/value heads than query heads, as torch's CPU kernels
    accept) groups the query heads by key/value head instead of repeating the key/value heads:
    the repeat would be a materialized ``[..., heads, S, E]`` copy (and its gradient a sum) in
    every program, forward and backward.

    Half-precision inputs are multiplied as they are with float32 accumulation and the softmax is
    float32, so no float32 copy of Q, K, V or P is made. Rows that see nothing (every key masked)
    give 0 and a logsumexp of -inf, as torch's kernels do.
    """
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    if fused and q.ndim >= 3:
        return _fused_softmax(q, k, v, attn_mask, is_causal, scale, precision, platform)
    L, S = q.shape[-2], k.shape[-2]
    headed = q.ndim >= 3
    if headed:
        heads, kv_heads = q.shape[-3], k.shape[-3]
        q = _token_major(q, kv_heads)  # [..., L, kv_heads, group, E]
        k, v = jnp.swapaxes(k, -3, -2), jnp.swapaxes(v, -3, -2)  # [..., S, kv_heads, E]
        attn_mask = _grouped_mask(attn_mask, q.ndim, heads, kv_heads)
        qk, pv = "...lhge,...she->...hgls", "...hgls,...she->...lhge"
    else:
        qk, pv = "...le,...se->...ls", "...ls,...se->...le"
    dot = _matmul(precision, platform, q.dtype, k.dtype)
    s = _mask_scores(dot(qk, q, k) * scale, attn_mask, is_causal, L, S)
    # Unnormalized probabilities (rows shifted by their max), normalized after P @ V, as torch's
    # CPU flash kernel computes; rows that see nothing give 0 and a logsumexp of -inf.
    m = jnp.max(s, axis=-1, keepdims=True)
    m = lax.stop_gradient(jnp.where(jnp.isfinite(m), m, 0))
    e = jnp.exp(s - m)
    z = jnp.sum(e, axis=-1, keepdims=True)
    out = dot(pv, e.astype(v.dtype), v)
    lse = (m + jnp.log(z))[..., 0]
    if headed:  # out [..., L, kv_heads, group, E]; z and lse [..., kv_heads, group, L]
        z = jnp.moveaxis(z[..., 0], -1, -3)[..., None]
        out = _head_major(out / jnp.where(z == 0, 1, z), heads)
        lse = lse.reshape(*lse.shape[:-3], heads, L)
    else:
        out = out / jnp.where(z == 0, 1, z)
    return out.astype(q.dtype), lse.astype(jnp.float32)


def _fused_softmax(q, k, v, attn_mask, is_causal: bool, scale: float, precision, platform):
    """:func:`attention`'s fused-softmax form: ``[..., kv_heads, group, L, E]`` queries against
    ``[..., kv_heads, S, E]`` keys, masked positions zeroed in the exponentials (not by guarding
    the row max), and the probabilities normalized before ``P @ V``.

    NOTE: XLA fuses this attention on a TPU only with all three (as it does
    ``jax.nn.dot_product_attention``); without any one of them, or with bf16 operands asking for
    ``Precision.HIGHEST`` (``registry.matmul_precision``), it moves the scores through HBM. The
    probabilities stay in the operands' dtype until after normalizing: rounding them to bf16
    later drifts further from torch's kernel (measured: ``python -m benchmarks.tpu_programs``).

    NOTE: at head dimension 128 this form, like JAX's attention, can move more bytes than
    torch's while XLA still estimates fewer cycles; it is kept for the cycles.
    """
    L, S, heads, kv_heads = q.shape[-2], k.shape[-2], q.shape[-3], k.shape[-3]
    q = q.reshape(*q.shape[:-3], kv_heads, heads // kv_heads, L, q.shape[-1])
    mask = _grouped_mask(attn_mask, q.ndim, heads, kv_heads)
    dot = _matmul(precision, platform, q.dtype, k.dtype)
    s = _mask_scores(dot("...hgle,...hse->...hgls", q, k) * scale, mask, is_causal, L, S)
    m = lax.stop_gradient(jnp.max(s, axis=-1, keepdims=True))
    e = jnp.exp(s - m)
    seen = _seen(mask, is_causal, L, S)
    if seen is not None:  # rows that see nothing: exp(-inf - -inf) is NaN
        e = jnp.where(seen, e, 0)
    z = jnp.sum(e, axis=-1, keepdims=True)
    out = dot("...hgls,...hse->...hgle", (e / jnp.where(z == 0, 1, z)).astype(v.dtype), v)
    lse = (m + jnp.log(z))[..., 0]
    out = out.reshape(*out.shape[:-4], heads, L, out.shape[-1])
    return out.astype(q.dtype), lse.reshape(*lse.shape[:-3], heads, L).astype(jnp.float32)


def _seen(mask, is_causal: bool, L: int, S: int):
    """Where a score can be finite after :func:`_mask_scores` (``None``: everywhere)."""
    seen = jnp.tril(jnp.ones((L, S), jnp.bool_)) if is_causal else None
    if mask is not None:
        allowed = mask if mask.dtype == jnp.bool_ else mask != -jnp.inf
        seen = allowed if seen is None else seen & allowed
    return seen


def _matmul(precision, platform: str | None, *dtypes):
    """``einsum(subscripts, a, b)`` for attention: half-precision operands accumulate in float32.

    NOTE: XLA:CPU (jaxlib 0.10) has no kernel for some bf16 x bf16 -> f32 dots, depending on the
    layouts it picks ("Unsupported element type for DotThunk"), so for the CPU (or an unknown
    platform) half-precision operands are converted to float32 first. That is exact (products of
    bf16 values are exact in float32): the same numbers as a bf16 dot accumulating in float32.
    """
    acc = accumulate_in(*dtypes)
    widen = acc is not None and platform in (None, "cpu")

    def dot(subscripts, a, b):
        if widen:
            a, b = upcast(a), upcast(b)
        prec = matmul_precision(precision, a, b)
        return jnp.einsum(subscripts, a, b, precision=prec, preferred_element_type=acc)

    return dot


def _token_major(x, kv_heads: int):
    """``[..., H, L, E]`` -> ``[..., L, kv_heads, H // kv_heads, E]``."""
    *batch, heads, length, dim = x.shape
    return jnp.swapaxes(x, -3, -2).reshape(*batch, length, kv_heads, heads // kv_heads, dim)


def _head_major(x, heads: int):
    """``[..., L, kv_heads, group, E]`` -> ``[..., H, L, E]``."""
    *batch, length, _, _, dim = x.shape
    return jnp.swapaxes(x.reshape(*batch, length, heads, dim), -3, -2)


def _mask_scores(s, attn_mask, is_causal: bool, L: int, S: int):
    if is_causal:
        s = jnp.where(jnp.tril(jnp.ones((L, S), jnp.bool_)), s, -jnp.inf)
    if attn_mask is not None:
        if attn_mask.dtype == jnp.bool_:
            s = jnp.where(attn_mask, s, -jnp.inf)
        else:
            s = s + upcast(attn_mask)
    return s


def _grouped_mask(mask, ndim: int, heads: int, kv_heads: int):
    """A mask broadcastable to ``[..., heads, L, S]`` as one broadcastable to
    ``[..., kv_heads, heads // kv_heads, L, S]`` (``ndim`` is the grouped rank)."""
    if mask is None:
        return None
    mask = mask.reshape((1,) * (ndim - 1 - mask.ndim) + mask.shape)  # [..., h, L, S]
    if mask.shape[-3] == heads:
        return mask.reshape(*mask.shape[:-3], kv_heads, heads // kv_heads, *mask.shape[-2:])
    return mask.reshape(*mask.shape[:-3], 1, 1, *mask.shape[-2:])


# aten::_scaled_dot_product_flash_attention_for_cpu(Tensor query, Tensor key, Tensor value,
#   float dropout_p=0., bool is_causal=False, *, Tensor? attn_mask=None, float? scale=None)
#   -> (Tensor output, Tensor logsumexp)
@lowers(aten._scaled_dot_product_flash_attention_for_cpu.default)
def sdpa_flash_cpu(
    ctx, query, key, value, dropout_p=0.0, is_causal=False, attn_mask=None, scale=None
):
    # NOTE: dropout_p > 0 is refused at registration (unsupported.REFUSED): eager runs it.
    attn_mask = _as_boolean(ctx, attn_mask)
    form = long_attention.plan(ctx.platform, query, key, value, attn_mask, dropout_p)
    if form is not None:
        log.debug(long_attention.describe(form, query, key))
        if form == "splash":
            out, lse = long_attention.splash_forward(
                query, key, value, attn_mask, is_causal, _scale(query, scale)
            )
        else:
            out, lse = long_attention.blockwise_forward(
                attention,
                query,
                key,
                value,
                attn_mask,
                is_causal,
                scale,
                ctx.precision,
                ctx.platform,
            )
        return out.astype(query.dtype), lse.astype(ctx.out_dtype(1))
    chunk = long_attention.key_chunk(ctx.platform, query, key, dropout_p, is_causal)
    if chunk:  # few queries over a long cache: K and V read once
        heads, kv_heads = query.shape[1], key.shape[1]
        q = query.reshape(query.shape[0], kv_heads, heads // kv_heads, *query.shape[2:])
        mask = _grouped_mask(attn_mask, q.ndim, heads, kv_heads)
        dot = _matmul(ctx.precision, ctx.platform, query.dtype, key.dtype)
        out, lse = long_attention.key_chunks_forward(
            q, key, value, mask, _scale(query, scale), dot, chunk
        )
        out = out.reshape(*out.shape[:1], heads, *out.shape[3:])
        lse = lse.reshape(*lse.shape[:1], heads, lse.shape[-1])
        return out.astype(query.dtype), lse.astype(ctx.out_dtype(1))
    out, lse = attention(
        query,
        key,
        value,
        attn_mask,
        is_causal,
        scale,
        ctx.precision,
        ctx.platform,
        fused=fused_softmax(ctx, query, _reads_second_output(ctx.node)),
    )
    return out, lse.astype(ctx.out_dtype(1))


# aten::_scaled_dot_product_flash_attention_for_cpu_backward(Tensor grad_out, Tensor query, Tensor
#   key, Tensor value, Tensor out, Tensor logsumexp, float dropout_p, bool is_causal, *, Tensor?
#   attn_mask=None, float? scale=None) -> (Tensor grad_query, Tensor grad_key, Tensor grad_value)
@lowers(aten._scaled_dot_product_flash_attention_for_cpu_backward.default)
def sdpa_flash_cpu_backward(
    ctx,
    grad_out,
    query,
    key,
    value,
    out,
    logsumexp,
    dropout_p,
    is_causal,
    attn_mask=None,
    scale=None,
):
    attn_mask = _as_boolean(ctx, attn_mask)
    form = long_attention.plan(ctx.platform, query, key, value, attn_mask, dropout_p)
    if form == "splash":
        grads = long_attention.splash_backward(
            grad_out, query, key, value, out, logsumexp, attn_mask, is_causal, _scale(query, scale)
        )
        return tuple(g.astype(ctx.out_dtype(i)) for i, g in enumerate(grads))
    if form == "blockwise":
        grads = long_attention.blockwise_backward(
            attention_backward, grad_out, query, key, value, out, logsumexp, attn_mask,
            is_causal, scale, ctx.precision, ctx.platform,
        )  # fmt: skip
        return tuple(g.astype(ctx.out_dtype(i)) for i, g in enumerate(grads))
    if query.ndim != 4:
        f = lambda q, k, v: attention(  # noqa: E731
            q, k, v, attn_mask, is_causal, scale, ctx.precision, ctx.platform
        )[0]
        _, vjp = jax.vjp(f, query, key, value)
        return vjp(grad_out.astype(query.dtype))
    grads = attention_backward(
        grad_out,
        query,
        key,
        value,
        out,
        logsumexp,
        attn_mask,
        is_causal,
        scale,
        ctx.precision,
        ctx.platform,
    )
    return tuple(g.astype(ctx.out_dtype(i)) for i, g in enumerate(grads))


# Ops that keep a tensor's values (-inf stays -inf, 0 stays 0) between a mask and SDPA.
_VALUE_KEEPING = frozenset(
    {aten.expand.default, aten.view.default, aten.unsqueeze.default, aten._to_copy.default,
     aten.clone.default, aten.alias.default, aten.slice.Tensor, aten.squeeze.dim,
     aten.permute.default}
)  # fmt: skip


def _constant(arg):
    """The value of a number, or of a node that makes a 0-d constant, else ``None``."""
    if isinstance(arg, int | float):
        return arg
    target = getattr(arg, "target", None)
    if target is aten.scalar_tensor.default:
        return arg.args[0]
    if target in (aten.full.default, aten.full_like.default):
        return arg.args[1]
    return None


def _as_boolean(ctx, attn_mask):
    """A float mask torch made from a boolean one (``sdpa`` turns ``attn_mask=bool`` into
    ``where(mask, 0, -inf)`` before its kernel) as that boolean, so the long forms can treat it
    as a mask rather than a bias; any other mask as it is. Read from the graph (the mask's
    producer, through value-keeping views and casts): a placeholder's values are unknown."""
    if attn_mask is None or attn_mask.dtype == jnp.bool_:
        return attn_mask
    node = ctx.node.kwargs.get("attn_mask")
    while getattr(node, "target", None) in _VALUE_KEEPING:
        node = node.args[0]
    if getattr(node, "target", None) is not aten.where.self:
        return attn_mask
    if _constant(node.args[1]) == 0 and _constant(node.args[2]) == -math.inf:
        return attn_mask != -jnp.inf
    return attn_mask


def _scale(q, scale):
    return 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale


def attention_backward(
    dout, q, k, v, out, lse, attn_mask, is_causal, scale, precision, platform=None
):
    """Gradients of :func:`attention` for ``[B, H, L, E]`` inputs from its saved output and
    logsumexp, as torch's CPU flash kernel computes them: the probabilities are recomputed from
    Q K^T and the logsumexp (one score-sized matmul) instead of differentiating the forward
    again. Grouped heads stay grouped (the key/value gradients sum over each group inside the
    matmuls), and the matmuls run over ``[B, L, heads, E]`` views as in :func:`attention`."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    B, H, L, E = q.shape
    Hkv, S = k.shape[1], k.shape[2]
    G = H // Hkv
    q_, dout_, out_ = (_token_major(t, Hkv) for t in (q, dout, out))  # [B, L, Hkv, G, E]
    k_, v_ = jnp.swapaxes(k, 1, 2), jnp.swapaxes(v, 1, 2)  # [B, S, Hkv, E]
    lse_ = lse.reshape(B, Hkv, G, L).astype(jnp.float32)
    mask = _grouped_mask(attn_mask, 5, H, Hkv)
    dot = _matmul(precision, platform, q.dtype, k.dtype)
    s = _mask_scores(dot("blhge,bshe->bhgls", q_, k_) * scale, mask, is_causal, L, S)
    # Rows that saw nothing have a logsumexp of -inf and no gradient.
    p = jnp.exp(s - jnp.where(jnp.isfinite(lse_), lse_, 0)[..., None])
    dv = dot("bhgls,blhge->bshe", p.astype(dout.dtype), dout_)
    dp = dot("blhge,bshe->bhgls", dout_, v_)
    d = jnp.sum(upcast(dout_) * upcast(out_), axis=-1)  # [B, L, Hkv, G]
    ds = (p * (dp - jnp.moveaxis(d, 1, -1)[..., None])).astype(q.dtype)
    dq = dot("bhgls,bshe->blhge", ds, k_) * scale
    dk = dot("bhgls,blhge->bshe", ds, q_) * scale
    return _head_major(dq, H), jnp.swapaxes(dk, 1, 2), jnp.swapaxes(dv, 1, 2)


# --- 2. nn.TransformerEncoderLayer's fast path ----------------------------------------------------


# aten::_transformer_encoder_layer_fwd(...): nn.TransformerEncoderLayer's inference fast path.
@lowers(aten._transformer_encoder_layer_fwd.default)
def transformer_encoder_layer_fwd(
    ctx,
    src,
    embed_dim,
    num_heads,
    qkv_weight,
    qkv_bias,
    proj_weight,
    proj_bias,
    use_gelu,
    norm_first,
    eps,
    norm_weight_1,
    norm_bias_1,
    norm_weight_2,
    norm_bias_2,
    ffn_weight_1,
    ffn_bias_1,
    ffn_weight_2,
    ffn_bias_2,
    mask=None,
    mask_type=None,
):
    prec = ctx.precision
    B, L, E = src.shape
    hd = E // num_heads

    def lin(x, w, b):
        return jnp.matmul(x, w.T, precision=prec) + b

    def mha(x):
        q, k, v = jnp.split(lin(x, qkv_weight, qkv_bias), 3, axis=-1)
        q, k, v = (t.reshape(B, L, num_heads, hd).transpose(0, 2, 1, 3) for t in (q, k, v))
        m = None
        if mask is not None:
            # NOTE: True marks positions to ignore (nn.MultiheadAttention convention).
            if mask_type == 1:  # key padding mask (B, S)
                m = mask[:, None, None, :]
            else:  # (L, S) or (B, H, L, S)
                m = mask
            m = ~m if m.dtype == jnp.bool_ else m
        fused = fused_softmax(ctx, q, reads_lse=False)  # an inference op
        o, _ = attention(q, k, v, m, False, None, prec, ctx.platform, fused)
        return lin(o.transpose(0, 2, 1, 3).reshape(B, L, E), proj_weight, proj_bias)

    act = (lambda h: jax.nn.gelu(h, approximate=False)) if use_gelu else jax.nn.relu

    def ffn(x):
        return lin(act(lin(x, ffn_weight_1, ffn_bias_1)), ffn_weight_2, ffn_bias_2)

    def ln(x, w, b):
        return layer_norm(x, (E,), w, b, eps)[0]

    x = src
    if norm_first:
        x = x + mha(ln(x, norm_weight_1, norm_bias_1))
        x = x + ffn(ln(x, norm_weight_2, norm_bias_2))
    else:
        x = ln(x + mha(x), norm_weight_1, norm_bias_1)
        x = ln(x + ffn(x), norm_weight_2, norm_bias_2)
    return x

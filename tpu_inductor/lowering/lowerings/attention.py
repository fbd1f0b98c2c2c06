"""Attention: scaled dot-product attention (forward and backward, grouped-query heads, masks,
causal) and ``nn.TransformerEncoderLayer``'s fused fast path. Split from ``nn.py`` (which was
904 lines); the layer norm the fast path applies is ``nn.layer_norm``.

Half-precision inputs compute the softmax in float32, like torch's CPU kernels.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import torch
from jax import lax

from tpu_inductor.lowering.lowerings.nn import layer_norm
from tpu_inductor.lowering.lowerings.registry import accumulate_in, register_lowering, upcast

aten = torch.ops.aten


# --- 1. scaled dot-product attention --------------------------------------------------------------


def attention(q, k, v, attn_mask=None, is_causal=False, scale=None, precision=None, platform=None):
    """Scaled dot-product attention (math form) returning output and float32 logsumexp.

    With heads (``[..., H, L, E]``), the matmuls run over ``[..., L, heads, E]`` views: attention
    code makes its ``[.., H, L, E]`` tensors as ``linear(x).view(.., L, H, E).transpose(1, 2)``,
    so XLA cancels that transpose against this one, and the output transposed back by the caller
    cancels too; without it, the head split below would copy transposed Q, K, V and outputs.

    Grouped-query attention (fewer key/value heads than query heads, as torch's CPU kernels
    accept) groups the query heads by key/value head instead of repeating the key/value heads:
    the repeat would be a materialized ``[..., heads, S, E]`` copy (and its gradient a sum) in
    every program, forward and backward.

    Half-precision inputs are multiplied as they are with float32 accumulation, the softmax is
    float32, and its (unnormalized) probabilities go back to the input dtype for ``P @ V``, as
    torch's CPU flash kernel does, so no float32 copy of Q, K, V or P is made (bfloat16: mean
    error against torch's kernel 3e-5, against 1.6e-4 with float32 probabilities).
    ``platform`` is the device it compiles for (:func:`_matmul`).
    """
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
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
        return jnp.einsum(subscripts, a, b, precision=precision, preferred_element_type=acc)

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
@register_lowering(aten._scaled_dot_product_flash_attention_for_cpu.default)
def sdpa_flash_cpu(
    ctx, query, key, value, dropout_p=0.0, is_causal=False, attn_mask=None, scale=None
):
    # NOTE: dropout_p > 0 is refused at registration (unsupported.REFUSED): eager runs it.
    out, lse = attention(
        query, key, value, attn_mask, is_causal, scale, ctx.precision, ctx.platform
    )
    return out, lse.astype(ctx.out_dtype(1))


# aten::_scaled_dot_product_flash_attention_for_cpu_backward(Tensor grad_out, Tensor query, Tensor
#   key, Tensor value, Tensor out, Tensor logsumexp, float dropout_p, bool is_causal, *, Tensor?
#   attn_mask=None, float? scale=None) -> (Tensor grad_query, Tensor grad_key, Tensor grad_value)
@register_lowering(aten._scaled_dot_product_flash_attention_for_cpu_backward.default)
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
@register_lowering(aten._transformer_encoder_layer_fwd.default)
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
        o, _ = attention(q, k, v, m, False, None, prec, ctx.platform)
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

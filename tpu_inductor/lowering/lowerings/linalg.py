"""Matrix products (mm, bmm, addmm, baddbmm, addbmm, matmul-likes, dot) and pairwise distances
(cdist, pdist).

float32 products use the precision the graph was compiled with (from
``torch.get_float32_matmul_precision()``: "highest" -> ``Precision.HIGHEST``), so TPU results
stay comparable with CPU unless the user opts into lower precision.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import torch
from jax import lax

from tpu_inductor.core import config
from tpu_inductor.lowering.lowerings.registry import HALF, P, accumulate_in, register_lowering

aten = torch.ops.aten

# On a TPU a bf16 x bf16 dot accumulates in float32 in the MXU and rounds once, whatever its
# result type, so a half-precision product keeps its own dtype (knob ``tpu_half_dots``): asking
# for a float32 result and converting it gives the same numbers but makes XLA's layout assignment
# copy each projection that is split into heads. A product the graph converts to float32 next
# keeps the float32 form (as a bf16 dot its float32 copy is laid out twice). Measured:
# ``python -m benchmarks.tpu_levers --issue 30``.

_VIEWS = (aten.view.default, aten._unsafe_view.default, aten.reshape.default)


def _upcast_next(node) -> bool:
    """Whether a user of ``node`` (through views) converts it to float32."""
    for user in getattr(node, "users", ()):
        if user.target in _VIEWS and _upcast_next(user):
            return True
        if user.target is aten._to_copy.default and user.kwargs.get("dtype") == torch.float32:
            return True
    return False


def _half_result(ctx, out) -> bool:
    """Whether a half-precision product is computed in its own dtype (knob ``tpu_half_dots``)."""
    return config.get("tpu_half_dots") and ctx.platform == "tpu" and not _upcast_next(ctx.node)


def _dtypes(ctx):
    """A product's result dtype and the dtype it accumulates in (``preferred_element_type``)."""
    out = ctx.out_dtype()
    # NOTE: integer matmuls accumulate in their own dtype, like torch (wrapping on overflow).
    pref = accumulate_in(out)
    if pref is not None and _half_result(ctx, out):
        pref = out
    return out, pref


def _mm(ctx, a, b):
    out, pref = _dtypes(ctx)
    prec = ctx.matmul_precision(a, b)
    return jnp.matmul(a, b, precision=prec, preferred_element_type=pref).astype(out)


# Products over leading dimensions, which lowering/leading_dims.py puts where a graph flattens
# ``[..., K]`` to ``[M, K]`` for a 2-D product: each is the torch computation it replaces, and
# the first two are lowered as mm and addmm (jnp.matmul and broadcasting take the leading dims).


def matmul_leading(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``mm(x.flatten(0, -2), w)`` without the flattening: ``[..., K] @ [K, N] -> [..., N]``."""
    return torch.mm(x.flatten(0, -2), w).unflatten(0, x.shape[:-1])


def addmm_leading(bias: torch.Tensor, x: torch.Tensor, w: torch.Tensor, beta=1, alpha=1):
    """``addmm(bias, x.flatten(0, -2), w)`` without the flattening (``bias`` is ``[N]``)."""
    flat = torch.addmm(bias, x.flatten(0, -2), w, beta=beta, alpha=alpha)
    return flat.unflatten(0, x.shape[:-1])


def mm_leading(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a.flatten(0, -2).T @ b.flatten(0, -2)``: ``[..., K], [..., N] -> [K, N]`` summed over
    every leading position (a linear layer's weight gradient)."""
    return torch.mm(a.flatten(0, -2).t(), b.flatten(0, -2))


# aten::mm(Tensor self, Tensor mat2) -> Tensor
@register_lowering(
    aten.mm.default, aten.bmm.default, aten.matmul.default, matmul_leading, promote=P.NO_OPMATH
)
def mm(ctx, self, mat2):
    return _mm(ctx, self, mat2)


# aten::dot(Tensor self, Tensor tensor) -> Tensor
@register_lowering(aten.dot.default, aten.vdot.default, aten.mv.default, promote=P.NO_OPMATH)
def dot(ctx, self, other):
    if ctx.node.target is aten.vdot.default:
        self = jnp.conj(self)
    return _mm(ctx, self, other)


def _scalars(dtype, *scalars):
    """``alpha``/``beta`` as torch applies them: cast to the (integer) result dtype."""
    if jnp.issubdtype(dtype, jnp.integer):
        return tuple(int(s) for s in scalars)
    return scalars


# aten::addmm(Tensor self, Tensor mat1, Tensor mat2, *, Scalar beta=1, Scalar alpha=1) -> Tensor
@register_lowering(
    aten.addmm.default,
    aten.baddbmm.default,
    aten.addmv.default,
    addmm_leading,
    promote=P.NO_OPMATH,
    promote_args=(0, 1, 2),
)
def addmm(ctx, self, mat1, mat2, beta=1, alpha=1):
    out = ctx.out_dtype()
    alpha, beta = _scalars(out, alpha, beta)
    half = out in HALF
    if half:
        # Like torch's CPU gemm: beta * self + alpha * product in float32, rounded once.
        prec = ctx.matmul_precision(mat1, mat2)
        prod = jnp.matmul(mat1, mat2, precision=prec, preferred_element_type=jnp.float32)
        self = self.astype(jnp.float32)
    else:
        prod = _mm(ctx, mat1, mat2)
    if alpha != 1:
        prod = prod * alpha
    if beta == 0:
        # NOTE: beta=0 ignores self entirely (NaN in self does not propagate).
        return prod.astype(out)
    return ((self * beta if beta != 1 else self) + prod).astype(out)


# aten::mm over every leading position of both operands (leading_dims.py's weight gradients)
@register_lowering(mm_leading, promote=P.NO_OPMATH)
def _mm_leading(ctx, a, b):
    out, pref = _dtypes(ctx)
    lead = tuple(range(a.ndim - 1))
    dims = ((lead, lead), ((), ()))
    prec = ctx.matmul_precision(a, b)
    product = lax.dot_general(a, b, dims, precision=prec, preferred_element_type=pref)
    return product.astype(out)


# aten::outer(Tensor self, Tensor vec2) -> Tensor
@register_lowering(aten.outer.default, promote=P.NO_OPMATH)
def outer(ctx, self, vec2):
    return jnp.outer(self, vec2)


# aten::tril(Tensor self, SymInt diagonal=0) -> Tensor
@register_lowering(aten.tril.default)
def tril(ctx, self, diagonal=0):
    return jnp.tril(self, diagonal)


# aten::triu(Tensor self, SymInt diagonal=0) -> Tensor
@register_lowering(aten.triu.default)
def triu(ctx, self, diagonal=0):
    return jnp.triu(self, diagonal)


# aten::addbmm(Tensor self, Tensor batch1, Tensor batch2, *, Scalar beta=1, Scalar alpha=1)
@register_lowering(aten.addbmm.default, promote=P.NO_OPMATH, promote_args=(0, 1, 2))
def addbmm(ctx, self, batch1, batch2, beta=1, alpha=1):
    out = ctx.out_dtype()
    alpha, beta = _scalars(out, alpha, beta)
    if out in HALF:
        # NOTE: torch runs one addmm per batch (float32 accumulation, result rounded to the half
        # dtype each time); done the same way so results round alike. float32 and wider sum all
        # batches in one einsum.
        def step(i, acc, beta=1):
            prod = jnp.matmul(
                batch1[i], batch2[i], precision=ctx.precision, preferred_element_type=jnp.float32
            )
            acc = acc.astype(jnp.float32)
            return ((acc * beta if beta != 1 else acc) + prod * alpha).astype(out)

        acc = jnp.broadcast_to(self, ctx.out_shape())
        if batch1.shape[0] == 0:
            return (acc * beta).astype(out) if beta != 0 else jnp.zeros_like(acc)
        acc = step(0, jnp.zeros_like(acc) if beta == 0 else acc, beta)
        return lax.fori_loop(1, batch1.shape[0], step, acc)
    prod = jnp.einsum("bij,bjk->ik", batch1, batch2, precision=ctx.precision)
    if alpha != 1:
        prod = prod * alpha
    if beta == 0:
        return prod.astype(out)  # NOTE: beta=0 ignores self entirely (NaN does not propagate).
    return ((self * beta if beta != 1 else self) + prod).astype(out)


def _pnorm(diff, p):
    """The p-norm over the last axis of ``diff``, as torch's cdist/pdist kernels compute it."""
    a = jnp.abs(diff)
    if p == 0:
        return jnp.sum(a != 0, axis=-1).astype(diff.dtype)
    if p == 1:
        return jnp.sum(a, axis=-1)
    if p == 2:
        return jnp.sqrt(jnp.sum(a * a, axis=-1))
    if p == float("inf"):
        return jnp.max(a, axis=-1, initial=0)
    return jnp.sum(a**p, axis=-1) ** (1 / p)


# aten::_cdist_forward(Tensor x1, Tensor x2, float p, int? compute_mode) -> Tensor
@register_lowering(aten._cdist_forward.default)
def cdist(ctx, x1, x2, p, compute_mode=None):
    batch = ctx.out_shape()[:-2]
    x1 = jnp.broadcast_to(x1, batch + x1.shape[-2:])
    x2 = jnp.broadcast_to(x2, batch + x2.shape[-2:])
    r1, r2 = x1.shape[-2], x2.shape[-2]
    mode = 0 if compute_mode is None else compute_mode
    if x1.shape[-1] == 0:
        return jnp.zeros(ctx.out_shape(), ctx.out_dtype())
    if p == 2 and (mode == 1 or (mode == 0 and (r1 > 25 or r2 > 25))):
        # torch's matmul form |a|^2 - 2 a.b + |b|^2 (faster, less accurate): same rounding.
        n1 = jnp.sum(x1 * x1, axis=-1, keepdims=True)
        n2 = jnp.sum(x2 * x2, axis=-1, keepdims=True)
        a = jnp.concatenate([x1 * -2, n1, jnp.ones_like(n1)], axis=-1)
        b = jnp.concatenate([x2, jnp.ones_like(n2), n2], axis=-1)
        d2 = jnp.matmul(a, jnp.swapaxes(b, -1, -2), precision=ctx.precision)
        return jnp.sqrt(jnp.maximum(d2, 0)).astype(ctx.out_dtype())
    return _pnorm(x1[..., :, None, :] - x2[..., None, :, :], p).astype(ctx.out_dtype())


# aten::_pdist_forward(Tensor self, float p=2.) -> Tensor
@register_lowering(aten._pdist_forward.default)
def pdist(ctx, self, p=2.0):
    n = self.shape[0]
    if n < 2:
        return jnp.zeros(ctx.out_shape(), ctx.out_dtype())
    i, j = np.triu_indices(n, 1)
    return _pnorm(self[i] - self[j], p).astype(ctx.out_dtype())

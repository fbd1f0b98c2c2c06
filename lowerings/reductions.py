"""Reductions and scans: sum, mean, prod, var/std, amax/amin, max/min with indices, argmax,
any/all, logsumexp, norms, cumsum/cumprod, sort, topk.

Half-precision inputs accumulate in float32 (torch's opmath) and the result is cast to the dtype
torch reports in ``meta["val"]``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import torch
from jax import lax
from tpu_inductor.lowerings.registry import register_lowering

aten = torch.ops.aten

_HALF = (jnp.float16, jnp.bfloat16)


def _dims(dim, ndim):
    if dim is None or (isinstance(dim, list | tuple) and len(dim) == 0):
        return None
    dims = dim if isinstance(dim, list | tuple) else [dim]
    return tuple(d + max(ndim, 1) if d < 0 else d for d in dims) if ndim else None


def _acc(dtype):
    return jnp.float32 if dtype in _HALF else dtype


# aten::sum.dim_IntList(Tensor self, int[1]? dim, bool keepdim=False, *, ScalarType? dtype=None)
@register_lowering(aten.sum.dim_IntList, aten.sum.default)
def sum_(ctx, self, dim=None, keepdim=False, dtype=None):
    out = ctx.out_dtype()
    x = self.astype(_acc(out))
    return jnp.sum(x, axis=_dims(dim, self.ndim), keepdims=keepdim).astype(out)


@register_lowering(aten.mean.dim, aten.mean.default)
def mean(ctx, self, dim=None, keepdim=False, dtype=None):
    out = ctx.out_dtype()
    x = self.astype(_acc(out))
    return jnp.mean(x, axis=_dims(dim, self.ndim), keepdims=keepdim).astype(out)


@register_lowering(aten.prod.dim_int, aten.prod.default)
def prod(ctx, self, dim=None, keepdim=False, dtype=None):
    out = ctx.out_dtype()
    return jnp.prod(self.astype(_acc(out)), axis=_dims(dim, self.ndim), keepdims=keepdim).astype(
        out
    )


# aten::var.correction(Tensor self, int[1]? dim=None, *, Scalar? correction=None, bool keepdim=False)
@register_lowering(aten.var.correction)
def var(ctx, self, dim=None, correction=None, keepdim=False):
    out = ctx.out_dtype()
    x = self.astype(_acc(self.dtype))
    ddof = 1 if correction is None else correction
    return jnp.var(x, axis=_dims(dim, self.ndim), ddof=ddof, keepdims=keepdim).astype(out)


@register_lowering(aten.std.correction)
def std(ctx, self, dim=None, correction=None, keepdim=False):
    return jnp.sqrt(var(ctx, self, dim, correction=correction, keepdim=keepdim))


@register_lowering(aten.var_mean.correction)
def var_mean(ctx, self, dim=None, correction=None, keepdim=False):
    x = self.astype(_acc(self.dtype))
    ddof = 1 if correction is None else correction
    axes = _dims(dim, self.ndim)
    return (
        jnp.var(x, axis=axes, ddof=ddof, keepdims=keepdim).astype(ctx.out_dtype(0)),
        jnp.mean(x, axis=axes, keepdims=keepdim).astype(ctx.out_dtype(1)),
    )


def _minmax(fn, self, dim, keepdim):
    axes = _dims(dim, self.ndim)
    if self.dtype == jnp.bool_:
        red = jnp.any if fn is jnp.max else jnp.all
        return red(self, axis=axes, keepdims=keepdim)
    # NOTE: jnp.max/min propagate NaN, like torch.
    return fn(self, axis=axes, keepdims=keepdim)


@register_lowering(aten.amax.default)
def amax(ctx, self, dim=(), keepdim=False):
    return _minmax(jnp.max, self, dim, keepdim)


@register_lowering(aten.amin.default)
def amin(ctx, self, dim=(), keepdim=False):
    return _minmax(jnp.min, self, dim, keepdim)


@register_lowering(aten.max.default)
def max_(ctx, self):
    return _minmax(jnp.max, self, None, False)


@register_lowering(aten.min.default)
def min_(ctx, self):
    return _minmax(jnp.min, self, None, False)


def _arg(self, dim, keepdim, largest):
    """First index of the max (min); NaN counts as the extreme value, like torch."""
    if self.ndim == 0:
        return jnp.zeros((), jnp.int64)
    x = self
    axis = None if dim is None else (dim + self.ndim if dim < 0 else dim)
    if axis is None:
        x = x.reshape(-1)
        axis = 0
    if x.dtype == jnp.bool_:
        x = x.astype(jnp.int8)
    idx = jnp.argmax(x, axis=axis) if largest else jnp.argmin(x, axis=axis)
    if jnp.issubdtype(x.dtype, jnp.floating):
        nan = jnp.isnan(x)
        idx = jnp.where(jnp.any(nan, axis=axis), jnp.argmax(nan, axis=axis), idx)
    idx = idx.astype(jnp.int64)
    if keepdim:
        idx = jnp.expand_dims(idx, axis) if dim is not None else idx.reshape((1,) * self.ndim)
    return idx


@register_lowering(aten.argmax.default)
def argmax(ctx, self, dim=None, keepdim=False):
    return _arg(self, dim, keepdim, True)


@register_lowering(aten.argmin.default)
def argmin(ctx, self, dim=None, keepdim=False):
    return _arg(self, dim, keepdim, False)


# aten::max.dim(Tensor self, int dim, bool keepdim=False) -> (Tensor values, Tensor indices)
@register_lowering(aten.max.dim)
def max_dim(ctx, self, dim, keepdim=False):
    return _minmax(jnp.max, self, dim, keepdim), _arg(self, dim, keepdim, True)


@register_lowering(aten.min.dim)
def min_dim(ctx, self, dim, keepdim=False):
    return _minmax(jnp.min, self, dim, keepdim), _arg(self, dim, keepdim, False)


@register_lowering(aten.any.default, aten.any.dim, aten.any.dims)
def any_(ctx, self, dim=None, keepdim=False):
    out = jnp.any(self != 0, axis=_dims(dim, self.ndim), keepdims=keepdim)
    return out.astype(ctx.out_dtype())


@register_lowering(aten.all.default, aten.all.dim, aten.all.dims)
def all_(ctx, self, dim=None, keepdim=False):
    out = jnp.all(self != 0, axis=_dims(dim, self.ndim), keepdims=keepdim)
    return out.astype(ctx.out_dtype())


@register_lowering(aten.logsumexp.default)
def logsumexp(ctx, self, dim, keepdim=False):
    out = ctx.out_dtype()
    x = self.astype(_acc(out))
    return jax.nn.logsumexp(x, axis=_dims(dim, self.ndim), keepdims=keepdim).astype(out)


# aten::linalg_vector_norm(Tensor self, Scalar ord=2, int[1]? dim=None, bool keepdim=False, ...)
@register_lowering(aten.linalg_vector_norm.default)
def linalg_vector_norm(ctx, self, ord=2, dim=None, keepdim=False, dtype=None):
    out = ctx.out_dtype()
    x = jnp.abs(self.astype(_acc(out) if dtype is None else jnp.dtype(out)))
    axes = _dims(dim, self.ndim)
    if ord == float("inf"):
        r = jnp.max(x, axis=axes, keepdims=keepdim)
    elif ord == float("-inf"):
        r = jnp.min(x, axis=axes, keepdims=keepdim)
    elif ord == 0:
        r = jnp.sum(x != 0, axis=axes, keepdims=keepdim).astype(x.dtype)
    elif ord == 1:
        r = jnp.sum(x, axis=axes, keepdims=keepdim)
    elif ord == 2:
        r = jnp.sqrt(jnp.sum(x * x, axis=axes, keepdims=keepdim))
    else:
        r = jnp.sum(x**ord, axis=axes, keepdims=keepdim) ** (1.0 / ord)
    return r.astype(out)


@register_lowering(aten.cumsum.default)
def cumsum(ctx, self, dim, dtype=None):
    out = ctx.out_dtype()
    if self.ndim == 0:
        return self.astype(out)
    return jnp.cumsum(self.astype(_acc(out)), axis=dim).astype(out)


@register_lowering(aten.cumprod.default)
def cumprod(ctx, self, dim, dtype=None):
    out = ctx.out_dtype()
    if self.ndim == 0:
        return self.astype(out)
    return jnp.cumprod(self.astype(_acc(out)), axis=dim).astype(out)


# aten::histc(Tensor self, int bins=100, Scalar min=0, Scalar max=0) -> Tensor
@register_lowering(aten.histc.default)
def histc(ctx, self, bins=100, min=0, max=0):
    # Mirrors torch's CPU kernel: the bin is int((x - lo) * bins / (hi - lo)) in the input dtype,
    # x == hi lands in the last bin, values outside [lo, hi] (and NaN) are not counted.
    x = self.reshape(-1)
    if min == max and x.size:
        lo, hi = jnp.min(x), jnp.max(x)
    else:
        lo, hi = jnp.asarray(min, x.dtype), jnp.asarray(max, x.dtype)
    # NOTE: torch raises when the range is not finite (e.g. NaN input with min == max); a
    # compiled graph can't raise on data, so such inputs count nothing.
    same = lo == hi
    lo, hi = jnp.where(same, lo - 1, lo), jnp.where(same, hi + 1, hi)
    keep = (x >= lo) & (x <= hi)
    pos = jnp.where(keep, (x - lo) * bins / (hi - lo), 0).astype(jnp.int64)
    pos = jnp.clip(pos, 0, bins - 1)
    counts = jnp.zeros((bins,), x.dtype).at[pos].add(keep.astype(x.dtype))
    return counts.astype(ctx.out_dtype())


# aten::sort.stable(Tensor self, *, bool? stable, int dim=-1, bool descending=False)
@register_lowering(aten.sort.default, aten.sort.stable)
def sort(ctx, self, *args, stable=None, dim=-1, descending=False):
    if args:  # sort.default(self, int dim=-1, bool descending=False)
        dim = args[0]
        descending = args[1] if len(args) > 1 else descending
    if self.ndim == 0:
        return self, jnp.zeros((), jnp.int64)
    dim = dim + self.ndim if dim < 0 else dim
    iota = lax.broadcasted_iota(jnp.int64, self.shape, dim)
    keys = self
    if descending:
        # NOTE: stable descending: sort the negated order key, NaN first like torch.
        if jnp.issubdtype(self.dtype, jnp.floating):
            keys = jnp.where(jnp.isnan(self), -jnp.inf, -self)
            nan_first = jnp.where(jnp.isnan(self), 0, 1)
            _, _, idx = lax.sort((nan_first, keys, iota), dimension=dim, num_keys=2, is_stable=True)
        elif self.dtype == jnp.bool_:
            _, idx = lax.sort((~self, iota), dimension=dim, num_keys=1, is_stable=True)
        elif jnp.issubdtype(self.dtype, jnp.unsignedinteger):
            _, idx = lax.sort((~self, iota), dimension=dim, num_keys=1, is_stable=True)
        else:
            # -x overflows for the minimum value; ~x = -x - 1 keeps the order exactly.
            _, idx = lax.sort((~self, iota), dimension=dim, num_keys=1, is_stable=True)
    else:
        # lax.sort orders NaN last, like torch.
        _, idx = lax.sort((keys, iota), dimension=dim, num_keys=1, is_stable=True)
    return jnp.take_along_axis(self, idx, axis=dim), idx


# aten::topk(Tensor self, SymInt k, int dim=-1, bool largest=True, bool sorted=True)
@register_lowering(aten.topk.default)
def topk(ctx, self, k, dim=-1, largest=True, sorted=True):
    values, idx = sort(ctx, self, dim=dim, descending=largest)
    if self.ndim == 0:
        return values, idx
    dim = dim + self.ndim if dim < 0 else dim
    return lax.slice_in_dim(values, 0, k, axis=dim), lax.slice_in_dim(idx, 0, k, axis=dim)

"""Indexing: advanced indexing, index_put, gather/scatter families, index_select, masked ops.

Negative indices wrap like torch. Out-of-range indices, which torch rejects eagerly, are
clamped (gathers) or dropped (scatters) by XLA instead of raising.
"""

from __future__ import annotations

import jax.numpy as jnp
import torch
from tpu_inductor.lowerings.registry import register_lowering

aten = torch.ops.aten


def _wrap(idx, size):
    if idx.dtype == jnp.bool_:
        raise NotImplementedError("boolean-mask indexing has a data-dependent output shape")
    return jnp.where(idx < 0, idx + size, idx)


def _index_tuple(self, indices):
    out = []
    for d, i in enumerate(indices):
        out.append(slice(None) if i is None else _wrap(i, self.shape[d]))
    return tuple(out)


# aten::index.Tensor(Tensor self, Tensor?[] indices) -> Tensor
@register_lowering(aten.index.Tensor, aten.index.Tensor_hacked_twin)
def index(ctx, self, indices):
    return self[_index_tuple(self, indices)]


# aten::index_put(Tensor self, Tensor?[] indices, Tensor values, bool accumulate=False) -> Tensor
@register_lowering(
    aten.index_put.default, aten.index_put.hacked_twin, aten._unsafe_index_put.default
)
def index_put(ctx, self, indices, values, accumulate=False):
    idx = _index_tuple(self, indices)
    values = values.astype(self.dtype)
    if accumulate:
        # NOTE: duplicate indices all accumulate, like torch's accumulate=True.
        return self.at[idx].add(values)
    return self.at[idx].set(values)


@register_lowering(aten._unsafe_index.Tensor)
def unsafe_index(ctx, self, indices):
    return self[_index_tuple(self, indices)]


# aten::gather(Tensor self, int dim, Tensor index, *, bool sparse_grad=False) -> Tensor
@register_lowering(aten.gather.default)
def gather(ctx, self, dim, index, sparse_grad=False):
    if self.ndim == 0:
        return jnp.broadcast_to(self, index.shape)
    dim = dim + self.ndim if dim < 0 else dim
    return jnp.take_along_axis(self, _wrap(index, self.shape[dim]), axis=dim, mode="clip")


def _scatter_index(self, dim, index):
    """Full coordinate tuple for scatter-style ops: index along dim, iota elsewhere."""
    dim = dim + self.ndim if dim < 0 else dim
    grids = jnp.meshgrid(*[jnp.arange(n) for n in index.shape], indexing="ij")
    grids[dim] = _wrap(index, self.shape[dim])
    return tuple(grids)


def _src(src, index, dtype):
    src = jnp.asarray(src, dtype=dtype)
    if src.ndim == 0:
        return jnp.broadcast_to(src, index.shape)
    return src[tuple(slice(0, n) for n in index.shape)]


# aten::scatter.src(Tensor self, int dim, Tensor index, Tensor src) -> Tensor
@register_lowering(aten.scatter.src, aten.scatter.value)
def scatter(ctx, self, dim, index, src):
    if self.ndim == 0:
        return jnp.asarray(src, self.dtype).reshape(()) if index.size else self
    return self.at[_scatter_index(self, dim, index)].set(_src(src, index, self.dtype))


@register_lowering(aten.scatter.reduce, aten.scatter.value_reduce)
def scatter_reduce_legacy(ctx, self, dim, index, src, reduce):
    at = self.at[_scatter_index(self, dim, index)]
    src = _src(src, index, self.dtype)
    return at.add(src) if reduce == "add" else at.multiply(src)


@register_lowering(aten.scatter_add.default)
def scatter_add(ctx, self, dim, index, src):
    if self.ndim == 0:
        return self + jnp.sum(src) if index.size else self
    return self.at[_scatter_index(self, dim, index)].add(_src(src, index, self.dtype))


# aten::scatter_reduce.two(Tensor self, int dim, Tensor index, Tensor src, str reduce, *,
#                          bool include_self=True) -> Tensor
@register_lowering(aten.scatter_reduce.two)
def scatter_reduce(ctx, self, dim, index, src, reduce, include_self=True):
    idx = _scatter_index(self, dim, index) if self.ndim else ()
    src = _src(src, index, self.dtype)
    if reduce == "sum":
        base = self if include_self else self.at[idx].set(0)
        return base.at[idx].add(src)
    if reduce == "prod":
        base = self if include_self else self.at[idx].set(1)
        return base.at[idx].multiply(src)
    if reduce in ("amax", "amin"):
        if include_self:
            base = self
        else:
            fill = -jnp.inf if reduce == "amax" else jnp.inf
            if not jnp.issubdtype(self.dtype, jnp.floating):
                info = jnp.iinfo(self.dtype)
                fill = info.min if reduce == "amax" else info.max
            base = self.at[idx].set(fill)
        return base.at[idx].max(src) if reduce == "amax" else base.at[idx].min(src)
    if reduce == "mean":
        acc = jnp.float32 if not jnp.issubdtype(self.dtype, jnp.floating) else self.dtype
        base = self.astype(acc) if include_self else self.astype(acc).at[idx].set(0)
        total = base.at[idx].add(src.astype(acc))
        count = jnp.ones(self.shape, acc) if include_self else jnp.zeros(self.shape, acc)
        count = count.at[idx].add(1)
        mean = total / jnp.maximum(count, 1)
        if not jnp.issubdtype(self.dtype, jnp.floating):
            mean = jnp.floor_divide(total, jnp.maximum(count, 1))
        return mean.astype(self.dtype)
    raise NotImplementedError(f"scatter_reduce reduce={reduce!r}")


@register_lowering(aten.index_select.default)
def index_select(ctx, self, dim, index):
    if self.ndim == 0:
        return self.reshape(index.shape) if index.ndim else self
    dim = dim + self.ndim if dim < 0 else dim
    return jnp.take(self, _wrap(index.reshape(-1), self.shape[dim]), axis=dim)


# aten::index_add(Tensor self, int dim, Tensor index, Tensor source, *, Scalar alpha=1) -> Tensor
@register_lowering(aten.index_add.default)
def index_add(ctx, self, dim, index, source, alpha=1):
    dim = dim + self.ndim if dim < 0 else dim
    src = jnp.moveaxis(source.astype(self.dtype) * alpha, dim, 0)
    moved = jnp.moveaxis(self, dim, 0).at[_wrap(index, self.shape[dim])].add(src)
    return jnp.moveaxis(moved, 0, dim)


@register_lowering(aten.index_copy.default)
def index_copy(ctx, self, dim, index, source):
    dim = dim + self.ndim if dim < 0 else dim
    src = jnp.moveaxis(source.astype(self.dtype), dim, 0)
    moved = jnp.moveaxis(self, dim, 0).at[_wrap(index, self.shape[dim])].set(src)
    return jnp.moveaxis(moved, 0, dim)


@register_lowering(aten.index_fill.int_Scalar, aten.index_fill.int_Tensor)
def index_fill(ctx, self, dim, index, value):
    dim = dim + self.ndim if dim < 0 else dim
    moved = (
        jnp.moveaxis(self, dim, 0)
        .at[_wrap(index, self.shape[dim])]
        .set(jnp.asarray(value, self.dtype))
    )
    return jnp.moveaxis(moved, 0, dim)


# aten::masked_fill.Scalar(Tensor self, Tensor mask, Scalar value) -> Tensor
@register_lowering(aten.masked_fill.Scalar, aten.masked_fill.Tensor)
def masked_fill(ctx, self, mask, value):
    return jnp.where(mask, jnp.asarray(value).astype(self.dtype), self)

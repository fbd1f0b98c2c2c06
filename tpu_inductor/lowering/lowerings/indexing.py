"""Indexing: advanced indexing, index_put, gather/scatter families, index_select, masked ops.

Negative indices wrap like torch. Out-of-range indices, which torch rejects eagerly, are
clamped (gathers) or dropped (scatters) by XLA instead of raising.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import torch
from jax import lax

from tpu_inductor.lowering.lowerings.registry import lowers

aten = torch.ops.aten


def _wrap(idx, size):
    if idx.dtype == jnp.bool_:
        raise NotImplementedError("boolean-mask indexing has a data-dependent output shape")
    return jnp.where(idx < 0, idx + size, idx)


def _int_if_bool(x):
    """Bools as int32, so sums, products and extrema become or/and (cast back with != 0)."""
    return x.astype(jnp.int32) if x.dtype == jnp.bool_ else x


def _like(out, dtype):
    return out != 0 if dtype == jnp.bool_ else out.astype(dtype)


def _index_tuple(self, indices):
    out = []
    for d, i in enumerate(indices):
        out.append(slice(None) if i is None else _wrap(i, self.shape[d]))
    return tuple(out)


# aten::index.Tensor(Tensor self, Tensor?[] indices) -> Tensor
@lowers(aten.index.Tensor, aten.index.Tensor_hacked_twin)
def index(ctx, self, indices):
    return self[_index_tuple(self, indices)]


# aten::index_put(Tensor self, Tensor?[] indices, Tensor values, bool accumulate=False) -> Tensor
@lowers(aten.index_put.default, aten.index_put.hacked_twin, aten._unsafe_index_put.default)
def index_put(ctx, self, indices, values, accumulate=False):
    if any(i is not None and i.dtype in (jnp.bool_, jnp.uint8) for i in indices):
        return _mask_put(self, list(indices), values, accumulate)
    idx = _index_tuple(self, indices)
    values = values.astype(self.dtype)
    if accumulate:
        # NOTE: duplicate indices all accumulate, like torch's accumulate=True (or, for bools).
        return _like(_int_if_bool(self).at[idx].add(_int_if_bool(values)), self.dtype)
    return self.at[idx].set(values)


def _mask_put(self, indices, values, accumulate):
    """``x[mask] = v`` (``x[:, mask] = v``): every True position takes the next value, in
    row-major order, or the one value that broadcasts; a where, not a data-dependent shape.
    ``unsupported.REFUSED`` lets only a mask after leading Nones through."""
    while indices[-1] is None:
        indices.pop()
    mask, p = indices[-1], len(indices) - 1
    rest = self.shape[p + mask.ndim :]
    # v broadcasts to x[mask]'s shape: lead + (n_true,) + rest. Its n_true axis has a static
    # size n here: 1 (one value for every True) or the number of Trues (torch checks that).
    lead = self.shape[:p]
    values = values.astype(self.dtype)
    values = values.reshape((1,) * (len(lead) + 1 + len(rest) - values.ndim) + values.shape)
    n = values.shape[p]
    values = jnp.broadcast_to(values, lead + (n,) + rest)
    mask = mask.astype(jnp.bool_)
    # NOTE: a values axis of n > 1 that is not the number of Trues, which torch rejects, gives
    # the k-th True the min(k, n-1)-th value instead of raising.
    rank = jnp.clip(jnp.cumsum(mask.reshape(-1).astype(jnp.int32)) - 1, 0, n - 1)
    spread = jnp.take(values, rank.reshape(mask.shape), axis=p)  # lead + mask.shape + rest
    where = mask.reshape((1,) * p + mask.shape + (1,) * len(rest))
    if not accumulate:
        return jnp.where(where, spread, self)
    added = _int_if_bool(self) + jnp.where(where, _int_if_bool(spread), 0)
    return _like(added, self.dtype)


# aten::_unsafe_index.Tensor(Tensor self, Tensor?[] indices) -> Tensor
@lowers(aten._unsafe_index.Tensor)
def unsafe_index(ctx, self, indices):
    return self[_index_tuple(self, indices)]


# aten::gather(Tensor self, int dim, Tensor index, *, bool sparse_grad=False) -> Tensor
@lowers(aten.gather.default)
def gather(ctx, self, dim, index, sparse_grad=False):
    if index.size == 0:
        return jnp.zeros(ctx.out_shape(), self.dtype)
    if self.ndim == 0:
        return jnp.broadcast_to(self, index.shape)
    dim = dim + self.ndim if dim < 0 else dim
    if index.ndim == 0:  # a 0-d index into a 1-d input (torch allows it): a 0-d result
        return jnp.take(self, _wrap(index, self.shape[dim]), mode="clip")
    # torch allows index.size(d) <= self.size(d) in the dimensions other than dim and reads
    # only the leading part there; take_along_axis would broadcast them instead.
    self = self[_leading(index.shape, dim)]
    return jnp.take_along_axis(self, _wrap(index, self.shape[dim]), axis=dim, mode="clip")


def _leading(shape, dim) -> tuple:
    """``self[...]`` keeping the first ``shape[d]`` entries of every dimension but ``dim``."""
    return tuple(slice(None) if d == dim else slice(0, n) for d, n in enumerate(shape))


# aten::take(Tensor self, Tensor index) -> Tensor
@lowers(aten.take.default)
def take(ctx, self, index):
    # Lowered rather than decomposed: torch's decomposition, ``self.reshape(-1)[index]``, turns
    # a 0-d index into a Python integer (a data-dependent .item()).
    flat = self.reshape(-1)
    return jnp.take(flat, _wrap(index, flat.shape[0]), mode="clip")


def _scatter_index(self, dim, index):
    """Full coordinate tuple for scatter-style ops: index along dim, iota elsewhere."""
    dim = dim + self.ndim if dim < 0 else dim
    grids = jnp.meshgrid(*[jnp.arange(n) for n in index.shape], indexing="ij")
    grids[dim] = _wrap(index, self.shape[dim])
    return tuple(grids)


def _flat1(x):
    return jnp.reshape(x, (-1,)) if isinstance(x, jax.Array) else x


def _src(src, index, dtype):
    src = jnp.asarray(src, dtype=dtype)
    if src.ndim == 0:
        return jnp.broadcast_to(src, index.shape)
    return src[_leading(index.shape, None)]


# aten::scatter.src(Tensor self, int dim, Tensor index, Tensor src) -> Tensor
@lowers(aten.scatter.src, aten.scatter.value)
def scatter(ctx, self, dim, index, src):
    if self.ndim == 0:
        return jnp.asarray(src, self.dtype).reshape(()) if index.size else self
    return self.at[_scatter_index(self, dim, index)].set(_src(src, index, self.dtype))


# aten::scatter.reduce(Tensor self, int dim, Tensor index, Tensor src, *, str reduce) -> Tensor
@lowers(aten.scatter.reduce, aten.scatter.value_reduce)
def scatter_reduce_legacy(ctx, self, dim, index, src, reduce):
    if self.ndim == 0:
        out = scatter_reduce_legacy(ctx, self.reshape(1), 0, index.reshape(-1), _flat1(src), reduce)
        return out.reshape(())
    at = _int_if_bool(self).at[_scatter_index(self, dim, index)]
    src = _int_if_bool(_src(src, index, self.dtype))
    return _like(at.add(src) if reduce == "add" else at.multiply(src), self.dtype)


# aten::scatter_add(Tensor self, int dim, Tensor index, Tensor src) -> Tensor
@lowers(aten.scatter_add.default)
def scatter_add(ctx, self, dim, index, src):
    if self.ndim == 0:
        if not index.size:
            return self
        total = jnp.sum(_int_if_bool(jnp.asarray(src, self.dtype)).reshape(-1)[: index.size])
        return _like(_int_if_bool(self) + total, self.dtype)
    src = _int_if_bool(_src(src, index, self.dtype))
    return _like(_int_if_bool(self).at[_scatter_index(self, dim, index)].add(src), self.dtype)


# aten::scatter_reduce.two(Tensor self, int dim, Tensor index, Tensor src, str reduce, *,
#                          bool include_self=True) -> Tensor
@lowers(aten.scatter_reduce.two)
def scatter_reduce(ctx, self, dim, index, src, reduce, include_self=True):
    idx = _scatter_index(self, dim, index) if self.ndim else ()
    src = _src(src, index, self.dtype)
    if self.dtype == jnp.bool_ and reduce != "mean":
        # Bools reduce as or (sum, amax) / and (prod, amin), as in torch.
        out = scatter_reduce(
            ctx, self.astype(jnp.int32), dim, index, src.astype(jnp.int32), reduce, include_self
        )
        return out != 0
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


# aten::index_select(Tensor self, int dim, Tensor index) -> Tensor
@lowers(aten.index_select.default)
def index_select(ctx, self, dim, index):
    if self.ndim == 0:
        return jnp.reshape(self, ctx.out_shape())
    dim = dim + self.ndim if dim < 0 else dim
    return jnp.take(self, _wrap(index.reshape(-1), self.shape[dim]), axis=dim)


def _along(self, dim, index, source, update):
    """``update(self, index, source)`` with ``dim`` moved first; a 0-d self is a 1-element row.

    ``index`` is flattened and wrapped; ``source`` (when given) is moved like ``self``.
    """
    shape = self.shape
    if self.ndim == 0:
        self, dim = self.reshape(1), 0
        source = None if source is None else jnp.reshape(source, (-1,))
    dim = dim + self.ndim if dim < 0 else dim
    idx = _wrap(index.reshape(-1), self.shape[dim])
    if source is not None:
        source = jnp.moveaxis(source.astype(self.dtype), dim, 0)
    out = update(jnp.moveaxis(self, dim, 0), idx, source)
    return jnp.moveaxis(out, 0, dim).reshape(shape)


# aten::index_add(Tensor self, int dim, Tensor index, Tensor source, *, Scalar alpha=1) -> Tensor
@lowers(aten.index_add.default)
def index_add(ctx, self, dim, index, source, alpha=1):
    if alpha != 1:
        source = (source * alpha).astype(self.dtype)
    return _along(
        self,
        dim,
        index,
        source,
        lambda s, i, src: _like(_int_if_bool(s).at[i].add(_int_if_bool(src)), s.dtype),
    )


# aten::index_copy(Tensor self, int dim, Tensor index, Tensor source) -> Tensor
@lowers(aten.index_copy.default)
def index_copy(ctx, self, dim, index, source):
    # NOTE: written in place along ``dim`` (a KV cache's positions), not with ``dim`` moved
    # first: XLA:TPU made that transpose a copy of the whole cache for one kv head per device.
    if self.ndim == 0:
        return _along(self, dim, index, source, lambda s, i, src: s.at[i].set(src))
    dim %= self.ndim
    idx = _wrap(index.reshape(-1), self.shape[dim])
    source = jnp.reshape(
        source.astype(self.dtype), self.shape[:dim] + idx.shape + self.shape[dim + 1 :]
    )
    if idx.shape[0] == 1:  # one row (a decode step): an update slice
        return lax.dynamic_update_slice_in_dim(self, source, idx[0], dim)
    return self.at[(slice(None),) * dim + (idx,)].set(source)


# aten::index_fill.int_Scalar(Tensor self, int dim, Tensor index, Scalar value) -> Tensor
@lowers(aten.index_fill.int_Scalar, aten.index_fill.int_Tensor)
def index_fill(ctx, self, dim, index, value):
    value = jnp.asarray(value, self.dtype)
    return _along(self, dim, index, None, lambda s, i, _: s.at[i].set(value))


# aten::index_reduce(Tensor self, int dim, Tensor index, Tensor source, str reduce, *,
#                    bool include_self=True) -> Tensor
@lowers(aten.index_reduce.default)
def index_reduce(ctx, self, dim, index, source, reduce, include_self=True):
    floating = jnp.issubdtype(self.dtype, jnp.floating)

    def update(s, i, src):
        if reduce == "prod":
            base = s if include_self else s.at[i].set(1)
            return base.at[i].multiply(src)
        if reduce in ("amax", "amin"):
            if include_self:
                base = s
            elif floating:
                base = s.at[i].set(-jnp.inf if reduce == "amax" else jnp.inf)
            else:
                info = jnp.iinfo(s.dtype)
                base = s.at[i].set(info.min if reduce == "amax" else info.max)
            return base.at[i].max(src) if reduce == "amax" else base.at[i].min(src)
        if reduce == "mean":
            base = s if include_self else s.at[i].set(0)
            total = base.at[i].add(src)
            count = jnp.ones(s.shape[:1], s.dtype if floating else jnp.int64)
            if not include_self:
                count = count.at[i].set(0)
            count = jnp.maximum(count.at[i].add(1), 1).reshape((-1,) + (1,) * (s.ndim - 1))
            if floating:
                return (total / count.astype(s.dtype)).astype(s.dtype)
            # Integers: floor division, like torch's div_(counts, rounding_mode="floor").
            return jnp.floor_divide(total, count.astype(s.dtype)).astype(s.dtype)
        raise NotImplementedError(f"index_reduce reduce={reduce!r}")

    return _along(self, dim, index, source, update)


# aten::masked_scatter(Tensor self, Tensor mask, Tensor source) -> Tensor
@lowers(aten.masked_scatter.default)
def masked_scatter(ctx, self, mask, source):
    # The k-th True position (row-major) takes source's k-th element.
    # NOTE: a source with fewer elements than mask has Trues, which torch rejects, repeats its
    # last element instead of raising.
    shape = ctx.out_shape()
    self = jnp.broadcast_to(self, shape).reshape(-1)
    mask = jnp.broadcast_to(mask, shape).reshape(-1)
    flat = source.reshape(-1).astype(self.dtype)
    if flat.size == 0:
        return self.reshape(shape)
    pos = jnp.clip(jnp.cumsum(mask.astype(jnp.int32)) - 1, 0, flat.size - 1)
    return jnp.where(mask, flat[pos], self).reshape(shape)


# aten::put(Tensor self, Tensor index, Tensor source, bool accumulate=False) -> Tensor
@lowers(aten.put.default)
def put(ctx, self, index, source, accumulate=False):
    flat = self.reshape(-1)
    idx = _wrap(index.reshape(-1), flat.shape[0])
    src = source.reshape(-1).astype(self.dtype)
    if accumulate:
        out = _like(_int_if_bool(flat).at[idx].add(_int_if_bool(src)), self.dtype)
    else:
        out = flat.at[idx].set(src)
    return out.reshape(self.shape)


# aten::nonzero_static(Tensor self, *, SymInt size, int fill_value=-1) -> Tensor
@lowers(aten.nonzero_static.default)
def nonzero_static(ctx, self, *, size, fill_value=-1):
    if self.ndim == 0 or self.size == 0:
        return jnp.full((size, self.ndim), fill_value, jnp.int64)
    coords = jnp.nonzero(self, size=size, fill_value=fill_value)
    return jnp.stack(coords, axis=1).astype(jnp.int64)


# aten::masked_fill.Scalar(Tensor self, Tensor mask, Scalar value) -> Tensor
@lowers(aten.masked_fill.Scalar, aten.masked_fill.Tensor)
def masked_fill(ctx, self, mask, value):
    return jnp.where(mask, jnp.asarray(value).astype(self.dtype), self)

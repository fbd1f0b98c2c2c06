"""Selection and search on sorted data: median, nanmedian, kthvalue, mode, searchsorted, bucketize.

Selections sort each slice stably on (value, position), NaN last, and pick a rank, which is the
order torch's CPU kernels define for median (``nth_element`` on (value, index)). Searches run
torch's own binary search, unrolled to the sequence's static length, so NaN values and unsorted
sequences land where torch puts them.
"""

from __future__ import annotations

import jax.numpy as jnp
import torch
from jax import lax

from tpu_inductor.lowering.lowerings.registry import jdt, lowers

aten = torch.ops.aten


def _sorted_with_index(x, axis):
    """``x`` sorted along ``axis`` (NaN last, ties by position) and the original positions."""
    iota = lax.broadcasted_iota(jnp.int64, x.shape, axis)
    keys = x.astype(jnp.int8) if x.dtype == jnp.bool_ else x
    _, idx = lax.sort((keys, iota), dimension=axis, num_keys=1, is_stable=True)
    return jnp.take_along_axis(x, idx, axis=axis), idx


def _pick(values, idx, pos, axis, keepdim):
    """values/idx at per-slice rank ``pos`` (shape of the slice without ``axis``)."""
    pos = jnp.expand_dims(pos, axis)
    v = jnp.take_along_axis(values, pos, axis=axis)
    i = jnp.take_along_axis(idx, pos, axis=axis)
    if not keepdim:
        v, i = jnp.squeeze(v, axis), jnp.squeeze(i, axis)
    return v, i


def _median(x, dim, keepdim, ignore_nan):
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int64)
    axis = dim % x.ndim
    size = x.shape[axis]
    values, idx = _sorted_with_index(x, axis)
    if not jnp.issubdtype(x.dtype, jnp.floating):
        pos = jnp.full(values.shape[:axis] + values.shape[axis + 1 :], (size - 1) // 2)
        return _pick(values, idx, pos, axis, keepdim)
    nan = jnp.isnan(x)
    if ignore_nan:
        # The lower median of the non-NaN values; all-NaN slices give their first NaN.
        count = size - jnp.sum(nan, axis=axis)
        pos = jnp.maximum(count - 1, 0) // 2
        return _pick(values, idx, pos, axis, keepdim)
    # median: a slice holding NaN gives NaN at the first NaN's position.
    pos = jnp.full(values.shape[:axis] + values.shape[axis + 1 :], (size - 1) // 2)
    v, i = _pick(values, idx, pos, axis, keepdim)
    any_nan = jnp.any(nan, axis=axis, keepdims=keepdim)
    first_nan = jnp.argmax(nan, axis=axis, keepdims=keepdim).astype(jnp.int64)
    return jnp.where(any_nan, jnp.nan, v).astype(x.dtype), jnp.where(any_nan, first_nan, i)


# aten::median.dim(Tensor self, int dim, bool keepdim=False) -> (Tensor values, Tensor indices)
@lowers(aten.median.dim)
def median_dim(ctx, self, dim, keepdim=False):
    return _median(self, dim, keepdim, ignore_nan=False)


# aten::nanmedian.dim(Tensor self, int dim, bool keepdim=False) -> (Tensor values, Tensor indices)
@lowers(aten.nanmedian.dim)
def nanmedian_dim(ctx, self, dim, keepdim=False):
    return _median(self, dim, keepdim, ignore_nan=True)


# aten::median(Tensor self) -> Tensor
@lowers(aten.median.default)
def median(ctx, self):
    return _median(self.reshape(-1), 0, False, ignore_nan=False)[0]


# aten::nanmedian(Tensor self) -> Tensor
@lowers(aten.nanmedian.default)
def nanmedian(ctx, self):
    return _median(self.reshape(-1), 0, False, ignore_nan=True)[0]


# aten::kthvalue(Tensor self, SymInt k, int dim=-1, bool keepdim=False) -> (Tensor values, ...)
@lowers(aten.kthvalue.default)
def kthvalue(ctx, self, k, dim=-1, keepdim=False):
    if self.ndim == 0:
        return self, jnp.zeros((), jnp.int64)
    axis = dim % self.ndim
    values, idx = _sorted_with_index(self, axis)
    # NOTE: torch's quickselect leaves the index among equal values unspecified; this returns
    # the k-th in (value, position) order.
    pos = jnp.full(values.shape[:axis] + values.shape[axis + 1 :], k - 1)
    return _pick(values, idx, pos, axis, keepdim)


# aten::mode(Tensor self, int dim=-1, bool keepdim=False) -> (Tensor values, Tensor indices)
@lowers(aten.mode.default)
def mode(ctx, self, dim=-1, keepdim=False):
    if self.ndim == 0:
        return self, jnp.zeros((), jnp.int64)
    axis = dim % self.ndim
    size = self.shape[axis]
    values, idx = _sorted_with_index(self, axis)
    # Runs of equal values in sorted order; the longest run wins, the smallest value on ties
    # (torch keeps the first run that beats the count so far), reporting the position of the
    # run's last element.
    nxt = lax.slice_in_dim(values, 1, size, axis=axis)
    cur = lax.slice_in_dim(values, 0, size - 1, axis=axis)
    last_shape = list(values.shape)
    last_shape[axis] = 1
    run_end = jnp.concatenate([cur != nxt, jnp.ones(last_shape, jnp.bool_)], axis=axis)
    pos = lax.broadcasted_iota(jnp.int64, values.shape, axis)
    run_start = jnp.concatenate(
        [jnp.ones(last_shape, jnp.bool_), lax.slice_in_dim(run_end, 0, size - 1, axis=axis)],
        axis=axis,
    )
    start = lax.cummax(jnp.where(run_start, pos, 0), axis=axis)
    freq = jnp.where(run_end, pos - start + 1, 0)
    best = jnp.argmax(freq, axis=axis)
    return _pick(values, idx, best, axis, keepdim)


def _search(seq, values, right):
    """torch's ``cus_lower_bound`` / ``cus_upper_bound`` over the last axis of ``seq``."""
    length = seq.shape[-1]
    start = jnp.zeros(values.shape, jnp.int64)
    if length == 0:
        return start
    end = jnp.full(values.shape, length, jnp.int64)
    for _ in range(length.bit_length() + 1):
        active = start < end
        mid = start + ((end - start) >> 1)
        safe = jnp.minimum(mid, length - 1)
        mid_val = jnp.take(seq, safe) if seq.ndim == 1 else jnp.take_along_axis(seq, safe, -1)
        # NaN compares false, so a NaN value moves right and ends past the sequence.
        go_right = ~(mid_val > values) if right else ~(mid_val >= values)
        start = jnp.where(active & go_right, mid + 1, start)
        end = jnp.where(active & ~go_right, mid, end)
    return start


def _common(ctx, a, b, i, j):
    """``a`` and ``b`` in torch's result type of the arguments at positions ``i`` and ``j``."""
    dt = jdt(torch.result_type(ctx.arg_metas[i], ctx.arg_metas[j]))
    return jnp.asarray(a).astype(dt), jnp.asarray(b).astype(dt)


# aten::searchsorted.Tensor(Tensor sorted_sequence, Tensor self, *, bool out_int32=False,
#     bool right=False, str? side=None, Tensor? sorter=None) -> Tensor
@lowers(aten.searchsorted.Tensor, aten.searchsorted.Scalar)
def searchsorted(ctx, sorted_sequence, self, out_int32=False, right=False, side=None, sorter=None):
    seq, values = _common(ctx, sorted_sequence, self, 0, 1)
    if sorter is not None:
        seq = jnp.take_along_axis(seq, sorter.astype(jnp.int64), axis=-1)
    right = right or side == "right"
    return _search(seq, values, right).astype(ctx.out_dtype())


# aten::bucketize.Tensor(Tensor self, Tensor boundaries, *, bool out_int32=False,
#     bool right=False) -> Tensor
@lowers(aten.bucketize.Tensor, aten.bucketize.Scalar)
def bucketize(ctx, self, boundaries, out_int32=False, right=False):
    values, seq = _common(ctx, self, boundaries, 0, 1)
    return _search(seq, values, right).astype(ctx.out_dtype())

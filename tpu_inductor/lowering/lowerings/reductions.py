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

from tpu_inductor.lowering.lowerings.registry import lowers, opmath_dtype

aten = torch.ops.aten


def _dims(dim, ndim):
    if dim is None or (isinstance(dim, list | tuple) and len(dim) == 0):
        return None
    dims = dim if isinstance(dim, list | tuple) else [dim]
    return tuple(d + max(ndim, 1) if d < 0 else d for d in dims) if ndim else None


# aten::sum.dim_IntList(Tensor self, int[1]? dim, bool keepdim=False, *, ScalarType? dtype=None)
@lowers(aten.sum.dim_IntList, aten.sum.default)
def sum_(ctx, self, dim=None, keepdim=False, dtype=None):
    out = ctx.out_dtype()
    x = self.astype(opmath_dtype(out))
    return jnp.sum(x, axis=_dims(dim, self.ndim), keepdims=keepdim).astype(out)


# aten::mean.dim(Tensor self, int[1]? dim, bool keepdim=False, *, ScalarType? dtype=None) -> Tensor
@lowers(aten.mean.dim, aten.mean.default)
def mean(ctx, self, dim=None, keepdim=False, dtype=None):
    out = ctx.out_dtype()
    x = self.astype(opmath_dtype(out))
    return jnp.mean(x, axis=_dims(dim, self.ndim), keepdims=keepdim).astype(out)


# aten::prod.dim_int(Tensor self, int dim, bool keepdim=False, *, ScalarType? dtype=None) -> Tensor
@lowers(aten.prod.dim_int, aten.prod.default)
def prod(ctx, self, dim=None, keepdim=False, dtype=None):
    out = ctx.out_dtype()
    return jnp.prod(
        self.astype(opmath_dtype(out)), axis=_dims(dim, self.ndim), keepdims=keepdim
    ).astype(out)


# aten::var.correction(Tensor self, int[1]? dim=None, *, Scalar? correction=None,
#     bool keepdim=False) -> Tensor
@lowers(aten.var.correction)
def var(ctx, self, dim=None, correction=None, keepdim=False):
    out = ctx.out_dtype()
    x = self.astype(opmath_dtype(self.dtype))
    ddof = 1 if correction is None else correction
    return jnp.var(x, axis=_dims(dim, self.ndim), ddof=ddof, keepdims=keepdim).astype(out)


# aten::std.correction(Tensor self, int[1]? dim=None, *, Scalar? correction=None, bool
#   keepdim=False) -> Tensor
@lowers(aten.std.correction)
def std(ctx, self, dim=None, correction=None, keepdim=False):
    return jnp.sqrt(var(ctx, self, dim, correction=correction, keepdim=keepdim))


# aten::var_mean.correction(Tensor self, int[1]? dim=None, *, Scalar? correction=None, bool
#   keepdim=False) -> (Tensor, Tensor)
@lowers(aten.var_mean.correction)
def var_mean(ctx, self, dim=None, correction=None, keepdim=False):
    x = self.astype(opmath_dtype(self.dtype))
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


# aten::amax(Tensor self, int[1] dim=[], bool keepdim=False) -> Tensor
@lowers(aten.amax.default)
def amax(ctx, self, dim=(), keepdim=False):
    return _minmax(jnp.max, self, dim, keepdim)


# aten::amin(Tensor self, int[1] dim=[], bool keepdim=False) -> Tensor
@lowers(aten.amin.default)
def amin(ctx, self, dim=(), keepdim=False):
    return _minmax(jnp.min, self, dim, keepdim)


# aten::max(Tensor self) -> Tensor
@lowers(aten.max.default)
def max_(ctx, self):
    return _minmax(jnp.max, self, None, False)


# aten::min(Tensor self) -> Tensor
@lowers(aten.min.default)
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


# aten::argmax(Tensor self, int? dim=None, bool keepdim=False) -> Tensor
@lowers(aten.argmax.default)
def argmax(ctx, self, dim=None, keepdim=False):
    return _arg(self, dim, keepdim, True)


# aten::argmin(Tensor self, int? dim=None, bool keepdim=False) -> Tensor
@lowers(aten.argmin.default)
def argmin(ctx, self, dim=None, keepdim=False):
    return _arg(self, dim, keepdim, False)


# aten::max.dim(Tensor self, int dim, bool keepdim=False) -> (Tensor values, Tensor indices)
@lowers(aten.max.dim)
def max_dim(ctx, self, dim, keepdim=False):
    return _minmax(jnp.max, self, dim, keepdim), _arg(self, dim, keepdim, True)


# aten::min.dim(Tensor self, int dim, bool keepdim=False) -> (Tensor values, Tensor indices)
@lowers(aten.min.dim)
def min_dim(ctx, self, dim, keepdim=False):
    return _minmax(jnp.min, self, dim, keepdim), _arg(self, dim, keepdim, False)


# aten::any(Tensor self) -> Tensor
@lowers(aten.any.default, aten.any.dim, aten.any.dims)
def any_(ctx, self, dim=None, keepdim=False):
    out = jnp.any(self != 0, axis=_dims(dim, self.ndim), keepdims=keepdim)
    return out.astype(ctx.out_dtype())


# aten::all(Tensor self) -> Tensor
@lowers(aten.all.default, aten.all.dim, aten.all.dims)
def all_(ctx, self, dim=None, keepdim=False):
    out = jnp.all(self != 0, axis=_dims(dim, self.ndim), keepdims=keepdim)
    return out.astype(ctx.out_dtype())


# aten::logsumexp(Tensor self, int[1] dim, bool keepdim=False) -> Tensor
@lowers(aten.logsumexp.default)
def logsumexp(ctx, self, dim, keepdim=False):
    out = ctx.out_dtype()
    x = self.astype(opmath_dtype(out))
    return jax.nn.logsumexp(x, axis=_dims(dim, self.ndim), keepdims=keepdim).astype(out)


# aten::linalg_vector_norm(Tensor self, Scalar ord=2, int[1]? dim=None, bool keepdim=False, ...)
@lowers(aten.linalg_vector_norm.default)
def linalg_vector_norm(ctx, self, ord=2, dim=None, keepdim=False, dtype=None):
    out = ctx.out_dtype()
    # |z| before the cast: out is real for complex inputs, and casting z first drops Im(z).
    x = jnp.abs(self) if jnp.issubdtype(self.dtype, jnp.complexfloating) else self
    x = jnp.abs(x.astype(opmath_dtype(out) if dtype is None else jnp.dtype(out)))
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


# aten::cumsum(Tensor self, int dim, *, ScalarType? dtype=None) -> Tensor
@lowers(aten.cumsum.default)
def cumsum(ctx, self, dim, dtype=None):
    out = ctx.out_dtype()
    if self.ndim == 0:
        return self.astype(out)
    return jnp.cumsum(self.astype(opmath_dtype(out)), axis=dim).astype(out)


# aten::cumprod(Tensor self, int dim, *, ScalarType? dtype=None) -> Tensor
@lowers(aten.cumprod.default)
def cumprod(ctx, self, dim, dtype=None):
    out = ctx.out_dtype()
    if self.ndim == 0:
        return self.astype(out)
    return jnp.cumprod(self.astype(opmath_dtype(out)), axis=dim).astype(out)


# aten::histc(Tensor self, int bins=100, Scalar min=0, Scalar max=0) -> Tensor
@lowers(aten.histc.default)
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
@lowers(aten.sort.default, aten.sort.stable)
def sort(ctx, self, *args, stable=None, dim=-1, descending=False):
    if args:  # sort.default(self, int dim=-1, bool descending=False)
        dim = args[0]
        descending = args[1] if len(args) > 1 else descending
    if self.ndim == 0:
        return self, jnp.zeros((), jnp.int64)
    dim = dim + self.ndim if dim < 0 else dim
    # NOTE: always stable. With stable=False torch's CPU kernel uses std::sort, whose order among
    # equal values is an artifact of introsort (and its radix sort path for integers is stable),
    # so indices of ties can differ from eager (bf16, bool); values are the same.
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
@lowers(aten.topk.default)
def topk(ctx, self, k, dim=-1, largest=True, sorted=True):
    # NOTE: ties come in position order; torch's partial_sort / nth_element leaves their order
    # unspecified, so indices of equal values can differ from eager (values are the same).
    values, idx = sort(ctx, self, dim=dim, descending=largest)
    if self.ndim == 0:
        return values, idx
    dim = dim + self.ndim if dim < 0 else dim
    return lax.slice_in_dim(values, 0, k, axis=dim), lax.slice_in_dim(idx, 0, k, axis=dim)


def _cum_extreme(x, dim, greater):
    """cummax/cummin: a NaN takes over (the latest NaN's index), ties take the later index."""
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int64)
    axis = dim % x.ndim
    keys = x.astype(jnp.int8) if x.dtype == jnp.bool_ else x
    floating = jnp.issubdtype(keys.dtype, jnp.inexact)

    def combine(a, b):
        (av, ai), (bv, bi) = a, b
        take_b = bv >= av if greater else bv <= av
        if floating:
            take_b = jnp.isnan(bv) | (~jnp.isnan(av) & take_b)
        return jnp.where(take_b, bv, av), jnp.where(take_b, bi, ai)

    iota = lax.broadcasted_iota(jnp.int64, x.shape, axis)
    values, idx = lax.associative_scan(combine, (keys, iota), axis=axis)
    return values.astype(x.dtype), idx


# aten::cummax(Tensor self, int dim) -> (Tensor values, Tensor indices)
@lowers(aten.cummax.default)
def cummax(ctx, self, dim):
    return _cum_extreme(self, dim, greater=True)


# aten::cummin(Tensor self, int dim) -> (Tensor values, Tensor indices)
@lowers(aten.cummin.default)
def cummin(ctx, self, dim):
    return _cum_extreme(self, dim, greater=False)


# aten::logcumsumexp(Tensor self, int dim) -> Tensor
@lowers(aten.logcumsumexp.default)
def logcumsumexp(ctx, self, dim):
    out = ctx.out_dtype()
    if self.ndim == 0:
        return self.astype(out)
    return lax.cumlogsumexp(self.astype(opmath_dtype(out)), axis=dim % self.ndim).astype(out)


# aten::dist(Tensor self, Tensor other, Scalar p=2) -> Tensor
@lowers(aten.dist.default)
def dist(ctx, self, other, p=2):
    # torch: linalg_vector_norm(self - other, p), the difference rounded to the input dtype.
    return linalg_vector_norm(ctx, jnp.subtract(self, other), ord=p)


def _linspace(lo, hi, steps):
    """torch's CPU linspace: from ``lo`` up to halfway, from ``hi`` down after."""
    step = (hi - lo) / (steps - 1)
    i = jnp.arange(steps)
    fi = i.astype(lo.dtype)
    return jnp.where(i < steps // 2, lo + step * fi, hi - step * ((steps - 1) - fi))


def _hist_edges(x, bins, range):
    """Bin edges of each column of ``x`` (N, D): torch's outer edges, widened when empty."""
    edges = []
    for d, nbins in enumerate(bins):
        if range is not None:
            lo, hi = jnp.asarray(range[2 * d], x.dtype), jnp.asarray(range[2 * d + 1], x.dtype)
        elif x.shape[0]:
            lo, hi = jnp.min(x[:, d]), jnp.max(x[:, d])
        else:  # no data: [0, 1], like numpy
            lo, hi = jnp.zeros((), x.dtype), jnp.ones((), x.dtype)
        # NOTE: torch raises for non-finite or reversed ranges; a compiled graph cannot raise on
        # data, so those give NaN edges and count nothing.
        same = lo == hi
        lo, hi = jnp.where(same, lo - 0.5, lo), jnp.where(same, hi + 0.5, hi)
        edges.append(_linspace(lo, hi, nbins + 1))
    return edges


def _histogramdd(x, edges, weight, density):
    """Counts (or weights) of the rows of ``x`` (N, D) in the bins ``edges``; NaN and values
    outside the outer edges are skipped, the last bin includes its right edge."""
    keep = jnp.ones(x.shape[:1], jnp.bool_)
    flat = jnp.zeros(x.shape[:1], jnp.int64)
    for d, e in enumerate(edges):
        v, nbins = x[:, d], e.shape[0] - 1
        keep = keep & (v >= e[0]) & (v <= e[-1])
        pos = jnp.searchsorted(e, v, side="right").astype(jnp.int64) - 1
        flat = flat * nbins + jnp.clip(pos, 0, nbins - 1)
    shape = tuple(e.shape[0] - 1 for e in edges)
    w = jnp.ones(x.shape[:1], x.dtype) if weight is None else weight.reshape(-1).astype(x.dtype)
    size = 1
    for n in shape:
        size *= n
    hist = jnp.zeros((size,), x.dtype).at[flat].add(jnp.where(keep, w, 0)).reshape(shape)
    if density:
        hist = hist / jnp.sum(hist)
        for d, e in enumerate(edges):
            hist = hist / jnp.diff(e).reshape([-1 if i == d else 1 for i in range(len(edges))])
    return hist


# aten::histogram.bin_ct(Tensor self, int bins=100, *, float[]? range=None, Tensor? weight=None,
#     bool density=False) -> (Tensor hist, Tensor bin_edges)
@lowers(aten.histogram.bin_ct)
def histogram(ctx, self, bins=100, range=None, weight=None, density=False):
    x = self.reshape(-1, 1)
    edges = _hist_edges(x, [bins], range)
    return _histogramdd(x, edges, weight, density), edges[0]


# aten::histogram.bins_tensor(Tensor self, Tensor bins, *, Tensor? weight=None, bool density=False)
@lowers(aten.histogram.bins_tensor)
def histogram_bins(ctx, self, bins, weight=None, density=False):
    return _histogramdd(self.reshape(-1, 1), [bins], weight, density), bins


# aten::_histogramdd_bin_edges(Tensor self, int[] bins, *, float[]? range=None, ...) -> Tensor[]
@lowers(aten._histogramdd_bin_edges.default)
def histogramdd_bin_edges(ctx, self, bins, range=None, weight=None, density=False):
    return _hist_edges(self.reshape(-1, self.shape[-1]), bins, range)


# aten::_histogramdd_from_bin_cts(Tensor self, int[] bins, *, float[]? range=None, ...) -> Tensor
@lowers(aten._histogramdd_from_bin_cts.default)
def histogramdd_from_bin_cts(ctx, self, bins, range=None, weight=None, density=False):
    x = self.reshape(-1, self.shape[-1])
    return _histogramdd(x, _hist_edges(x, bins, range), weight, density)


# aten::_histogramdd_from_bin_tensors(Tensor self, Tensor[] bins, *, Tensor? weight=None, ...)
@lowers(aten._histogramdd_from_bin_tensors.default)
def histogramdd_from_bin_tensors(ctx, self, bins, weight=None, density=False):
    return _histogramdd(self.reshape(-1, self.shape[-1]), list(bins), weight, density)


# aten::segment_reduce(Tensor data, str reduce, *, Tensor? lengths=None, Tensor? indices=None,
#     Tensor? offsets=None, int axis=0, bool unsafe=False, Scalar? initial=None) -> Tensor
@lowers(aten.segment_reduce.default)
def segment_reduce(
    ctx, data, reduce, lengths=None, indices=None, offsets=None, axis=0, unsafe=False, initial=None
):
    out_shape = ctx.out_shape()
    axis = axis % data.ndim
    if offsets is not None:
        starts, ends = offsets[..., :-1], offsets[..., 1:]
    else:
        ends = jnp.cumsum(lengths, axis=-1)
        starts = ends - lengths
    nseg, n = starts.shape[-1], data.shape[axis]
    outer = 1
    for s in data.shape[:axis]:
        outer *= s
    if nseg == 0 or outer == 0:
        return jnp.zeros(out_shape, data.dtype)
    starts, ends = starts.reshape(outer, nseg), ends.reshape(outer, nseg)
    # Each position's segment: the first whose end lies past it (empty segments are skipped).
    j = jnp.arange(n)
    seg = jnp.stack([jnp.searchsorted(ends[o], j, side="right") for o in range(outer)])
    first = jnp.take_along_axis(starts, jnp.minimum(seg, nseg - 1), axis=1)
    valid = (seg < nseg) & (j >= first)
    ids = jnp.where(valid, jnp.arange(outer)[:, None] * nseg + seg, outer * nseg).reshape(-1)
    acc = opmath_dtype(data.dtype)
    x = data.astype(acc).reshape(outer * n, -1)
    num = outer * nseg
    count = jax.ops.segment_sum(valid.reshape(-1).astype(acc), ids, num_segments=num)[:, None]
    init = None if initial is None else jnp.asarray(initial, acc)
    if reduce in ("max", "min"):
        seg_op = jax.ops.segment_max if reduce == "max" else jax.ops.segment_min
        pick = jnp.maximum if reduce == "max" else jnp.minimum
        inf = jnp.asarray(-jnp.inf if reduce == "max" else jnp.inf, acc)
        has_nan = jax.ops.segment_max(jnp.isnan(x), ids, num_segments=num)
        # Empty segments give the initial value, or -inf (max) / inf (min), like torch.
        r = jnp.where(count > 0, seg_op(x, ids, num_segments=num), inf)
        r = pick(inf if init is None else init, r)
        r = jnp.where(has_nan, jnp.nan, r)
    elif reduce == "prod":
        r = jax.ops.segment_prod(x, ids, num_segments=num) * (1 if init is None else init)
    else:
        r = jax.ops.segment_sum(x, ids, num_segments=num) + (0 if init is None else init)
        if reduce == "mean":
            empty = jnp.nan if init is None else r
            r = jnp.where(count > 0, jnp.where(jnp.isnan(r), r, r / count), empty)
    return r.astype(data.dtype).reshape(out_shape)


def _hash_bits(x):
    """Each element's bits as torch's hash_tensor sees them: floats as float64, ints as int64."""
    if x.dtype == jnp.bool_ or jnp.issubdtype(x.dtype, jnp.integer):
        return lax.bitcast_convert_type(x.astype(jnp.int64), jnp.uint64)
    if x.dtype == jnp.float64:
        return lax.bitcast_convert_type(x, jnp.uint64)
    # float32 (and half types, exact in float32) re-encoded as float64 in integer arithmetic, so
    # no 64-bit float is needed (TPUs have none).
    b = lax.bitcast_convert_type(x.astype(jnp.float32), jnp.uint32).astype(jnp.uint64)
    sign = (b >> 31) << 63
    exp = (b >> 23) & 0xFF
    man = b & 0x7FFFFF
    normal = ((exp + (1023 - 127)) << 52) | (man << 29)
    special = (jnp.uint64(0x7FF) << 52) | (man << 29)
    # Subnormals become normal float64 numbers: shift the leading one out of the mantissa.
    top = 31 - lax.clz(man.astype(jnp.uint32)).astype(jnp.uint64)
    sub = ((top + (1023 - 149)) << 52) | ((man << (52 - top)) & ((1 << 52) - 1))
    out = jnp.where(exp == 0xFF, special, normal)
    out = jnp.where(exp == 0, jnp.where(man == 0, jnp.uint64(0), sub), out)
    return sign | out


# aten::hash_tensor(Tensor self, int[1] dim=[], *, bool keepdim=False, int mode=0) -> Tensor
@lowers(aten.hash_tensor.default)
def hash_tensor(ctx, self, dim=(), keepdim=False, mode=0):
    # mode 0 (the only one): XOR of the elements' bits.
    bits = _hash_bits(self)
    axes = _dims(dim, self.ndim)
    axes = tuple(range(self.ndim)) if axes is None else axes
    out = lax.reduce(bits, jnp.uint64(0), lax.bitwise_xor, axes)
    if keepdim:
        out = out.reshape(ctx.out_shape())
    return out

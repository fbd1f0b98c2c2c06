"""Shape and layout ops: views, reshapes, permutations, slicing, concatenation, padding.

JAX arrays have no strides, so every view becomes a value; AOTAutograd's functionalization
guarantees no one writes through these views.
"""

from __future__ import annotations

import functools
import sys

import jax
import jax.numpy as jnp
import numpy as np
import sympy
import torch
from jax import lax

from tpu_inductor.core.boundary import is_traced
from tpu_inductor.core.errors import ASSERT_FAILED
from tpu_inductor.core.shapes import strided_index
from tpu_inductor.core.sources import user_frame
from tpu_inductor.core.transfers import D2H, TOTAL
from tpu_inductor.lowering.lowerings.registry import lowers

aten = torch.ops.aten


def _dim(d: int, ndim: int) -> int:
    return d + max(ndim, 1) if d < 0 else d


# aten::view(Tensor(a) self, SymInt[] size) -> Tensor(a)
@lowers(aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.view_copy.default)
def view(ctx, self, size):
    # NOTE: the output's meta shape is ``size`` made concrete (-1 resolved, symbols bound).
    return jnp.reshape(self, ctx.out_shape())


# aten::view.dtype(Tensor(a) self, ScalarType dtype) -> Tensor(a)
@lowers(aten.view.dtype)
def view_dtype(ctx, self, dtype):
    out = ctx.out_dtype()
    if out.itemsize == self.dtype.itemsize:
        return lax.bitcast_convert_type(self, out)
    if out.itemsize < self.dtype.itemsize:
        y = lax.bitcast_convert_type(self, out)
        return y.reshape(*self.shape[:-1], -1)
    ratio = out.itemsize // self.dtype.itemsize
    y = self.reshape(*self.shape[:-1], self.shape[-1] // ratio, ratio)
    return lax.bitcast_convert_type(y, out)


# aten::permute(Tensor(a) self, int[] dims) -> Tensor(a)
@lowers(aten.permute.default)
def permute(ctx, self, dims):
    return jnp.transpose(self, [_dim(d, self.ndim) for d in dims])


# aten::transpose.int(Tensor(a) self, int dim0, int dim1) -> Tensor(a)
@lowers(aten.transpose.int)
def transpose(ctx, self, dim0, dim1):
    if self.ndim == 0:  # torch allows dims 0 / -1 of a 0-d tensor: itself
        return self
    return jnp.swapaxes(self, _dim(dim0, self.ndim), _dim(dim1, self.ndim))


# aten::t(Tensor(a) self) -> Tensor(a)
@lowers(aten.t.default)
def t(ctx, self):
    return self.T


# aten::expand(Tensor(a) self, SymInt[] size, *, bool implicit=False) -> Tensor(a)
@lowers(aten.expand.default, aten.expand_copy.default)
def expand(ctx, self, size, implicit=False):
    # NOTE: the output's meta shape is ``size`` made concrete (each -1 as the input's size).
    return jnp.broadcast_to(self, ctx.out_shape())


# aten::unsqueeze(Tensor(a) self, int dim) -> Tensor(a)
@lowers(aten.unsqueeze.default)
def unsqueeze(ctx, self, dim):
    return jnp.expand_dims(self, _dim(dim, self.ndim + 1))


# aten::squeeze(Tensor(a) self) -> Tensor(a)
@lowers(aten.squeeze.default, aten.squeeze.dim, aten.squeeze.dims)
def squeeze(ctx, self, dim=None):
    if self.ndim == 0:
        return self
    dims = range(self.ndim) if dim is None else (dim if isinstance(dim, list | tuple) else [dim])
    dims = tuple(d for d in (_dim(d, self.ndim) for d in dims) if self.shape[d] == 1)
    return jnp.squeeze(self, dims) if dims else self


def _norm_slice(start, end, size):
    start = 0 if start is None else start
    end = size if end is None or end >= sys.maxsize // 2 else end
    start = start + size if start < 0 else start
    end = end + size if end < 0 else end
    start = min(max(start, 0), size)
    end = min(max(end, start), size)
    return start, end


# aten::slice.Tensor(Tensor self, int dim=0, SymInt? start=None, SymInt? end=None, SymInt step=1)
@lowers(aten.slice.Tensor, aten.slice_copy.Tensor)
def slice_(ctx, self, dim=0, start=None, end=None, step=1):
    dim = _dim(dim, self.ndim)
    start, end = _norm_slice(start, end, self.shape[dim])
    return lax.slice_in_dim(self, start, end, step, axis=dim)


# aten::slice_scatter(Tensor self, Tensor src, int dim=0, SymInt? start=None, SymInt? end=None,
#                     SymInt step=1) -> Tensor
@lowers(aten.slice_scatter.default)
def slice_scatter(ctx, self, src, dim=0, start=None, end=None, step=1):
    dim = _dim(dim, self.ndim)
    src = src.astype(self.dtype)
    if is_traced(start) or is_traced(end):
        # A position read from a tensor in the program (x[:, i:i + 2] = v under
        # capture_scalar_outputs): src's size is known, the start is the runtime value.
        # NOTE: like lax.dynamic_update_slice, a start past the end is clamped; eager raises.
        start = _wrap(0 if start is None else start, self.shape[dim])
        if step == 1:
            return lax.dynamic_update_slice_in_dim(self, src, start, axis=dim)
        index = start + jnp.arange(src.shape[dim]) * step
        moved = jnp.moveaxis(self, dim, 0).at[index].set(jnp.moveaxis(src, dim, 0))
        return jnp.moveaxis(moved, 0, dim)
    start, end = _norm_slice(start, end, self.shape[dim])
    index = (slice(None),) * dim + (slice(start, end, step),)
    return self.at[index].set(src)


def _wrap(index, size: int):
    """A position that may be negative (counted from the end), traced or not."""
    if is_traced(index):
        return jnp.where(index < 0, index + size, index)
    return index + size if index < 0 else index


# aten::select_scatter(Tensor self, Tensor src, int dim, SymInt index) -> Tensor
@lowers(aten.select_scatter.default)
def select_scatter(ctx, self, src, dim, index):
    # Lowered rather than decomposed: torch's decomposition (a where over an arange mask)
    # promotes self with src (an int64 src made an int32 self int64); the result is self's dtype.
    dim = _dim(dim, self.ndim)
    index = _wrap(index, self.shape[dim])  # traced: a position read in the program
    if is_traced(index):
        return lax.dynamic_update_index_in_dim(self, src.astype(self.dtype), index, axis=dim)
    return self.at[(slice(None),) * dim + (index,)].set(src.astype(self.dtype))


# aten::select.int(Tensor(a) self, int dim, SymInt index) -> Tensor(a)
@lowers(aten.select.int, aten.select_copy.int)
def select(ctx, self, dim, index):
    dim = _dim(dim, self.ndim)
    index = _wrap(index, self.shape[dim])
    if is_traced(index):  # a position read in the program
        return lax.dynamic_index_in_dim(self, index, axis=dim, keepdims=False)
    return lax.index_in_dim(self, index, axis=dim, keepdims=False)


# aten::narrow(Tensor(a) self, int dim, SymInt start, SymInt length) -> Tensor(a)
@lowers(aten.narrow.default)
def narrow(ctx, self, dim, start, length):
    dim = _dim(dim, self.ndim)
    start = _wrap(start, self.shape[dim])
    if is_traced(start):  # a position read in the program; the length is known
        return lax.dynamic_slice_in_dim(self, start, length, axis=dim)
    return lax.slice_in_dim(self, start, start + length, axis=dim)


# aten::split_with_sizes(Tensor(a -> *) self, SymInt[] split_sizes, int dim=0) -> Tensor(a)[]
@lowers(aten.split_with_sizes.default, aten.split_with_sizes_copy.default)
def split_with_sizes(ctx, self, split_sizes, dim=0):
    dim = _dim(dim, self.ndim)
    offsets = np.cumsum([0, *split_sizes])
    return tuple(
        lax.slice_in_dim(self, int(a), int(b), axis=dim)
        for a, b in zip(offsets[:-1], offsets[1:], strict=True)
    )


# aten::split.Tensor(Tensor(a -> *) self, SymInt split_size, int dim=0) -> Tensor(a)[]
@lowers(aten.split.Tensor, aten.split_copy.Tensor)
def split(ctx, self, split_size, dim=0):
    dim = _dim(dim, self.ndim)
    n = self.shape[dim]
    sizes = [min(split_size, n - i) for i in range(0, n, split_size)] if n else [0]
    return split_with_sizes(ctx, self, sizes, dim)


# aten::unbind.int(Tensor(a -> *) self, int dim=0) -> Tensor(a)[]
@lowers(aten.unbind.int, aten.unbind_copy.int)
def unbind(ctx, self, dim=0):
    dim = _dim(dim, self.ndim)
    return tuple(
        lax.index_in_dim(self, i, axis=dim, keepdims=False) for i in range(self.shape[dim])
    )


# aten::cat(Tensor[] tensors, int dim=0) -> Tensor
@lowers(aten.cat.default)
def cat(ctx, tensors, dim=0):
    dtype = ctx.out_dtype()
    # NOTE: torch skips legacy 1-d empty tensors in cat whatever the other shapes are.
    parts = [t.astype(dtype) for t in tensors if not (t.ndim == 1 and t.shape[0] == 0)]
    if not parts:
        return jnp.zeros(ctx.out_shape(), dtype)
    return jnp.concatenate(parts, axis=_dim(dim, parts[0].ndim))


# aten::stack(Tensor[] tensors, int dim=0) -> Tensor
@lowers(aten.stack.default)
def stack(ctx, tensors, dim=0):
    dtype = ctx.out_dtype()
    return jnp.stack([t.astype(dtype) for t in tensors], axis=_dim(dim, tensors[0].ndim + 1))


# aten::flip(Tensor self, int[] dims) -> Tensor
@lowers(aten.flip.default)
def flip(ctx, self, dims):
    return jnp.flip(self, [_dim(d, self.ndim) for d in dims]) if dims else self


# aten::roll(Tensor self, SymInt[1] shifts, int[1] dims=[]) -> Tensor
@lowers(aten.roll.default)
def roll(ctx, self, shifts, dims=()):
    # A shift may be a value read in the program (torch.roll(x, t.item())): jnp.roll takes a
    # traced shift per axis.
    if not dims:
        return jnp.roll(self.reshape(-1), shifts[0]).reshape(self.shape)
    for shift, d in zip(shifts, dims, strict=True):
        self = jnp.roll(self, shift, _dim(d, self.ndim))
    return self


# aten::repeat(Tensor self, SymInt[] repeats) -> Tensor
@lowers(aten.repeat.default)
def repeat(ctx, self, repeats):
    return jnp.tile(self, repeats)


# aten::constant_pad_nd(Tensor self, SymInt[] pad, Scalar value=0) -> Tensor
@lowers(aten.constant_pad_nd.default)
def constant_pad_nd(ctx, self, pad, value=0):
    # torch lists (before, after) pairs from the last dim backwards; negatives crop.
    config = [(0, 0, 0)] * self.ndim
    for i in range(len(pad) // 2):
        config[self.ndim - 1 - i] = (pad[2 * i], pad[2 * i + 1], 0)
    return lax.pad(self, jnp.asarray(value, dtype=self.dtype), config)


# aten::diagonal(Tensor(a) self, int offset=0, int dim1=0, int dim2=1) -> Tensor(a)
@lowers(aten.diagonal.default, aten.diagonal_copy.default)
def diagonal(ctx, self, offset=0, dim1=0, dim2=1):
    return jnp.diagonal(self, offset, _dim(dim1, self.ndim), _dim(dim2, self.ndim))


# aten::view_as_real(Tensor(a) self) -> Tensor(a)
@lowers(aten.view_as_real.default)
def view_as_real(ctx, self):
    return jnp.stack([jnp.real(self), jnp.imag(self)], axis=-1)


# aten::view_as_complex(Tensor(a) self) -> Tensor(a)
@lowers(aten.view_as_complex.default)
def view_as_complex(ctx, self):
    return lax.complex(self[..., 0], self[..., 1])


# aten::real(Tensor(a) self) -> Tensor(a)
@lowers(aten.real.default)
def real(ctx, self):
    return jnp.real(self)


# aten::imag(Tensor(a) self) -> Tensor(a)
@lowers(aten.imag.default)
def imag(ctx, self):
    return jnp.imag(self)


# aten::diagonal_scatter(Tensor self, Tensor src, int offset=0, int dim1=0, int dim2=1) -> Tensor
@lowers(aten.diagonal_scatter.default)
def diagonal_scatter(ctx, self, src, offset=0, dim1=0, dim2=1):
    dim1, dim2 = _dim(dim1, self.ndim), _dim(dim2, self.ndim)
    moved = jnp.moveaxis(self, (dim1, dim2), (-2, -1))
    n = src.shape[-1]
    rows = np.arange(n) + max(-offset, 0)
    cols = np.arange(n) + max(offset, 0)
    moved = moved.at[..., rows, cols].set(src.astype(self.dtype))
    return jnp.moveaxis(moved, (-2, -1), (dim1, dim2))


# aten::as_strided(Tensor self, SymInt[] size, SymInt[] stride, SymInt? storage_offset) -> Tensor
@lowers(aten.as_strided.default, aten.as_strided_copy.default)
def as_strided(ctx, self, size, stride, storage_offset=None):
    # NOTE: strides index the input's contiguous storage (functionalization hands us bases).
    index = strided_index(size, stride, storage_offset)
    return jnp.reshape(self, -1)[jnp.asarray(index)] if index.size else jnp.zeros(size, self.dtype)


# aten::as_strided_scatter(Tensor self, Tensor src, SymInt[] size, SymInt[] stride,
#                          SymInt? storage_offset=None) -> Tensor
@lowers(aten.as_strided_scatter.default)
def as_strided_scatter(ctx, self, src, size, stride, storage_offset=None):
    # NOTE: like as_strided, strides index self's contiguous storage; where the view overlaps
    # itself, one of the overlapping src elements wins (torch leaves that unspecified too).
    index = strided_index(size, stride, storage_offset)
    if not index.size:
        return self
    flat = (
        jnp.reshape(self, -1)
        .at[jnp.asarray(index.reshape(-1))]
        .set(jnp.reshape(src.astype(self.dtype), -1))
    )
    return flat.reshape(self.shape)


# aten::unfold(Tensor(a) self, int dimension, int size, int step) -> Tensor(a)
@lowers(aten.unfold.default)
def unfold(ctx, self, dimension, size, step):
    if self.ndim == 0:
        return jnp.reshape(self, (1,))
    dim = _dim(dimension, self.ndim)
    n = (self.shape[dim] - size) // step + 1
    idx = np.arange(n)[:, None] * step + np.arange(size)[None, :]
    out = jnp.take(self, jnp.asarray(idx), axis=dim)  # [..., n, size, ...]
    return jnp.moveaxis(out, dim + 1, -1)


# Size queries left in graphs with symbolic shapes; the sizes are concrete while tracing.
# aten::sym_size.int(Tensor self, int dim) -> SymInt
@lowers(aten.sym_size.int)
def sym_size(ctx, self, dim):
    return self.shape[dim]


# aten::sym_numel(Tensor self) -> SymInt
@lowers(aten.sym_numel.default)
def sym_numel(ctx, self):
    return self.size


# aten::sym_stride.int(Tensor self, int dim) -> SymInt
@lowers(aten.sym_stride.int)
def sym_stride(ctx, self, dim):
    strides = np.cumprod((1,) + tuple(reversed(self.shape[1:])))[::-1]
    return int(strides[dim])


# aten::sym_storage_offset(Tensor self) -> SymInt
@lowers(aten.sym_storage_offset.default)
def sym_storage_offset(ctx, self):
    return 0


# Scalars read from tensors (.item() under capture_scalar_outputs) and torch's checks on them.
# aten::_local_scalar_dense(Tensor self) -> Scalar
@lowers(aten._local_scalar_dense.default)
def local_scalar_dense(ctx, self):
    # The value stays a 0-d array in the program; ops taking it as a Scalar promote it as the
    # number torch sees (arg_metas holds the SymInt/SymFloat). unsupported.REFUSED sends a read
    # whose value becomes a size to eager: XLA needs sizes before the program runs, unless the
    # value is built from sizes only: then lower.py evaluated it while tracing, and the number
    # binds the unbacked symbol (u0) it defines, so later sizes in u0 are concrete.
    if isinstance(self, jax.core.Tracer):
        return jnp.reshape(self, ())
    value = np.asarray(self).reshape(()).item()
    sym = ctx.out
    if isinstance(sym, torch.SymInt | torch.SymFloat | torch.SymBool) and ctx.bindings is not None:
        expr = sym.node.expr
        if isinstance(expr, sympy.Symbol):
            ctx.bindings[expr] = value
    return value


# aten::_assert_scalar(Scalar self, str assert_msg) -> ()
@lowers(aten._assert_scalar.default)
def assert_scalar(ctx, self, assert_msg):
    # A size assertion (u0 >= 0, s0 <= 12) is concrete here and checked while tracing, once
    # per signature. NOTE: a condition on a value read in the program (.item()) is dropped:
    # an XLA program cannot raise.
    if isinstance(self, bool | int | float | np.bool_) and not self:
        raise RuntimeError(assert_msg)
    return None


ASSERT_ASYNC_DEFAULT = "Expected Tensor with single nonzero value, but got zero"  # torch's


def _fail_unless(cond, message: str, count: bool = True) -> None:
    # The host half of a value check: runs once the program has computed ``cond`` (or while
    # tracing, for a condition on sizes: no crossing to count).
    if count:
        TOTAL.add(D2H, "check", 1)
    if not np.asarray(cond).reshape(()).item():
        raise RuntimeError(ASSERT_FAILED + message)


# aten::_assert_async(Tensor self) -> ()
# aten::_assert_async.msg(Tensor self, str assert_msg) -> ()
@lowers(aten._assert_async.default, aten._assert_async.msg)
def assert_async(ctx, self, assert_msg=ASSERT_ASYNC_DEFAULT):
    # torch._assert_async(cond): a condition on sizes is concrete here and checked while
    # tracing; one on values is checked on the host by a callback once the program has computed
    # it (one byte per call), raising at the call as torch's CPU kernel does (CUDA's raises later).
    if self.size != 1:
        raise RuntimeError("Boolean value of Tensor with more than one value is ambiguous")
    message = f"{assert_msg}\n  at {user_frame(ctx.node)}"
    if not isinstance(self, jax.core.Tracer):
        _fail_unless(self, message, count=False)
        return None
    jax.debug.callback(functools.partial(_fail_unless, message=message), self.reshape(()) != 0)
    return None


# aten::sym_constrain_range(Scalar size, *, int? min=None, int? max=None) -> ()
@lowers(aten.sym_constrain_range.default, aten.sym_constrain_range_for_size.default)
def sym_constrain_range(ctx, size, *, min=None, max=None):
    # torch._check_is_size / constrain_as_size: range facts for the symbolic-shape solver,
    # nothing to compute.
    return None

"""Tensor factories: full/zeros/ones/empty (and their _like forms), arange, scalar_tensor.

The output dtype always comes from the node's ``meta["val"]`` (torch resolved the default dtype
and any ``dtype=`` argument already). ``empty`` is zero-filled: deterministic, and XLA has no
uninitialized buffers anyway.
"""

from __future__ import annotations

import jax.numpy as jnp
import torch

from tpu_inductor.lowering.lowerings.registry import lowers

aten = torch.ops.aten


def _out(ctx):
    return ctx.out_shape(), ctx.out_dtype()


# aten::full(SymInt[] size, Scalar fill_value, ...); full_like(Tensor self, Scalar fill_value, ...)
@lowers(aten.full.default, aten.full_like.default)
def full(ctx, size_or_self, fill_value, **kwargs):
    shape, dtype = _out(ctx)
    return jnp.full(shape, fill_value, dtype=dtype)


# aten::new_full(Tensor self, SymInt[] size, Scalar fill_value, ...)
@lowers(aten.new_full.default)
def new_full(ctx, self, size, fill_value, **kwargs):
    shape, dtype = _out(ctx)
    return jnp.full(shape, fill_value, dtype=dtype)


# aten::zeros(SymInt[] size, *, ScalarType? dtype=None, Layout? layout=None, Device? device=None,
#   bool? pin_memory=None) -> Tensor
@lowers(
    aten.zeros.default,
    aten.zeros_like.default,
    aten.new_zeros.default,
    aten.empty.memory_format,
    aten.empty_like.default,
    aten.new_empty.default,
    aten.empty_strided.default,
    aten.new_empty_strided.default,
    aten.empty_permuted.default,
)
def zeros(ctx, *args, **kwargs):
    shape, dtype = _out(ctx)
    return jnp.zeros(shape, dtype=dtype)


# aten::ones(SymInt[] size, *, ScalarType? dtype=None, Layout? layout=None, Device? device=None,
#   bool? pin_memory=None) -> Tensor
@lowers(aten.ones.default, aten.ones_like.default, aten.new_ones.default)
def ones(ctx, *args, **kwargs):
    shape, dtype = _out(ctx)
    return jnp.ones(shape, dtype=dtype)


# aten::scalar_tensor(Scalar s, *, ScalarType? dtype=None, ...) -> Tensor
@lowers(aten.scalar_tensor.default)
def scalar_tensor(ctx, s, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.asarray(s).astype(ctx.out_dtype())


# aten::arange.start_step(Scalar start, Scalar end, Scalar step=1, *, ScalarType? dtype=None, ...)
@lowers(aten.arange.start_step, aten.arange.start, aten.arange.default)
def arange(ctx, start, end=None, step=1, dtype=None, layout=None, device=None, pin_memory=None):
    if end is None:
        start, end = 0, start
    (n,), out_dtype = _out(ctx)
    if jnp.issubdtype(out_dtype, jnp.integer):
        return (jnp.arange(n, dtype=jnp.int64) * int(step) + int(start)).astype(out_dtype)
    # NOTE: torch computes start + i * step in double precision, then casts.
    return (start + jnp.arange(n, dtype=jnp.float64) * step).astype(out_dtype)


# aten::linspace(Scalar start, Scalar end, int steps, *, ScalarType? dtype=None, Layout?
#   layout=None, Device? device=None, bool? pin_memory=None) -> Tensor
@lowers(aten.linspace.default)
def linspace(ctx, start, end, steps, dtype=None, layout=None, device=None, pin_memory=None):
    (n,), out_dtype = _out(ctx)
    if n == 1:
        return jnp.full((1,), start, dtype=out_dtype)
    step = (end - start) / (n - 1)
    i = jnp.arange(n, dtype=jnp.float64)
    # NOTE: torch fills the first half from start and the second half from end.
    vals = jnp.where(i < n // 2, start + step * i, end - step * (n - 1 - i))
    if jnp.issubdtype(out_dtype, jnp.integer):
        vals = jnp.trunc(vals)
    return vals.astype(out_dtype)


# aten::eye(SymInt n, *, ScalarType? dtype=None, Layout? layout=None, Device? device=None, bool?
#   pin_memory=None) -> Tensor
@lowers(aten.eye.default, aten.eye.m)
def eye(ctx, n, m=None, **kwargs):
    shape, dtype = _out(ctx)
    return jnp.eye(*shape, dtype=dtype)

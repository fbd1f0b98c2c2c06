"""Random ops. Each draws from ``ctx.key()``: a key derived per call from torch's default
generator and folded with the node's position, so ``torch.manual_seed`` makes compiled runs
repeatable and successive calls differ.

NOTE: the streams differ from torch's (XLA's threefry, not Philox/MT19937): the same seed gives
repeatable results, not the same numbers as eager.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import torch
from tpu_inductor.lowerings.registry import register_lowering

aten = torch.ops.aten


def _out(ctx):
    return ctx.out_shape(), ctx.out_dtype()


def _uniform(ctx, low=0.0, high=1.0):
    shape, dtype = _out(ctx)
    wide = jnp.float64 if dtype == jnp.float64 else jnp.float32
    return jax.random.uniform(ctx.key(), shape, wide, low, high).astype(dtype)


@register_lowering(aten.rand.default, aten.rand_like.default, random=True)
def rand(ctx, *args, **kwargs):
    return _uniform(ctx)


@register_lowering(aten.randn.default, aten.randn_like.default, random=True)
def randn(ctx, *args, **kwargs):
    shape, dtype = _out(ctx)
    wide = jnp.float64 if dtype == jnp.float64 else jnp.float32
    return jax.random.normal(ctx.key(), shape, wide).astype(dtype)


# aten::uniform(Tensor self, float from=0, float to=1, *, Generator? generator=None) -> Tensor
@register_lowering(aten.uniform.default, random=True)
def uniform(ctx, self, *args, **kwargs):
    low = args[0] if args else kwargs.get("from", 0.0)
    high = args[1] if len(args) > 1 else kwargs.get("to", 1.0)
    return _uniform(ctx, low, high)


# aten::normal_functional(Tensor self, float mean=0, float std=1, *, Generator? generator=None)
@register_lowering(aten.normal_functional.default, random=True)
def normal_functional(ctx, self, mean=0.0, std=1.0, generator=None):
    shape, dtype = _out(ctx)
    return (jax.random.normal(ctx.key(), shape, jnp.float32) * std + mean).astype(dtype)


# aten::bernoulli(Tensor self, *, Generator? generator=None) -> Tensor
@register_lowering(aten.bernoulli.default, aten.bernoulli.p, random=True)
def bernoulli(ctx, self, p=None, generator=None):
    shape, dtype = _out(ctx)
    prob = self if p is None else p
    u = jax.random.uniform(ctx.key(), shape, jnp.float32)
    return (u < jnp.asarray(prob, jnp.float32)).astype(dtype)


@register_lowering(aten.exponential.default, random=True)
def exponential(ctx, self, lambd=1.0, generator=None):
    shape, dtype = _out(ctx)
    return (jax.random.exponential(ctx.key(), shape, jnp.float32) / lambd).astype(dtype)


# aten::randint.low(SymInt low, SymInt high, SymInt[] size, *, ScalarType? dtype=4, ...)
@register_lowering(aten.randint.low, random=True)
def randint_low(ctx, low, high, size, **kwargs):
    return _randint(ctx, low, high)


@register_lowering(aten.randint.default, random=True)
def randint(ctx, high, size, **kwargs):
    return _randint(ctx, 0, high)


@register_lowering(aten.randint_like.default, random=True)
def randint_like(ctx, self, high, **kwargs):
    return _randint(ctx, 0, high)


@register_lowering(aten.randint_like.low_dtype, random=True)
def randint_like_low(ctx, self, low, high, **kwargs):
    return _randint(ctx, low, high)


def _randint(ctx, low, high):
    shape, dtype = _out(ctx)
    return jax.random.randint(ctx.key(), shape, low, high, jnp.int64).astype(dtype)

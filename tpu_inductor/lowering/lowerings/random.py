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

from tpu_inductor.lowering.lowerings.registry import lowers

aten = torch.ops.aten


def _out(ctx):
    return ctx.out_shape(), ctx.out_dtype()


def _uniform(ctx, low=0.0, high=1.0):
    shape, dtype = _out(ctx)
    wide = jnp.float64 if dtype == jnp.float64 else jnp.float32
    return jax.random.uniform(ctx.key(), shape, wide, low, high).astype(dtype)


# aten::rand(SymInt[] size, *, ScalarType? dtype=None, Layout? layout=None, Device? device=None,
#   bool? pin_memory=None) -> Tensor
@lowers(aten.rand.default, aten.rand_like.default, random=True)
def rand(ctx, *args, **kwargs):
    return _uniform(ctx)


# aten::randn(SymInt[] size, *, ScalarType? dtype=None, Layout? layout=None, Device? device=None,
#   bool? pin_memory=None) -> Tensor
@lowers(aten.randn.default, aten.randn_like.default, random=True)
def randn(ctx, *args, **kwargs):
    shape, dtype = _out(ctx)
    wide = jnp.float64 if dtype == jnp.float64 else jnp.float32
    return jax.random.normal(ctx.key(), shape, wide).astype(dtype)


# aten::uniform(Tensor self, float from=0, float to=1, *, Generator? generator=None) -> Tensor
@lowers(aten.uniform.default, random=True)
def uniform(ctx, self, *args, **kwargs):
    low = args[0] if args else kwargs.get("from", 0.0)
    high = args[1] if len(args) > 1 else kwargs.get("to", 1.0)
    return _uniform(ctx, low, high)


# aten::normal_functional(Tensor self, float mean=0, float std=1, *, Generator? generator=None)
@lowers(aten.normal_functional.default, random=True)
def normal_functional(ctx, self, mean=0.0, std=1.0, generator=None):
    shape, dtype = _out(ctx)
    return (jax.random.normal(ctx.key(), shape, jnp.float32) * std + mean).astype(dtype)


# aten::bernoulli(Tensor self, *, Generator? generator=None) -> Tensor
@lowers(aten.bernoulli.default, aten.bernoulli.p, aten.bernoulli.Tensor, random=True)
def bernoulli(ctx, self, p=None, generator=None):
    shape, dtype = _out(ctx)
    prob = self if p is None else p
    u = jax.random.uniform(ctx.key(), shape, jnp.float32)
    return (u < jnp.asarray(prob, jnp.float32)).astype(dtype)


# aten::poisson(Tensor self, Generator? generator=None) -> Tensor
@lowers(aten.poisson.default, random=True)
def poisson(ctx, self, generator=None):
    shape, dtype = _out(ctx)
    rate = self.astype(jnp.float64 if dtype == jnp.float64 else jnp.float32)
    return jax.random.poisson(ctx.key(), rate, shape).astype(dtype)


# aten::exponential(Tensor self, float lambd=1., *, Generator? generator=None) -> Tensor
@lowers(aten.exponential.default, random=True)
def exponential(ctx, self, lambd=1.0, generator=None):
    shape, dtype = _out(ctx)
    return (jax.random.exponential(ctx.key(), shape, jnp.float32) / lambd).astype(dtype)


# aten::randint.low(SymInt low, SymInt high, SymInt[] size, *, ScalarType? dtype=4, ...)
@lowers(aten.randint.low, random=True)
def randint_low(ctx, low, high, size, **kwargs):
    return _randint(ctx, low, high)


# aten::randint(SymInt high, SymInt[] size, *, ScalarType? dtype=4, Layout? layout=None, Device?
#   device=None, bool? pin_memory=None) -> Tensor
@lowers(aten.randint.default, random=True)
def randint(ctx, high, size, **kwargs):
    return _randint(ctx, 0, high)


# aten::randint_like(Tensor self, SymInt high, *, ScalarType? dtype=None, Layout? layout=None,
#   Device? device=None, bool? pin_memory=None, MemoryFormat? memory_format=None) -> Tensor
@lowers(aten.randint_like.default, random=True)
def randint_like(ctx, self, high, **kwargs):
    return _randint(ctx, 0, high)


# aten::randint_like.low_dtype(Tensor self, SymInt low, SymInt high, *, ScalarType? dtype=None,
#   Layout? layout=None, Device? device=None, bool? pin_memory=None, MemoryFormat?
#   memory_format=None) -> Tensor
@lowers(aten.randint_like.low_dtype, random=True)
def randint_like_low(ctx, self, low, high, **kwargs):
    return _randint(ctx, low, high)


def _randint(ctx, low, high):
    shape, dtype = _out(ctx)
    return jax.random.randint(ctx.key(), shape, low, high, jnp.int64).astype(dtype)


def _normal_draw(ctx, mean, std):
    shape, dtype = _out(ctx)
    wide = jnp.float64 if dtype == jnp.float64 else jnp.float32
    z = jax.random.normal(ctx.key(), shape, wide)
    return (z * jnp.asarray(std, wide) + jnp.asarray(mean, wide)).astype(dtype)


# aten::normal.Tensor_Tensor(Tensor mean, Tensor std, *, Generator? generator=None) -> Tensor
@lowers(aten.normal.Tensor_Tensor, aten.normal.Tensor_float, aten.normal.float_Tensor, random=True)
def normal(ctx, mean, std=1.0, generator=None):
    return _normal_draw(ctx, mean, std)


# aten::normal.float_float(float mean, float std, SymInt[] size, *, Generator? generator=None,
#                          ScalarType? dtype=None, ...) -> Tensor
@lowers(aten.normal.float_float, random=True)
def normal_float_float(ctx, mean, std, size, **kwargs):
    return _normal_draw(ctx, mean, std)


# prims::normal(SymInt[] shape, *, Scalar mean, Scalar std, ScalarType? dtype, Device? device,
#               bool requires_grad, Generator? generator=None) -> Tensor
@lowers(torch.ops.prims.normal.default, random=True)
def prims_normal(ctx, shape, *, mean, std, **kwargs):
    return _normal_draw(ctx, mean, std)


# aten::multinomial(Tensor self, SymInt num_samples, bool replacement=False, *,
#                   Generator? generator=None) -> Tensor
@lowers(aten.multinomial.default, random=True)
def multinomial(ctx, self, num_samples, replacement=False, generator=None):
    # Rows of unnormalized probabilities, sampled through their logits: with replacement as
    # independent categorical draws, without as the top num_samples of logits + Gumbel noise.
    # NOTE: invalid rows (negative, non-finite or all-zero weights), which torch rejects, give
    # arbitrary indices instead of an error.
    wide = jnp.float64 if self.dtype == jnp.float64 else jnp.float32
    logits = jnp.log(self.astype(wide))
    rows = logits.reshape(-1, logits.shape[-1])
    if replacement:
        idx = jax.random.categorical(ctx.key(), rows, axis=-1, shape=(num_samples, rows.shape[0])).T
    else:
        gumbel = jax.random.gumbel(ctx.key(), rows.shape, wide)
        idx = jax.lax.top_k(rows + gumbel, num_samples)[1]
    return idx.reshape(ctx.out_shape()).astype(ctx.out_dtype())


# aten::randperm(SymInt n, *, ScalarType? dtype=long, Layout? layout=None, Device? device=None,
#                bool? pin_memory=None) -> Tensor
@lowers(aten.randperm.default, random=True)
def randperm(ctx, n, **kwargs):
    return jax.random.permutation(ctx.key(), n).astype(ctx.out_dtype())


# aten::rrelu_with_noise_functional(Tensor self, Tensor noise, Scalar lower=0.125,
#   Scalar upper=0.3333333333333333, bool training=False, Generator? generator=None)
#   -> (Tensor, Tensor noise_out)
@lowers(aten.rrelu_with_noise_functional.default, random=True)
def rrelu_with_noise_functional(
    ctx, self, noise, lower=0.125, upper=1.0 / 3.0, training=False, generator=None
):
    wide = jnp.float64 if self.dtype == jnp.float64 else jnp.float32
    x = self.astype(wide)
    if not training:
        slope = (lower + upper) / 2
        return jnp.where(x >= 0, x, x * slope).astype(self.dtype), noise
    # Each non-positive element gets its own slope drawn from U(lower, upper); the slopes (1
    # elsewhere) come back as the new noise, which rrelu's backward multiplies by.
    r = jax.random.uniform(ctx.key(), self.shape, wide, lower, upper)
    slope = jnp.where(x <= 0, r, 1)
    return (x * slope).astype(self.dtype), slope.astype(noise.dtype)

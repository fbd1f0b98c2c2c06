"""Discrete Fourier transforms (``_fft_r2c``, ``_fft_c2c``, ``_fft_c2r``) and conjugation.

Every ``torch.fft`` function (fft/ifft/rfft/irfft/hfft/ihfft and their 2-D / n-D forms, stft)
decomposes to these three ATen ops. They are unnormalized transforms followed by a scale chosen
by ``normalization`` (torch's ``fft_norm_mode``): 0 none, 1 ``1/sqrt(n)``, 2 ``1/n``, where ``n``
is the number of elements of the signal (the product of the transformed sizes, output sizes for
``c2r``).

XLA's FFT transforms at most 3 trailing axes at once, so longer axis lists are done in groups.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import torch

from tpu_inductor.lowering.lowerings.registry import lowers

aten = torch.ops.aten

_MAX_AXES = 3  # XLA's FftOp transforms at most 3 dimensions


def _axes(dim, ndim: int) -> tuple[int, ...]:
    return tuple(d % ndim for d in dim) if ndim else ()


def _scale(y, normalization: int, n: int):
    if normalization == 0 or n == 0:
        return y
    factor = 1.0 / math.sqrt(n) if normalization == 1 else 1.0 / n
    return y * jnp.asarray(factor, jnp.finfo(y.dtype).dtype)


def _c2c(x, axes: tuple[int, ...], forward: bool):
    """Unnormalized complex transform over ``axes``, ``_MAX_AXES`` at a time."""
    for start in range(0, len(axes), _MAX_AXES):
        group = axes[start : start + _MAX_AXES]
        if forward:
            x = jnp.fft.fftn(x, axes=group, norm="backward")
        else:
            x = jnp.fft.ifftn(x, axes=group, norm="forward")
    return x


def _complex_dtype(dtype):
    return jnp.complex128 if dtype in (jnp.float64, jnp.complex128) else jnp.complex64


# aten::_fft_r2c(Tensor self, int[] dim, int normalization, bool onesided) -> Tensor
@lowers(aten._fft_r2c.default)
def fft_r2c(ctx, self, dim, normalization, onesided):
    axes = _axes(dim, self.ndim)
    n = math.prod(self.shape[a] for a in axes)
    if onesided:
        # The last axis goes real -> half spectrum, the others are complex transforms.
        y = jnp.fft.rfft(self, axis=axes[-1], norm="backward")
        y = _c2c(y, axes[:-1], forward=True)
    else:
        y = _c2c(self.astype(_complex_dtype(self.dtype)), axes, forward=True)
    return _scale(y, normalization, n).astype(ctx.out_dtype())


# aten::_fft_c2c(Tensor self, SymInt[] dim, int normalization, bool forward) -> Tensor
@lowers(aten._fft_c2c.default)
def fft_c2c(ctx, self, dim, normalization, forward):
    axes = _axes(dim, self.ndim)
    n = math.prod(self.shape[a] for a in axes)
    return _scale(_c2c(self, axes, forward), normalization, n).astype(ctx.out_dtype())


# aten::_fft_c2r(Tensor self, int[] dim, int normalization, SymInt last_dim_size) -> Tensor
@lowers(aten._fft_c2r.default)
def fft_c2r(ctx, self, dim, normalization, last_dim_size):
    axes = _axes(dim, self.ndim)
    last_dim_size = int(last_dim_size)
    n = math.prod(self.shape[a] for a in axes[:-1]) * last_dim_size
    # NOTE: like pocketfft, the imaginary parts of the zero-frequency (and Nyquist) terms of the
    # last axis are ignored rather than folded in.
    y = _c2c(self, axes[:-1], forward=False)
    y = jnp.fft.irfft(y, n=last_dim_size, axis=axes[-1], norm="forward")
    return _scale(y, normalization, n).astype(ctx.out_dtype())


# aten::_conj(Tensor(a) self) -> Tensor(a)
@lowers(aten._conj.default, aten._conj_physical.default, aten.conj_physical.default)
def conj(ctx, self):
    # NOTE: a functional graph has no conjugate bit: the conjugate is always materialized.
    return jnp.conj(self) if jnp.iscomplexobj(self) else self

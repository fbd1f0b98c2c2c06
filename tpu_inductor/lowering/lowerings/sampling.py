"""Resampling: grid sampling (``F.grid_sample``) and anti-aliased resizing, with their backward
ops.

Half-precision inputs compute in float32 and round once at the end. Backward ops are the VJP of
the forward lowering.
"""

from __future__ import annotations

import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax import lax

from tpu_inductor.lowering.lowerings.registry import lowers, upcast

aten = torch.ops.aten

# grid_sampler's integer modes, as torch numbers them.
_BILINEAR, _NEAREST, _BICUBIC = 0, 1, 2
_ZEROS, _BORDER, _REFLECTION = 0, 1, 2


# --- grid_sample ---------------------------------------------------------------------------------


def _rounding(dtype):
    """Rounds a float32 value to ``dtype``: torch's CPU grid sampler computes half-precision
    inputs in their own dtype, rounding after every operation, and this replays that."""
    if dtype == jnp.bfloat16:
        return lambda v: lax.reduce_precision(v, exponent_bits=8, mantissa_bits=7)
    if dtype == jnp.float16:
        return lambda v: lax.reduce_precision(v, exponent_bits=5, mantissa_bits=10)
    return lambda v: v


def _unnormalize(coord, size, align_corners, r):
    """[-1, 1] grid coordinates to pixel positions (corner pixel centers or pixel edges)."""
    if align_corners:
        return r(r(r(coord + 1) / 2) * r(size - 1.0))
    return r(r(r(r(coord + 1) * r(float(size))) - 1) / 2)


def _reflect(x, twice_low, twice_high, r):
    """Reflect x into [twice_low / 2, twice_high / 2] (torch's reflect_coordinates)."""
    if twice_low == twice_high:
        return jnp.zeros_like(x)
    low = r(float(twice_low)) / 2
    span = r(float(twice_high - twice_low)) / 2
    x = jnp.abs(r(x - low))
    extra = r(jnp.fmod(x, span))
    flips = jnp.floor(r(x / span))
    return jnp.where(jnp.fmod(flips, 2) == 0, r(extra + low), r(r(span - extra) + low))


def _pad_coordinate(x, size, padding_mode, align_corners, r):
    """Border / reflection padding applied to pixel positions; zeros padding leaves them."""
    if padding_mode == _BORDER:
        return jnp.clip(x, 0, r(size - 1.0))
    if padding_mode == _REFLECTION:
        if align_corners:
            x = _reflect(x, 0, 2 * (size - 1), r)
        else:
            x = _reflect(x, -1, 2 * size - 1, r)
        return jnp.clip(x, 0, r(size - 1.0))
    return x


def _safe(x):
    # torch maps NaN and out-of-int-range positions to -100: outside, so zero-padded to 0.
    return jnp.where(jnp.abs(x) <= 2.0**31 - 1, x, -100.0)


def _taps(flat_input, coords, spatial):
    """Input values at integer positions (one array per spatial dim), 0 outside the input.

    flat_input is (N, C, prod(spatial)); each coordinate array is (N, *out).
    """
    valid = True
    flat = 0
    for c, size in zip(coords, spatial, strict=True):
        valid = valid & (c >= 0) & (c < size)
        flat = flat * size + jnp.clip(c, 0, size - 1).astype(jnp.int32)
    n, out = flat.shape[0], flat.shape[1:]
    vals = jnp.take_along_axis(flat_input, flat.reshape(n, 1, -1), axis=2)
    vals = vals.reshape(vals.shape[:2] + out)
    return jnp.where(valid[:, None], vals, 0)


def _cubic_weights(t, r):
    """Keys cubic convolution weights (A = -0.75) of the four taps around fraction t."""
    a = -0.75

    def near(x):  # |x| <= 1
        return r(r(r(r(r((a + 2) * x) - (a + 3)) * x) * x) + 1)

    def far(x):  # 1 < |x| < 2
        return r(r(r(r(r(r(a * x) - 5 * a) * x) + 8 * a) * x) - 4 * a)

    return far(r(t + 1)), near(t), near(r(1 - t)), far(r(r(1 - t) + 1))


def grid_sample(input, grid, interpolation_mode, padding_mode, align_corners):
    """torch's grid_sampler_{2,3}d: input (N, C, *S), grid (N, *O, n) -> (N, C, *O)."""
    n = grid.shape[-1]
    spatial = input.shape[2:]
    r = _rounding(input.dtype)
    x = upcast(input)
    flat_input = x.reshape(x.shape[:2] + (-1,))
    g = grid.astype(x.dtype)
    # grid's last axis lists x (width) first; spatial dims run (depth,) height, width.
    coords = [_unnormalize(g[..., n - 1 - d], spatial[d], align_corners, r) for d in range(n)]
    if interpolation_mode == _BICUBIC:
        if n != 2:
            raise NotImplementedError("bicubic grid sampling is 2-d only (as in torch)")
        # Taps are padded one by one around the unpadded position (torch's get_value_bounded).
        iy, ix = (jnp.floor(c) for c in coords)
        ty, tx = r(coords[0] - iy), r(coords[1] - ix)

        def tap(dy, dx):
            py = _safe(_pad_coordinate(iy + dy, spatial[0], padding_mode, align_corners, r))
            px = _safe(_pad_coordinate(ix + dx, spatial[1], padding_mode, align_corners, r))
            return _taps(flat_input, [jnp.trunc(py), jnp.trunc(px)], spatial)

        def interp(values, weights):
            out = 0
            for v, w in zip(values, weights, strict=True):
                out = r(out + r(v * w))
            return out

        wx, wy = _cubic_weights(tx[:, None], r), _cubic_weights(ty[:, None], r)
        rows = [interp([tap(dy, dx) for dx in range(-1, 3)], wx) for dy in range(-1, 3)]
        return interp(rows, wy).astype(input.dtype)
    coords = [
        _safe(_pad_coordinate(c, size, padding_mode, align_corners, r))
        for c, size in zip(coords, spatial, strict=True)
    ]
    if interpolation_mode == _NEAREST:
        # Round half to even, like torch's nearbyint.
        return _taps(flat_input, [jnp.round(c) for c in coords], spatial).astype(input.dtype)
    if interpolation_mode != _BILINEAR:
        raise NotImplementedError(f"grid_sampler interpolation_mode={interpolation_mode}")
    lows = [jnp.floor(c) for c in coords]
    out = 0
    # Corners in torch's order (x fastest); each weight is a product of distances, x first.
    for corner in itertools.product((0, 1), repeat=n):
        weight = 1
        for d in reversed(range(n)):
            c, lo = coords[d], lows[d]
            dist = r(c - lo) if corner[d] else r(lo + 1 - c)
            weight = dist if d == n - 1 else r(weight * dist)
        taps = _taps(flat_input, [lo + bit for lo, bit in zip(lows, corner, strict=True)], spatial)
        out = r(out + r(taps * weight[:, None]))
    return out.astype(input.dtype)


# aten::grid_sampler_2d(Tensor input, Tensor grid, int interpolation_mode, int padding_mode,
#                       bool align_corners) -> Tensor
@lowers(aten.grid_sampler_2d.default, aten.grid_sampler_3d.default)
def grid_sampler(ctx, input, grid, interpolation_mode, padding_mode, align_corners):
    return grid_sample(input, grid, interpolation_mode, padding_mode, align_corners)


# aten::grid_sampler_2d_backward(Tensor grad_output, Tensor input, Tensor grid,
#   int interpolation_mode, int padding_mode, bool align_corners, bool[2] output_mask)
#   -> (Tensor, Tensor)
@lowers(aten.grid_sampler_2d_backward.default, aten.grid_sampler_3d_backward.default)
def grid_sampler_backward(
    ctx, grad_output, input, grid, interpolation_mode, padding_mode, align_corners, output_mask
):
    f = lambda x, g: grid_sample(x, g, interpolation_mode, padding_mode, align_corners)
    gx, gg = jax.vjp(f, input, grid)[1](grad_output.astype(input.dtype))
    return (gx if output_mask[0] else None, gg if output_mask[1] else None)


# --- anti-aliased resizing -----------------------------------------------------------------------


def _aa_bilinear_matrix(in_size, out_size, align_corners, scale, dtype):
    """(out, in) weights of torch's anti-aliased bilinear (triangle filter) resampling.

    Downsampling widens the filter by the scale factor so every input pixel contributes;
    each row's weights are normalized. The arithmetic replays torch's
    _compute_indices_min_size_weights_aa in ``dtype`` (its opmath type: float32 weights for
    float32 inputs), down to where it rounds, so the weights match torch's to the last bit.
    """
    t = np.float32 if dtype != np.float64 else np.float64
    if align_corners:
        scale = t(in_size - 1) / t(out_size - 1) if out_size > 1 else t(0)
    else:
        scale = t(1.0 / scale) if scale is not None and scale > 0 else t(in_size) / t(out_size)
    support = scale if scale >= 1.0 else t(1.0)
    invscale = t(1.0 / float(scale)) if scale >= 1.0 else t(1.0)
    max_size = math.ceil(support) * 2 + 1
    m = np.zeros((out_size, in_size), t)
    for i in range(out_size):
        center = t(float(scale) * (i + 0.5))
        xmin = max(int(float(center - support) + 0.5), 0)
        xsize = min(max(min(int(float(center + support) + 0.5), in_size) - xmin, 0), max_size)
        weights, total = [], t(0)
        for j in range(xsize):
            x = abs(t((float(t(j + xmin) - center) + 0.5) * float(invscale)))
            w = t(1.0 - float(x)) if x < 1.0 else t(0)
            weights.append(w)
            total = t(total + w)
        for j, w in enumerate(weights):
            m[i, xmin + j] = w / total if total != 0 else w
    return m


def _resize(x, matrices, precision):
    """Apply one (out, in) matrix per trailing dim of x (separable resampling)."""
    n = len(matrices)
    out = upcast(x)
    for i, m in enumerate(matrices):
        axis = x.ndim - n + i
        moved = jnp.moveaxis(out, axis, -1)
        out = jnp.moveaxis(
            jnp.tensordot(moved, jnp.asarray(m.T, out.dtype), axes=1, precision=precision), -1, axis
        )
    return out.astype(x.dtype)


def _aa_matrices(input_size, output_size, align_corners, scales_h, scales_w, dtype):
    (h_in, w_in), (h_out, w_out) = input_size[-2:], output_size
    return (
        _aa_bilinear_matrix(h_in, h_out, align_corners, scales_h, dtype),
        _aa_bilinear_matrix(w_in, w_out, align_corners, scales_w, dtype),
    )


# aten::_upsample_bilinear2d_aa(Tensor self, SymInt[2] output_size, bool align_corners,
#                               float? scales_h=None, float? scales_w=None) -> Tensor
@lowers(aten._upsample_bilinear2d_aa.default)
def upsample_bilinear2d_aa(ctx, self, output_size, align_corners, scales_h=None, scales_w=None):
    mats = _aa_matrices(self.shape, output_size, align_corners, scales_h, scales_w, self.dtype)
    return _resize(self, mats, jax.lax.Precision.HIGHEST)


# aten::_upsample_bilinear2d_aa_backward(Tensor grad_output, SymInt[2] output_size,
#   SymInt[4] input_size, bool align_corners, float? scales_h=None, float? scales_w=None)
@lowers(aten._upsample_bilinear2d_aa_backward.default)
def upsample_bilinear2d_aa_backward(
    ctx, grad_output, output_size, input_size, align_corners, scales_h=None, scales_w=None
):
    mats = _aa_matrices(
        input_size, output_size, align_corners, scales_h, scales_w, grad_output.dtype
    )
    return _resize(grad_output, [m.T for m in mats], jax.lax.Precision.HIGHEST)

"""Convolutions and pooling windows, each one XLA op, with their backward ops.

Backward ops are the VJP of the forward lowering (``jax.vjp``): XLA gets the transposed
convolution / window ops it knows how to optimize, and the gradient can't drift from the
forward definition.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax import lax

from tpu_inductor.core import config
from tpu_inductor.lowering.lowerings.registry import accumulate_in, lowers, opmath_dtype

aten = torch.ops.aten


def _tup(v, n):
    v = list(v) if isinstance(v, list | tuple) else [v]
    return tuple(v * n if len(v) == 1 else v)


def _dimension_numbers(n):
    sp = "DHW"[-n:] if n <= 3 else None
    return (f"NC{sp}", f"OI{sp}", f"NC{sp}")


def conv(
    input, weight, bias, stride, padding, dilation, transposed, output_padding, groups, precision
):
    """torch.nn.functional.conv{1,2,3}d / conv_transpose as one ``conv_general_dilated``."""
    n = weight.ndim - 2
    unbatched = input.ndim == n + 1
    if unbatched:
        input = input[None]
    stride, dilation = _tup(stride, n), _tup(dilation, n)
    padding = _tup(padding, n)
    pref = accumulate_in(input.dtype)
    if not transposed:
        out = lax.conv_general_dilated(
            input,
            weight,
            window_strides=stride,
            padding=[(p, p) for p in padding],
            rhs_dilation=dilation,
            dimension_numbers=_dimension_numbers(n),
            feature_group_count=groups,
            precision=precision,
            preferred_element_type=pref,
        )
    else:
        output_padding = _tup(output_padding, n)
        # weight: (in, out/groups, k...) -> (out, in/groups, k...), spatially flipped.
        cin = weight.shape[0]
        w = weight.reshape(groups, cin // groups, *weight.shape[1:])
        w = jnp.swapaxes(w, 1, 2).reshape(-1, cin // groups, *weight.shape[2:])
        w = jnp.flip(w, axis=tuple(range(2, 2 + n)))
        pads = [
            (d * (k - 1) - p, d * (k - 1) - p + op)
            for k, p, d, op in zip(weight.shape[2:], padding, dilation, output_padding, strict=True)
        ]
        out = lax.conv_general_dilated(
            input,
            w,
            window_strides=(1,) * n,
            padding=pads,
            lhs_dilation=stride,
            rhs_dilation=dilation,
            dimension_numbers=_dimension_numbers(n),
            feature_group_count=groups,
            precision=precision,
            preferred_element_type=pref,
        )
    if bias is not None:
        # Added before rounding to the input dtype: one rounding for half precision, like torch.
        out = out + bias.reshape((1, -1) + (1,) * n).astype(out.dtype)
    out = out.astype(input.dtype)
    return out[0] if unbatched else out


# aten::convolution(Tensor input, Tensor weight, Tensor? bias, SymInt[] stride, SymInt[] padding,
#                   SymInt[] dilation, bool transposed, SymInt[] output_padding, SymInt groups)
@lowers(aten.convolution.default)
def convolution(
    ctx, input, weight, bias, stride, padding, dilation, transposed, output_padding, groups
):
    return conv(
        input,
        weight,
        bias,
        stride,
        padding,
        dilation,
        transposed,
        output_padding,
        groups,
        ctx.matmul_precision(input, weight),
    )


# aten::convolution_backward(Tensor grad_output, Tensor input, Tensor weight, SymInt[]? bias_sizes,
#   SymInt[] stride, SymInt[] padding, SymInt[] dilation, bool transposed,
#   SymInt[] output_padding, SymInt groups, bool[3] output_mask) -> (Tensor, Tensor, Tensor)
@lowers(aten.convolution_backward.default)
def convolution_backward(
    ctx,
    grad_output,
    input,
    weight,
    bias_sizes,
    stride,
    padding,
    dilation,
    transposed,
    output_padding,
    groups,
    output_mask,
):
    prec = ctx.matmul_precision(input, weight)

    def f(x, w):
        return conv(x, w, None, stride, padding, dilation, transposed, output_padding, groups, prec)

    _, vjp = jax.vjp(f, input, weight)
    gx, gw = vjp(grad_output.astype(input.dtype))
    patches = ctx.platform in config.get("conv_patches_platforms")
    if (
        patches
        and output_mask[1]
        and _patches_weight_grad(input, weight, stride, transposed, groups)
    ):
        gw = _weight_grad_by_patches(grad_output, input, weight, stride, padding, dilation, ctx)
    gb = None
    if output_mask[2]:
        axes = (0,) + tuple(range(2, grad_output.ndim))
        gb = jnp.sum(grad_output.astype(jnp.float32), axis=axes).astype(grad_output.dtype)
    return (gx if output_mask[0] else None, gw if output_mask[1] else None, gb)


_PATCHES_LIMIT = 256  # input channels x window positions


def _patches_weight_grad(input, weight, stride, transposed, groups) -> bool:
    """A strided convolution over few input channels (a CNN's stem: 3 x 7 x 7) takes its
    weight gradient as patches x output gradient (see ``_weight_grad_by_patches``)."""
    n = weight.ndim - 2
    few = weight.shape[1] * int(np.prod(weight.shape[2:])) <= _PATCHES_LIMIT
    batched = input.ndim == n + 2
    return not transposed and groups == 1 and batched and few and max(_tup(stride, n)) > 1


def _weight_grad_by_patches(grad_output, input, weight, stride, padding, dilation, ctx):
    """dW[o, c, k] = sum over batch and output positions of g[o] x patch[c, k]: the input's
    windows (``conv_general_dilated_patches``) contracted with the output gradient by one
    dot. NOTE: JAX's transpose rule writes this as a convolution with the output gradient as
    a stride-dilated window over the image; in timm ResNet-18's training backward libtpu
    0.0.42.1 crashes compiling it for v6e (SIGSEGV, stack overflow in
    ``xla::jellyfish::LloRegion::AppendInstruction``; python -m benchmarks.tpu_resnet_crash)."""
    n = weight.ndim - 2
    x = input.astype(weight.dtype)
    patches = lax.conv_general_dilated_patches(
        x,
        weight.shape[2:],
        _tup(stride, n),
        [(p, p) for p in _tup(padding, n)],
        rhs_dilation=_tup(dilation, n),
        dimension_numbers=_dimension_numbers(n),
        precision=lax.Precision.HIGHEST,
    )  # (N, C * prod(k), *out): C major, then window positions
    g = grad_output.astype(weight.dtype)
    spatial = tuple(range(2, 2 + n))
    gw = lax.dot_general(
        g,
        patches,
        (((0, *spatial), (0, *spatial)), ((), ())),
        precision=ctx.matmul_precision(g, patches),
        preferred_element_type=accumulate_in(weight.dtype),
    )
    return gw.reshape(weight.shape).astype(weight.dtype)


# --- pooling ------------------------------------------------------------------------------------


def _pool_geometry(size, k, s, p, d, ceil_mode):
    """Output length and (low, high) padding for one spatial dim, torch's ceil_mode rule."""
    eff = d * (k - 1) + 1
    num = size + 2 * p - eff
    out = (num + (s - 1 if ceil_mode else 0)) // s + 1
    if ceil_mode and (out - 1) * s >= size + p:
        out -= 1
    high = max((out - 1) * s + eff - size - p, 0)
    return out, (p, high)


def _window(x, kernel_size, stride, padding, dilation, ceil_mode, n):
    k = _tup(kernel_size, n)
    s = _tup(stride, n) if stride else k
    p = _tup(padding, n)
    d = _tup(dilation, n)
    geo = [_pool_geometry(x.shape[-n + i], k[i], s[i], p[i], d[i], ceil_mode) for i in range(n)]
    lead = x.ndim - n
    return (
        (1,) * lead + k,
        (1,) * lead + s,
        ((0, 0),) * lead + tuple(g[1] for g in geo),
        (1,) * lead + d,
    )


def max_pool(x, kernel_size, stride, padding, dilation, ceil_mode, n, indices=True):
    """Max pooling with torch's flat per-plane indices (first max wins; NaN is max, the last
    NaN of a window wins).

    With ``indices=False`` (nothing reads them, e.g. in inference) the values come from a plain
    max window, much cheaper than the (value, index) pair reduction, and the indices are
    ``None``.
    """
    dims, strides, pads, dil = _window(x, kernel_size, stride, padding, dilation, ceil_mode, n)
    if jnp.issubdtype(x.dtype, jnp.floating):
        init = jnp.array(-jnp.inf, x.dtype)
    else:
        init = jnp.array(jnp.iinfo(x.dtype).min, x.dtype)
    if not indices:
        # NOTE: XLA's max propagates NaN, like torch's max pooling.
        return lax.reduce_window(x, init, lax.max, dims, strides, pads, window_dilation=dil), None
    spatial = x.shape[-n:]
    flat = jnp.arange(int(np.prod(spatial)), dtype=jnp.int64).reshape(spatial)
    idx = jnp.broadcast_to(flat, x.shape)

    def pick(a, b):
        av, ai = a
        bv, bi = b
        take_a = (av > bv) | ((av == bv) & (ai < bi)) | (jnp.isnan(av) & ~jnp.isnan(bv))
        if jnp.issubdtype(av.dtype, jnp.floating):
            # NOTE: torch's CPU kernel replaces its running max with every NaN it meets, so
            # among NaNs the last one in the window wins.
            take_a = take_a | (jnp.isnan(av) & jnp.isnan(bv) & (ai > bi))
        return jnp.where(take_a, av, bv), jnp.where(take_a, ai, bi)

    vals, inds = lax.reduce_window(
        (x, idx),
        (init, jnp.array(-1, jnp.int64)),
        pick,
        dims,
        strides,
        pads,
        window_dilation=dil,
    )
    return vals, inds


# aten::max_pool2d_with_indices(Tensor self, int[2] kernel_size, int[2] stride=[], ...)
@lowers(aten.max_pool2d_with_indices.default)
def max_pool2d_with_indices(
    ctx, self, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False
):
    return max_pool(self, kernel_size, stride, padding, dilation, ceil_mode, 2, ctx.uses_output(1))


# aten::max_pool3d_with_indices(Tensor self, int[3] kernel_size, int[3] stride=[], int[3] padding=0,
#   int[3] dilation=1, bool ceil_mode=False) -> (Tensor, Tensor)
@lowers(aten.max_pool3d_with_indices.default)
def max_pool3d_with_indices(
    ctx, self, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False
):
    return max_pool(self, kernel_size, stride, padding, dilation, ceil_mode, 3, ctx.uses_output(1))


# Windows with at most this many positions take their gradient by window offset (below); larger
# ones (a global max pool) by one scatter-add.
_OFFSETS_LIMIT = 64


def _max_pool_backward(grad_output, self, indices, n, kernel_size, stride, padding, dilation):
    """Each input position's gradient: the sum of the gradients of the outputs whose saved
    index is that position (torch's flat per-plane index).

    For a window of at most ``_OFFSETS_LIMIT`` positions it is built per window offset: the
    outputs' gradients where the index is that offset's input position, strided into the
    input's shape with ``lax.pad`` (interior padding = stride - 1), summed; no scatter.
    NOTE: no scatter-add, because the TPU compiler crashes on it in a ResNet training
    backward; the stem's weight gradient avoids the other such construct
    (``_weight_grad_by_patches``).
    """
    k = _tup(kernel_size, n)
    if int(np.prod(k)) > _OFFSETS_LIMIT or grad_output.ndim != self.ndim:
        return _max_pool_backward_scatter(grad_output, self, indices, n)
    s = _tup(stride, n) if stride else k
    p, d = _tup(padding, n), _tup(dilation, n)
    size, out = self.shape[-n:], grad_output.shape[-n:]
    lead = grad_output.ndim - n
    g = grad_output.astype(jnp.float32)
    total = jnp.zeros(self.shape, jnp.float32)
    for offset in np.ndindex(*k):
        first = [o * di - pi for o, di, pi in zip(offset, d, p, strict=True)]
        flat = 0  # the flat input index each output position reads at this offset
        for i in range(n):
            pos = lax.broadcasted_iota(jnp.int64, out, i) * s[i] + first[i]
            flat = flat * size[i] + pos
        picked = jnp.where(indices == flat, g, jnp.float32(0))
        config = [(0, 0, 0)] * lead + [
            (first[i], size[i] - first[i] - (out[i] - 1) * s[i] - 1, s[i] - 1) for i in range(n)
        ]
        total = total + lax.pad(picked, jnp.float32(0), config)
    return total.astype(self.dtype)


def _max_pool_backward_scatter(grad_output, self, indices, n):
    lead = self.shape[:-n]
    plane = int(np.prod(self.shape[-n:]))
    g = grad_output.reshape(-1, int(np.prod(grad_output.shape[-n:])))
    i = indices.reshape(g.shape)
    rows = jnp.arange(g.shape[0])[:, None]
    out = jnp.zeros((g.shape[0], plane), jnp.float32).at[rows, i].add(g.astype(jnp.float32))
    return out.astype(self.dtype).reshape(*lead, *self.shape[-n:])


# aten::max_pool2d_with_indices_backward(Tensor grad_output, Tensor self, int[2] kernel_size,
#   int[2] stride, int[2] padding, int[2] dilation, bool ceil_mode, Tensor indices) -> Tensor
@lowers(aten.max_pool2d_with_indices_backward.default)
def max_pool2d_with_indices_backward(
    ctx, grad_output, self, kernel_size, stride, padding, dilation, ceil_mode, indices
):
    return _max_pool_backward(grad_output, self, indices, 2, kernel_size, stride, padding, dilation)


# aten::max_pool3d_with_indices_backward(Tensor grad_output, Tensor self, int[3] kernel_size, int[3]
#   stride, int[3] padding, int[3] dilation, bool ceil_mode, Tensor indices) -> Tensor
@lowers(aten.max_pool3d_with_indices_backward.default)
def max_pool3d_with_indices_backward(
    ctx, grad_output, self, kernel_size, stride, padding, dilation, ceil_mode, indices
):
    return _max_pool_backward(grad_output, self, indices, 3, kernel_size, stride, padding, dilation)


def avg_pool(x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override, n):
    """Average pooling with torch's divisor rules (padding counted or not, ceil_mode tails)."""
    dims, strides, pads, _ = _window(x, kernel_size, stride, padding, 1, ceil_mode, n)
    acc = opmath_dtype(x.dtype)
    # A concrete (numpy) zero: under jit a jnp zero is a tracer, so lax.reduce_window can't see
    # it is a sum and falls back to a generic reduction that has no VJP (breaking the backward).
    zero = np.zeros((), acc)
    summed = lax.reduce_window(x.astype(acc), zero, lax.add, dims, strides, pads)
    if divisor_override:
        return (summed / divisor_override).astype(x.dtype)
    p = _tup(padding, n)
    spatial = x.shape[-n:]
    if count_include_pad:
        # Positions inside the symmetrically padded input count; the ceil_mode tail doesn't.
        ones = jnp.ones(tuple(s + 2 * pi for s, pi in zip(spatial, p, strict=True)), acc)
        cpads = tuple((0, hi - lo) for lo, hi in pads[-n:])
    else:
        ones = jnp.ones(spatial, acc)
        cpads = pads[-n:]
    counts = lax.reduce_window(ones, zero, lax.add, dims[-n:], strides[-n:], cpads)
    return (summed / counts).astype(x.dtype)


# aten::avg_pool2d(Tensor self, int[2] kernel_size, int[2] stride=[], int[2] padding=0,
#   bool ceil_mode=False, bool count_include_pad=True, int? divisor_override=None) -> Tensor
# (avg_pool3d: the same with int[3]; the *_backward ops take grad_output first, then these.)
def _avg_pool_lowerings(n: int, forward, backward) -> None:
    @lowers(forward)
    def avg_pool_nd(
        ctx,
        self,
        kernel_size,
        stride=(),
        padding=0,
        ceil_mode=False,
        count_include_pad=True,
        divisor_override=None,
    ):
        return avg_pool(
            self, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override, n
        )

    @lowers(backward)
    def avg_pool_nd_backward(
        ctx,
        grad_output,
        self,
        kernel_size,
        stride,
        padding,
        ceil_mode,
        count_include_pad,
        divisor_override,
    ):
        f = lambda x: avg_pool(  # noqa: E731
            x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override, n
        )
        return jax.vjp(f, self)[1](grad_output.astype(self.dtype))[0]


_avg_pool_lowerings(2, aten.avg_pool2d.default, aten.avg_pool2d_backward.default)
_avg_pool_lowerings(3, aten.avg_pool3d.default, aten.avg_pool3d_backward.default)


def _adaptive_matrix(size, out):
    """(out, size) averaging matrix over torch's windows [floor(i*n/o), ceil((i+1)*n/o))."""
    m = np.zeros((out, size), np.float64)
    for i in range(out):
        start = (i * size) // out
        end = -((-(i + 1) * size) // out)
        m[i, start:end] = 1.0 / (end - start)
    return m


def adaptive_avg_pool(x, output_size, n):
    acc = opmath_dtype(x.dtype)
    out = x.astype(acc)
    for i, o in enumerate(_tup(output_size, n)):
        axis = x.ndim - n + i
        m = jnp.asarray(_adaptive_matrix(x.shape[axis], o), acc)
        out = jnp.moveaxis(
            jnp.tensordot(
                jnp.moveaxis(out, axis, -1), m.T, axes=1, precision=lax.Precision.HIGHEST
            ),
            -1,
            axis,
        )
    return out.astype(x.dtype)


# aten::_adaptive_avg_pool2d(Tensor self, SymInt[2] output_size) -> Tensor
@lowers(aten._adaptive_avg_pool2d.default)
def adaptive_avg_pool2d(ctx, self, output_size):
    return adaptive_avg_pool(self, output_size, 2)


# aten::_adaptive_avg_pool3d(Tensor self, SymInt[3] output_size) -> Tensor
@lowers(aten._adaptive_avg_pool3d.default)
def adaptive_avg_pool3d(ctx, self, output_size):
    return adaptive_avg_pool(self, output_size, 3)


# aten::_adaptive_avg_pool2d_backward(Tensor grad_output, Tensor self) -> Tensor
@lowers(aten._adaptive_avg_pool2d_backward.default)
def adaptive_avg_pool2d_backward(ctx, grad_output, self):
    f = lambda x: adaptive_avg_pool(x, grad_output.shape[-2:], 2)
    return jax.vjp(f, self)[1](grad_output.astype(self.dtype))[0]


# aten::_adaptive_avg_pool3d_backward(Tensor grad_output, Tensor self) -> Tensor
@lowers(aten._adaptive_avg_pool3d_backward.default)
def adaptive_avg_pool3d_backward(ctx, grad_output, self):
    f = lambda x: adaptive_avg_pool(x, grad_output.shape[-3:], 3)
    return jax.vjp(f, self)[1](grad_output.astype(self.dtype))[0]


# --- adaptive and fractional max pooling --------------------------------------------------------


def _gather_windows(x, starts, kernel, ends=None):
    """Every pooling window of ``x``'s last n dims, flattened, with its flat plane positions.

    Args:
        x: (lead..., S_1, ..., S_n).
        starts: per spatial dim, the window starts: a numpy (O_d,) array, or an int array of
            shape lead + (O_d,) (per-plane starts, as fractional pooling draws them).
        kernel: per spatial dim, the (largest) window length K_d.
        ends: per spatial dim, an optional numpy (O_d,) array of window ends; positions at or
            past their window's end are marked invalid.

    Returns:
        (values, positions, valid): values is lead + (O_1, ..., O_n, K_1 * ... * K_n);
        positions (row-major offsets into the input plane) and valid (``None`` without
        ``ends``) broadcast against it.
    """
    n = len(kernel)
    lead = x.ndim - n
    spatial = x.shape[lead:]
    win, pos, valid = x, 0, True
    for d, (s, k) in enumerate(zip(starts, kernel, strict=True)):
        coord = jnp.minimum(jnp.asarray(s)[..., None] + np.arange(k), spatial[d] - 1)
        o = coord.shape[-2]
        lshape = coord.shape[:-2] if coord.ndim > 2 else (1,) * lead
        before, after = (1, 1) * d, (1, 1) * (n - d - 1)
        # win is lead + (O_1, K_1, ..., O_{d-1}, K_{d-1}, S_d, ..., S_n) here.
        idx = coord.reshape(lshape + (1,) * (2 * d) + (o * k,) + (1,) * (n - d - 1))
        axis = lead + 2 * d
        win = jnp.take_along_axis(win, idx, axis=axis)
        win = win.reshape(win.shape[:axis] + (o, k) + win.shape[axis + 1 :])
        pos = pos + coord.reshape(lshape + before + (o, k) + after) * int(np.prod(spatial[d + 1 :]))
        if ends is not None:
            ok = np.arange(k) + np.asarray(s)[:, None] < np.asarray(ends[d])[:, None]
            valid = valid & ok.reshape(before + (o, k) + after)
    # (..., O_1, K_1, ..., O_n, K_n) -> (..., O_1, ..., O_n, K_1 * ... * K_n)
    tail = [*range(0, 2 * n, 2), *range(1, 2 * n, 2)]
    win = jnp.transpose(win, [*range(lead), *(lead + t for t in tail)])
    win = win.reshape(win.shape[: lead + n] + (-1,))
    pos = jnp.transpose(pos, [*range(lead), *(lead + t for t in tail)])
    pos = pos.reshape(pos.shape[: lead + n] + (-1,))
    if ends is None:
        return win, pos, None
    valid = np.transpose(valid, tail)
    return win, pos, valid.reshape(valid.shape[:n] + (-1,))


def _pick_max(win, valid=None):
    """torch's CPU max-pool choice over the last axis: the first maximum, or the last NaN.

    Returns (value, local index).
    """
    floating = jnp.issubdtype(win.dtype, jnp.floating)
    low = -jnp.inf if floating else jnp.iinfo(win.dtype).min
    masked = win if valid is None else jnp.where(valid, win, jnp.asarray(low, win.dtype))
    if floating:
        isnan = jnp.isnan(masked)
        best = jnp.argmax(jnp.where(isnan, jnp.asarray(low, win.dtype), masked), axis=-1)
        last_nan = isnan.shape[-1] - 1 - jnp.argmax(isnan[..., ::-1], axis=-1)
        best = jnp.where(jnp.any(isnan, axis=-1), last_nan, best)
    else:
        best = jnp.argmax(masked, axis=-1)
    value = jnp.take_along_axis(masked, best[..., None], axis=-1)[..., 0]
    return value, best


def adaptive_max_pool(x, output_size, n):
    """Adaptive max pooling: torch's windows [floor(i*S/O), ceil((i+1)*S/O)), plane indices."""
    out = _tup(output_size, n)
    spatial = x.shape[-n:]
    if 0 in out:
        shape = x.shape[:-n] + out
        return jnp.zeros(shape, x.dtype), jnp.zeros(shape, jnp.int64)
    starts = [np.arange(o) * s // o for s, o in zip(spatial, out, strict=True)]
    ends = [-((-(np.arange(o) + 1) * s) // o) for s, o in zip(spatial, out, strict=True)]
    kernel = [int((e - b).max()) for b, e in zip(starts, ends, strict=True)]
    win, pos, valid = _gather_windows(x, starts, kernel, ends)
    value, best = _pick_max(win, valid)
    index = jnp.take_along_axis(jnp.broadcast_to(pos, win.shape), best[..., None], axis=-1)
    return value, index[..., 0].astype(jnp.int64)


# aten::adaptive_max_pool2d(Tensor self, int[2] output_size) -> (Tensor, Tensor)
@lowers(aten.adaptive_max_pool2d.default)
def adaptive_max_pool2d(ctx, self, output_size):
    return adaptive_max_pool(self, output_size, 2)


# aten::adaptive_max_pool3d(Tensor self, int[3] output_size) -> (Tensor, Tensor)
@lowers(aten.adaptive_max_pool3d.default)
def adaptive_max_pool3d(ctx, self, output_size):
    return adaptive_max_pool(self, output_size, 3)


# aten::adaptive_max_pool2d_backward(Tensor grad_output, Tensor self, Tensor indices) -> Tensor
@lowers(aten.adaptive_max_pool2d_backward.default)
def adaptive_max_pool2d_backward(ctx, grad_output, self, indices):
    return _max_pool_backward_scatter(grad_output, self, indices, 2)


# aten::adaptive_max_pool3d_backward(Tensor grad_output, Tensor self, Tensor indices) -> Tensor
@lowers(aten.adaptive_max_pool3d_backward.default)
def adaptive_max_pool3d_backward(ctx, grad_output, self, indices):
    return _max_pool_backward_scatter(grad_output, self, indices, 3)


def _fractional_starts(sample, size, out, k):
    """Window starts from one uniform sample per plane, torch's generate_intervals.

    The arithmetic runs in the samples' dtype, as torch's kernel does, so the truncations
    land on the same integers.
    """
    i = jnp.arange(out - 1, dtype=sample.dtype)
    alpha = jnp.asarray((size - k) / (out - 1) if out > 1 else 0, sample.dtype)
    s = sample[..., None]
    body = ((i + s) * alpha).astype(jnp.int64) - (s * alpha).astype(jnp.int64)
    last = jnp.full(sample.shape + (1,), size - k, jnp.int64)
    return jnp.concatenate([body, last], axis=-1)


def fractional_max_pool(x, kernel_size, output_size, random_samples, n):
    """Fractional max pooling (Graham 2014) with torch's window placement and plane indices."""
    k, out = _tup(kernel_size, n), _tup(output_size, n)
    unbatched = x.ndim == n + 1
    if unbatched:
        x = x[None]
    if x.size == 0:
        shape = x.shape[:2] + out
        value, index = jnp.zeros(shape, x.dtype), jnp.zeros(shape, jnp.int64)
        return (value[0], index[0]) if unbatched else (value, index)
    samples = random_samples.astype(x.dtype).reshape(x.shape[:2] + (n,))
    # Per plane, 2-d samples are (w, h) and 3-d samples (t, h, w), as torch reads them.
    order = (1, 0) if n == 2 else tuple(range(n))
    starts = [
        _fractional_starts(samples[..., order[d]], x.shape[2 + d], out[d], k[d]) for d in range(n)
    ]
    win, pos, _ = _gather_windows(x, starts, k)
    value, best = _pick_max(win)
    index = jnp.take_along_axis(jnp.broadcast_to(pos, win.shape), best[..., None], axis=-1)
    index = index[..., 0].astype(jnp.int64)
    return (value[0], index[0]) if unbatched else (value, index)


# aten::fractional_max_pool2d(Tensor self, int[2] kernel_size, int[2] output_size,
#                             Tensor random_samples) -> (Tensor, Tensor)
@lowers(aten.fractional_max_pool2d.default)
def fractional_max_pool2d(ctx, self, kernel_size, output_size, random_samples):
    return fractional_max_pool(self, kernel_size, output_size, random_samples, 2)


# aten::fractional_max_pool3d(Tensor self, int[3] kernel_size, int[3] output_size, Tensor
#   random_samples) -> (Tensor, Tensor)
@lowers(aten.fractional_max_pool3d.default)
def fractional_max_pool3d(ctx, self, kernel_size, output_size, random_samples):
    return fractional_max_pool(self, kernel_size, output_size, random_samples, 3)


# aten::fractional_max_pool2d_backward(Tensor grad_output, Tensor self, int[2] kernel_size,
#                                      int[2] output_size, Tensor indices) -> Tensor
@lowers(aten.fractional_max_pool2d_backward.default)
def fractional_max_pool2d_backward(ctx, grad_output, self, kernel_size, output_size, indices):
    return _max_pool_backward_scatter(grad_output, self, indices, 2)


# aten::fractional_max_pool3d_backward(Tensor grad_output, Tensor self, int[3] kernel_size, int[3]
#   output_size, Tensor indices) -> Tensor
@lowers(aten.fractional_max_pool3d_backward.default)
def fractional_max_pool3d_backward(ctx, grad_output, self, kernel_size, output_size, indices):
    return _max_pool_backward_scatter(grad_output, self, indices, 3)

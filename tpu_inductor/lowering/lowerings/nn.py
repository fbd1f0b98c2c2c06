"""Neural-network ops: softmax, losses, normalization, dropout, embedding, and the backward ops
AOTAutograd emits for them that have no Core ATen decomposition (attention: ``attention.py``).

Half-precision inputs compute statistics in float32, like torch's CPU kernels.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax import lax

from tpu_inductor.lowering.lowerings.registry import accumulate_in, lowers, upcast

aten = torch.ops.aten


# --- 1. softmax and log-softmax -------------------------------------------------------------------


# aten::_softmax(Tensor self, int dim, bool half_to_float) -> Tensor
@lowers(aten._softmax.default)
def softmax(ctx, self, dim, half_to_float=False):
    if self.ndim == 0:
        return jnp.ones((), ctx.out_dtype())
    return jax.nn.softmax(upcast(self), axis=dim).astype(ctx.out_dtype())


# aten::_log_softmax(Tensor self, int dim, bool half_to_float) -> Tensor
@lowers(aten._log_softmax.default)
def log_softmax(ctx, self, dim, half_to_float=False):
    if self.ndim == 0:
        return jnp.zeros((), ctx.out_dtype())
    return jax.nn.log_softmax(upcast(self), axis=dim).astype(ctx.out_dtype())


# aten::_softmax_backward_data(Tensor grad_output, Tensor output, int dim, ScalarType input_dtype)
@lowers(aten._softmax_backward_data.default)
def softmax_backward_data(ctx, grad_output, output, dim, input_dtype):
    g, y = upcast(grad_output), upcast(output)
    return (y * (g - jnp.sum(g * y, axis=dim, keepdims=True))).astype(ctx.out_dtype())


# aten::_log_softmax_backward_data(Tensor grad_output, Tensor output, int dim, ScalarType
#   input_dtype) -> Tensor
@lowers(aten._log_softmax_backward_data.default)
def log_softmax_backward_data(ctx, grad_output, output, dim, input_dtype):
    g, y = upcast(grad_output), upcast(output)
    return (g - jnp.exp(y) * jnp.sum(g, axis=dim, keepdims=True)).astype(ctx.out_dtype())


# aten::nll_loss_forward(Tensor self, Tensor target, Tensor? weight, int reduction,
#   SymInt ignore_index) -> (Tensor output, Tensor total_weight)
# (aten::nll_loss2d_forward has the same schema, with spatial dimensions after the classes.)
@lowers(aten.nll_loss_forward.default, aten.nll_loss2d_forward.default)
def nll_loss_forward(ctx, self, target, weight, reduction, ignore_index):
    # NOTE: torch's decomposition gathers each target's log-probability; a masked sum over the
    # classes is the same number (the other terms are exact zeros), and XLA fuses the
    # log-softmax that makes ``self`` into it, where a gather needs ``self`` written out: for a
    # language model's loss, a [tokens, vocabulary] float32 buffer.
    channel_dim = 0 if self.ndim < 2 else 1
    dtype = ctx.out_dtype(0)
    if weight is not None:
        shape = [1] * self.ndim
        shape[channel_dim] = weight.shape[0]
        w = weight.reshape(shape)
        self = self * w
    valid = target != ignore_index
    onehot = lax.broadcasted_iota(target.dtype, self.shape, channel_dim) == jnp.expand_dims(
        jnp.where(valid, target, 0), channel_dim
    )
    result = jnp.where(valid, -jnp.sum(jnp.where(onehot, self, 0), axis=channel_dim), 0)
    if reduction == 0 and self.ndim > 1:  # none
        return result.astype(dtype), jnp.zeros((), ctx.out_dtype(1))
    wdtype = ctx.out_dtype(1)
    if weight is not None:
        picked = jnp.sum(jnp.where(onehot, jnp.broadcast_to(w, self.shape), 0), channel_dim)
        total_weight = _sum_as(jnp.where(valid, picked, 0), wdtype)
    else:
        total_weight = jnp.sum(valid).astype(wdtype)
    if reduction == 1:  # mean
        result = upcast(_sum_as(result, dtype)) / upcast(total_weight)
    elif reduction == 2:  # sum
        result = _sum_as(result, dtype)
    return result.astype(dtype), total_weight


def _sum_as(x, dtype):
    """A sum accumulated in float32 for half precision and rounded once, as torch's CPU sum."""
    return jnp.sum(upcast(x)).astype(dtype)


# aten::nll_loss_backward(Tensor grad_output, Tensor self, Tensor target, Tensor? weight,
#   int reduction, SymInt ignore_index, Tensor total_weight) -> Tensor
# (aten::nll_loss2d_backward has the same schema, with spatial dimensions after the classes.)
@lowers(aten.nll_loss_backward.default, aten.nll_loss2d_backward.default)
def nll_loss_backward(
    ctx, grad_output, self, target, weight, reduction, ignore_index, total_weight
):
    # NOTE: torch's decomposition scatters -1 into a zeroed [N, classes] buffer; this is the same
    # numbers as a comparison with the class index, which XLA fuses into what reads the gradient
    # (the log-softmax backward), so no vocabulary-sized buffer is written for it.
    channel_dim = 0 if self.ndim < 2 else 1
    g = grad_output
    if reduction == 1:  # mean
        g = g / total_weight
    if self.ndim == 1 and target.ndim > 0:
        target = target[0]  # torch's kernel reads only target[0] without a batch dimension
    target = jnp.expand_dims(target, channel_dim)
    if self.ndim > g.ndim > 0:
        g = jnp.expand_dims(g, channel_dim)
    if weight is not None:
        shape = [1] * self.ndim
        shape[channel_dim] = weight.shape[0]
        g = g * weight.reshape(shape)
    g = jnp.where(target != ignore_index, g, 0)
    onehot = lax.broadcasted_iota(target.dtype, self.shape, channel_dim) == target
    dtype = ctx.out_dtype()
    return (jnp.where(onehot, -1, 0).astype(dtype) * g).astype(dtype)


# --- 2. layer norm --------------------------------------------------------------------------------


def layer_norm(x, normalized_shape, weight, bias, eps):
    axes = tuple(range(x.ndim - len(normalized_shape), x.ndim))
    xf = upcast(x)
    mean = jnp.mean(xf, axis=axes, keepdims=True)
    var = jnp.mean(jnp.square(xf - mean), axis=axes, keepdims=True)
    rstd = lax.rsqrt(var + eps)
    out = (xf - mean) * rstd
    if weight is not None:
        out = out * upcast(weight)
    if bias is not None:
        out = out + upcast(bias)
    return out.astype(x.dtype), mean, rstd


# aten::native_layer_norm(Tensor input, SymInt[] normalized_shape, Tensor? weight, Tensor? bias,
#                         float eps) -> (Tensor, Tensor, Tensor)
@lowers(aten.native_layer_norm.default)
def native_layer_norm(ctx, input, normalized_shape, weight, bias, eps):
    out, mean, rstd = layer_norm(input, normalized_shape, weight, bias, eps)
    return out, mean.astype(ctx.out_dtype(1)), rstd.astype(ctx.out_dtype(2))


# aten::native_layer_norm_backward(Tensor grad_out, Tensor input, SymInt[] normalized_shape,
#   Tensor mean, Tensor rstd, Tensor? weight, Tensor? bias, bool[3] output_mask)
@lowers(aten.native_layer_norm_backward.default)
def native_layer_norm_backward(
    ctx, grad_out, input, normalized_shape, mean, rstd, weight, bias, output_mask
):
    # Analytic form from the saved statistics (eps is already folded into rstd).
    axes = tuple(range(input.ndim - len(normalized_shape), input.ndim))
    lead = tuple(range(input.ndim - len(normalized_shape)))
    n = math.prod(input.shape[a] for a in axes)
    g = upcast(grad_out)
    xhat = (upcast(input) - upcast(mean)) * upcast(rstd)
    gxhat = g * upcast(weight) if weight is not None else g
    gx = (upcast(rstd) / n) * (
        n * gxhat
        - jnp.sum(gxhat, axis=axes, keepdims=True)
        - xhat * jnp.sum(gxhat * xhat, axis=axes, keepdims=True)
    )
    gw = jnp.sum(g * xhat, axis=lead).astype(weight.dtype) if weight is not None else None
    gb = jnp.sum(g, axis=lead).astype(bias.dtype) if bias is not None else None
    out = (gx.astype(input.dtype), gw, gb)
    return tuple(v if m else None for v, m in zip(out, output_mask, strict=True))


# --- 3. batch norm --------------------------------------------------------------------------------


def _bn_axes(x):
    return (0,) + tuple(range(2, x.ndim))


def _bn_shape(x):
    return (1, -1) + (1,) * (x.ndim - 2)


def _bn_apply(x, mean, rstd, weight, bias):
    s = _bn_shape(x)
    out = (upcast(x) - mean.reshape(s)) * rstd.reshape(s)
    if weight is not None:
        out = out * upcast(weight).reshape(s)
    if bias is not None:
        out = out + upcast(bias).reshape(s)
    return out.astype(x.dtype)


def _bn_train(x, weight, bias, running_mean, running_var, momentum, eps):
    axes = _bn_axes(x)
    xf = upcast(x)
    mean = jnp.mean(xf, axis=axes)
    var = jnp.mean(jnp.square(xf - mean.reshape(_bn_shape(x))), axis=axes)
    rstd = lax.rsqrt(var + eps)
    out = _bn_apply(x, mean, rstd, weight, bias)
    new_rm = new_rv = None
    if running_mean is not None:
        n = x.size // x.shape[1]
        unbiased = var * (n / max(n - 1, 1))
        new_rm = (1 - momentum) * upcast(running_mean) + momentum * mean
        new_rv = (1 - momentum) * upcast(running_var) + momentum * unbiased
        new_rm, new_rv = new_rm.astype(running_mean.dtype), new_rv.astype(running_var.dtype)
    return out, mean, rstd, new_rm, new_rv


# aten::_native_batch_norm_legit_functional(Tensor input, Tensor? weight, Tensor? bias,
#   Tensor running_mean, Tensor running_var, bool training, float momentum, float eps)
#   -> (Tensor, Tensor, Tensor, Tensor running_mean_out, Tensor running_var_out)
@lowers(aten._native_batch_norm_legit_functional.default)
def batch_norm_functional(
    ctx, input, weight, bias, running_mean, running_var, training, momentum, eps
):
    if training:
        out, mean, rstd, rm, rv = _bn_train(
            input, weight, bias, running_mean, running_var, momentum, eps
        )
        # Output dtypes from torch's meta: with half-precision inputs the saved statistics stay
        # half and the new running stats come out float32 (copied back into the buffers).
        return tuple(v.astype(ctx.out_dtype(i)) for i, v in enumerate((out, mean, rstd, rm, rv)))
    outs = batch_norm_no_training(
        ctx, input, weight, bias, running_mean, running_var, momentum, eps
    )
    return (*outs, running_mean.astype(ctx.out_dtype(3)), running_var.astype(ctx.out_dtype(4)))


# aten::_native_batch_norm_legit_no_training(Tensor input, Tensor? weight, Tensor? bias,
#   Tensor running_mean, Tensor running_var, float momentum, float eps) -> (Tensor, Tensor, Tensor)
@lowers(aten._native_batch_norm_legit_no_training.default)
def batch_norm_no_training(ctx, input, weight, bias, running_mean, running_var, momentum, eps):
    rstd = lax.rsqrt(upcast(running_var) + eps)
    out = _bn_apply(input, upcast(running_mean), rstd, weight, bias)
    return (
        out,
        jnp.zeros(ctx.out_shape(1), ctx.out_dtype(1)),
        jnp.zeros(ctx.out_shape(2), ctx.out_dtype(2)),
    )


# aten::_native_batch_norm_legit.no_stats(Tensor input, Tensor? weight, Tensor? bias, bool training,
#   float momentum, float eps) -> (Tensor, Tensor, Tensor)
@lowers(aten._native_batch_norm_legit.no_stats)
def batch_norm_no_stats(ctx, input, weight, bias, training, momentum, eps):
    out, mean, rstd, _, _ = _bn_train(input, weight, bias, None, None, momentum, eps)
    return out, mean.astype(ctx.out_dtype(1)), rstd.astype(ctx.out_dtype(2))


# aten::native_batch_norm_backward(Tensor grad_out, Tensor input, Tensor? weight,
#   Tensor? running_mean, Tensor? running_var, Tensor? save_mean, Tensor? save_invstd,
#   bool train, float eps, bool[3] output_mask) -> (Tensor, Tensor, Tensor)
@lowers(aten.native_batch_norm_backward.default)
def native_batch_norm_backward(
    ctx,
    grad_out,
    input,
    weight,
    running_mean,
    running_var,
    save_mean,
    save_invstd,
    train,
    eps,
    output_mask,
):
    def f(x, w):
        if train:
            return _bn_train(x, w, None, None, None, 0.0, eps)[0]
        return _bn_apply(x, upcast(running_mean), lax.rsqrt(upcast(running_var) + eps), w, None)

    w = weight if weight is not None else jnp.ones((input.shape[1],), input.dtype)
    _, vjp = jax.vjp(f, input, w)
    gx, gw = vjp(grad_out.astype(input.dtype))
    gb = jnp.sum(upcast(grad_out), axis=_bn_axes(input)).astype(w.dtype)
    return tuple(v if m else None for v, m in zip((gx, gw, gb), output_mask, strict=True))


# --- 4. group norm --------------------------------------------------------------------------------


# aten::native_group_norm(Tensor input, Tensor? weight, Tensor? bias, SymInt N, SymInt C,
#   SymInt HxW, int group, float eps) -> (Tensor, Tensor, Tensor)
@lowers(aten.native_group_norm.default)
def native_group_norm(ctx, input, weight, bias, N, C, HxW, group, eps):
    x = upcast(input).reshape(N, group, -1)
    mean = jnp.mean(x, axis=-1)
    var = jnp.mean(jnp.square(x - mean[..., None]), axis=-1)
    rstd = lax.rsqrt(var + eps)
    out = ((x - mean[..., None]) * rstd[..., None]).reshape(input.shape)
    s = (1, -1) + (1,) * (input.ndim - 2)
    if weight is not None:
        out = out * upcast(weight).reshape(s)
    if bias is not None:
        out = out + upcast(bias).reshape(s)
    return out.astype(input.dtype), mean.astype(ctx.out_dtype(1)), rstd.astype(ctx.out_dtype(2))


# --- 5. dropout -----------------------------------------------------------------------------------


# aten::native_dropout(Tensor input, float p, bool? train) -> (Tensor, Tensor)
@lowers(aten.native_dropout.default, random=True)
def native_dropout(ctx, input, p, train):
    if train is False or p == 0:
        return input, jnp.ones(input.shape, jnp.bool_)
    if p >= 1:
        return jnp.zeros_like(input), jnp.zeros(input.shape, jnp.bool_)
    keep = jax.random.uniform(ctx.key(), input.shape, jnp.float32) < (1 - p)
    out = jnp.where(keep, upcast(input) * np.float32(1 / (1 - p)), 0).astype(input.dtype)
    return out, keep


# aten::native_dropout_backward(Tensor grad_output, Tensor mask, float scale) -> Tensor
@lowers(aten.native_dropout_backward.default)
def native_dropout_backward(ctx, grad_output, mask, scale):
    # Integer and bool gradients promote with the float scale (to the default float dtype).
    dtype = ctx.out_dtype()
    return (grad_output.astype(dtype) * mask.astype(dtype) * scale).astype(dtype)


# --- 6. embedding and embedding bags --------------------------------------------------------------


# aten::embedding(Tensor weight, Tensor indices, SymInt padding_idx=-1, ...) -> Tensor
@lowers(aten.embedding.default)
def embedding(ctx, weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    return jnp.take(weight, indices, axis=0, mode="clip")


# aten::embedding_renorm(Tensor self, Tensor indices, float max_norm, float norm_type) -> Tensor
@lowers(aten.embedding_renorm.default)
def embedding_renorm(ctx, self, indices, max_norm, norm_type):
    # Rows that indices select and whose p-norm exceeds max_norm are scaled down to it.
    w = upcast(self)
    if norm_type == math.inf:
        norm = jnp.max(jnp.abs(w), axis=1)
    elif norm_type == 0:
        norm = jnp.sum(w != 0, axis=1).astype(w.dtype)
    else:
        norm = jnp.sum(jnp.abs(w) ** norm_type, axis=1) ** (1.0 / norm_type)
    used = jnp.zeros(self.shape[0], jnp.bool_).at[indices.reshape(-1)].set(True)
    scale = jnp.where(used & (norm > max_norm), max_norm / (norm + 1e-7), 1.0)
    return jnp.where(scale[:, None] != 1.0, w * scale[:, None], w).astype(self.dtype)


# aten::embedding_dense_backward(Tensor grad_output, Tensor indices, SymInt num_weights,
#   SymInt padding_idx, bool scale_grad_by_freq) -> Tensor
@lowers(aten.embedding_dense_backward.default)
def embedding_dense_backward(
    ctx, grad_output, indices, num_weights, padding_idx, scale_grad_by_freq
):
    idx = indices.reshape(-1)
    dtype = ctx.out_dtype()
    g = upcast(grad_output)
    g = g.astype(jnp.int32) if g.dtype == jnp.bool_ else g  # bools accumulate as "or"
    g = g.reshape(idx.shape[0], grad_output.shape[-1])
    if padding_idx >= 0:
        g = jnp.where((idx == padding_idx)[:, None], 0, g)
    if scale_grad_by_freq:
        counts = jnp.zeros((num_weights,), jnp.int32).at[idx].add(1)[idx][:, None]
        if jnp.issubdtype(g.dtype, jnp.inexact):
            g = g / counts.astype(g.dtype)
        elif dtype != jnp.bool_:
            # NOTE: torch adds grad * (1.0 / count) with the scale cast to the integer dtype:
            # an index seen more than once contributes 0 (bool(1 / count) is True: no change).
            g = jnp.where(counts == 1, g, 0)
    out = jnp.zeros((num_weights, g.shape[1]), g.dtype).at[idx].add(g)
    return out != 0 if dtype == jnp.bool_ else out.astype(dtype)


def _bags(indices, offsets, num_bags, include_last_offset):
    """Each index's bag: offsets[b] <= position < offsets[b + 1]; num_bags past the end."""
    pos = jnp.arange(indices.shape[0])
    starts = offsets[:num_bags] if include_last_offset else offsets
    bag = jnp.searchsorted(starts, pos, side="right") - 1
    if include_last_offset:
        bag = jnp.where(pos < offsets[num_bags], bag, num_bags)
    return bag


def embedding_bag(
    ctx, weight, indices, offsets, mode, per_sample_weights, include_last_offset, padding_idx
):
    """torch's _embedding_bag forward: (output, offset2bag, bag_size, max_indices)."""
    num_bags = ctx.out_shape(0)[0]
    bag = _bags(indices, offsets, num_bags, include_last_offset)
    keep = (bag >= 0) & (bag < num_bags)
    if padding_idx is not None and padding_idx >= 0:
        keep = keep & (indices != padding_idx)
    seg = jnp.where(keep, bag, num_bags)  # dropped rows land in an extra, discarded segment
    rows = upcast(jnp.take(weight, indices, axis=0, mode="clip"))
    count = jax.ops.segment_sum(keep.astype(jnp.int64), seg, num_bags + 1)[:num_bags]
    max_indices = None
    if mode == 2:  # max: per feature, the first largest row of the bag; empty bags give 0
        out = jax.ops.segment_max(jnp.where(keep[:, None], rows, -jnp.inf), seg, num_bags + 1)
        out = out[:num_bags]
        first = jnp.where(keep[:, None] & (rows == out[bag.clip(0, num_bags - 1)]), 1, 0)
        pos = jnp.where(first == 1, jnp.arange(indices.shape[0])[:, None], indices.shape[0])
        at = jax.ops.segment_min(pos, seg, num_bags + 1)[:num_bags]
        max_indices = jnp.where(count[:, None] > 0, indices[at.clip(0, indices.shape[0] - 1)], 0)
        out = jnp.where(count[:, None] > 0, out, 0)
    else:
        if per_sample_weights is not None:
            rows = rows * upcast(per_sample_weights)[:, None]
        out = jax.ops.segment_sum(jnp.where(keep[:, None], rows, 0), seg, num_bags + 1)
        out = out[:num_bags]
        if mode == 1:  # mean over the bag's non-padding rows; empty bags give 0
            out = out / jnp.maximum(count, 1)[:, None].astype(out.dtype)
    # The auxiliary outputs (for the backward) follow torch's CPU kernel: in sum mode bag_size
    # and max_indices are zeros, and their shapes (like offset2bag's) vary with the path taken.
    bag_size = count if mode != 0 else jnp.zeros_like(count)
    if max_indices is None:
        max_indices = bag_size if mode == 1 else jnp.zeros_like(count)
    aux = []
    for i, v in enumerate((bag, bag_size, max_indices), start=1):
        shape, dtype = ctx.out_shape(i), ctx.out_dtype(i)
        aux.append(v.astype(dtype) if v.shape == shape else jnp.zeros(shape, dtype))
    return (out.astype(ctx.out_dtype(0)), *aux)


# aten::_embedding_bag(Tensor weight, Tensor indices, Tensor offsets,
#   bool scale_grad_by_freq=False, int mode=0, bool sparse=False,
#   Tensor? per_sample_weights=None, bool include_last_offset=False, int padding_idx=-1)
#   -> (Tensor, Tensor, Tensor, Tensor)
@lowers(aten._embedding_bag.default, aten._embedding_bag_forward_only.default)
def embedding_bag_forward(
    ctx,
    weight,
    indices,
    offsets,
    scale_grad_by_freq=False,
    mode=0,
    sparse=False,
    per_sample_weights=None,
    include_last_offset=False,
    padding_idx=-1,
):
    return embedding_bag(
        ctx, weight, indices, offsets, mode, per_sample_weights, include_last_offset, padding_idx
    )


# aten::_embedding_bag_backward(Tensor grad, Tensor indices, Tensor offsets, Tensor offset2bag,
#   Tensor bag_size, Tensor maximum_indices, SymInt num_weights, bool scale_grad_by_freq,
#   int mode, bool sparse, Tensor? per_sample_weights, int padding_idx=-1) -> Tensor
@lowers(aten._embedding_bag_backward.default)
def embedding_bag_backward(
    ctx,
    grad,
    indices,
    offsets,
    offset2bag,
    bag_size,
    maximum_indices,
    num_weights,
    scale_grad_by_freq,
    mode,
    sparse,
    per_sample_weights,
    padding_idx=-1,
):
    # NOTE: always the dense gradient (sparse=True gives a dense tensor, like the meta says).
    # NOTE: scale_grad_by_freq divides each row's gradient by that row's frequency in indices;
    # torch's CPU kernel divides by the frequency of another index (the i-th smallest for the
    # i-th distinct one), so the two differ when indices repeat unevenly.
    # Bags are recomputed from offsets: offset2bag is empty on torch's sum fast path.
    num_bags = grad.shape[0]
    bag = _bags(indices, offsets, num_bags, offsets.shape[0] > num_bags)
    keep = (bag >= 0) & (bag < num_bags)
    if padding_idx is not None and padding_idx >= 0:
        keep = keep & (indices != padding_idx)
    g = upcast(grad)
    out = jnp.zeros((num_weights, g.shape[1]), g.dtype)
    if mode == 2:
        count = jax.ops.segment_sum(
            keep.astype(jnp.int32), jnp.where(keep, bag, num_bags), num_bags + 1
        )[:num_bags]
        g = jnp.where(count[:, None] > 0, g, 0)
        cols = jnp.broadcast_to(jnp.arange(g.shape[1]), g.shape)
        return out.at[maximum_indices, cols].add(g).astype(ctx.out_dtype())
    rows = jnp.where(keep[:, None], g[bag.clip(0, num_bags - 1)], 0)
    if mode == 1:
        count = jax.ops.segment_sum(
            keep.astype(g.dtype), jnp.where(keep, bag, num_bags), num_bags + 1
        )[:num_bags]
        rows = rows / jnp.maximum(count, 1)[bag.clip(0, num_bags - 1)][:, None]
    elif per_sample_weights is not None:
        rows = rows * upcast(per_sample_weights)[:, None]
    if scale_grad_by_freq:
        freq = jnp.zeros(num_weights, g.dtype).at[indices].add(1)
        rows = rows / freq[indices][:, None]
    return out.at[indices].add(rows).astype(ctx.out_dtype())


# aten::_embedding_bag_per_sample_weights_backward(Tensor grad, Tensor weight, Tensor indices,
#   Tensor offsets, Tensor offset2bag, int mode, int padding_idx=-1) -> Tensor
@lowers(aten._embedding_bag_per_sample_weights_backward.default)
def embedding_bag_per_sample_weights_backward(
    ctx, grad, weight, indices, offsets, offset2bag, mode, padding_idx=-1
):
    num_bags = grad.shape[0]
    bag = _bags(indices, offsets, num_bags, offsets.shape[0] > num_bags)
    keep = (bag >= 0) & (bag < num_bags)
    if padding_idx is not None and padding_idx >= 0:
        keep = keep & (indices != padding_idx)
    rows = upcast(jnp.take(weight, indices, axis=0, mode="clip"))
    dot = jnp.sum(upcast(grad)[bag.clip(0, num_bags - 1)] * rows, axis=1)
    return jnp.where(keep, dot, 0).astype(ctx.out_dtype())


# --- 7. bilinear (nn.Bilinear's _trilinear) -------------------------------------------------------


# aten::_trilinear(Tensor i1, Tensor i2, Tensor i3, int[] expand1, int[] expand2, int[] expand3,
#                  int[] sumdim, int unroll_dim=1) -> Tensor
@lowers(aten._trilinear.default)
def trilinear(ctx, i1, i2, i3, expand1, expand2, expand3, sumdim, unroll_dim=1):
    # i1 * i2 * i3, each unsqueezed at its expand dims, summed over sumdim. Like torch, i1 and
    # i2 contract first (over the summed dims i3 lacks), the result rounds to the output dtype,
    # and then it contracts with i3.
    ndim = i1.ndim + len(expand1)
    letters = "abcdefghijklmnopqrstuvwxyz"[:ndim]

    def spec(dims):
        return "".join(letters[d] for d in dims)

    dims1, dims2, dims3 = (
        [d for d in range(ndim) if d not in expand] for expand in (expand1, expand2, expand3)
    )
    sum12 = {d for d in sumdim if d in expand3}
    dims12 = [d for d in range(ndim) if (d in dims1 or d in dims2) and d not in sum12]
    dims_out = [d for d in range(ndim) if d not in sumdim]
    dtype = ctx.out_dtype()
    pref = accumulate_in(dtype)
    kw = dict(precision=ctx.precision, preferred_element_type=pref)
    buf = jnp.einsum(f"{spec(dims1)},{spec(dims2)}->{spec(dims12)}", i1, i2, **kw)
    buf = buf.astype(dtype)
    out = jnp.einsum(f"{spec(dims12)},{spec(dims3)}->{spec(dims_out)}", buf, i3, **kw)
    return out.astype(dtype).reshape(ctx.out_shape())


# --- 8. fused linear + cross-entropy (torch_nn's chunked kernels) ---------------------------------


def _linear_ce_losses(input, linear_weight, target, linear_bias, weight, ignore_index, precision):
    """Per-row loss weights and weighted losses of cross_entropy(linear(input), target)."""
    acc = jnp.float64 if input.dtype == jnp.float64 else jnp.float32
    logits = jnp.matmul(input.astype(acc), linear_weight.astype(acc).T, precision=precision)
    if linear_bias is not None:
        logits = logits + linear_bias.astype(acc)
    ignored = target == ignore_index
    tgt = jnp.where(ignored, 0, target)
    nll = -jnp.take_along_axis(jax.nn.log_softmax(logits, axis=-1), tgt[:, None], axis=-1)[:, 0]
    w = jnp.ones(tgt.shape, acc) if weight is None else weight.astype(acc)[tgt]
    w = jnp.where(ignored, 0, w)
    return w, w * nll


# torch_nn::_linear_cross_entropy_batch_chunked(Tensor input, Tensor linear_weight, Tensor target,
#   Tensor? linear_bias, Tensor? weight, str reduction, SymInt ignore_index, float label_smoothing,
#   SymInt batch_chunk_size, str acc_policy, ScalarType acc_dtype, bool allow_retain_graph,
#   bool compute_input_grad, bool compute_linear_weight_grad, bool compute_linear_bias_grad)
#   -> (Tensor, Tensor, Tensor, Tensor)
def linear_cross_entropy_batch_chunked(
    ctx,
    input,
    linear_weight,
    target,
    linear_bias,
    weight,
    reduction,
    ignore_index,
    label_smoothing,
    batch_chunk_size,
    acc_policy,
    acc_dtype,
    allow_retain_graph,
    compute_input_grad,
    compute_linear_weight_grad,
    compute_linear_bias_grad,
):
    # F.linear_cross_entropy's fused loss, returning the gradients it precomputes for its
    # backward (empty where not requested).
    # NOTE: not chunked: XLA gets the whole (batch, classes) logits matrix and schedules the
    # memory itself; batch_chunk_size and acc_policy do not change the result beyond rounding.
    if label_smoothing > 0:
        raise NotImplementedError("linear_cross_entropy with label smoothing (torch rejects it)")

    def loss(x, lw, lb):
        w, losses = _linear_ce_losses(x, lw, target, lb, weight, ignore_index, ctx.precision)
        total = jnp.sum(losses)
        return total / jnp.sum(w) if reduction == "mean" else total

    bias = linear_bias if linear_bias is not None else jnp.zeros(linear_weight.shape[:1])
    value, grads = jax.value_and_grad(loss, argnums=(0, 1, 2))(input, linear_weight, bias)
    wanted = (compute_input_grad, compute_linear_weight_grad, compute_linear_bias_grad)
    outs = [value]
    for i, (g, want) in enumerate(zip(grads, wanted, strict=True), start=1):
        outs.append(g if want else jnp.zeros(ctx.out_shape(i)))
    return tuple(v.astype(ctx.out_dtype(i)) for i, v in enumerate(outs))


# torch_nn::_linear_cross_entropy_batch_chunked_no_reduction(Tensor input, Tensor linear_weight,
#   Tensor target, Tensor? linear_bias, Tensor? weight, SymInt ignore_index,
#   SymInt batch_chunk_size, str acc_policy, ScalarType acc_dtype) -> Tensor
def linear_cross_entropy_batch_chunked_no_reduction(
    ctx,
    input,
    linear_weight,
    target,
    linear_bias,
    weight,
    ignore_index,
    batch_chunk_size,
    acc_policy,
    acc_dtype,
):
    # NOTE: not chunked, like the reducing op above.
    _, losses = _linear_ce_losses(
        input, linear_weight, target, linear_bias, weight, ignore_index, ctx.precision
    )
    return losses.astype(ctx.out_dtype())


def _register_linear_cross_entropy():
    # torch registers these custom ops when F.linear_cross_entropy's module is first imported.
    try:
        import torch.nn.modules.linear_cross_entropy  # noqa: F401
    except ImportError:  # a torch without F.linear_cross_entropy
        return
    ops = torch.ops.torch_nn
    lowers(ops._linear_cross_entropy_batch_chunked.default)(linear_cross_entropy_batch_chunked)
    lowers(ops._linear_cross_entropy_batch_chunked_no_reduction.default)(
        linear_cross_entropy_batch_chunked_no_reduction
    )


_register_linear_cross_entropy()

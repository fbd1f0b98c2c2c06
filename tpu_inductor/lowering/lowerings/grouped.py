"""Grouped (ragged) matrix products of mixture-of-experts layers: ``aten._grouped_mm`` and the
custom ops ``transformers::grouped_mm_fallback`` / ``grouped_mm_fallback_backward`` that
transformers uses on CPU and for non-bfloat16 weights.

All of them lower to ``jax.lax.ragged_dot_general``: a native ragged GEMM on TPU, a masked dense
product elsewhere. ``offs`` holds the cumulative group ends (``offs[i]`` ends group ``i``);
empty groups are allowed. The backward of ``_grouped_mm`` is ``_grouped_mm`` again (AOTAutograd
writes it with transposed operands), so its ragged-M and ragged-K forms are the forward's
2d x 3d and 2d x 2d forms.
"""

from __future__ import annotations

import jax.numpy as jnp
import torch
from jax import lax

from tpu_inductor.lowering.lowerings.registry import (
    accumulate_in,
    lowers,
    matmul_precision,
)

aten = torch.ops.aten


def _group_sizes(offs):
    """Group sizes from cumulative group ends (int32, as ``ragged_dot`` wants them)."""
    offs = offs.astype(jnp.int32)
    return jnp.diff(offs, prepend=jnp.zeros((1,), jnp.int32))


def _dims(contract, ragged, group):
    return lax.RaggedDotDimensionNumbers(
        dot_dimension_numbers=(contract, ((), ())),
        lhs_ragged_dimensions=[ragged],
        rhs_group_dimensions=[group] if group is not None else [],
    )


def ragged_mm(a, b, offs, precision, out):
    """``torch._grouped_mm(a, b, offs=offs)`` in dtype ``out``.

    Forms (``G`` groups, ``offs`` of length ``G``, ``-`` marks the ragged dimension):

    - 2d x 3d: ``(M-, K) x (G, K, N) -> (M, N)``: rows of ``a`` in groups (MoE forward, and the
      input gradient: ragged M).
    - 3d x 2d: ``(G, M, K) x (K, N-) -> (M, N)``: columns of ``b`` in groups.
    - 2d x 2d: ``(M, K-) x (K-, N) -> (G, M, N)``: the contraction in groups (the weight
      gradient: ragged K).
    - 3d x 3d: ``(G, M, K) x (G, K, N) -> (G, M, N)``: a batched product, no ``offs``.

    Half-precision inputs accumulate in float32 and are rounded once. ``precision`` applies to
    float32 (and float16) operands only: see ``registry.matmul_precision``.
    """
    pref = accumulate_in(a.dtype, b.dtype)
    kw = dict(precision=matmul_precision(precision, a, b), preferred_element_type=pref)
    if a.ndim == 3 and b.ndim == 3:
        prod = lax.dot_general(a, b, (((2,), (1,)), ((0,), (0,))), **kw)
        return prod.astype(out)
    if offs is None:
        raise ValueError(f"grouped mm of {a.ndim}d x {b.ndim}d operands needs offs")
    sizes = _group_sizes(offs)
    if a.ndim == 2 and b.ndim == 3:
        prod = lax.ragged_dot_general(a, b, sizes, _dims(((1,), (1,)), 0, 0), **kw)
    elif a.ndim == 3 and b.ndim == 2:
        # Computed transposed, (N-, M): b's columns are then the ragged rows of the product.
        # NOTE: rounded before the transpose: XLA:CPU folds a transpose of a bf16 x bf16 -> f32
        # product into a dot it cannot run ("Unsupported element type for DotThunk").
        prod = lax.ragged_dot_general(b, a, sizes, _dims(((0,), (2,)), 1, 0), **kw)
        return prod.astype(out).T
    elif a.ndim == 2 and b.ndim == 2:
        prod = lax.ragged_dot_general(a, b, sizes, _dims(((1,), (0,)), 1, None), **kw)
    else:
        raise ValueError(f"grouped mm of {a.ndim}d x {b.ndim}d operands (expected 2d or 3d)")
    return prod.astype(out)


# aten::_grouped_mm(Tensor self, Tensor mat2, Tensor? offs=None, Tensor? bias=None,
#     ScalarType? out_dtype=None) -> Tensor
@lowers(aten._grouped_mm.default)
def grouped_mm(ctx, self, mat2, offs=None, bias=None, out_dtype=None):
    # NOTE: a bias is refused before tracing (unsupported.REFUSED); torch rejects it too.
    # NOTE: rows (2d x 3d) or columns (3d x 2d) past offs[-1] are zeros; torch leaves them
    # uninitialized.
    return ragged_mm(self, mat2, offs, ctx.precision, ctx.out_dtype())


# transformers::grouped_mm_fallback(Tensor input, Tensor weight, Tensor offs) -> Tensor
# (transformers/integrations/moe.py: a Python loop of torch.mm over the groups, rows past
# offs[-1] zero; input (S, K) sorted by expert, weight (E, K, N), offs int32 or int64.)
@lowers("transformers::grouped_mm_fallback.default")
def grouped_mm_fallback(ctx, input, weight, offs):
    return ragged_mm(input, weight, offs, ctx.precision, ctx.out_dtype())


# transformers::grouped_mm_fallback_backward(Tensor input, Tensor weight, Tensor offs,
#     Tensor grad_output) -> (Tensor, Tensor)
@lowers("transformers::grouped_mm_fallback_backward.default")
def grouped_mm_fallback_backward(ctx, input, weight, offs, grad_output):
    grad_input = ragged_mm(
        grad_output, jnp.swapaxes(weight, 1, 2), offs, ctx.precision, ctx.out_dtype(0)
    )
    grad_weight = ragged_mm(input.T, grad_output, offs, ctx.precision, ctx.out_dtype(1))
    return grad_input, grad_weight

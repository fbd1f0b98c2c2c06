"""Matrix products: mm, bmm, addmm, baddbmm, matmul-likes, dot.

float32 products use the precision the graph was compiled with (from
``torch.get_float32_matmul_precision()``: "highest" -> ``Precision.HIGHEST``), so TPU results
stay comparable with CPU unless the user opts into lower precision.
"""

from __future__ import annotations

import jax.numpy as jnp
import torch
from tpu_inductor.lowerings.registry import P, register_lowering

aten = torch.ops.aten


def _mm(ctx, a, b):
    out = ctx.out_dtype()
    # NOTE: integer matmuls accumulate in their own dtype, like torch (wrapping on overflow).
    pref = jnp.float32 if out in (jnp.float16, jnp.bfloat16) else None
    return jnp.matmul(a, b, precision=ctx.precision, preferred_element_type=pref).astype(out)


@register_lowering(aten.mm.default, aten.bmm.default, aten.matmul.default, promote=P.NO_OPMATH)
def mm(ctx, self, mat2):
    return _mm(ctx, self, mat2)


@register_lowering(aten.dot.default, aten.vdot.default, aten.mv.default, promote=P.NO_OPMATH)
def dot(ctx, self, other):
    if ctx.node.target is aten.vdot.default:
        self = jnp.conj(self)
    return _mm(ctx, self, other)


# aten::addmm(Tensor self, Tensor mat1, Tensor mat2, *, Scalar beta=1, Scalar alpha=1) -> Tensor
@register_lowering(
    aten.addmm.default,
    aten.baddbmm.default,
    aten.addmv.default,
    promote=P.NO_OPMATH,
    promote_args=(0, 1, 2),
)
def addmm(ctx, self, mat1, mat2, beta=1, alpha=1):
    prod = _mm(ctx, mat1, mat2)
    if alpha != 1:
        prod = prod * alpha
    if beta == 0:
        return prod  # NOTE: beta=0 ignores self entirely (NaN in self does not propagate).
    return (self * beta if beta != 1 else self) + prod


@register_lowering(aten.outer.default, promote=P.NO_OPMATH)
def outer(ctx, self, vec2):
    return jnp.outer(self, vec2)


@register_lowering(aten.tril.default)
def tril(ctx, self, diagonal=0):
    return jnp.tril(self, diagonal)


@register_lowering(aten.triu.default)
def triu(ctx, self, diagonal=0):
    return jnp.triu(self, diagonal)

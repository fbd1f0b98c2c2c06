"""ATen ops tpu-inductor does not lower on purpose, each with the reason and what to do.

``tpu_inductor.lowering.lower.check_supported`` quotes these reasons in its
:class:`UnsupportedOpError`,
and ``tests/conformance/test_core_aten.py`` counts a Core ATen op listed here as accounted for.
An op listed here must not also have a lowering (a test checks it): remove its row when one is
added.

XLA compiles programs whose every shape is known before they run, so ops whose output shape
depends on tensor values, and ops that hand a tensor value back to Python in the middle of a
graph, have no lowering.

``REFUSED`` is for ops that *are* lowered, but not for every argument: its predicate gets the FX
node and returns why this node cannot be lowered (or ``None``). ``lower.is_lowerable`` asks it,
so such a node is sent to eager (``fallback="eager"``) or listed in the ``UnsupportedOpError``
up front, instead of failing mid-trace. This is DESIGN.md's ``supports=`` predicate, kept here
beside the other reasons.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from tpu_inductor.core.shapes import size_only_inputs

aten = torch.ops.aten

_DYNAMIC_SHAPE = (
    "its output shape depends on the input's values, and XLA needs every shape before the "
    "program runs. What to do: leave torch._dynamo.config.capture_dynamic_output_shape_ops at "
    "False (the default) and compile without fullgraph=True, so Dynamo runs this op eagerly "
    "between compiled graphs; or rewrite it with fixed-shape ops: torch.where(mask, x, 0) or a "
    "masked reduction instead of x[mask]"
)

_SCALAR = (
    "it reads a tensor value back into Python (.item(), int(t), float(t), bool(t), "
    "data-dependent if/while) in the middle of a graph, which XLA cannot do. What to do: keep "
    "the value a tensor (torch.where(cond, a, b) instead of `if cond:`), or leave "
    "torch._dynamo.config.capture_scalar_outputs at False (the default) and compile without "
    "fullgraph=True, so Dynamo splits the graph there"
)

UNSUPPORTED: dict[torch._ops.OpOverload, str] = {
    aten.nonzero.default: _DYNAMIC_SHAPE + ", or torch.nonzero_static(x, size=N) with a bound",
    aten.masked_select.default: _DYNAMIC_SHAPE,
    aten._unique2.default: _DYNAMIC_SHAPE + ", or torch.unique on CPU outside the compiled region",
    aten.unique_dim.default: _DYNAMIC_SHAPE
    + ", or torch.unique on CPU outside the compiled region",
    aten.unique_consecutive.default: _DYNAMIC_SHAPE,
    aten.bincount.default: _DYNAMIC_SHAPE
    + ", or with a known bound n: torch.zeros(n, dtype=w.dtype).index_add_(0, x, w)",
    aten.resize_.default: (
        "it changes a tensor's size in place, which a functional XLA program cannot express. "
        "What to do: allocate a new tensor of the target size (x.new_empty(shape), torch.empty) "
        "or use reshape/view when the number of elements is unchanged"
    ),
}


_MASK_DTYPES = (torch.bool, torch.uint8)


def _is_mask(a) -> bool:
    val = getattr(a, "meta", {}).get("val")
    return isinstance(val, torch.Tensor) and val.dtype in _MASK_DTYPES


def _bool_mask_read(node) -> str | None:
    # aten::index.Tensor(Tensor self, Tensor?[] indices) -> Tensor
    if not any(_is_mask(i) for i in node.args[1]):
        return None
    return "boolean-mask read x[mask]: " + _DYNAMIC_SHAPE + " (or x.masked_fill(~mask, 0))"


def _bool_mask_write(node) -> str | None:
    # aten::index_put(Tensor self, Tensor?[] indices, Tensor values, bool accumulate=False)
    # Lowered (a where) when the one tensor index is a boolean mask after leading Nones:
    # x[mask] = v, x[:, mask] = v, for any v that broadcasts.
    indices = list(node.args[1])
    if not any(_is_mask(i) for i in indices):
        return None
    while indices and indices[-1] is None:
        indices.pop()
    mask = indices[-1] if indices else None
    if _is_mask(mask) and all(i is None for i in indices[:-1]) and mask.meta["val"].ndim > 0:
        return None
    return (
        "x[...] = v with a boolean mask mixed with other tensor indices (or a 0-d mask): the "
        "mask's positions depend on its values. What to do: index with the mask alone "
        "(x[mask] = v and x[:, mask] = v are lowered) or use torch.where(mask, v, x)"
    )


def _scalar_read_as_size(node) -> str | None:
    # aten::_local_scalar_dense(Tensor self) -> Scalar: lowered unless the value (through any
    # Python arithmetic on it) reaches an op whose output shape is data-dependent and it reads
    # a tensor's values (a value built from sizes only is a Python number while tracing).
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

    if size_only_inputs(node) is not None:  # known once the sizes are: evaluated while tracing
        return None
    users = list(getattr(node, "users", ()))  # none for a with_effects view
    seen = set(users)
    while users:
        user = users.pop()
        if not isinstance(user.target, torch._ops.OpOverload):  # operator.add, sym_max, ...
            more = [u for u in user.users if u not in seen]
            seen.update(more)
            users.extend(more)
            continue
        vals = user.meta.get("val")
        for v in vals if isinstance(vals, list | tuple) else [vals]:
            if isinstance(v, torch.Tensor) and free_unbacked_symbols(v):
                return "its value becomes a tensor size: " + _SCALAR
    return None


def _arg(node, i: int, name: str, default=None):
    """Argument ``name`` (position ``i``) of an FX node, given positionally or by keyword."""
    if len(node.args) > i:
        return node.args[i]
    return node.kwargs.get(name, default)


def _is_complex(a) -> bool:
    val = getattr(a, "meta", {}).get("val")
    return isinstance(val, torch.Tensor) and val.is_complex()


def _lu_without_pivoting(node) -> str | None:
    # aten::linalg_lu_factor_ex(Tensor A, *, bool pivot=True, bool check_errors=False)
    # aten::linalg_lu(Tensor A, *, bool pivot=True)
    if node.kwargs.get("pivot", True):
        return None
    return (
        "LU without pivoting (pivot=False) is not lowered; torch itself computes it on CUDA "
        "only. What to do: use pivot=True (the default)"
    )


def _complex_ldl(node) -> str | None:
    # aten::linalg_ldl_factor_ex(Tensor self, *, bool hermitian, bool check_errors)
    # aten::linalg_ldl_solve(Tensor LD, Tensor pivots, Tensor B, *, bool hermitian=False)
    tensors = [node.args[0]] + ([node.args[2]] if len(node.args) > 2 else [])
    if not any(_is_complex(t) for t in tensors):
        return None
    return (
        "the LDL factorization of a complex matrix is not lowered (only real ones). What to do: "
        "torch.linalg.solve, or run the LDL step outside the compiled region"
    )


def _grouped_mm_bias(node) -> str | None:
    # aten::_grouped_mm(Tensor self, Tensor mat2, Tensor? offs=None, Tensor? bias=None, ...)
    if _arg(node, 3, "bias") is None:
        return None
    return "a bias is not supported (torch's own kernels reject it too). What to do: add it after"


def _attention_dropout(node) -> str | None:
    # aten::_scaled_dot_product_flash_attention_for_cpu(Tensor query, Tensor key, Tensor value,
    #   float dropout_p=0., ...) and its backward (dropout_p is argument 6 there)
    names = [a.name for a in node.target._schema.arguments]
    if not _arg(node, names.index("dropout_p"), "dropout_p", 0.0):
        return None
    return (
        "dropout_p > 0, which torch's own CPU kernel rejects too (\"Currently do not support "
        'dropout > 0"). What to do: F.scaled_dot_product_attention picks a kernel that takes '
        'dropout; or use the model\'s eager attention (attn_implementation="eager" in '
        "transformers), or dropout_p=0.0"
    )


REFUSED: dict[torch._ops.OpOverload, Callable[[Any], str | None]] = {
    aten.linalg_lu_factor_ex.default: _lu_without_pivoting,
    aten.linalg_lu.default: _lu_without_pivoting,
    aten.linalg_ldl_factor_ex.default: _complex_ldl,
    aten.linalg_ldl_solve.default: _complex_ldl,
    aten._grouped_mm.default: _grouped_mm_bias,
    aten.index.Tensor: _bool_mask_read,
    aten.index.Tensor_hacked_twin: _bool_mask_read,
    aten._unsafe_index.Tensor: _bool_mask_read,
    aten.index_put.default: _bool_mask_write,
    aten.index_put.hacked_twin: _bool_mask_write,
    aten._unsafe_index_put.default: _bool_mask_write,
    aten._local_scalar_dense.default: _scalar_read_as_size,
    aten._scaled_dot_product_flash_attention_for_cpu.default: _attention_dropout,
    aten._scaled_dot_product_flash_attention_for_cpu_backward.default: _attention_dropout,
}


def refusal(node) -> str | None:
    """Why a node whose op has a lowering cannot be lowered with these arguments, or ``None``."""
    check = REFUSED.get(node.target)
    return None if check is None else check(node)

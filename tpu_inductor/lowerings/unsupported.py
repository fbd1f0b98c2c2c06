"""ATen ops tpu-inductor does not lower on purpose, each with the reason and what to do.

``tpu_inductor.lower.check_supported`` quotes these reasons in its :class:`UnsupportedOpError`,
and ``tests/conformance/test_core_aten.py`` counts a Core ATen op listed here as accounted for.
An op listed here must not also have a lowering (a test checks it): remove its row when one is
added.

XLA compiles programs whose every shape is known before they run, so ops whose output shape
depends on tensor values, and ops that hand a tensor value back to Python in the middle of a
graph, have no lowering.
"""

from __future__ import annotations

import torch

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
    aten._local_scalar_dense.default: _SCALAR,
    aten.resize_.default: (
        "it changes a tensor's size in place, which a functional XLA program cannot express. "
        "What to do: allocate a new tensor of the target size (x.new_empty(shape), torch.empty) "
        "or use reshape/view when the number of elements is unchanged"
    ),
}

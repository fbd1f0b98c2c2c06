"""Symbolic sizes made concrete, and the storage positions of a strided layout.

With ``dynamic=True`` Dynamo hands the backend graphs whose ``meta["val"]`` shapes hold SymInts
(``s0``, ``2*s0 + 1``). The backend specializes each graph to the concrete shapes of each call:
the symbols are bound from the actual inputs and every symbolic size evaluates to an int.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import sympy
import torch


def is_symbolic(v) -> bool:
    """Whether ``v`` is a SymInt/SymFloat/SymBool whose value is not a constant."""
    return isinstance(v, torch.SymInt | torch.SymFloat | torch.SymBool) and (
        v.node.maybe_as_int() is None if isinstance(v, torch.SymInt) else True
    )


def graph_is_dynamic(metas: Sequence) -> bool:
    """Whether any placeholder meta (tensor shape or scalar) is symbolic."""
    for m in metas:
        if isinstance(m, torch.Tensor):
            if any(is_symbolic(d) for d in m.shape):
                return True
        elif is_symbolic(m):
            return True
    return False


def bind(metas: Sequence, values: Sequence) -> dict:
    """Map each free symbol of the placeholders' metas to its value in this call.

    Args:
        metas: the placeholders' ``meta["val"]`` (FakeTensors and SymInts).
        values: the call's inputs in the same order (arrays or tracers with concrete shapes,
            and Python scalars).
    """
    bindings: dict = {}
    for m, v in zip(metas, values, strict=True):
        if isinstance(m, torch.Tensor):
            for d, n in zip(m.shape, v.shape, strict=True):
                if isinstance(d, torch.SymInt):
                    expr = d.node.expr
                    if isinstance(expr, sympy.Symbol):
                        bindings[expr] = int(n)
        elif isinstance(m, torch.SymInt | torch.SymFloat | torch.SymBool):
            expr = m.node.expr
            if isinstance(expr, sympy.Symbol):
                bindings[expr] = v
    return bindings


def concrete(v, bindings: dict | None):
    """The value of an int/float/bool or a symbolic one under ``bindings``."""
    if not isinstance(v, torch.SymInt | torch.SymFloat | torch.SymBool):
        return v
    expr = v.node.expr
    value = sympy.sympify(expr.xreplace(bindings or {}))
    if not value.is_number and value not in (sympy.true, sympy.false):
        raise ValueError(f"size {expr} depends on symbols not bound by the inputs: {value}")
    if isinstance(v, torch.SymInt):
        return int(value)
    if isinstance(v, torch.SymBool):
        return bool(value)
    return float(value)


def concrete_shape(shape, bindings: dict | None) -> tuple[int, ...]:
    """A torch.Size of ints and SymInts as a tuple of ints."""
    return tuple(d if isinstance(d, int) else concrete(d, bindings) for d in shape)


def size_only_inputs(node) -> set | None:
    """The nodes that compute ``node``'s inputs, when none reads a tensor's values.

    A value built only from sizes and constants (``torch.tensor(x.shape[0]).item()``) is known
    once the sizes are: the lowering evaluates these nodes while tracing, so a scalar read from
    them is a Python number and may become a size. ``None`` when any of them reads a tensor
    input, draws random numbers or is a graph input other than a size.
    """
    seen: set = set()
    todo = list(node.all_input_nodes)
    while todo:
        n = todo.pop()
        if n in seen:
            continue
        seen.add(n)
        if n.op == "placeholder":
            if isinstance(n.meta.get("val"), torch.Tensor):
                return None
            continue
        target = getattr(n, "target", None)
        if isinstance(target, torch._ops.OpOverload) and (
            torch.Tag.nondeterministic_seeded in target.tags
        ):
            return None
        todo.extend(n.all_input_nodes)
    return {n for n in seen if n.op != "placeholder"}


def strided_index(size, stride, storage_offset) -> np.ndarray:
    """Flat storage positions of an ``as_strided`` layout, as an int64 array of shape ``size``."""
    index = np.full(tuple(size), storage_offset or 0, dtype=np.int64)
    for d, (n, s) in enumerate(zip(size, stride, strict=True)):
        shape = [1] * len(size)
        shape[d] = n
        index = index + (np.arange(n) * s).reshape(shape)
    return index

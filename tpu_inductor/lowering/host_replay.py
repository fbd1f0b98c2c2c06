"""Write-backs the host computes instead of copying: small integer state stepped by constants.

A graph that updates an input in place hands its new value back to the host (``write-back``).
When that value is a function of the input's old value and constants alone, with integer or
bool values throughout (a decode step's position counter: ``cumulative_length.add_(1)`` in
transformers' static cache, a step counter), the host has everything it needs: it runs the same
ATen ops on its own copy, exactly (integer arithmetic rounds nowhere), and nothing crosses.
The device computes the value too, for the graph's own use and for the next call's input.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.fx as fx
from torch.utils import _pytree as pytree

MAX_ELEMENTS = 1024  # only small state: the host repeats the work of each step
MAX_STEPS = 16


@dataclasses.dataclass(frozen=True)
class Ref:
    """An argument of a replay step: the input's old value (``-1``) or step ``k``'s result."""

    k: int


def _integer(v) -> bool:
    return isinstance(v, torch.Tensor) and not (v.is_floating_point() or v.is_complex())


def replay_steps(dst: fx.Node, src: fx.Node) -> tuple | None:
    """The steps that compute ``src`` (the new value of placeholder ``dst``) on the host, or
    ``None`` when ``src`` reads anything but ``dst`` and constants, or anything is not an
    integer or bool tensor, random, symbolic, or large. Each step is ``(op, args, kwargs)``
    with :class:`Ref` where a tensor goes."""
    val = dst.meta.get("val")
    if not _integer(val) or val.numel() > MAX_ELEMENTS:
        return None
    index: dict[fx.Node, int] = {dst: -1}
    order: list[fx.Node] = []

    def visit(n) -> bool:
        if n in index:
            return True
        if len(order) >= MAX_STEPS or n.op != "call_function":
            return False
        if not isinstance(n.target, torch._ops.OpOverload):
            return False
        if torch.Tag.nondeterministic_seeded in n.target.tags or n.target._schema.is_mutable:
            return False
        if not _integer(n.meta.get("val")):
            return False
        for a in pytree.tree_leaves((n.args, n.kwargs)):
            if isinstance(a, fx.Node):
                if not visit(a):
                    return False
            elif isinstance(a, torch.SymInt | torch.SymFloat | torch.SymBool | torch.Tensor):
                return False
        index[n] = len(order)
        order.append(n)
        return True

    if not isinstance(src, fx.Node) or src is dst or not visit(src):
        return None
    return tuple(
        (
            n.target,
            *pytree.tree_map_only(fx.Node, lambda a: Ref(index[a]), (n.args, n.kwargs)),
        )
        for n in order
    )


def replay(steps: tuple, old: torch.Tensor) -> torch.Tensor:
    """The new value, computed on the host from ``old`` (:func:`replay_steps`' steps)."""
    values: list = []

    def get(r: Ref):
        return old if r.k < 0 else values[r.k]

    for op, args, kwargs in steps:
        args, kwargs = pytree.tree_map_only(Ref, get, (args, kwargs))
        values.append(op(*args, **kwargs))
    return values[-1]

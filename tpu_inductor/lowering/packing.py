"""Stacked state: a scanned graph takes each kind of per-layer input as one stacked array.

With ``scan_layers`` a run of N layers reads N weights of each kind (and, in ``compile_step``'s
one program, N of each optimizer moment) and writes N new values of each. Passed one by one,
each is a buffer of its own that the program stacks on entry and slices apart on exit, and
XLA compiles that glue again per layer, so compile time would grow with depth; stacked, it
stays flat (measured: ``python -m benchmarks.first_step``; docs/architecture.md, "Stacked
state").

:func:`plan_packing` picks, from the scans ``lower.py`` planned, the groups of graph inputs a
scan stacks (all placeholders, one per layer, in layer order) and, where every member of a
group is updated in place as a whole, the group of their new values. :func:`packed_fn` wraps
the lowered function so each group crosses as one array: the input stack is sliced per layer
inside the program (the scans take it whole, :func:`scan_layers._stacked`), and the new values
leave as the update scan's own stack. The runtime keeps that stack as the members' device
value (``residency.StackSlice``), so the next step passes it back without stacking anything.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import jax.numpy as jnp
import torch
from jax import lax


@dataclasses.dataclass(frozen=True)
class Packing:
    """The calling convention of a lowered function whose per-layer state crosses stacked.

    Attributes:
        slots: per packed input, the graph input positions it holds: one, or a stack's
            members in layer order (packed as ``[layers, *shape]``).
        results: per packed result, the positions among ``LoweredGraph.fn``'s results it
            holds: one, or a stack of new values (members in layer order); stacks come last.
    """

    slots: tuple[tuple[int, ...], ...]
    results: tuple[tuple[int, ...], ...]

    def slot_of(self) -> dict[int, int]:
        """Graph input position -> its packed input."""
        return {p: s for s, slot in enumerate(self.slots) for p in slot}

    def result_of(self) -> dict[int, int]:
        """``fn`` result position -> its packed result."""
        return {j: r for r, res in enumerate(self.results) for j in res}

    def unpack(self, outs: Sequence, part: Callable) -> list:
        """Packed results -> per ``fn`` result (``part(stack, k)`` for a stack's member k)."""
        full: list = [None] * sum(len(r) for r in self.results)
        for r, res in enumerate(self.results):
            if len(res) == 1:
                full[res[0]] = outs[r]
            else:
                for k, j in enumerate(res):
                    full[j] = part(outs[r], k)
        return full


def plan_packing(groups: dict, placeholders: list, mutations: Sequence, n_results: int):
    """The :class:`Packing` of a graph whose scans are ``groups`` (``plan_scans``), or ``None``
    when no scan reads per-layer graph inputs."""
    index = {p: i for i, p in enumerate(placeholders)}
    taken: set[int] = set()
    stacks: list[tuple[int, ...]] = []
    for g in groups.values():
        for nodes in g.xs:
            if not all(n in index for n in nodes) or len(set(nodes)) != len(nodes):
                continue
            pos = tuple(index[n] for n in nodes)
            if pos[0] > pos[-1]:  # the backward reads the layers last to first
                pos = pos[::-1]
            if pos in stacks or taken & set(pos):
                continue
            metas = [placeholders[p].meta.get("val") for p in pos]
            if not all(isinstance(m, torch.Tensor) for m in metas):
                continue
            stacks.append(pos)
            taken |= set(pos)
    if not stacks:
        return None
    first = {s[0]: s for s in stacks}
    slots = tuple(
        first.get(i, (i,)) for i in range(len(placeholders)) if i in first or i not in taken
    )
    new_value = {m.input_index: m.value_index for m in mutations if m.delta is None}
    out_stacks = [
        tuple(new_value[p] for p in slot)
        for slot in slots
        if len(slot) > 1 and all(p in new_value for p in slot)
    ]
    in_stack = {j for res in out_stacks for j in res}
    results = [(j,) for j in range(n_results) if j not in in_stack] + out_stacks
    return Packing(slots, tuple(results))


def packed_fn(fn: Callable, packing: Packing, n_inputs: int) -> Callable:
    """``fn(seed, *inputs, stacks=...)`` (``LoweredGraph.fn``) with ``packing``'s calling
    convention: ``packed(seed, *packed_inputs) -> packed results``."""

    def packed(seed, *args):
        inputs: list = [None] * n_inputs
        stacks: dict = {}  # scan_layers' record of values sliced from a stack (see _stacked)
        whole = set()
        for slot, value in zip(packing.slots, args, strict=True):
            if len(slot) == 1:
                inputs[slot[0]] = value
                continue
            whole.add(id(value))
            for k, p in enumerate(slot):
                v = lax.index_in_dim(value, k, keepdims=False)
                inputs[p] = v
                stacks[id(v)] = (value, k, v)
        outs = fn(seed, *inputs, stacks=stacks)
        result = []
        for res in packing.results:
            if len(res) == 1:
                result.append(outs[res[0]])
                continue
            values = [outs[j] for j in res]
            found = [stacks.get(id(v)) for v in values]
            if (
                all(f is not None and f[2] is v for f, v in zip(found, values, strict=True))
                and [f[1] for f in found] == list(range(len(values)))
                and all(f[0] is found[0][0] for f in found)
            ):
                stacked = found[0][0]  # the update scan's own stack of new values
                if id(stacked) in whole:  # an input returned as it is: a fresh buffer
                    stacked = jnp.copy(stacked)
            else:
                stacked = jnp.stack([v.astype(values[0].dtype) for v in values])
            result.append(stacked)
        return tuple(result)

    return packed

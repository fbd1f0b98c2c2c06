"""What a graph does with its inputs besides reading them: the ones it updates in place
(AOTAutograd's in-graph ``copy_``, with what the host needs to write back only what changed), and
the ones it reads only by row lookups (an embedding table: the report counts the rows)."""

from __future__ import annotations

import dataclasses

import torch
import torch.fx as fx

from tpu_inductor.lowering import host_replay

COPY_ = torch.ops.aten.copy_.default
EMBEDDING = torch.ops.aten.embedding.default


@dataclasses.dataclass(frozen=True)
class Mutation:
    """Graph input ``input_index`` is updated in place; ``fn``'s result ``value_index`` is its
    new value. ``delta`` says how to write only what changed on the host: ``("index_copy",
    dim, index_result, source_result)`` or ``("slice", dim, start, end, step, source_result)``
    (result positions in ``fn``'s output), or ``None`` to copy the whole value. ``replay``:
    steps the host runs to compute the new value itself (``host_replay.py``), so nothing is
    copied."""

    input_index: int
    value_index: int
    delta: tuple | None = None
    replay: tuple | None = None


def mutations_of(nodes, placeholders, start: int) -> tuple[tuple, list]:
    """The graph's in-graph input mutations (``copy_(placeholder, new)``) and the extra values
    ``fn`` returns for them: each new value, then the pieces of delta write-backs."""
    index_of = {p: i for i, p in enumerate(placeholders)}
    mutations, extra = [], []

    def result(v) -> int:
        extra.append(v)
        return start + len(extra) - 1

    for n in nodes:
        if n.op != "call_function" or n.target is not COPY_ or n.args[0] not in index_of:
            continue
        dst, src = n.args[0], n.args[1]
        value_index = result(n)
        delta = None
        same_shape = _same_shape(dst, src)
        if same_shape and isinstance(src, fx.Node) and src.args and src.args[0] is dst:
            if src.target is torch.ops.aten.index_copy.default:
                _, dim, index, source = src.args
                delta = ("index_copy", dim, result(index), result(source))
            elif src.target is torch.ops.aten.slice_scatter.default:
                args = list(src.args) + [None] * (6 - len(src.args))
                _, source, dim, begin, end, step = args
                if all(isinstance(v, int | None) for v in (dim, begin, end, step)):
                    delta = ("slice", dim or 0, begin, end, step or 1, result(source))
        steps = host_replay.replay_steps(dst, src) if delta is None else None
        mutations.append(Mutation(index_of[dst], value_index, delta, steps))
    return tuple(mutations), extra


def _same_shape(dst: fx.Node, src) -> bool:
    a, b = dst.meta.get("val"), getattr(src, "meta", {}).get("val")
    return (
        isinstance(a, torch.Tensor)
        and isinstance(b, torch.Tensor)
        and a.shape == b.shape
        and a.dtype == b.dtype
    )


def gathered_rows(placeholders) -> dict[int, int]:
    """Inputs that only ``embedding`` reads (as its table), and the rows it takes per call."""
    out = {}
    for i, p in enumerate(placeholders):
        users = list(p.users)
        if not users or any(u.target is not EMBEDDING or u.args[0] is not p for u in users):
            continue
        rows = [
            u.args[1].meta.get("val") if isinstance(u.args[1], fx.Node) else None for u in users
        ]
        if all(isinstance(r, torch.Tensor) and isinstance(r.numel(), int) for r in rows):
            out[i] = sum(r.numel() for r in rows)
    return out

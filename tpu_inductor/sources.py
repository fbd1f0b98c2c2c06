"""Where a graph node comes from: the user's source line, for errors and warnings.

Dynamo records each node's ``stack_trace``; nodes AOTAutograd makes without one (a
decomposition's cast, a symbolic float's arithmetic) borrow the nearest traced neighbour's.
"""

from __future__ import annotations

import torch
import torch.fx as fx


def user_frame(node: fx.Node) -> str:
    """The user's source line for a node: the last frame of its stack trace or, for a node
    AOTAutograd made without one (a decomposition's cast, a symbolic float's arithmetic), of
    the nearest node that consumes it (then that it consumes) that has one. With none at all,
    what the node computes from: ``"from a symbolic size (... )"`` for arithmetic on the
    graph's symbolic sizes, else a note that torch's tracing made it."""
    trace = _nearest_trace(node)
    if not trace:
        return _untraced(node)
    lines = [ln.strip() for ln in trace.strip().splitlines() if ln.strip()]
    for i in range(len(lines) - 1, -1, -1):
        if lines[i].startswith("File "):
            code = (
                lines[i + 1] if i + 1 < len(lines) and not lines[i + 1].startswith("File ") else ""
            )
            return f"{lines[i]}: {code}" if code else lines[i]
    return lines[-1]


def _untraced(node) -> str:
    """Where a node with no stack trace near it comes from, in words."""
    symbols = set()
    if isinstance(node, fx.Node):
        for n in (node, *node.all_input_nodes):
            val = n.meta.get("val")
            vals = val.shape if isinstance(val, torch.Tensor) else [val]
            for v in vals:
                if isinstance(v, torch.SymInt | torch.SymFloat | torch.SymBool):
                    if v.node.maybe_as_int() is None if isinstance(v, torch.SymInt) else True:
                        symbols.update(str(x) for x in getattr(v.node.expr, "free_symbols", ()))
    if symbols:
        return f"from a symbolic size ({', '.join(sorted(symbols))}; no source line in the graph)"
    name = getattr(node, "name", node)
    return f"{name}, made by torch's tracing (no source line in the graph)"


def _nearest_trace(node) -> str | None:
    trace = getattr(node, "meta", {}).get("stack_trace")
    if trace or not isinstance(node, fx.Node):
        return trace
    for step in (lambda n: n.users, lambda n: n.all_input_nodes):
        seen, frontier = {node}, [node]
        while frontier:
            nxt = []
            for n in frontier:
                for m in step(n):
                    if m in seen or m.op == "output":
                        continue
                    if m.meta.get("stack_trace"):
                        return m.meta["stack_trace"]
                    seen.add(m)
                    nxt.append(m)
            frontier = nxt
    return None

"""What a graph's calls of a traced-once layer look like: ``invoke_subgraph`` and its
functional form with in-place updates, ``auto_functionalized_v2(invoke_subgraph, ...)``. Read by
the subgraph lowering (``lowerings/subgraphs.py``) and the scan planner (``scan_calls.py``)."""

from __future__ import annotations

import torch
import torch.fx as fx

INVOKE_SUBGRAPH = getattr(torch.ops.higher_order, "invoke_subgraph", None)
# AOTAutograd's functional form of a call whose subgraph updates its inputs in place (a repeated
# layer's optimizer update in compile_step): auto_functionalized_v2(invoke_subgraph, subgraph=,
# identifier=, argN=..., _argN_base_index=k, _all_bases=[...], _op_schema=) -> (outputs...,
# new value of each base)
AUTO_FUNCTIONALIZED = getattr(torch.ops.higher_order, "auto_functionalized_v2", None)


def subgraph_of(node: fx.Node) -> fx.GraphModule | None:
    """The ``GraphModule`` an ``invoke_subgraph`` node (or its ``auto_functionalized_v2``
    form) calls; ``None`` for any other node."""
    if node.op != "call_function" or INVOKE_SUBGRAPH is None:
        return None
    if node.target is INVOKE_SUBGRAPH:
        ref = node.args[0]
    elif node.target is AUTO_FUNCTIONALIZED and node.args and node.args[0] is INVOKE_SUBGRAPH:
        ref = node.kwargs.get("subgraph")
    else:
        return None
    if isinstance(ref, fx.Node) and ref.op == "get_attr":
        owner = node.graph.owning_module
        return getattr(owner, ref.target, None) if owner is not None else None
    return ref

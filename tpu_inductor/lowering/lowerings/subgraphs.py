"""``invoke_subgraph``: a region traced once and called many times (a model's repeated layer).

``torch.compiler.nested_compile_region`` (``options={"scan_layers": True}`` marks a model's
repeated layers with it: ``tpu_inductor/dynamo/regions.py``) makes Dynamo and AOTAutograd trace
a layer's body once and call it once per layer: ``invoke_subgraph(subgraph, identifier,
*operands)``, where ``subgraph`` is an ATen ``GraphModule`` shared by every call. It is lowered
here once per subgraph (``lower_graph``, cached on the module) and called with each call's
operands; ``scan_layers`` turns a run of such calls into one ``lax.scan``
(:mod:`tpu_inductor.lowering.scan_calls`).

A subgraph that draws random numbers draws from the calling graph's seed and counter, so each
call draws the numbers the same ops draw unrolled (each layer's dropout its own); a run of such
calls stays calls (a scan body would draw the same numbers in every layer).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable

import torch.fx as fx

from tpu_inductor.core.errors import UnsupportedOpError
from tpu_inductor.lowering.calls import AUTO_FUNCTIONALIZED, INVOKE_SUBGRAPH, subgraph_of
from tpu_inductor.lowering.lowerings.registry import lowers
from tpu_inductor.lowering.lowerings.unsupported import REFUSED

# subgraph -> (platform, precision) -> its lowered function; dies with the subgraph's module
_LOWERED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def draws_random(node: fx.Node) -> bool:
    """Whether an ``invoke_subgraph`` node's subgraph draws random numbers."""
    from tpu_inductor.lowering.lower import _is_random  # noqa: PLC0415 (lower imports this)

    sub = subgraph_of(node)
    return sub is not None and any(
        n.op == "call_function" and _is_random(n) for n in sub.graph.nodes
    )


def _unsupported_inside(node: fx.Node) -> str | None:
    """Why an ``invoke_subgraph`` node cannot be lowered: the ops of its subgraph that can't."""
    from tpu_inductor.lowering.lower import describe_node, is_lowerable, user_frame

    sub = subgraph_of(node)
    if sub is None:
        return "its subgraph is not an ATen GraphModule of this graph"
    missing = [
        f"{describe_node(n)} at {user_frame(n)}"
        for n in sub.graph.nodes
        if n.op == "call_function" and not is_lowerable(n)
    ]
    if not missing:
        return None
    return "the repeated layer it calls uses ops without a lowering: " + "; ".join(missing)


def lowered_subgraph(sub: fx.GraphModule, platform: str | None, precision) -> Callable:
    """``sub`` lowered once per platform and precision: ``fn(seed, *operands) -> outputs``;
    ``fn.updated`` maps each operand the subgraph updates in place to the position of its new
    value after the outputs."""
    from tpu_inductor.lowering.lower import PRECISIONS, lower_graph

    per_module = _LOWERED.setdefault(sub, {})
    key = (platform, precision)
    fn = per_module.get(key)
    if fn is None:
        name = next((k for k, v in PRECISIONS.items() if v == precision), "highest")
        lowered = lower_graph(sub, precision=name, platform=platform)
        plan = lowered.output_plan

        n_out = sum(1 for kind, _ in plan if kind == "out")

        def fn(seed, *operands, draws=None, _lowered=lowered, _plan=plan):
            outs = _lowered.fn(seed, *operands, draws=draws)
            declared = [
                outs[i] if kind == "out" else operands[i] if kind == "input" else None
                for kind, i in _plan
            ]
            for j, (kind, i) in enumerate(_plan):
                if kind in ("dup", "detach"):
                    declared[j] = declared[i]
            return (*declared, *outs[n_out:])

        if any(m.delta is not None for m in lowered.mutations):
            raise UnsupportedOpError("a repeated layer updates a slice of an input in place")
        fn.has_rng = lowered.has_rng  # type: ignore[attr-defined]
        fn.updated = {  # type: ignore[attr-defined]
            m.input_index: len(plan) + k for k, m in enumerate(lowered.mutations)
        }
        per_module[key] = fn
    return fn


# invoke_subgraph(GraphModule subgraph, str identifier, *operands) -> tuple
def _invoke_subgraph(ctx, subgraph, identifier, *operands):
    if not isinstance(subgraph, fx.GraphModule):
        raise UnsupportedOpError(
            f"invoke_subgraph {identifier!r}: its subgraph reached the backend as "
            f"{type(subgraph).__name__}, not an ATen GraphModule"
        )
    fn = lowered_subgraph(subgraph, ctx.platform, ctx.precision)
    if fn.updated:
        raise UnsupportedOpError(
            f"invoke_subgraph {identifier!r}: its subgraph updates its inputs in place; "
            "AOTAutograd hands such a call over as auto_functionalized_v2"
        )
    # NOTE: outputs that are inputs or duplicates come back as the same array; the calling
    # graph copies any it returns (lower._fresh).
    return fn(ctx.seed, *operands, draws=ctx.draws)


# auto_functionalized_v2(invoke_subgraph, **kwargs) -> (*outputs, *new bases)
def _auto_functionalized(ctx, mutable_op, **kwargs):
    import torch.utils._pytree as pytree

    subgraph = kwargs.pop("subgraph")
    identifier = kwargs.pop("identifier")
    bases = list(kwargs.pop("_all_bases"))
    schema = pytree.tree_unflatten([], kwargs.pop("_op_schema")).schema
    operands, base_of = [], {}
    for a in schema.arguments[2:]:  # subgraph, identifier, then the operands
        if f"_{a.name}_base_index" in kwargs:
            k = kwargs.pop(f"_{a.name}_base_index")
            kwargs.pop(f"_{a.name}_alias", None)  # an alias reads as its base
            base_of[len(operands)] = k
            operands.append(None if k is None else bases[k])
        else:
            operands.append(kwargs.pop(a.name))
    if kwargs:
        raise UnsupportedOpError(
            f"invoke_subgraph {identifier!r} updates a view of an input in place "
            f"({', '.join(sorted(kwargs))}); only whole inputs are supported"
        )
    fn = lowered_subgraph(subgraph, ctx.platform, ctx.precision)
    outs = fn(ctx.seed, *operands, draws=ctx.draws)
    n_declared = len(outs) - len(fn.updated)
    new_bases = list(bases)
    for i, at in fn.updated.items():
        if i in base_of and base_of[i] is not None:
            new_bases[base_of[i]] = outs[at]
    return (*outs[:n_declared], *new_bases)


def _view_free(node: fx.Node) -> str | None:
    """Why an ``auto_functionalized_v2`` node is not lowered: it wraps something other than a
    subgraph call, updates a view of an input, or its subgraph uses unsupported ops."""
    if not node.args or node.args[0] is not INVOKE_SUBGRAPH:
        return "it updates the inputs of an op in place that has no functional lowering"
    views = [k for k in node.kwargs if k.endswith(("_size", "_slice_dim", "_storage_offset"))]
    if views:
        return "a repeated layer updates a view of its input in place (" + views[0] + ")"
    return _unsupported_inside(node)


if INVOKE_SUBGRAPH is not None:
    lowers(INVOKE_SUBGRAPH, random=draws_random)(_invoke_subgraph)
    REFUSED[INVOKE_SUBGRAPH] = _unsupported_inside
if INVOKE_SUBGRAPH is not None and AUTO_FUNCTIONALIZED is not None:
    lowers(AUTO_FUNCTIONALIZED, random=draws_random)(_auto_functionalized)
    REFUSED[AUTO_FUNCTIONALIZED] = _view_free

"""Runs of calls of one repeated layer as one ``lax.scan`` (the part of ``scan_layers`` for
layers traced once).

With ``scan_layers`` a model's repeated layers are nested compile regions
(``dynamo/regions.py``), so the graphs AOTAutograd hands over call one subgraph per layer
(``invoke_subgraph``, or ``auto_functionalized_v2`` around it for a region that updates its
inputs: compile_step's optimizer update), lowered once (``lowerings/subgraphs.py``). A run of
calls of one subgraph is one scan with the subgraph as its body: each call and its items is a
block of :func:`tpu_inductor.lowering.scan_layers._analyze`, which sorts the other reads into
the carry (the previous call's items), constants and per-layer inputs (stacked).
"""

from __future__ import annotations

import logging
import operator

import torch.fx as fx

from tpu_inductor.lowering.calls import subgraph_of
from tpu_inductor.lowering.scan_layers import ScanGroup, _analyze

log = logging.getLogger("tpu_inductor.lowering.scan_layers")


def plan_call_scans(
    nodes: list[fx.Node], gm: fx.GraphModule, keep: set, unscannable: set
) -> dict[fx.Node, ScanGroup]:
    """Scans of runs of calls of one ``invoke_subgraph`` (a layer Dynamo and AOTAutograd traced
    once, ``lowerings/subgraphs.py``): each call and its items is a block; consecutive calls of
    the same subgraph whose other reads are the previous call's items (the carry), one value for
    every call or one per call (stacked) are one scan with the subgraph as its body, lowered
    where the run's last node is. Calls of a subgraph that draws random numbers stay calls
    (each draws its own key). :func:`tidy_calls` has made the calls read alike.
    """
    index = {n: i for i, n in enumerate(nodes)}
    by_sub: dict[str, list[fx.Node]] = {}
    for n in nodes:
        sub = subgraph_of(n)
        if sub is not None:  # calls of equal subgraphs (tidy_subgraph_calls made them one)
            by_sub.setdefault(sub.code, []).append(n)

    def gm_attrs(target):
        return getattr(gm, target)

    groups: dict[fx.Node, ScanGroup] = {}
    for same in by_sub.values():
        ident = same[0].args[1] if len(same[0].args) > 1 else same[0].kwargs.get("identifier")
        name = f"subgraph {ident}"
        if len(same) < 2:
            continue
        if any(c in unscannable for c in same):
            log.debug("scan_layers: the calls of %s stay calls (it draws random numbers)", name)
            continue
        blocks = [[c, *sorted(c.users, key=lambda u: u.args[1])] for c in same]
        for run in _call_runs(blocks, index):
            if len(run) < 2:
                continue
            group = _analyze(name, run, keep, gm_attrs, carry_required=False)
            if isinstance(group, str):
                log.debug("scan_layers: %d calls of %s stay calls: %s", len(run), name, group)
                continue
            groups[max(group.nodes, key=index.__getitem__)] = group
            log.info(
                "scan_layers: %d calls of %s (%d ops) lowered as one lax.scan",
                len(run),
                name,
                sum(1 for n in subgraph_of(run[0][0]).graph.nodes if n.op == "call_function"),
            )
    return groups


def tidy_calls(gm: fx.GraphModule) -> None:
    """Make the calls of one subgraph read alike, changing nothing they compute: one ``get_attr``
    node per subgraph (AOTAutograd gives each call its own name for it, and for a call that
    updates its inputs, ``auto_functionalized_v2``, its own copy of the subgraph and of its
    schema), placed before the first call, and a ``getitem`` for every output of a call whose
    result is only read item by item (an item nobody reads is still taken, so every call of a
    run has the same items)."""
    graph = gm.graph
    calls = [n for n in graph.nodes if subgraph_of(n) is not None]
    if len(calls) < 2:
        return
    first: dict[tuple, fx.Node] = {}

    def same(c: fx.Node, ref):
        if not (isinstance(ref, fx.Node) and ref.op == "get_attr"):
            return ref
        keep = first.setdefault(_attr_key(gm, ref.target), ref)
        if _before(c, keep):
            c.prepend(keep)
        return keep

    for c in calls:
        old = [a for a in (*c.args, *c.kwargs.values()) if isinstance(a, fx.Node)]
        c.args = tuple(same(c, a) for a in c.args)
        c.kwargs = {k: same(c, v) for k, v in c.kwargs.items()}
        for ref in old:
            if ref.op == "get_attr" and not ref.users:
                graph.erase_node(ref)
        outs = c.meta.get("val")
        if not isinstance(outs, tuple | list):
            continue
        items = {u.args[1]: u for u in c.users if u.target is operator.getitem}
        if len(items) != len(c.users):
            continue  # a call whose result is read whole: left as it is
        for k in range(len(outs)):
            if k not in items:
                with graph.inserting_after(c):
                    item = graph.call_function(operator.getitem, (c, k))
                item.meta["val"] = outs[k]
    by_body: dict[str, list[fx.Node]] = {}
    for c in calls:
        by_body.setdefault(subgraph_of(c).code, []).append(c)
    for same in by_body.values():
        _defer_readers(graph, same)


def _defer_readers(graph: fx.Graph, calls: list[fx.Node]) -> None:
    """Move the nodes between the first and the last of ``calls`` that read an earlier call's
    items (compile_step's copies of each layer's new parameters back into its inputs) to after
    the last call, where a scan of the calls has computed them, unless a later call reads what
    they compute (then the calls stay apart)."""
    if len(calls) < 2:
        return
    order = list(graph.nodes)
    pos = {n: i for i, n in enumerate(order)}
    members = set(calls) | {u for c in calls for u in c.users if u.target is operator.getitem}
    end = max(pos[n] for n in members)
    window = [n for n in order[pos[calls[0]] : end + 1] if n not in members]
    readers: set[fx.Node] = set()
    for n in window:
        if any(a in members or a in readers for a in n.all_input_nodes):
            readers.add(n)
    if not readers:
        return
    fed: set[fx.Node] = set()  # what the calls read, within the window
    todo = [a for c in calls for a in c.all_input_nodes]
    while todo:
        a = todo.pop()
        if a in fed or pos.get(a, -1) < pos[calls[0]]:
            continue
        fed.add(a)
        todo += a.all_input_nodes
    if readers & fed or any(n.op != "call_function" for n in readers):
        return
    at = order[end]
    for n in sorted(readers, key=pos.__getitem__):
        at.append(n)
        at = n


def _attr_key(gm: fx.GraphModule, target: str) -> tuple:
    """What makes two ``get_attr`` values of subgraph calls interchangeable: a subgraph's code,
    a schema's text; anything else is itself."""
    value = getattr(gm, target)
    if isinstance(value, fx.GraphModule):
        return ("graph", value.code)
    spec = getattr(value, "context", None)
    if type(value).__name__ == "TreeSpec" or spec is not None:
        import torch.utils._pytree as pytree

        try:
            return ("schema", str(pytree.tree_unflatten([], value).schema))
        except (ValueError, TypeError, AttributeError):  # a spec with leaves, or of no schema
            pass
    return ("value", id(value))


def _before(a: fx.Node, b: fx.Node) -> bool:
    """Whether ``a`` comes before ``b`` in their graph."""
    return a < b if hasattr(fx.Node, "__lt__") else _position(a) < _position(b)


def _position(n: fx.Node) -> int:
    return list(n.graph.nodes).index(n)


def _call_runs(blocks: list[list[fx.Node]], index: dict) -> list[list[list[fx.Node]]]:
    """The calls split where a node between two of them reads an earlier call's items (a scan
    computes every call's items at its end, so nothing may read them before that)."""
    runs, run = [], [blocks[0]]
    order = sorted(index, key=index.__getitem__)
    for prev, block in zip(blocks, blocks[1:], strict=False):
        inside = {n for b in run for n in b}
        lo = max(index[n] for n in prev)
        between = [n for n in order[lo + 1 : index[block[0]]] if n not in inside]
        if any(a in inside for n in between for a in n.all_input_nodes):
            runs.append(run)
            run = [block]
        else:
            run.append(block)
    runs.append(run)
    return runs

"""The optimizer update of repeated layers as one ``lax.scan`` (the rest of ``scan_layers``).

In ``compile_step``'s one program the forward and the backward of ``model.layers.0 .. N-1`` are
runs of blocks (:mod:`tpu_inductor.lowering.scan_layers`), but the update that follows is not:
torch's
single-tensor Adam/SGD writes one chain of ops per parameter (``lerp``, ``addcdiv``, ...), its
foreach form one op per parameter and step (op-major), and both carry no module path. Unrolled,
that is ~20 ops per parameter for XLA to compile again per layer.

:func:`plan_update_scans` gives each of those nodes (no module path, not already in a scan) the
layer of the values it reads, by data flow: a parameter is in the layer whose forward reads it,
a gradient in the layer its backward block is in, a moment or a step count (read only by the
update) in none. A node reading one layer's values (and values of no layer: a clipping factor, a
learning rate tensor) is in that layer; one reading two layers' is in none. Layer ``k``'s
*update block* is its nodes in graph order (not contiguous when the update is op-major).
Neighbouring update blocks that are the same computation (:func:`scan_layers._describe`) become
one scan with no carry: the per-layer parameters, gradients and optimizer state stacked as its
``xs`` (the forward's stacked weights and the backward's stacked gradients reused where they
exist), the new values written back into those stacks (``ScanGroup._scan``).

The scan is lowered after the run's last node. A block node whose value is read, outside the
run, before that point (a per-parameter norm that clipping sums) leaves the blocks together with
the block nodes it reads, in every layer alike: the main walk lowers them and the scan reads
them as per-layer inputs. A run that reads a value lowered after that point stays unrolled.
"""

from __future__ import annotations

import logging

import torch
import torch.fx as fx

from tpu_inductor.lowering import scan_layers as sl

log = logging.getLogger("tpu_inductor.lowering.scan_layers")

_MIXED = ("*", -1)
_COPY = torch.ops.aten.copy.default  # a value of two layers (or of a layer and the model's outside)


def _update_labels(nodes: list[fx.Node], labels: dict, free: set) -> dict:
    """Each ``free`` node's layer, by the values it reads (see the module docstring)."""
    lab: dict = {}

    def of(a: fx.Node):
        if a in lab:
            return lab[a]
        if a.op == "placeholder":
            users = {labels.get(u) for u in a.users if u not in free} - {None}
            return users.pop() if len(users) == 1 else None
        return labels.get(a)

    for n in nodes:
        if n not in free:
            continue
        seen = {of(a) for a in n.all_input_nodes} - {None, _MIXED}
        lab[n] = seen.pop() if len(seen) == 1 else (_MIXED if seen else None)
    for n in reversed(nodes):  # a value of no layer that one layer alone reads (a step count)
        if lab.get(n, _MIXED) is None:
            seen = {lab.get(u) for u in n.users if u in free} - {None}
            if len(seen) == 1 and _MIXED not in seen:
                lab[n] = seen.pop()
    return lab


def _trim(blocks: list[list[fx.Node]], when: dict) -> list[list[fx.Node]]:
    """The blocks less every position whose value is read outside the blocks before the scan's
    point, and the positions it reads (in every block alike, so they stay the same computation)."""
    while True:
        window = {n for b in blocks for n in b}
        point = max(when[n] for n in window)
        drop: set[int] = set()
        for b in blocks:
            pos = {n: i for i, n in enumerate(b)}
            early = [
                p for p, n in enumerate(b) if any(when[u] <= point for u in n.users.keys() - window)
            ]
            while early:
                p = early.pop()
                if p not in drop:
                    drop.add(p)
                    early += [pos[a] for a in b[p].all_input_nodes if a in pos]
        if not drop:
            return blocks
        blocks = [[n for p, n in enumerate(b) if p not in drop] for b in blocks]
        if not blocks[0]:
            return blocks


def plan_update_scans(
    nodes: list[fx.Node],
    *,
    labels: dict,
    groups: dict,
    unscannable: set,
    keep: set,
    gm_attrs,
) -> dict[fx.Node, sl.ScanGroup]:
    """Scans of the per-layer update blocks of a graph (:mod:`tpu_inductor.lowering.scan_updates`).

    Args:
        nodes: the graph's nodes, in order.
        labels: each node's numbered module (``scan_layers._labels``).
        groups: the scans planned so far, by the node they are lowered at (not changed).
        unscannable: nodes that can't be in a scan body.
        keep: nodes the lowered function returns besides through ``users``.
        gm_attrs: ``get_attr`` target -> constant.

    Returns:
        The new scans, by the node they are lowered at.
    """
    index = {n: i for i, n in enumerate(nodes)}
    inside = {n: key for key, g in groups.items() for n in g.nodes}
    when = {n: index[inside.get(n, n)] for n in nodes}  # where a node's value is computed
    free = {
        n
        for n in nodes
        if n.op == "call_function"
        and n not in inside
        and labels.get(n) is None
        and n not in unscannable
        and n.target is not _COPY  # a value copied as it is (a layer region's new values)
    }
    lab = _update_labels(nodes, labels, free)
    by_layer: dict = {}
    for n in nodes:
        if lab.get(n) not in (None, _MIXED, sl._OUTSIDE):
            by_layer.setdefault(lab[n], []).append(n)
    found: dict[fx.Node, sl.ScanGroup] = {}
    for prefix in dict.fromkeys(k[0] for k in by_layer):
        layers = sorted(i for p, i in by_layer if p == prefix)
        s = 0
        while s < len(layers) - 1:
            j = s + 1
            tmpl = sl._describe(by_layer[(prefix, layers[s])], None, gm_attrs)[0]
            while j < len(layers) and layers[j] == layers[j - 1] + 1:
                cand = by_layer[(prefix, layers[j])]
                if sl._describe(cand, None, gm_attrs)[0] != tmpl:
                    break
                j += 1
            name = f"{prefix}.{layers[s]}.. update"
            if j - s >= 2:
                group = _plan(
                    name, [by_layer[(prefix, i)] for i in layers[s:j]], when, keep, gm_attrs
                )
                if isinstance(group, str):
                    log.debug("scan_layers: %s stays unrolled: %s", name, group)
                else:
                    key = max(group.nodes, key=index.__getitem__)
                    found[key] = group
                    log.info(
                        "scan_layers: %d update blocks of %d ops from %s lowered as one lax.scan",
                        len(group.blocks),
                        len(group.blocks[0]),
                        group.blocks[0][0].name,
                    )
            else:
                log.debug("scan_layers: update block %d of %s matches no neighbour", s, prefix)
            s = j
    return found


def _plan(name, blocks, when, keep, gm_attrs) -> sl.ScanGroup | str:
    """The scan of a run of matching update blocks, or why there is none."""
    blocks = _trim(blocks, when)
    if not blocks[0]:
        return "every value is read before the run ends"
    group = sl._analyze(name, blocks, keep, gm_attrs, carry_required=False)
    if isinstance(group, str):
        return group
    point = max(when[n] for n in group.nodes)
    late = [
        a.name
        for n in group.nodes
        for a in n.all_input_nodes
        if a not in group.nodes and when[a] >= point
    ]
    if late:
        return f"it reads {late[0]}, computed after the run"
    return group

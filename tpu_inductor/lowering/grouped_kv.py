"""Grouped-query attention reads its key/value heads as they are (a graph rewrite).

transformers' ``repeat_kv`` (``k[:, :, None].expand(b, kv_heads, g, S, E).reshape(b,
kv_heads * g, S, E)``, used whenever SDPA gets a mask) arrives in ATen as ``unsqueeze ->
expand -> clone -> view``: a materialized copy of every key and value head ``g`` times, per
layer and per call. For a decode step over a static cache that is ``g`` x the cache written to
HBM and read back, each token. SDPA's kernels take fewer key/value heads than query heads (torch's
CPU flash kernel, and our lowering, which groups the query heads: ``lowerings/attention.py``), so
this rewrite hands the forward SDPA the tensor before the repeat. It is exact (query head ``h``
reads key/value head ``h // g`` either way) and the rewritten graph still runs in torch.

The backward op keeps the repeated operands: its key/value gradients are shaped like them and
the repeat's own backward sums them.
"""

from __future__ import annotations

import torch
import torch.fx as fx

aten = torch.ops.aten

_SDPA = (aten._scaled_dot_product_flash_attention_for_cpu.default,)
_RESHAPES = (aten.view.default, aten._unsafe_view.default, aten.reshape.default)


def _shape(node) -> tuple | None:
    val = node.meta.get("val") if isinstance(node, fx.Node) else None
    return tuple(val.shape) if isinstance(val, torch.Tensor) else None


def _repeated(node) -> tuple[fx.Node, list[fx.Node]] | None:
    """``(source, chain)`` when ``node`` is ``source`` ([b, kv, S, E]) with each head repeated
    (``[b, kv * g, S, E]``, heads ``h * g .. h * g + g - 1`` copies of head ``h``), else None;
    ``chain``: the nodes of the repeat, last first."""
    if not isinstance(node, fx.Node) or node.target not in _RESHAPES:
        return None
    chain = [node]
    x = node.args[0]
    if getattr(x, "target", None) is aten.clone.default:
        chain.append(x)
        x = x.args[0]
    if getattr(x, "target", None) is not aten.expand.default:
        return None
    chain.append(x)
    expanded, x = _shape(x), x.args[0]
    if getattr(x, "target", None) is aten.unsqueeze.default and x.args[1] in (2, -3):
        chain.append(x)
        source = x.args[0]
    elif getattr(x, "target", None) in _RESHAPES:
        chain.append(x)
        source = x.args[0]
    else:
        return None
    shape, out = _shape(source), _shape(node)
    if shape is None or expanded is None or out is None or len(shape) != 4:
        return None
    b, kv, s, e = shape
    if _shape(x) != (b, kv, 1, s, e) or len(expanded) != 5:
        return None
    g = expanded[2]
    if expanded != (b, kv, g, s, e) or out != (b, kv * g, s, e):
        return None
    return source, chain


def read_kv_heads(gm: fx.GraphModule) -> int:
    """Make each forward SDPA read repeated key/value heads before the repeat; returns how many
    operands it rewired. The repeats nothing else reads are removed."""
    rewired = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target not in _SDPA:
            continue
        # both or neither: the kernels take K and V with the same heads
        found = [_repeated(node.args[i]) for i in (1, 2)]
        if None in found or _shape(found[0][0])[1] != _shape(found[1][0])[1]:
            continue
        for i, (source, chain) in zip((1, 2), found, strict=True):
            node.update_arg(i, source)
            rewired += 1
            for dead in chain:
                if dead.users:
                    break
                gm.graph.erase_node(dead)
    if rewired:
        gm.recompile()
    return rewired

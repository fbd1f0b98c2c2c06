"""Linear layers over ``[..., K]`` activations without flattening them (a graph rewrite).

torch's ``linear`` on a ``[B, T, K]`` input decomposes to ``view(x, [B*T, K])``, a 2-D
``addmm``/``mm`` and a ``view`` back; its backward flattens the gradient the same way for the
input gradient (``mm``), the weight gradient (``mm(g.T, x)``) and the bias gradient
(``sum(g, [0])``). On a TPU those views are not free when ``T`` is not a multiple of the tile's
8 rows (a ViT's 197 tokens, a BERT batch's ragged lengths): merging ``[B, 197, K]`` into
``[1576, K]`` moves every row to another tile, so XLA writes a physical reshape (and often a
layout copy) on each side of every product, forward and backward. This rewrite makes such
products read the activation as it is: ``matmul_leading(x, w)`` (``[..., K] @ [K, N]``),
``addmm_leading(b, x, w)``, ``mm_leading(g, x)`` (the weight gradient: contracting every
leading dimension) and a ``sum`` over the leading dimensions; each new node is the torch
computation it replaces (``lowerings/linalg.py``), so the graph still runs in torch and computes
the same numbers. A flattening other ops still read stays; XLA folds the ``view`` back. With
aligned tokens (a multiple of 8) a flattening is a bitcast, but unflattened products still make
fewer layout copies (BERT, 256 tokens); the products of a layer whose output is widened to
float32 next are left 2-D (``_widened_layers``).

Measured (``python -m benchmarks.tpu_programs --layers 1 --only vit-train-bf16 --contenders
hand,ours-1prog``, v5e, compile only): see ``docs/architecture.md``, "Products over leading
dimensions". Only for TPUs (the knob ``leading_dims_platforms``): on XLA:CPU and GPU a
row-major flattening is a bitcast, and their programs stay as they were.
"""

from __future__ import annotations

import math

import torch
import torch.fx as fx

from tpu_inductor.lowering.lowerings.linalg import addmm_leading, matmul_leading, mm_leading

aten = torch.ops.aten

_VIEWS = (aten.view.default, aten._unsafe_view.default, aten.reshape.default)
# Marks a product left 2-D (_widened_layers); the mark survives AOTAutograd's split, so the
# forward and backward graphs keep what the joint graph's rewrite kept.
KEEP = "tpu_inductor_keep_flattened"


def _shape(node) -> tuple | None:
    val = node.meta.get("val") if isinstance(node, fx.Node) else None
    if not isinstance(val, torch.Tensor):
        return None
    shape = tuple(val.shape)
    return shape if all(isinstance(d, int) for d in shape) else None


def _flattened(node) -> fx.Node | None:
    """The ``[..., K]`` (rank >= 3) tensor that view ``node`` flattens to ``[M, K]``, or None."""
    if not isinstance(node, fx.Node) or node.target not in _VIEWS:
        return None
    src, out = node.args[0], _shape(node)
    shape = _shape(src)
    if shape is None or out is None or len(shape) < 3:
        return None
    return src if out == (math.prod(shape[:-1]), shape[-1]) else None


def _base(node):
    """``node`` through transposes (``w.t().t()`` -> ``w``)."""
    while (a := _transposed(node)) is not None:
        node = a
    return node


_PASS = (*_VIEWS, aten.slice.Tensor, aten.clone.default, aten._to_copy.default)


def _widened_logits(node: fx.Node) -> bool:
    """Whether product ``node`` is converted to float32 and then log-softmaxed (through views,
    slices and copies): a classifier's logits before a float32 loss."""
    todo = [(node, False)]
    for _ in range(64):
        if not todo:
            return False
        n, wide = todo.pop()
        for user in n.users:
            if user.target is aten._log_softmax.default and wide:
                return True
            if user.target in _PASS:
                up = user.target is aten._to_copy.default and (
                    user.kwargs.get("dtype") == torch.float32
                )
                todo.append((user, wide or up))
    return False


def _widened_layers(graph: fx.Graph) -> None:
    """Mark ``KEEP`` the products of every layer whose output is converted to float32 and
    log-softmaxed (a language model's logits before a float32 loss), forward and backward.

    Unflattened, XLA:TPU fuses that float32 convert into the vocabulary-sized products and
    writes float32 logits beside the half-precision ones, so those products keep their leading
    dimensions (measured: ``python examples/compile_for_tpu.py --readme-sample``). The
    backward's products of that layer read its weight (the input gradient) or its activation
    (the weight gradient)."""
    weights, activations = set(), set()
    for node in graph.nodes:
        if node.target in (aten.mm.default, aten.addmm.default) and _widened_logits(node):
            a, b = node.args[-2:]
            if (x := _flattened(a)) is not None:
                node.meta[KEEP] = True
                weights.add(_base(b))
                activations.add(x)
    if not weights:
        return
    for node in graph.nodes:
        if node.target is aten.mm.default:
            a, b = node.args
            if _base(b) in weights or _flattened(b) in activations:
                node.meta[KEEP] = True


def _transposed(node) -> fx.Node | None:
    """``a`` when ``node`` is ``a.t()`` (or ``permute(a, [1, 0])``) of a 2-D ``a``."""
    if not isinstance(node, fx.Node) or _shape(node) is None or len(_shape(node)) != 2:
        return None
    if node.target is aten.t.default:
        return node.args[0]
    if node.target is aten.permute.default and list(node.args[1]) == [1, 0]:
        return node.args[0]
    return None


def new_node(graph: fx.Graph, target, args: tuple, like: fx.Node, **kwargs) -> fx.Node:
    """A node computing ``target(*args, **kwargs)`` before ``like``, with ``like``'s metadata
    (source line, module path) and its own ``meta["val"]``."""
    with graph.inserting_before(like):
        node = graph.call_function(target, args, kwargs)
    vals = [a.meta["val"] if isinstance(a, fx.Node) else a for a in args]
    node.meta = {k: v for k, v in like.meta.items() if k not in ("val", "tensor_meta")}
    node.meta["val"] = target(*vals, **kwargs)
    return node


def _replace(graph: fx.Graph, old: fx.Node, new: fx.Node) -> None:
    """Stand ``new`` (same values, maybe unflattened) in for ``old``: views of ``old`` to
    ``new``'s shape read ``new``; anything else reads ``new`` viewed as ``old``."""
    shape = tuple(old.meta["val"].shape)
    for user in list(old.users):
        if user.target in _VIEWS and _shape(user) == _shape(new):
            user.replace_all_uses_with(new)
            graph.erase_node(user)
    if old.users:
        if shape != _shape(new):
            with graph.inserting_before(old):
                flat = graph.call_function(aten.view.default, (new, list(shape)))
            flat.meta = dict(old.meta)
            new = flat
        old.replace_all_uses_with(new)
    graph.erase_node(old)


def keep_leading_dims(gm: fx.GraphModule) -> int:
    """Rewrite ``gm`` in place so products of flattened activations read them unflattened.

    Returns:
        How many products (and sums) were rewritten.
    """
    graph = gm.graph
    done = 0
    erased: set = set()
    _widened_layers(graph)
    for node in list(graph.nodes):
        if node.op != "call_function" or node.meta.get(KEEP):
            continue
        new = None
        if node.target is aten.mm.default:
            a, b = node.args
            x = _flattened(a)
            g = _flattened(_transposed(a))
            if x is not None and _shape(b) is not None:
                new = new_node(graph, matmul_leading, (x, b), node)
            elif g is not None and (y := _flattened(b)) is not None:
                if _shape(g)[:-1] == _shape(y)[:-1]:
                    new = new_node(graph, mm_leading, (g, y), node)
        elif node.target is aten.addmm.default and not node.kwargs:
            bias, a, b, *scalars = node.args
            x = _flattened(a)
            if x is not None and _shape(bias) is not None and len(_shape(bias)) == 1:
                new = new_node(graph, addmm_leading, (bias, x, b, *scalars), node)
        elif node.target is aten.sum.dim_IntList and not node.kwargs:
            x = _flattened(node.args[0])
            dims = list(node.args[1]) if len(node.args) > 1 else None
            if x is not None and dims == [0]:
                lead = list(range(len(_shape(x)) - 1))
                new = new_node(graph, aten.sum.dim_IntList, (x, lead), node)
        if new is not None:
            flat = [a for a in node.all_input_nodes if a.target in _VIEWS or _transposed(a)]
            _replace(graph, node, new)
            done += 1
            for a in flat:  # a flattening (or its transpose) nothing reads any more
                for b in [a, *a.all_input_nodes]:
                    if b in erased or b.users or b.op != "call_function":
                        continue
                    if b.target in _VIEWS or _transposed(b) is not None:
                        graph.erase_node(b)
                        erased.add(b)
    if done:
        gm.recompile()
    return done

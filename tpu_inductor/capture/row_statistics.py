"""Log-softmax as its row statistics and a subtraction, so a backward recomputes it (a graph
rewrite on AOTAutograd's joint graph, before the partitioner).

The min-cut partitioner recomputes in the backward only ops on its list (pointwise ops, views,
``amax``, ``sum``, ...). ``_log_softmax`` is not on it: Inductor decomposes it before the split.
We lower ``_log_softmax`` directly, so the forward saved its whole output for
``_log_softmax_backward_data``: for a language model the float32 ``[tokens, vocabulary]``
log-probabilities, written by the forward and read back by the backward, where the backward
could recompute them from the logits the forward returns anyway (bfloat16 logits: half the
bytes). Rewritten here into the ops of torch's own decomposition (and of ``jax.nn.log_softmax``,
so the forward computes the same numbers): ``x - amax(x)`` minus ``log(sum(exp(.)))``. The
partitioner then saves the two ``[rows, 1]`` statistics (a reduction's output, 4x smaller than
its input, is never recomputed) and the backward recomputes the subtractions from the input.

Measured (``python -m benchmarks.tpu_programs --layers 1 --only train-bf16,train-f32
--contenders hand,ours-3prog``, v5e, compile only): see ``docs/architecture.md``,
"Log-softmax in a split step".
"""

from __future__ import annotations

import torch
import torch.fx as fx
from torch.utils.checkpoint import CheckpointPolicy

aten = torch.ops.aten

_HALF = (torch.float16, torch.bfloat16)


def _call(graph: fx.Graph, target, args: tuple, like: fx.Node, **kwargs) -> fx.Node:
    """A node computing ``target(*args, **kwargs)`` before ``like``, with its ``meta["val"]``."""
    with graph.inserting_before(like):
        node = graph.call_function(target, args, kwargs)
    vals = [a.meta["val"] if isinstance(a, fx.Node) else a for a in args]
    node.meta = {k: v for k, v in like.meta.items() if k not in ("val", "tensor_meta")}
    node.meta["val"] = target(*vals, **kwargs)
    return node


def split_log_softmax(gm: fx.GraphModule) -> int:
    """Rewrite every ``_log_softmax`` of ``gm`` (a joint graph) into torch's decomposition of it:
    ``shifted = x - amax(x)``, ``shifted - log(sum(exp(shifted)))``, computed in float32 for a
    half-precision input as the kernel does.

    Returns:
        How many were rewritten.
    """
    graph = gm.graph
    done = 0
    for node in list(graph.nodes):
        if node.target is not aten._log_softmax.default or "val" not in node.meta:
            continue
        x, dim, half_to_float = node.args
        val = x.meta["val"]
        if val.ndim == 0 or val.shape[dim % val.ndim] == 0:  # amax refuses an empty dimension
            continue
        dim = dim % val.ndim
        out_dtype = node.meta["val"].dtype
        if x.meta["val"].dtype in _HALF:
            x = _call(graph, aten._to_copy.default, (x,), node, dtype=torch.float32)
        top = _call(graph, aten.amax.default, (x, [dim], True), node)
        shifted = _call(graph, aten.sub.Tensor, (x, top), node)
        exp = _call(graph, aten.exp.default, (shifted,), node)
        total = _call(graph, aten.sum.dim_IntList, (exp, [dim], True), node)
        log = _call(graph, aten.log.default, (total,), node)
        out = _call(graph, aten.sub.Tensor, (shifted, log), node)
        recomputed = [shifted, log, out]
        if out.meta["val"].dtype != out_dtype:
            out = _call(graph, aten._to_copy.default, (out,), node, dtype=out_dtype)
            recomputed.append(out)
        for r in recomputed:
            r.meta["recompute"] = CheckpointPolicy.MUST_RECOMPUTE
        node.replace_all_uses_with(out)
        graph.erase_node(node)
        done += 1
    if done:
        gm.recompile()
    return done

"""What the forward of a split step saves for its backward: rewrites of AOTAutograd's joint
graph before the min-cut partitioner (``capture/aot.py: partition_fn``) splits it.

The partitioner recomputes in the backward only ops on its list (pointwise ops, views, casts,
``amax``, ``sum``, ...) and never one that a backward op outside its fusible set reads
("materialized in backward": a matmul operand). Two things it saved that cost a split step HBM
and bytes:

- **Log-softmax** (:func:`split_log_softmax`, every platform). ``_log_softmax`` is not on the
  list (Inductor decomposes it before the split; we lower it whole), so the forward saved its
  whole output for ``_log_softmax_backward_data``: for a language model the float32
  ``[tokens, vocabulary]`` log-probabilities, when the backward can recompute them from the
  logits the forward returns anyway (bf16 logits: half the bytes). Rewritten into the ops of
  torch's own decomposition (and of ``jax.nn.log_softmax``, so the forward computes the same
  numbers); the partitioner then saves the two ``[rows, 1]`` statistics.
- **Autocast's casts of the parameters** (:func:`recast_parameters`, TPUs only:
  the knob ``recast_platforms``). Under ``torch.autocast`` each float32 weight is cast to
  bf16 for its matmul; the backward's matmul reads that cast too, so the partitioner saved a
  bf16 copy of every weight, written by the forward and held in HBM until the backward, where
  the float32 weight itself is there throughout (parameters are free to save). Marked to be
  recomputed, the backward casts again, which XLA:TPU fuses into the matmul reading the float32
  weight.

Measured (``python -m benchmarks.tpu_programs --layers 1 ...``, v5e, compile only): see
``docs/architecture.md``, "What a split step saves".
"""

from __future__ import annotations

import torch
import torch.fx as fx
from torch.utils.checkpoint import CheckpointPolicy

from tpu_inductor.lowering.leading_dims import new_node

aten = torch.ops.aten

_HALF = (torch.float16, torch.bfloat16)


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
        if node.meta.get("recompute") is not None:  # a user output, or a checkpoint policy's
            continue
        x, dim, half_to_float = node.args
        val = x.meta["val"]
        if val.ndim == 0 or val.shape[dim % val.ndim] == 0:  # amax refuses an empty dimension
            continue
        dim = dim % val.ndim
        out_dtype = node.meta["val"].dtype
        if val.dtype in _HALF:
            x = new_node(graph, aten._to_copy.default, (x,), node, dtype=torch.float32)
        top = new_node(graph, aten.amax.default, (x, [dim], True), node)
        shifted = new_node(graph, aten.sub.Tensor, (x, top), node)
        exp = new_node(graph, aten.exp.default, (shifted,), node)
        total = new_node(graph, aten.sum.dim_IntList, (exp, [dim], True), node)
        log = new_node(graph, aten.log.default, (total,), node)
        out = new_node(graph, aten.sub.Tensor, (shifted, log), node)
        recomputed = [shifted, log, out]
        if out.meta["val"].dtype != out_dtype:
            out = new_node(graph, aten._to_copy.default, (out,), node, dtype=out_dtype)
            recomputed.append(out)
        for r in recomputed:
            r.meta["recompute"] = CheckpointPolicy.MUST_RECOMPUTE
        node.replace_all_uses_with(out)
        graph.erase_node(node)
        done += 1
    if done:
        gm.recompile()
    return done


def recast_parameters(gm: fx.GraphModule, static_inputs) -> int:
    """Mark every cast of a parameter to a narrower float dtype in ``gm`` (a joint graph)
    ``MUST_RECOMPUTE``: the backward casts the (resident) parameter again instead of the forward
    saving the cast. ``static_inputs`` are the positions of the joint graph's placeholders that
    live as long as the model (AOTAutograd's ``static_lifetime_input_indices``: parameters and
    buffers); a cast of any other input (a batch under autocast) is left to the partitioner,
    which would otherwise save the wider input.

    Returns:
        How many casts were marked.
    """
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    params = {placeholders[i] for i in static_inputs if i < len(placeholders)}
    done = 0
    for node in gm.graph.nodes:
        if node.target is not aten._to_copy.default or node.args[0] not in params:
            continue
        src, dst = node.args[0].meta.get("val"), node.meta.get("val")
        if not isinstance(src, torch.Tensor) or not isinstance(dst, torch.Tensor):
            continue
        narrower = dst.dtype.is_floating_point and dst.dtype.itemsize < src.dtype.itemsize
        if narrower and src.device == dst.device and node.meta.get("recompute") is None:
            node.meta["recompute"] = CheckpointPolicy.MUST_RECOMPUTE
            done += 1
    return done

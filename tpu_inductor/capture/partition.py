"""Eager fallback: split a graph into JAX islands and torch-on-CPU ops.

With ``fallback="eager"`` (the default), a graph holding ops without a lowering is partitioned
with ``CapabilityBasedPartitioner``: each maximal group of supported nodes becomes one compiled
JAX executable; the unsupported nodes stay in the outer FX graph and run in torch on CPU between
them. One warning per graph names the ops that fell back and their source lines, so the
performance cliff is never silent.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable

import torch
import torch.fx as fx
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
from torch.fx.passes.operator_support import OperatorSupportBase

from tpu_inductor.core.errors import FallbackWarning

log = logging.getLogger(__name__)  # TORCH_LOGS="+tpu_inductor.capture.partition"


class _Supported(OperatorSupportBase):
    def __init__(self, is_supported: Callable[[fx.Node], bool]):
        self.is_supported_fn = is_supported

    def is_node_supported(self, submodules, node: fx.Node) -> bool:
        return node.op == "call_function" and self.is_supported_fn(node)


class _Island(torch.nn.Module):
    """Calls one compiled JAX island from the outer (torch) graph."""

    def __init__(self, compiled, single_output: bool):
        super().__init__()
        self.compiled = compiled
        self.single_output = single_output

    def forward(self, *args):
        outs = self.compiled(list(args))
        return outs[0] if self.single_output else tuple(outs)


def _tuple_output(gm: fx.GraphModule) -> bool:
    """Make the graph return a tuple; True if it returned a single value before."""
    out = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    value = out.args[0]
    if isinstance(value, list | tuple):
        return False
    out.args = ((value,),)
    gm.recompile()
    return True


def split_for_fallback(
    gm: fx.GraphModule,
    is_supported: Callable[[fx.Node], bool],
    compile_island: Callable[[fx.GraphModule], Callable],
    describe: Callable[[fx.Node], str],
) -> fx.GraphModule:
    """Return ``gm`` with every supported region replaced by a compiled island.

    Args:
        gm: a functional ATen graph with at least one unsupported node.
        is_supported: whether a ``call_function`` node has a lowering.
        compile_island: compiles one all-supported subgraph into a boxed callable.
        describe: a one-line description of a node (op, shapes, source line) for the warning.

    Returns:
        A GraphModule whose unsupported ops run in torch and the rest in JAX.
    """
    fallen = [n for n in gm.graph.nodes if n.op == "call_function" and not is_supported(n)]
    # Described before fusing: fusion rewires the nodes' users to the islands' outputs, and a
    # node without a source line takes the line of its nearest consumer.
    lines = "\n  - ".join(describe(n) for n in fallen)
    partitioner = CapabilityBasedPartitioner(
        gm, _Supported(is_supported), allows_single_node_partition=True
    )
    partitions = partitioner.propose_partitions()
    fused = partitioner.fuse_partitions(partitions)
    islands = 0
    for node in list(fused.graph.nodes):
        if node.op != "call_module" or not node.target.startswith("fused_"):
            continue
        sub = getattr(fused, node.target)
        single = _tuple_output(sub)
        setattr(fused, node.target, _Island(compile_island(sub), single))
        islands += 1
    fused.recompile()
    log.info(
        "%d op(s) run in torch eager, %d compiled island(s):\n  - %s", len(fallen), islands, lines
    )
    warnings.warn(
        FallbackWarning(
            f"{len(fallen)} op(s) have no lowering and run in torch on the CPU "
            f"({islands} compiled island(s) around them):\n  - {lines}\n"
            "Each fallback copies tensors between the device and the host. Use "
            "options={'fallback': 'error'} to make this an error instead."
        ),
        stacklevel=2,
    )
    return fused

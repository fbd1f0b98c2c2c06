"""Checking what the compiler did: the divergence locator (graph dumps: ``options={"dump_dir"}``).

``find_divergence(fn, *args)`` captures the ATen graphs the backend would compile for ``fn``,
then runs each graph node by node: every node is executed in torch on CPU and, fed the same
(torch-computed) inputs, through its JAX lowering. The first node whose result differs beyond
tolerance is reported with its op, argument shapes, source line and error. Feeding each lowering
eager's inputs isolates the op: errors can't pile up from earlier nodes.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
import torch
import torch.fx as fx
import torch.utils._pytree as pytree
from torch.fx.node import map_arg

from tpu_inductor.capture.aot import decomposition_table
from tpu_inductor.core.boundary import tensor_to_jax
from tpu_inductor.core.dtypes import tolerance
from tpu_inductor.core.graph_kind import GraphKind
from tpu_inductor.lowering.lower import PRECISIONS, _meta_of, describe_node, user_frame
from tpu_inductor.lowering.lowerings import LOWERINGS, LoweringContext


@dataclasses.dataclass
class Divergence:
    """The first ATen node whose JAX lowering disagrees with torch.

    Attributes:
        graph: which captured graph (``"forward"``, ``"backward"``, ``"inference"``).
        node: the op and its argument shapes/dtypes, e.g. ``aten.sin.default(float32[3])``.
        source: the user's source line.
        error: what differs (dtype, shape, or the largest absolute difference).
        max_abs_error: the largest absolute difference (``inf`` for dtype/shape mismatches).
    """

    graph: str
    node: str
    source: str
    error: str
    max_abs_error: float

    def __str__(self) -> str:
        return (
            f"first diverging ATen node ({self.graph} graph): {self.node}\n"
            f"  at {self.source}\n  {self.error}"
        )


def capture_graphs(fn: Callable, args: tuple, kwargs: dict, grads: bool) -> list:
    """Run ``fn`` through Dynamo + AOTAutograd (our decompositions) in eager mode, recording
    each ATen graph with the real inputs it was called with: ``[(kind, gm, inputs)]``."""
    from torch._dynamo.backends.common import aot_autograd

    seen: list = []

    def recorder(kind):
        def compiler(gm, example_inputs):
            def run(inputs: list):
                seen.append((kind, gm, [_clone(x) for x in inputs]))
                return gm(*inputs)

            run._boxed_call = True
            return run

        return compiler

    backend = aot_autograd(
        fw_compiler=recorder(GraphKind.FORWARD),
        bw_compiler=recorder(GraphKind.BACKWARD),
        inference_compiler=recorder(GraphKind.INFERENCE),
        decompositions=decomposition_table(),
    )
    torch._dynamo.reset()
    try:
        out = torch.compile(fn, backend=backend)(*args, **kwargs)
        if grads:
            loss = _loss(out)
            if loss is not None:
                loss.backward()
    finally:
        torch._dynamo.reset()
    return seen


def _clone(x):
    return x.detach().clone() if isinstance(x, torch.Tensor) else x


def _loss(out):
    leaves = [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
    leaves = [t for t in leaves if t.requires_grad and t.is_floating_point()]
    return sum(t.float().sum() for t in leaves) if leaves else None


def find_divergence(
    fn_or_module: Callable,
    *args,
    grads: bool = False,
    atol: float | None = None,
    rtol: float | None = None,
    **kwargs,
) -> Divergence | None:
    """Localize the first ATen node whose lowering disagrees with torch on CPU.

    Args:
        fn_or_module: a function or ``nn.Module`` (it is deep-copied, the original is untouched).
        args, kwargs: its inputs.
        grads: also check the backward graph (the loss is the sum of all float outputs).
        atol, rtol: override the per-dtype tolerances.

    Returns:
        A :class:`Divergence`, or ``None`` if every lowered node matches.

    Example:
        >>> d = find_divergence(model, x)
        >>> print(d)  # first diverging ATen node (forward graph): aten.gelu.default(...)
    """
    fn = copy.deepcopy(fn_or_module) if isinstance(fn_or_module, torch.nn.Module) else fn_or_module
    for kind, gm, inputs in capture_graphs(fn, copy.deepcopy(args), kwargs, grads):
        found = _first_divergence(kind, gm, inputs, atol, rtol)
        if found is not None:
            return found
    return None


def _first_divergence(
    kind: GraphKind, gm: fx.GraphModule, inputs: list, atol, rtol
) -> Divergence | None:

    device = jax.devices("cpu")[0]
    precision = PRECISIONS[torch.get_float32_matmul_precision()]
    env: dict[fx.Node, Any] = {}
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for node, value in zip(placeholders, inputs, strict=True):
        env[node] = value

    def load(a):
        return map_arg(a, env.__getitem__)

    def to_jax(v):
        if isinstance(v, torch.Tensor):
            return tensor_to_jax(v, device)
        if isinstance(v, list | tuple):
            return type(v)(to_jax(x) for x in v)
        return v

    with jax.enable_x64(True):
        for node in gm.graph.nodes:
            if node.op == "get_attr":
                env[node] = getattr(gm, node.target)
            if node.op != "call_function":
                continue
            args, kwargs = load(node.args), {k: load(v) for k, v in node.kwargs.items()}
            env[node] = node.target(*args, **kwargs)
            lowering = LOWERINGS.get(node.target)
            if lowering is None or lowering.random or lowering.wraps is not None:
                continue
            ctx = LoweringContext(
                node=node, precision=precision, arg_metas=tuple(_meta_of(a) for a in node.args)
            )
            try:
                got = lowering(ctx, to_jax(args), {k: to_jax(v) for k, v in kwargs.items()})
            except Exception as e:  # a lowering that raises is itself the divergence
                return Divergence(
                    kind.value,
                    describe_node(node),
                    user_frame(node),
                    f"the lowering raised {type(e).__name__}: {e}",
                    float("inf"),
                )
            problem = _compare(env[node], got, atol, rtol)
            if problem is not None:
                return Divergence(kind.value, describe_node(node), user_frame(node), *problem)
    return None


def _compare(expected, got, atol, rtol):
    exp = expected if isinstance(expected, list | tuple) else [expected]
    act = got if isinstance(got, list | tuple) else [got]
    for i, (e, a) in enumerate(zip(exp, act, strict=False)):
        if not isinstance(e, torch.Tensor) or a is None:
            continue
        where = f"output {i}: " if len(exp) > 1 else ""
        a_np = np.asarray(a)
        want = str(e.dtype).removeprefix("torch.")
        if tuple(a_np.shape) != tuple(e.shape):
            return f"{where}shape {list(a_np.shape)} != torch's {list(e.shape)}", float("inf")
        if str(a_np.dtype) != want:
            return f"{where}dtype {a_np.dtype} != torch's {want}", float("inf")
        if e.numel() == 0:
            continue
        at, rt = tolerance(e.dtype, atol, rtol)
        ref = e.detach().to(torch.float64 if not e.is_complex() else torch.complex128).numpy()
        val = a_np.astype(ref.dtype)
        diff = np.abs(val - ref)
        both_nan = np.isnan(val) & np.isnan(ref)
        bad = ~both_nan & ~(diff <= at + rt * np.abs(ref))
        if bad.any():
            worst = float(np.nanmax(np.where(both_nan, 0, diff)))
            idx = np.unravel_index(
                np.argmax(np.where(bad, np.nan_to_num(diff, nan=np.inf), -1)), bad.shape
            )
            return (
                f"{where}{int(bad.sum())} of {bad.size} values differ; max |diff| {worst:.3g} "
                f"(atol {at:g}, rtol {rt:g}); at index {tuple(int(i) for i in idx)}: "
                f"jax {val[idx]!r} vs torch {ref[idx]!r}",
                worst,
            )
    return None

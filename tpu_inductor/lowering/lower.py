"""ATen FX graph -> one pure JAX function.

Every node is looked up before anything is lowered, so a graph with several unsupported ops
fails once, listing all of them. The returned function is pure: tensors in, tensors out; its
first argument is a PRNG seed (``None`` when the graph draws no random numbers).
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import math
import operator
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import sympy
import torch
import torch.fx as fx
from jax import lax
from torch.fx.node import map_arg

from tpu_inductor.core import config
from tpu_inductor.core.boundary import is_traced
from tpu_inductor.core.dtypes import (
    TPU_UNSUPPORTED,
    describe_tensor,
    reject_tpu_64bit,
    to_jax_dtype,
)
from tpu_inductor.core.errors import (
    LoweringError,
    LoweringOutputError,
    ShapeMismatchError,
    UnsupportedDtypeError,
    UnsupportedOpError,
    raise_failed_assert,
)
from tpu_inductor.core.shapes import bind, concrete_shape, graph_is_dynamic, size_only_inputs
from tpu_inductor.core.sources import provenance, user_frame
from tpu_inductor.lowering import grouped_kv, leading_dims
from tpu_inductor.lowering.inputs import COPY_, gathered_rows, mutations_of
from tpu_inductor.lowering.lowerings.registry import LOWERINGS, LoweringContext
from tpu_inductor.lowering.lowerings.unsupported import UNSUPPORTED, refusal
from tpu_inductor.lowering.lowerings.wrappers import wrapped_view
from tpu_inductor.lowering.packing import packed_fn, plan_packing

# Python-level ops Dynamo/AOTAutograd leave in graphs (mostly SymInt arithmetic).
PYTHON_OPS: dict[Any, Callable] = {
    operator.getitem: operator.getitem,
    operator.add: operator.add,
    operator.sub: operator.sub,
    operator.mul: operator.mul,
    operator.truediv: operator.truediv,
    operator.floordiv: operator.floordiv,
    operator.mod: operator.mod,
    operator.pow: operator.pow,
    operator.neg: operator.neg,
    operator.eq: operator.eq,
    operator.ne: operator.ne,
    operator.lt: operator.lt,
    operator.le: operator.le,
    operator.gt: operator.gt,
    operator.ge: operator.ge,
    operator.abs: operator.abs,
    operator.pos: operator.pos,
    operator.and_: operator.and_,
    operator.or_: operator.or_,
    operator.xor: operator.xor,
    operator.lshift: operator.lshift,
    operator.rshift: operator.rshift,
    operator.not_: lambda a: jnp.logical_not(a) if is_traced(a) else not a,
    math.ceil: lambda a: jnp.ceil(a) if is_traced(a) else math.ceil(a),
    math.floor: lambda a: jnp.floor(a) if is_traced(a) else math.floor(a),
    math.trunc: lambda a: jnp.trunc(a) if is_traced(a) else math.trunc(a),
    round: lambda a, n=None: jnp.round(a, n or 0) if is_traced(a) else round(a, n),
    math.sqrt: lambda a: jnp.sqrt(a) if is_traced(a) else math.sqrt(a),
    torch.sym_sqrt: lambda a: jnp.sqrt(a) if is_traced(a) else math.sqrt(a),
    torch._sym_sqrt: lambda a: jnp.sqrt(a) if is_traced(a) else math.sqrt(a),
    torch.sym_float: lambda a: a.astype(jnp.float32) if is_traced(a) else float(a),
    torch.sym_int: lambda a: a.astype(jnp.int32) if is_traced(a) else int(a),
    torch.sym_max: lambda a, b: jnp.maximum(a, b) if is_traced(a) or is_traced(b) else max(a, b),
    torch.sym_min: lambda a, b: jnp.minimum(a, b) if is_traced(a) or is_traced(b) else min(a, b),
    torch.sym_sum: lambda args: sum(args),
    torch.sym_not: lambda a: jnp.logical_not(a) if is_traced(a) else not a,
    torch.sym_ite: lambda b, t, f: jnp.where(b, t, f) if is_traced(b) else (t if b else f),
}
for _name in ("sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "tanh", "log2"):
    # torch._sym_sin, ...: a symbolic float's math.sin
    PYTHON_OPS[getattr(torch, f"_sym_{_name}")] = lambda a, _f=_name: (
        getattr(jnp, {"asin": "arcsin", "acos": "arccos", "atan": "arctan"}.get(_f, _f))(a)
        if is_traced(a)
        else getattr(math, _f)(a)
    )
del _name


PRECISIONS = {
    "highest": lax.Precision.HIGHEST,
    "high": lax.Precision.HIGH,
    "medium": lax.Precision.DEFAULT,
}


def describe_value(v) -> str:
    """A compact description of an argument: ``f32[2, 3]`` for tensors, repr otherwise."""
    if isinstance(v, fx.Node):
        v = v.meta.get("val", v.name)
    if isinstance(v, torch.Tensor):
        return describe_tensor(v.dtype, v.shape)
    if isinstance(v, list | tuple):
        return "[" + ", ".join(describe_value(x) for x in v) + "]"
    return repr(v)


def describe_node(node: fx.Node) -> str:
    """``op(arg descriptions)`` for error messages."""
    args = [describe_value(a) for a in node.args]
    args += [f"{k}={describe_value(v)}" for k, v in node.kwargs.items()]
    return f"{node.target}({', '.join(args)})"


def _meta_of(a):
    """``a`` with every FX node replaced by its ``meta["val"]``."""
    return map_arg(a, lambda n: n.meta.get("val"))


@dataclasses.dataclass(kw_only=True)
class LoweredGraph:
    """A graph translated to a pure JAX function.

    Attributes:
        fn: ``fn(seed, *inputs) -> tuple``: the computed outputs (the ``("out", k)`` entries of
            ``output_plan``), then the new values of ``mutations``; ``seed`` is a ``uint32[2]``
            or ``None``.
        tensor_inputs: positions of graph inputs that are tensors (the rest are static).
        has_rng: whether ``fn`` needs a seed.
        num_outputs: how many outputs the graph declares (``len(output_plan)``; ``fn`` returns
            fewer when some are inputs or duplicates, more when inputs are updated in place).
        scalar_outputs: output positions that are Python numbers (sizes returned for backward);
            the jitted function returns them as 0-d arrays.
        dynamic: whether the graph has symbolic sizes (specialized per concrete shape).
        input_metas / output_metas: the placeholders' and outputs' ``meta["val"]``.
        output_plan: where each declared output comes from: ``("out", k)`` is ``fn``'s k-th
            result, ``("input", i)`` is graph input ``i`` returned as it is, ``("dup", j)`` is
            the same value as output ``j`` (so neither is copied on the device), and
            ``("detach", j)`` is ``detach``/``alias`` of output ``j`` (a saved activation that is
            a user output: handed back as that output's ``detach()``, which shares its version
            counter, so an in-place change of it before backward raises as in eager).
        mutations: inputs the graph updates in place (AOTAutograd's in-graph ``copy_``), whose
            new values ``fn`` returns after the declared outputs.
        host_sizes: whether a scalar built from sizes only (``torch.tensor(x.shape[0]).item()``)
            is evaluated while tracing, binding the unbacked symbol it defines.
        view_outputs: computed outputs whose layout (sizes, strides, storage offset) is
            symbolic: views such as ``x[:, n:n + 2]``, which AOTAutograd rebuilds from their base
            with ``as_strided`` and the layout of the tensor handed back (see
            ``runtime.with_layout``).
        layouts: per input binding (:meth:`binding_key`), each view output's concrete
            ``(size, stride, storage_offset)``, recorded while tracing (``None`` when it is not
            known then).
        packing: with ``scan_layers``, how per-layer inputs and their new values cross as
            stacks (:mod:`tpu_inductor.lowering.packing`): the executable is :attr:`packed`,
            not ``fn``; ``None`` when nothing is stacked.
        tangent_inputs: positions of a backward graph's tangents (AOTAutograd's ``tangents_*``
            placeholders): the gradients of the forward's outputs.
        gathered: inputs read only by row lookups (an embedding table), ``position -> rows``
            taken per call: such an input is read by its rows, not whole (``tpu.programs``).
    """

    fn: Callable
    tensor_inputs: tuple[int, ...]
    has_rng: bool
    num_outputs: int
    scalar_outputs: frozenset[int] = frozenset()
    dynamic: bool = False
    input_metas: tuple = ()
    output_metas: tuple = ()
    ops: dict[str, int] = dataclasses.field(default_factory=dict)
    output_plan: tuple = ()
    mutations: tuple = ()
    host_sizes: bool = False
    view_outputs: frozenset[int] = frozenset()
    layouts: dict = dataclasses.field(default_factory=dict)
    packing: Any = None
    tangent_inputs: frozenset[int] = frozenset()
    gathered: dict[int, int] = dataclasses.field(default_factory=dict)

    @property
    def packed(self) -> Callable:
        """The function an executable compiles: ``fn``, or ``fn`` with :attr:`packing`'s
        calling convention."""
        if self.packing is None:
            return self.fn
        return packed_fn(self.fn, self.packing, len(self.input_metas))

    def binding_key(self, inputs) -> tuple:
        """The input-size bindings of a call (graph inputs in order: tensors or arrays, and
        scalars) as a hashable key."""
        return _binding_key(bind(self.input_metas, inputs))

    @property
    def plain_outputs(self) -> bool:
        """Whether ``fn`` returns exactly the declared outputs, in order."""
        return not self.mutations and all(p == ("out", i) for i, p in enumerate(self.output_plan))


def _lowered_as(node: fx.Node) -> Any:
    """The node a lowering is looked up and refused for: for a wrapper op (a row with
    ``wraps``, such as ``with_effects``) the op it wraps, else ``node`` itself."""
    row = LOWERINGS.get(node.target)
    if row is None or row.wraps is None:
        return node
    return wrapped_view(node, row)


def is_lowerable(node: fx.Node) -> bool:
    """Whether a ``call_function`` node has a lowering (or is Python arithmetic we run) that
    handles its arguments (``lowerings.unsupported.REFUSED`` says when one does not)."""
    node = _lowered_as(node)
    if node.target in PYTHON_OPS or node.target is COPY_:
        return True
    if node.target not in LOWERINGS:
        return False
    return refusal(node) is None


def why_unsupported(node: fx.Node) -> str | None:
    """The reason a node is not lowered on purpose (``lowerings.unsupported``), if one is known."""
    node = _lowered_as(node)
    if node.target in LOWERINGS:
        return refusal(node)
    return UNSUPPORTED.get(node.target)


def check_supported(gm: fx.GraphModule) -> None:
    """Raise one :class:`UnsupportedOpError` listing every node without a lowering.

    Ops that are unsupported on purpose (``tpu_inductor.lowering.lowerings.unsupported``) carry
    their
    reason and the rewrite that avoids them.
    """
    missing = []
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        if is_lowerable(node):
            continue
        line = f"{describe_node(node)}\n      at {user_frame(node)}"
        reason = why_unsupported(node)
        if reason is not None:
            line += f"\n      not supported: {reason}"
        missing.append(line)
    if missing:
        raise UnsupportedOpError(
            f"{len(missing)} op(s) in this graph have no lowering:\n  - "
            + "\n  - ".join(missing)
            + "\nWhat to do: rewrite those lines with supported ops, move them outside the "
            "compiled region (e.g. torch.compiler.disable), or report the op so a lowering can "
            "be added.",
            missing=missing,
        )


def check_dtypes(gm: fx.GraphModule, platform: str) -> None:
    """Raise one :class:`UnsupportedDtypeError` for every value the device cannot hold."""
    if platform != "tpu":
        return
    bad = []
    for node in gm.graph.nodes:
        val = node.meta.get("val")
        vals = val if isinstance(val, list | tuple) else [val]
        for v in vals:
            if isinstance(v, torch.Tensor) and v.dtype in TPU_UNSUPPORTED:
                what = "a graph input" if node.op == "placeholder" else describe_node(node)
                bad.append(f"{what} is {v.dtype}\n      at {user_frame(node)}")
                break
    reject_tpu_64bit(bad, "these values")


def _check_meta(node: fx.Node, value, bindings: dict | None) -> None:
    spec = node.meta.get("val")
    specs = spec if isinstance(spec, list | tuple) else [spec]
    values = value if isinstance(value, list | tuple) else [value]
    for s, v in zip(specs, values, strict=False):
        if not isinstance(s, torch.Tensor) or v is None:
            continue
        want_shape, want_dtype = concrete_shape(s.shape, bindings), to_jax_dtype(s.dtype)
        if tuple(v.shape) != want_shape or v.dtype != want_dtype:
            raise ShapeMismatchError(
                f"lowering of {describe_node(node)} produced {v.dtype}{list(v.shape)}, "
                f"torch says {want_dtype}{list(want_shape)}\n  at {user_frame(node)}"
            )


def lower_graph(
    gm: fx.GraphModule,
    *,
    precision: str,
    check_meta: bool = False,
    platform: str | None = None,
    scan_layers: bool = False,
) -> LoweredGraph:
    """Translate an ATen FX graph into a pure JAX function.

    Args:
        gm: a functional Core ATen graph (what AOTAutograd hands a compiler).
        precision: ``"highest"``, ``"high"`` or ``"medium"`` for float32 matmuls/convolutions.
        check_meta: compare every lowered value with ``node.meta["val"]`` while tracing.
        platform: the device kind it compiles for (``LoweringContext.platform``; a registered
            Pallas kernel reads it through ``tpu_inductor.pallas_interpret``).
        scan_layers: lower runs of isomorphic repeated blocks once, as a ``lax.scan``
            (:mod:`tpu_inductor.lowering.scan_layers`); what doesn't match stays unrolled.

    Returns:
        A :class:`LoweredGraph`.

    Raises:
        UnsupportedOpError: listing every op without a lowering.
    """
    check_supported(gm)
    grouped_kv.read_kv_heads(gm)
    if platform in config.get("leading_dims_platforms"):
        leading_dims.keep_leading_dims(gm)
    if scan_layers:
        from tpu_inductor.lowering.scan_calls import tidy_calls

        tidy_calls(gm)
    nodes = list(gm.graph.nodes)
    placeholders = [n for n in nodes if n.op == "placeholder"]
    output_node = next(n for n in reversed(nodes) if n.op == "output")
    input_metas = tuple(n.meta.get("val") for n in placeholders)
    output_metas = tuple(_meta_of(a) for a in output_node.args[0])
    dynamic = graph_is_dynamic(input_metas)
    output_plan, computed = _output_plan(output_node.args[0], placeholders)
    view_outputs = frozenset(
        j
        for j, m in enumerate(output_metas)
        if output_plan[j][0] == "out" and isinstance(m, torch.Tensor) and _symbolic_layout(m)
    )
    mutations, extra = mutations_of(nodes, placeholders, len(computed))
    host_eval, host_sizes = _host_eval(nodes)
    jax_precision = PRECISIONS[precision]
    contexts = {}
    for n in nodes:
        if n.op == "call_function" and n.target in LOWERINGS:
            seen = _lowered_as(n)  # a wrapper's lowering sees the op it wraps
            metas = tuple(_meta_of(a) for a in seen.args)
            contexts[n] = LoweringContext(
                node=seen, precision=jax_precision, arg_metas=metas, platform=platform
            )
    groups = {}
    if scan_layers:
        keep = {n for n in computed + extra if isinstance(n, fx.Node)}
        groups = _plan_scans(gm, nodes, keep=keep, host_eval=host_eval, dynamic=dynamic)
    walk = _GraphWalk(
        gm=gm,
        n_inputs=len(placeholders),
        input_metas=input_metas,
        output_metas=output_metas,
        has_rng=any(n.op == "call_function" and _is_random(n) for n in nodes),
        dynamic=dynamic,
        check_meta=check_meta,
        contexts=contexts,
        host_eval=frozenset(host_eval),
        groups=groups,
        inside=frozenset(n for g in groups.values() for n in g.nodes),
        returned=tuple(computed + extra),
        view_outputs=view_outputs,
    )
    ops = collections.Counter(str(n.target) for n in nodes if n.op == "call_function")
    packing = None
    if groups:
        packing = plan_packing(groups, placeholders, mutations, len(computed) + len(extra))
    return LoweredGraph(
        fn=functools.partial(_trace, walk),
        tensor_inputs=tuple(i for i, m in enumerate(input_metas) if isinstance(m, torch.Tensor)),
        has_rng=walk.has_rng,
        num_outputs=len(output_node.args[0]),
        scalar_outputs=frozenset(
            i for i, m in enumerate(output_metas) if not isinstance(m, torch.Tensor | type(None))
        ),
        dynamic=dynamic,
        input_metas=input_metas,
        output_metas=output_metas,
        ops=dict(ops),
        output_plan=output_plan,
        mutations=mutations,
        host_sizes=host_sizes,
        view_outputs=view_outputs,
        layouts=walk.layouts,
        packing=packing,
        tangent_inputs=frozenset(
            i for i, n in enumerate(placeholders) if n.target.startswith("tangents")
        ),
        gathered=gathered_rows(placeholders),
    )


def _host_eval(nodes) -> tuple[set, bool]:
    """The nodes evaluated while tracing, and whether an item is read from sizes.

    Scalars read from values known once the sizes are, and assertions on them: their inputs
    run while tracing (jax.ensure_compile_time_eval), so the read is a Python number that may
    become a size, and the assertion is checked once per size instead of at every call. An
    item read from sizes means pad_to must not apply (see buckets.can_pad).
    """
    host_eval: set = set()
    host_sizes = False
    for n in nodes:
        if n.op == "call_function" and n.target in _READ_WHILE_TRACING:
            inputs = size_only_inputs(n)
            host_eval |= inputs or set()
            host_sizes |= inputs is not None and n.target is _READ_WHILE_TRACING[0]
    return host_eval, host_sizes


def _plan_scans(gm, nodes, *, keep: set, host_eval: set, dynamic: bool) -> dict:
    """scan_layers' plan: each run of repeated blocks (layers, subgraph calls, optimizer
    updates) by the node it is lowered at."""
    from tpu_inductor.lowering.scan_calls import plan_call_scans
    from tpu_inductor.lowering.scan_layers import plan_scans
    from tpu_inductor.lowering.scan_updates import plan_update_scans

    unscannable = {n for n in nodes if n.op == "call_function" and not _scannable(n)}
    return plan_scans(
        nodes,
        keep=keep,
        unscannable=unscannable | host_eval,
        dynamic=dynamic,
        gm=gm,
        calls=plan_call_scans,
        then=plan_update_scans,
    )


@dataclasses.dataclass(frozen=True, kw_only=True)
class _GraphWalk:
    """What :func:`lower_graph` found in a graph, read by every trace of it
    (:class:`JaxInterpreter`). ``contexts`` and ``layouts`` are updated by each trace."""

    gm: fx.GraphModule
    n_inputs: int
    input_metas: tuple
    output_metas: tuple
    has_rng: bool
    dynamic: bool
    check_meta: bool
    contexts: dict  # call_function node -> its LoweringContext
    host_eval: frozenset  # nodes evaluated while tracing (_host_eval)
    groups: dict  # scan_layers: the node a run of blocks is lowered at -> its ScanGroup
    inside: frozenset  # every node of those runs
    returned: tuple  # what fn returns: the computed outputs, then the mutations' values
    view_outputs: frozenset
    layouts: dict = dataclasses.field(default_factory=dict)


def _trace(walk: _GraphWalk, seed, *inputs, stacks: dict | None = None, draws=None) -> tuple:
    """``LoweredGraph.fn``: the graph's values for ``inputs``, traced into JAX.

    ``stacks`` is packing's record of inputs sliced from stacks (``packing.packed_fn``);
    ``draws`` the draw counter of a calling graph, shared by a subgraph's call."""
    if len(inputs) != walk.n_inputs:
        raise ValueError(f"the graph takes {walk.n_inputs} inputs, given {len(inputs)}")
    interpreter = JaxInterpreter(walk, seed=seed, inputs=inputs, stacks=stacks, draws=draws)
    return interpreter.run(*inputs, enable_io_processing=False)


class JaxInterpreter(fx.Interpreter):
    """One trace of a lowered graph: runs each node's lowering on JAX values.

    ``placeholder`` and ``output`` come from :class:`fx.Interpreter` and :meth:`output`;
    :meth:`run_node` hands a run of repeated blocks to its scan (``ScanGroup.run``);
    :meth:`lower` is one node's value, for the walk and for a scan body alike.
    """

    def __init__(self, walk: _GraphWalk, *, seed, inputs: tuple, stacks: dict | None, draws):
        super().__init__(walk.gm, garbage_collect_values=False)
        self.extra_traceback = False  # our errors name the node and the user's line already
        self.walk = walk
        self.seed = seed
        self.input_ids = {id(v) for v in inputs}
        self.bindings = bind(walk.input_metas, inputs) if walk.dynamic or walk.host_eval else None
        self.key = _binding_key(bind(walk.input_metas, inputs)) if walk.view_outputs else None
        # the next random draw's number; a subgraph's call shares its caller's (draws), so a
        # repeated layer draws what the same ops unrolled draw
        self.counter = draws if draws is not None else [0]
        self.base_key = None
        if walk.has_rng:
            self.base_key = jax.random.wrap_key_data(seed, impl="threefry2x32")
        for ctx in walk.contexts.values():
            ctx.bindings = self.bindings
            ctx.seed, ctx.draws = seed, self.counter
            ctx.make_key = self.draw if walk.has_rng else None
        # scan_layers: values sliced out of a stacked array (a scan's outputs, or a stacked
        # input: packing.py), so a scan reading them all takes that array
        self.stacks = {} if stacks is None else stacks
        if walk.groups:  # and the placements of the inputs it stacks (a sharding plan's)
            from tpu_inductor.lowering.scan_layers import Placements

            self.stacks["placed"] = Placements.of_inputs(inputs)

    def draw(self) -> jax.Array:
        """The key of the graph's next random draw (``ctx.make_key``)."""
        self.counter[0] += 1
        return jax.random.fold_in(self.base_key, self.counter[0] - 1)

    def run_node(self, n: fx.Node) -> Any:
        group = self.walk.groups.get(n)
        if group is not None:  # the last node of a run of repeated blocks: one lax.scan
            for node in group.nodes:  # the run's nodes were skipped until now
                self.env.pop(node, None)
            group.run(self.env, self.lower, self.stacks)
            return self.env.get(n)
        if n in self.walk.inside:  # lowered by its run's scan, at the run's last node
            return None
        if n.op in ("get_attr", "call_function"):
            args, kwargs = self.fetch_args_kwargs_from_env(n)
            return self.lower(n, args, kwargs)
        return super().run_node(n)

    def lower(self, node: fx.Node, args, kwargs) -> Any:
        """The value of one ``get_attr`` or ``call_function`` node, given its arguments'."""
        if node.op == "get_attr":
            if node in self.walk.host_eval:  # a constant a scalar is read from: concrete
                with jax.ensure_compile_time_eval():
                    return _constant(self.fetch_attr(node.target))
            return _constant(self.fetch_attr(node.target))
        if node.target in PYTHON_OPS:
            return PYTHON_OPS[node.target](*args, **kwargs)
        if node.target is COPY_:  # an in-graph input mutation: its value is returned
            dst, src = args[0], args[1]
            return jnp.broadcast_to(src.astype(dst.dtype), dst.shape)
        ctx = self.walk.contexts[node]
        try:
            if node in self.walk.host_eval:
                with jax.ensure_compile_time_eval():
                    value = LOWERINGS[node.target](ctx, args, kwargs)
            else:
                with provenance(node):
                    value = LOWERINGS[node.target](ctx, args, kwargs)
        except (UnsupportedOpError, UnsupportedDtypeError, ShapeMismatchError, LoweringOutputError):
            raise
        except Exception as e:
            raise_failed_assert(e)  # a torch._assert_async on sizes: torch's RuntimeError
            raise LoweringError(
                f"lowering {describe_node(node)} failed: {type(e).__name__}: {e}\n"
                f"  at {user_frame(node)}"
            ) from e
        if self.walk.check_meta:
            _check_meta(node, value, self.bindings)
        return value

    def output(self, target, args, kwargs) -> tuple:
        """``fn``'s results (:attr:`_GraphWalk.returned`), each a buffer of its own."""
        walk, env = self.walk, self.env
        if walk.view_outputs:  # the layout AOTAutograd rebuilds each view output with
            output_node = next(n for n in reversed(walk.gm.graph.nodes) if n.op == "output")
            walk.layouts[self.key] = {
                j: _replayed_layout(output_node.args[0][j], env, self.bindings)
                or _layout(walk.output_metas[j], self.bindings)
                for j in walk.view_outputs
            }
        outs = []
        seen = set(self.input_ids)
        for out in [env[n] if isinstance(n, fx.Node) else n for n in walk.returned]:
            # A returned buffer must be fresh: jit forwards inputs returned as-is, and one
            # buffer returned twice would alias two torch tensors.
            if isinstance(out, jax.Array | jax.core.Tracer):
                if id(out) in seen:
                    out = _fresh(out)
                seen.add(id(out))
            outs.append(out)
        return tuple(outs)


def _symbolic_layout(meta: torch.Tensor) -> bool:
    """Whether a value's layout is symbolic and not plainly contiguous from offset 0 (a
    contiguous one is what a fresh output has anyway: most reshapes of a matmul's result)."""
    layout = (*meta.shape, *meta.stride(), meta.storage_offset())
    if not any(isinstance(d, torch.SymInt) and d.node.maybe_as_int() is None for d in layout):
        return False
    expr = [d.node.expr if isinstance(d, torch.SymInt) else sympy.Integer(d) for d in layout]
    n = meta.dim()
    shape, stride, offset = expr[:n], expr[n : 2 * n], expr[2 * n]
    contiguous = sympy.Integer(1)
    for d in reversed(range(n)):
        if shape[d] != 1 and sympy.expand(stride[d] - contiguous) != 0:
            return True
        contiguous = contiguous * shape[d]
    return sympy.expand(offset) != 0


def _binding_key(bindings: dict) -> tuple:
    return tuple(sorted((str(k), v) for k, v in bindings.items() if not is_traced(v)))


def _layout(meta: torch.Tensor, bindings: dict | None):
    """``(size, stride, storage_offset)`` of a view output under ``bindings``, or ``None``
    where a symbol is not bound to a number (a value read in the program)."""
    bindings = {k: v for k, v in (bindings or {}).items() if not is_traced(v)}
    try:
        size = concrete_shape(meta.shape, bindings)
        stride = concrete_shape(meta.stride(), bindings)
        offset = concrete_shape([meta.storage_offset()], bindings)[0]
    except (ValueError, TypeError):
        return None
    return size, stride, offset


def _is_view_op(target) -> bool:
    return isinstance(target, torch._ops.OpOverload) and target.is_view


def _replayed_layout(out, env: dict, bindings: dict | None):
    """The layout of view output ``out``, found by replaying its chain of view ops (with the
    values their arguments have in this trace) on a ``meta`` tensor laid out as its base: a
    graph input (its layout under ``bindings``) or a computed value (handed back contiguous).
    A size or offset torch gave a fresh unbacked symbol (``narrow`` at ``u0``: offset ``u5``)
    is known this way once ``u0`` is. ``None`` where an argument is a value read in the
    program, or the chain is not views only."""
    chain = []
    node = out
    while isinstance(node, fx.Node) and node.op == "call_function":
        if node.target is operator.getitem and _is_view_op(getattr(node.args[0], "target", None)):
            chain.append(node)
        elif _is_view_op(node.target):
            chain.append(node)
        else:
            break
        node = node.args[0]
    if not chain or not isinstance(node, fx.Node):
        return None
    bound = {k: v for k, v in (bindings or {}).items() if not is_traced(v)}
    try:
        if node.op == "placeholder":
            meta = node.meta["val"]
            size = concrete_shape(meta.shape, bound)
            stride = concrete_shape(meta.stride(), bound)
            offset = concrete_shape([meta.storage_offset()], bound)[0]
        else:
            size = tuple(env[node].shape)
            stride = tuple(int(x) for x in np.cumprod((1, *size[:0:-1]))[::-1]) if size else ()
            offset = 0
        extent = offset + 1 + sum((n - 1) * st for n, st in zip(size, stride, strict=True))
        value = torch.empty(extent, device="meta").as_strided(size, stride, offset)
        for n in reversed(chain):
            if n.target is operator.getitem:
                value = value[n.args[1]]
                continue
            args = [env[a] if isinstance(a, fx.Node) else a for a in n.args[1:]]
            args = [list(a) if isinstance(a, list | tuple) else a for a in args]
            if any(is_traced(x) for x in torch.utils._pytree.tree_leaves(args)):
                return None
            value = n.target(value, *args, **n.kwargs)
    except (ValueError, TypeError, RuntimeError, KeyError, IndexError):
        return None
    return tuple(value.shape), tuple(value.stride()), value.storage_offset()


_READ_WHILE_TRACING = (
    torch.ops.aten._local_scalar_dense.default,
    torch.ops.aten._assert_async.default,
    torch.ops.aten._assert_async.msg,
)
_ALIASES = (torch.ops.aten.detach.default, torch.ops.aten.alias.default)


def _output_plan(outputs, placeholders) -> tuple[tuple, list]:
    """Each declared output's source, and the outputs ``fn`` computes (see LoweredGraph)."""
    index_of = {p: i for i, p in enumerate(placeholders)}
    plan, computed, first = [], [], {}
    for j, out in enumerate(outputs):
        if isinstance(out, fx.Node) and out in index_of:
            plan.append(("input", index_of[out]))
        elif isinstance(out, fx.Node) and out in first:
            plan.append(("dup", first[out]))
        elif _alias_base(out) in first:
            plan.append(("detach", first[_alias_base(out)]))
        else:
            if isinstance(out, fx.Node):
                first[out] = j
            plan.append(("out", len(computed)))
            computed.append(out)
    return tuple(plan), computed


def _alias_base(out) -> fx.Node | None:
    """The node a chain of ``detach``/``alias`` ops starts from (``detach(detach(exp))``, as the
    min-cut partitioner saves a forward output), or ``None`` if ``out`` is no such chain."""
    if not (isinstance(out, fx.Node) and out.target in _ALIASES):
        return None
    while isinstance(out, fx.Node) and out.target in _ALIASES and isinstance(out.args[0], fx.Node):
        out = out.args[0]
    return out


def _fresh(x):
    return jnp.array(x, copy=True)


def _constant(value):
    if isinstance(value, torch.Tensor):
        value = value.detach()
        if value.dtype == torch.bfloat16:
            return jnp.asarray(value.view(torch.uint16).numpy()).view(jnp.bfloat16)
        return jnp.asarray(value.resolve_conj().resolve_neg().contiguous().numpy())
    return value


def _is_random(node: fx.Node) -> bool:
    """Whether a node draws random numbers (its lowering's ``random``: a flag, or for a
    higher-order op a predicate of the node, e.g. whether a subgraph it calls draws)."""
    low = LOWERINGS.get(node.target)
    if low is None:
        return False
    return low.random(node) if callable(low.random) else low.random


def _scannable(node: fx.Node) -> bool:
    """Whether a node may be lowered inside a ``lax.scan`` body (scan_layers.py): no random
    draw (each layer's draw number differs), no in-place input update, no wrapper op (an
    effect token or RNG state), no Python-level (symbolic size) arithmetic except taking a
    tuple's item."""
    if node.target is operator.getitem:
        return True
    if node.target in PYTHON_OPS or node.target is COPY_:
        return False
    row = LOWERINGS.get(node.target)
    if row is not None and row.wraps is not None:
        return False
    return not _is_random(node)

"""The Dynamo backend entry points: ``backend="tpu"`` and ``backend="tpu_inductor"``.

Both are registered through the ``torch_dynamo_backends`` entry-point group (see
pyproject.toml), so ``torch.compile(model, backend="tpu")`` works without importing this
package. This module wires the stages: options -> AOTAutograd capture -> lowering -> jit ->
runtime.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import logging
import pathlib
import re
import threading
import time
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import torch
import torch.fx as fx

from tpu_inductor.capture import aot as capture
from tpu_inductor.capture.partition import split_for_fallback
from tpu_inductor.core import config, hints, stages, transfers
from tpu_inductor.core.devices import compiler_options, platform_of, select_device
from tpu_inductor.core.dtypes import TPU_UNSUPPORTED, reject_tpu_64bit
from tpu_inductor.core.errors import UnsupportedInputError
from tpu_inductor.core.graph_kind import GraphKind
from tpu_inductor.core.stages import FrameStages
from tpu_inductor.dynamo import breaks, optimizers, regions
from tpu_inductor.dynamo.options import (
    Options,
    configure_logging,
    parse_options,
    plan_of,
    program_fingerprint,
)
from tpu_inductor.dynamo.user_errors import our_errors_first
from tpu_inductor.lowering import custom_ops, refusals
from tpu_inductor.lowering.lower import (
    check_dtypes,
    describe_node,
    describe_value,
    is_lowerable,
    lower_graph,
    user_frame,
    why_unsupported,
)
from tpu_inductor.runtime import (
    buckets,
    cache,
    device_eager,
    device_owned,
    program_store,
    residency,
    sharding,
)
from tpu_inductor.runtime.call import CompiledGraph, Executables
from tpu_inductor.runtime.stacks import clear_stackers
from tpu_inductor.tpu import programs
from tpu_inductor.tpu.compile_only import TargetGraph
from tpu_inductor.tpu.targets import tpu_target

log = logging.getLogger(__name__)  # TORCH_LOGS="+tpu_inductor.dynamo.backend"

ENTRY_POINT_GROUP = "torch_dynamo_backends"
_graph_ids = itertools.count()


@our_errors_first
def tpu_backend(
    gm: fx.GraphModule,
    example_inputs: Sequence[Any],
    options: Mapping[str, Any] | None = None,
    mode: str | None = None,
):
    """Compile a Dynamo graph for the best JAX device (``torch.compile(backend="tpu")``).

    Args:
        gm: the torch-level FX graph Dynamo captured.
        example_inputs: its example inputs (FakeTensors, SymInts).
        options: ``torch.compile(..., options={...})``; see
        every knob of :func:`tpu_inductor.list_options` that ``per_compile`` allows.
        mode: ``torch.compile(..., mode=...)``: ``"default"``, ``"reduce-overhead"``,
            ``"max-autotune"`` or ``"max-autotune-no-cudagraphs"``; all compile the same way
            here (see :data:`tpu_inductor.dynamo.options.MODES` for why).

    Returns:
        A callable running the graph through JAX, forward and backward.

    Raises:
        InvalidOptionError: at the first call (the first graph: torch hands a backend its
            options no earlier), listing every bad option and an unknown mode.
        EagerRefusalError: ops eager refuses for their operands' dtypes (see refusals.py).

    Example:
        >>> model = torch.compile(torch.nn.Linear(4, 4), backend="tpu")
        >>> model(torch.randn(2, 4)).shape
        torch.Size([2, 4])
    """
    dynamo_s = stages.dynamo_seconds()  # before any of our work
    opts = parse_options(options, mode)
    configure_logging()
    optimizers.quiet_profiler_note()  # before a compiled opt.step is traced
    with config.scope(opts):  # every stage reads this compile's knobs (core/config.py)
        return _compile_frame(gm, example_inputs, opts, dynamo_s)


def _compile_frame(gm: fx.GraphModule, example_inputs: Sequence[Any], opts: Options, dynamo_s):
    """:func:`tpu_backend`'s work, inside its options' scope."""
    refusals.check_graph(gm)  # what eager's kernels refuse and fake tensors let through
    breaks.restart_to_join_step(gm)  # opt.step() joins this frame's program (may restart)
    if opts.scan_layers:  # repeated layers traced once (may restart)
        regions.restart_to_mark_layers(gm, breaks.current_tx())
    breaks.report_graph_break(gm)
    breaks.refuse_split_step(gm)  # a compile_step that breaks runs in parts (may raise)
    breaks.join_optimizer_step()
    # compiling for a target reads no data: meta tensors are fine (their CPU stand-ins are held
    # here, as the fake mode keeps them only weakly, until AOTAutograd has traced)
    cpu_fakes = (
        trace_meta_as_cpu(gm, example_inputs) if opts.target else check_inputs(gm, example_inputs)
    )
    frame = hints.frame_graph(gm, example_inputs, _input_name)
    optimizers.hint_float_hyperparameters(gm, example_inputs)
    plan = plan_of(opts)
    if plan is not None:
        device = plan.mesh.devices.flat[0]
        sharding.place_graph(plan, gm, example_inputs)
    elif opts.target is not None:
        device = tpu_target(opts.target).devices[0]
    else:
        device = select_device(opts.device)
    if platform_of(device) == "tpu":
        check_input_dtypes(gm, example_inputs)
    entry = None
    if opts.cache_dir:
        cache.enable_persistent_cache(opts.cache_dir)
        entry, warm = _saved_programs(gm, example_inputs, opts, device, dynamo_s)
        if warm is not None:
            return warm
    direct: list[CompiledGraph] = []
    built: list[Executables] = []  # the programs of this graph, for the report's stage times
    aot_start = time.perf_counter()
    with regions.cached_subgraph_schemas():
        aot_compiled = _aot_backend(
            opts, device, entry, len(example_inputs), direct, frame, built, gm
        )(gm, example_inputs)
    _attribute_stages(built, dynamo_s, time.perf_counter() - aot_start)
    del cpu_fakes
    if direct:
        # AOTAutograd's runtime wrapper would only pass arguments through: Dynamo calls the
        # executable's runtime directly, a layer less per call (measured: python -m
        # benchmarks.profile_overhead).
        return direct[0].call_unboxed
    return aot_compiled


def _saved_programs(gm, example_inputs, opts: Options, device, dynamo_s: float):
    """``(entry, warm)``: the graph's programs saved in ``cache_dir`` (``warm``, a callable,
    when a previous process saved them), else the :class:`program_store.Entry` its compile
    records into (``None`` when the graph can't be kept: a sharding plan, a TPU target, shape
    buckets, inputs that are not plain static tensors)."""
    if opts.target is not None or opts.mesh is not None or opts.pad_to:
        return None, None
    precision = opts.matmul_precision or torch.get_float32_matmul_precision()
    fingerprint = program_fingerprint(opts, device, precision, custom_ops.fingerprint())
    key = program_store.key_for(gm, example_inputs, fingerprint)
    if key is None:
        return None, None
    warm = program_store.load(opts.cache_dir, key, fingerprint, device, gm)
    if warm is None:
        return program_store.Entry(opts.cache_dir, key, fingerprint), None
    first = warm.graph if isinstance(warm, program_store.WarmInference) else warm.forward
    first.exes.stats.frame = FrameStages(dynamo=dynamo_s, load=warm.load_seconds)
    first.exes.stats.frame_owner = True
    return None, warm


def _attribute_stages(built: list, dynamo_s: float, aot_and_lower_s: float) -> None:
    """Give the programs of one Dynamo graph its Dynamo and AOTAutograd seconds (our lowering,
    done inside AOTAutograd's call, is each program's own ``lower_seconds``)."""
    if not built:
        return
    lowering = sum(e.lower_seconds for e in {id(e): e for e in built}.values())
    frame = FrameStages(dynamo=dynamo_s, aot=max(0.0, aot_and_lower_s - lowering))
    for e in built:
        if e.stats.frame is None:  # a program reused from the in-memory cache keeps its own
            e.stats.frame = frame
    if built[0].stats.frame is frame:
        built[0].stats.frame_owner = True


def check_inputs(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> None:
    """Raise one :class:`UnsupportedInputError` naming every meta-device input.

    Dynamo hands real (not fake) example inputs to the backend, so a ``device="meta"`` tensor
    (a model built under ``torch.device("meta")``, or before ``to_empty``) is visible here, at
    compile time, before anything reaches JAX. The runtime's input path (``runtime/call.py``) would
    otherwise fail converting it with torch's "Cannot copy out of meta tensor".
    """
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    bad = []
    for i, t in enumerate(example_inputs):
        if isinstance(t, torch.Tensor) and t.device.type == "meta":
            bad.append(f"{_input_name(placeholders, i)}: {describe_value(t)} on device 'meta'")
    if bad:
        raise UnsupportedInputError(
            "these inputs of the compiled region are meta tensors, which hold no data to "
            "compute with:\n  - " + "\n  - ".join(bad) + "\nWhat to do: give them data on the "
            "CPU before calling the compiled model (module.to_empty(device='cpu') and then "
            "load_state_dict or re-initialize; torch.empty_like(t, device='cpu') for a "
            "tensor). To compute only output shapes, call the model without torch.compile: "
            "eager torch runs meta tensors."
        )


def module_path(source_name: str) -> str:
    """``model.layers.0.mlp.up_proj.weight`` for Dynamo's source name of a graph input
    (``L['args'][0]._modules['model']..._parameters['weight']``, ``G['lin']._parameters['bias']``,
    ``L['x']``): a parameter or buffer by its module path, another input by its name."""
    path = re.sub(r"\._(?:modules|parameters|buffers)\['([^']+)'\]", r".\1", source_name)
    path = re.sub(r"^L\['(?:self|fn)'\](?=\.)|^L\['args'\]\[0\](?=\.)", "", path)
    path = re.sub(r"^[LG]\['([^']+)'\]", r"\1", path)
    return path.lstrip(".")


def check_input_dtypes(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> None:
    """Raise one :class:`UnsupportedDtypeError` naming, by module path, every input of a graph
    for a TPU (parameters, buffers, arguments) that is float64 or complex128, before torch's
    tracing renames them ``primals_N``."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    bad = [
        f"{module_path(_input_name(placeholders, i))}: {describe_value(t)}"
        for i, t in enumerate(example_inputs)
        if isinstance(t, torch.Tensor) and t.dtype in TPU_UNSUPPORTED
    ]
    reject_tpu_64bit(bad, "these inputs of the compiled region")


def trace_meta_as_cpu(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> list:
    """Let AOTAutograd trace the ``meta`` tensors of a compile-only graph as the CPU tensors
    they stand for.

    Ops pick their kernel or decomposition by device (SDPA: the CPU flash kernel on ``cpu``, its
    math form on ``meta``), so a model built on ``meta`` would otherwise compile to another
    program than the same model with real weights. Each such input's fake (what AOTAutograd
    finds for it in Dynamo's fake mode) is replaced by one of the same shape, strides and dtype
    on the CPU, whose dispatch keys are the CPU's, and every ``device="meta"`` argument Dynamo
    wrote into the graph (``torch.arange(n, device=x.device)``) says ``cpu``. Nothing is read
    or allocated. Inputs with symbolic sizes keep their fakes (dynamic shapes on meta trace as
    meta).

    Returns:
        The new fakes: the fake mode's memo holds them weakly, so the caller keeps them alive
        until AOTAutograd has traced.
    """
    from torch._subclasses.fake_tensor import FakeTensor

    ctx = torch._guards.TracingContext.try_get()
    fake_mode = getattr(ctx, "fake_mode", None)
    made: list = []
    if fake_mode is None:
        return made
    converter = fake_mode.fake_tensor_converter
    cpu = torch.device("cpu")

    def stand_in(t: torch.Tensor):
        old = converter._get_memo(t)
        if old is not None and old.device == cpu:
            return old
        if old is not None and any(
            not isinstance(d, int) for d in (*old.shape, *old.stride())
        ):  # symbolic sizes: keep Dynamo's fake
            return None
        elem = torch.empty_strided(tuple(t.shape), tuple(t.stride()), dtype=t.dtype, device="meta")
        new = FakeTensor(fake_mode, elem, cpu)
        if t.requires_grad:
            new.requires_grad_(True)
        grad = t.grad if t.is_leaf else None
        if grad is not None and grad.device.type == "meta":
            fake_grad = stand_in(grad)
            if fake_grad is not None:
                new.grad = fake_grad
        converter.set_tensor_memo(t, new)
        made.append(new)
        return new

    # the inputs, and the tensors Dynamo lifted into the graph (a compiled optimizer step's
    # parameters, whose .grad are inputs)
    lifted = [v for v in vars(gm).values() if isinstance(v, torch.Tensor)]
    for t in (*example_inputs, *gm.parameters(), *gm.buffers(), *lifted):
        if isinstance(t, torch.Tensor) and t.device.type == "meta":
            stand_in(t)
    if made:
        meta = torch.device("meta")

        def to_cpu(a):
            return cpu if isinstance(a, torch.device) and a == meta else a

        # the graph and its subgraphs (a scan_layers region's body, a checkpointed block)
        for sub in gm.modules():
            if isinstance(sub, fx.GraphModule):
                for node in sub.graph.nodes:
                    node.args = fx.node.map_aggregate(node.args, to_cpu)
                    node.kwargs = fx.node.map_aggregate(node.kwargs, to_cpu)
                sub.recompile()
    return made


_META_AS_CPU = threading.local()


@contextlib.contextmanager
def meta_fakes_as_cpu():
    """While active, Dynamo fakes every ``meta`` tensor it meets as a CPU tensor of the same
    shape, strides and dtype (its ``.grad`` too), so the whole function is traced as with real
    weights. :func:`trace_meta_as_cpu` does this for AOTAutograd only, after Dynamo has traced
    on ``meta``; a function that calls ``loss.backward()`` inside the compiled region
    (``compile_step``) is differentiated by Dynamo itself, and it must see CPU fakes: some ops
    (``nll_loss``) have no autograd kernel for ``meta`` fakes, so their gradients would be
    missing and the step would compile to a forward alone. Nothing is read or allocated: the
    fakes' storage is ``meta`` as always; only the device they report changes. Used around
    compile-only calls (``options["target"]``); thread-local and re-entrant.
    """
    from torch._subclasses.fake_tensor import FakeTensorConverter

    depth = getattr(_META_AS_CPU, "depth", 0)
    _META_AS_CPU.depth = depth + 1
    if depth == 0 and not getattr(FakeTensorConverter.from_real_tensor, "_tpu_meta_as_cpu", 0):
        FakeTensorConverter.from_real_tensor = _from_real_tensor_meta_as_cpu(
            FakeTensorConverter.from_real_tensor
        )
    try:
        yield
    finally:
        _META_AS_CPU.depth = depth


def _from_real_tensor_meta_as_cpu(original):
    meta, cpu = torch.device("meta"), torch.device("cpu")

    def as_cpu(a):
        return cpu if isinstance(a, torch.device | str) and torch.device(a) == meta else a

    @functools.wraps(original)
    def from_real_tensor(self, fake_mode, t, *args, **kwargs):
        if not getattr(_META_AS_CPU, "depth", 0) or t.device.type != "meta":
            return original(self, fake_mode, t, *args, **kwargs)
        inner = self.meta_converter

        def converter(tensor, *a, callback=None, **kw):
            def on_cpu(make, *cb_args, **cb_kwargs):
                cb_args = tuple(as_cpu(x) for x in cb_args)
                return callback(make, *cb_args, **{k: as_cpu(v) for k, v in cb_kwargs.items()})

            return inner(tensor, *a, callback=None if callback is None else on_cpu, **kw)

        self.meta_converter = _Delegate(inner, converter)
        try:
            return original(self, fake_mode, t, *args, **kwargs)
        finally:
            self.meta_converter = inner

    from_real_tensor._tpu_meta_as_cpu = 1
    return from_real_tensor


class _Delegate:
    """``inner`` with ``__call__`` replaced (its attributes, e.g. the memo, are ``inner``'s)."""

    def __init__(self, inner, call):
        self._inner, self._call = inner, call

    def __call__(self, *args, **kwargs):
        return self._call(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._inner, name)


def _input_name(placeholders: list[fx.Node], i: int) -> str:
    if i >= len(placeholders):
        return f"input {i}"
    node = placeholders[i]
    source = getattr(node.meta.get("grapharg"), "source", None)
    name = getattr(source, "name", None)
    if name is None:
        return node.name
    return name() if callable(name) else name


def _dump_graph(root: str, name: str, gm: fx.GraphModule) -> pathlib.Path:
    """Write ``gm``'s FX code and readable graph under ``root/name``; returns that folder."""
    folder = pathlib.Path(root) / name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "fx_graph.py").write_text(gm.code)
    (folder / "fx_graph.txt").write_text(gm.print_readable(print_output=False))
    return folder


def reset() -> None:
    """Forget every cached executable, device copy, the report's history, the counters and
    which hints were given, in every stage (``tpu_inductor.reset()``).

    The persistent cache on disk is left alone; call ``torch._dynamo.reset()`` too so Dynamo
    drops the compiled frames that use them.
    """
    device_eager.clear()
    hints.clear()
    cache.clear()
    transfers.TOTAL.reset()
    residency.VALUES.clear()
    clear_stackers()
    sharding.clear()
    programs.clear()
    optimizers.HINTED.clear()


def _on_dynamo_reset() -> None:
    """``torch._dynamo.reset()`` calls this (through ``torch.compile``'s backend wrapper).

    Dynamo's reset does not free every compiled function: the ``__compiled_fn_*`` global it
    puts in the module of each compiled frame (``transformers.utils.deprecation`` for a
    transformers model's ``forward``, ``torch.optim.adam`` for a compiled ``opt.step``) stays,
    holding AOTAutograd's functions and so our graphs. What a graph caches is dropped here: its
    device arrays (zero tangents), so deleted models leave none behind
    (tests/runtime/test_live_arrays.py), and its executables unless our in-memory cache still holds
    them for an identical graph (tests/runtime/test_boundary.py), since their JIT code maps would
    otherwise add up to Linux's per-process map limit
    (tests/runtime/test_live_arrays.py::test_reset_frees_executables); each is rebuilt if an old
    graph runs again.
    """
    for graph in list(cache.COMPILED):
        graph.release_caches(executables=not cache.is_cached(graph.exes))
    # Tensors Dynamo's leftover globals keep alive (a compiled opt.step's optimizer state) would
    # keep their device copies too: a copy of a host-current tensor is only a cache, so it goes
    # (crossing again on next use); a keep_on_device value pending on the device stays (it
    # would be synced to the host first anyway: tests/runtime/test_keep_on_device.py).
    residency.VALUES.forget_copies(device_owned.pending_array_ids())


def tpu_inductor_backend(
    gm: fx.GraphModule,
    example_inputs: Sequence[Any],
    options: Mapping[str, Any] | None = None,
    mode: str | None = None,
):
    """The same backend under the name ``"tpu_inductor"``, which no other package claims.

    If another package owns the name ``"tpu"`` (TorchTPU registers one too), this warns once
    so the user knows which backend ``"tpu"`` reaches. ``options`` and ``mode`` are as for
    :func:`tpu_backend`.
    """
    _warn_if_tpu_name_taken()
    return tpu_backend(gm, example_inputs, options, mode)


def _tpu_entry_points() -> list:
    from importlib.metadata import entry_points

    return list(entry_points(group=ENTRY_POINT_GROUP, name="tpu"))


@functools.cache
def _warn_if_tpu_name_taken() -> None:
    others = [ep for ep in _tpu_entry_points() if not _is_ours(ep.value)]
    if others:
        owners = ", ".join(f"{ep.value} ({getattr(ep.dist, 'name', '?')})" for ep in others)
        warnings.warn(
            f"another package also registers the torch.compile backend 'tpu': {owners}. "
            "Use backend='tpu_inductor' to be sure to get tpu-inductor.",
            stacklevel=3,
        )


def _is_ours(value: str) -> bool:
    return value.startswith("tpu_inductor.")


def _config_key(opts: Options, device: jax.Device, plan) -> tuple:
    """Everything besides the graph that changes what a graph compiles to: every knob that
    changes programs (core/config.py), the sharding plan parsed from ``opts`` (``plan``), and
    two knobs that shape the graph's runtime object."""
    precision = opts.matmul_precision or torch.get_float32_matmul_precision()
    return (
        config.program_key(opts),
        precision,
        opts.max_executables,
        opts.transfers,
        str(device),  # compile-only devices that print alike differ by target (program_key)
        custom_ops.fingerprint(),  # lowerings users registered (a replaced one is a new key)
        None if plan is None else plan.key(),
    )


def _aot_backend(
    opts: Options,
    device: jax.Device,
    entry: program_store.Entry | None,
    n_inputs: int,
    direct: list[CompiledGraph],
    frame: hints.FrameGraph | None = None,
    built: list | None = None,
    dynamo_gm: fx.GraphModule | None = None,
):
    """AOTAutograd with our compilers. An inference graph AOTAutograd passes through unchanged
    is appended to ``direct``. ``entry``: where the programs are recorded for later processes
    (``cache_dir``). ``frame``: the Dynamo graph's record for recompile hints (its forward's
    executables count its calls, and name its inputs)."""

    forward: list[CompiledGraph] = []
    # AOTAutograd puts the Dynamo graph's own parameters and buffers first (an optimizer step's)
    lifted = len(program_store.lifted_inputs(dynamo_gm)) if dynamo_gm is not None else 0

    def compiler(kind: GraphKind):
        def compile_fn(gm: fx.GraphModule, example_inputs: Sequence[Any]):
            static = capture.static_input_positions() if kind is not GraphKind.BACKWARD else ()
            compiled = compile_graph(gm, opts, device, kind=kind, static_positions=static)
            inner = getattr(compiled, "compiled", compiled)  # a PaddedGraph wraps one
            exes = getattr(inner, "exes", None)
            if built is not None:
                built.extend([exes] if exes is not None else getattr(compiled, "island_exes", []))
            if kind is not GraphKind.BACKWARD and frame is not None and exes is not None:
                hints.attach(frame, exes)
                n = sum(1 for node in gm.graph.nodes if node.op == "placeholder")
                if n >= len(frame.names):  # effect tokens come first
                    exes.stats.input_names = [None] * (n - len(frame.names)) + frame.names
            if kind is GraphKind.FORWARD:
                capture.never_donate_backward_buffers()
                if isinstance(compiled, CompiledGraph):
                    forward.append(compiled)
            if kind is GraphKind.BACKWARD and isinstance(compiled, CompiledGraph) and forward:
                compiled.forward = forward[-1]  # a lazy forward makes its backward lazy
            if (
                kind is GraphKind.INFERENCE
                and isinstance(compiled, CompiledGraph)
                and capture.passes_through(compiled.lowered, n_inputs)
            ):
                direct.append(compiled)
            if entry is not None:
                _record(entry, kind, compiled, static, n_inputs + lifted)
            return compiled

        return compile_fn

    return capture.aot_backend(
        compiler(GraphKind.FORWARD),
        compiler(GraphKind.BACKWARD),
        compiler(GraphKind.INFERENCE),
        platform_of(device),
    )


def _record(entry: program_store.Entry, kind: GraphKind, compiled, static, n_inputs: int) -> None:
    """Note one of a Dynamo graph's programs in its ``cache_dir`` entry, or why the graph can't
    be kept (``capture.runtime_convention``)."""
    if not isinstance(compiled, CompiledGraph):
        entry.refuse("ops of it run in eager or it is padded to buckets")
        return
    low = compiled.lowered
    if kind is not GraphKind.BACKWARD:
        convention = capture.runtime_convention(kind, low, n_inputs)
        if isinstance(convention, str):
            entry.refuse(convention)
            return
        entry.runtime = convention
    elif entry.runtime is not None:
        wanted = sum(entry.runtime["output_requires_grad"])
        saved = entry.runtime["saved_with_version_check"]
        saved += entry.runtime["saved_without_version_check"]
        if len(low.tangent_inputs) != wanted or len(low.input_metas) != saved + wanted:
            entry.refuse(
                "its backward takes other inputs than the forward saves "
                f"({len(low.input_metas)} inputs, {len(low.tangent_inputs)} tangents; "
                f"{saved} saved, {wanted} outputs need a gradient)"
            )
            return
    entry.add(
        kind,
        compiled,
        static_positions=sorted(compiled._static_positions),
        saved_outputs=sorted(compiled._saved),
        bumped=sorted(compiled._bumped),
        backward=compiled._backward,
        donate_inputs=sorted(compiled.exes.donated),
    )


def compile_graph(
    gm: fx.GraphModule,
    opts: Options,
    device: jax.Device,
    *,
    kind: GraphKind = GraphKind.INFERENCE,
    island: bool = False,
    static_positions: Sequence[int] = (),
) -> CompiledGraph:
    """Lower one functional ATen graph and wrap it for AOTAutograd.

    Args:
        gm: the ATen graph from AOTAutograd.
        opts: validated options.
        device: the JAX device to run on.
        kind: which of AOTAutograd's compilers the graph reached.
        island: the graph is a piece of one whose other ops run in eager (``fallback``).
        static_positions: inputs that are parameters/buffers, kept resident on the device.

    Returns:
        A boxed callable taking and returning torch tensors (saved activations of a training
        forward stay on the device behind placeholders; see ``CompiledGraph``).
    """
    with config.scope(opts):  # a backward compiles lazily, outside tpu_backend's scope
        return _compile_graph(gm, opts, device, kind, island, static_positions)


def _compile_graph(
    gm, opts: Options, device, kind: GraphKind, island: bool, static_positions
) -> CompiledGraph:
    for module in gm.modules():  # torch's NaN at lr == 0 (optimizers.py), subgraphs too
        if isinstance(module, fx.GraphModule):
            optimizers.repair_capturable_adam(module)
    if opts.fallback == "eager" and any(
        n.op == "call_function" and not is_lowerable(n) for n in gm.graph.nodes
    ):
        return _with_fallback(gm, opts, device, kind)
    start = time.perf_counter()
    platform = platform_of(device)
    check_dtypes(gm, platform)
    precision = opts.matmul_precision or torch.get_float32_matmul_precision()
    options = compiler_options(platform, kind)
    plan = plan_of(opts)
    key = cache.graph_key(gm, (_config_key(opts, device, plan), tuple(sorted(options.items()))))
    n_outputs = len(next(n for n in reversed(gm.graph.nodes) if n.op == "output").args[0])
    whole_forward = kind is GraphKind.FORWARD and not island
    saved = capture.saved_output_positions(n_outputs) if whole_forward else ()
    n_inputs = sum(1 for n in gm.graph.nodes if n.op == "placeholder")
    whole_backward = kind is GraphKind.BACKWARD and not island
    bumped = capture.bumped_mutation_inputs(n_inputs) if not whole_backward else frozenset()

    def create():
        t0 = time.perf_counter()
        lowered = lower_graph(
            gm,
            precision=precision,
            check_meta=opts.check_meta,
            platform=platform,
            scan_layers=opts.scan_layers,
        )
        # named by what it does (compile_step's program: "training-step"), not by AOTAutograd's
        # kind ("inference" for any graph it does not split)
        name = f"graph{next(_graph_ids)}-{programs.role_of(gm, kind, island).replace(' ', '-')}"
        dump = _dump_graph(opts.dump_dir, name, gm) if opts.dump_dir else None
        # Donate on accelerators only: on CPU a donated buffer may be a user's tensor memory.
        donating = platform != "cpu" or opts.donate_on_cpu
        donate = [m.input_index for m in lowered.mutations] if donating else []
        return Executables(
            lowered,
            opts.max_executables,
            name,
            dump,
            time.perf_counter() - t0,
            options,
            transfers=opts.transfers,
            donate=donate,
            plan=plan,
            platform=platform,
        )

    exes = cache.get_or_create(key, create)
    if opts.target is not None:
        role = programs.role_of(gm, kind, island)
        compiled = TargetGraph(exes, tpu_target(opts.target), kind.label(island), role, plan)
        cache.COMPILED.add(compiled)
        log.info("%s: %s graph for %s (compile only)", exes.name, kind.label(island), opts.target)
        return compiled
    compiled = CompiledGraph(
        exes,
        device,
        kind.label(island),
        static_positions=static_positions,
        saved_outputs=saved,
        bumped=bumped,
        backward=kind is GraphKind.BACKWARD,
        plan=plan,
    )
    cache.COMPILED.add(compiled)
    if opts.pad_to and buckets.can_pad(compiled):
        compiled = buckets.PaddedGraph(compiled, opts.pad_to, gm)
    log.info(
        "%s: %s graph, %d nodes, lowered in %.1f ms",
        exes.name,
        kind.label(island),
        len(gm.graph.nodes),
        (time.perf_counter() - start) * 1e3,
    )
    return compiled


def _with_fallback(gm: fx.GraphModule, opts: Options, device: jax.Device, kind: GraphKind):
    def describe(n: fx.Node) -> str:
        reason = why_unsupported(n)
        why = f"\n      not lowered: {reason}" if reason else ""
        return f"{describe_node(n)}\n      at {user_frame(n)}{why}"

    cache.FALLBACK_OPS.extend(
        describe(n) for n in gm.graph.nodes if n.op == "call_function" and not is_lowerable(n)
    )
    islands: list[CompiledGraph] = []

    def island(sub: fx.GraphModule) -> CompiledGraph:
        islands.append(compile_graph(sub, opts, device, kind=kind, island=True))
        return islands[-1]

    fused = split_for_fallback(gm, is_lowerable, island, describe)

    def run(args: list) -> list:
        outs = fused(*args)
        args.clear()
        return list(outs)

    run._boxed_call = True
    # for the report's stage seconds (a PaddedGraph wraps its CompiledGraph)
    run.island_exes = [getattr(c, "compiled", c).exes for c in islands]
    return run


tpu_backend.reset = _on_dynamo_reset  # type: ignore[attr-defined]
tpu_inductor_backend.reset = _on_dynamo_reset  # type: ignore[attr-defined]

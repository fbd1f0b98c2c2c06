"""Repeated layers traced once: with ``scan_layers``, each layer of a stack is a nested compile
region.

Unmarked, AOTAutograd traces a 32-layer model's 32 copies of a layer's ops, the lowering walks
them all and XLA compiles them all: compile time grows with depth. With
``options={"scan_layers": True}`` each run of alike layers of a model (children of one
``nn.ModuleList`` or ``nn.Sequential``: same class, same submodule classes, same parameters and
buffers by name, shape, dtype and ``requires_grad``, same training mode) has its ``forward``
marked, on the instance, with ``torch.compiler.nested_compile_region``. Dynamo traces each
layer's body into a subgraph and, where two bodies are the same graph, keeps one subgraph that
every such layer calls (``invoke_subgraph``); AOTAutograd traces that subgraph's forward and
backward once, the lowering lowers it once (``lowerings/subgraphs.py``) and a run of calls
becomes one ``lax.scan`` (``scan_layers.plan_subgraph_scans``). Eager calls are unchanged: a
region calls ``forward``.

Dynamo itself still traces every layer: it can reuse one layer's trace for the next, but in
torch 2.13 that reuse trusts guards that can miss what two layers differ in (found: an
``nn.Sequential`` stack of Linear+Tanh and Linear+GELU layers, whose third layer reused the
second's trace, Tanh and weights included, without an error). A marked layer's result is
therefore handed back with a ``None`` beside it, which Dynamo never reuses; the optimizer's
per-layer regions (``optimizers.group_updates_by_layer``) take every tensor as an argument and
are reused.

Where marking happens: ``compile_step`` marks the layers of the models its function reaches
(closure, named globals, ``self`` and its attributes) before the first trace, and unmarks them
if Dynamo cannot trace a layer whole (a graph break inside it); a plain ``torch.compile(model)``
marks them when the backend first sees a whole graph of them and has Dynamo trace the frame
again (one restart). Layers stay marked (Dynamo's guards read the instance's ``forward``);
layers that do not match their neighbours are left as they are, with the reason on the
``tpu_inductor.dynamo.regions`` logger.
"""

from __future__ import annotations

import logging
import types
import weakref
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

log = logging.getLogger(__name__)  # TORCH_LOGS="+tpu_inductor.dynamo.regions"

_INNER = "_tpu_inductor_inner_forward"  # an instance forward the region calls (checkpointing)
_REGIONS: dict[type, Any] = {}  # layer class -> its marked forward (one object: guards hold)
_MARKED: weakref.WeakSet = weakref.WeakSet()  # layers whose forward is a region


def layer_runs(root: nn.Module) -> list[list[tuple[str, nn.Module]]]:
    """The runs of alike consecutive layers of ``root`` (at least two each), outermost first:
    children of an ``nn.ModuleList`` or ``nn.Sequential`` with the same class, parameters,
    buffers and training mode. A stack inside a layer of a run is not a run of its own."""
    runs: list[list[tuple[str, nn.Module]]] = []
    inside: set[int] = set()
    for name, module in root.named_modules():
        if id(module) in inside or not isinstance(module, nn.ModuleList | nn.Sequential):
            continue
        children = list(module.named_children())
        run: list[tuple[str, nn.Module]] = []
        for child_name, child in children:
            path = f"{name}.{child_name}" if name else child_name
            if run and _signature(run[-1][1]) != _signature(child):
                why = _differs(run[-1][1], child)
                log.info("scan_layers: %s differs from %s (%s): not one run", path, run[-1][0], why)
                _close(run, runs, inside)
                run = []
            run.append((path, child))
        _close(run, runs, inside)
    return runs


def _close(run: list, runs: list, inside: set) -> None:
    if len(run) < 2:
        return
    subclass = next(
        (type(t).__name__ for _, layer in run for t in _tensors(layer) if _is_subclass(t)), None
    )
    if subclass is not None:  # keep_on_device's DeviceTensor: not marked, scanned unmarked
        log.info(
            "scan_layers: %s..%s are not marked: their parameters are %s, a tensor subclass "
            "torch 2.13's invoke_subgraph cannot take",
            run[0][0],
            run[-1][0],
            subclass,
        )
        return
    runs.append(run)
    for _, layer in run:
        inside.update(id(m) for m in layer.modules())


def _tensors(layer: nn.Module) -> list:
    return [*layer.parameters(), *layer.buffers()]


def _is_subclass(t: torch.Tensor) -> bool:
    return type(t) not in (torch.Tensor, nn.Parameter, nn.Buffer) and not isinstance(
        t, torch._subclasses.FakeTensor
    )


def _signature(layer: nn.Module) -> tuple:
    """What two layers of one run share: classes, training mode, parameters and buffers."""
    modules = tuple((n, type(m)) for n, m in layer.named_modules())
    tensors = [(n, tuple(p.shape), p.dtype, p.requires_grad) for n, p in layer.named_parameters()]
    tensors += [(n, tuple(b.shape), b.dtype) for n, b in layer.named_buffers()]
    return (modules, layer.training, tuple(tensors))


def _differs(a: nn.Module, b: nn.Module) -> str:
    if type(a) is not type(b):
        return f"{type(b).__name__}, not {type(a).__name__}"
    mine, theirs = dict(a.named_modules()), dict(b.named_modules())
    for name in dict.fromkeys([*mine, *theirs]):
        old, new = type(mine.get(name)).__name__, type(theirs.get(name)).__name__
        if old != new:
            return f"its {name} is {new}, not {old}"
    if a.training != b.training:
        return "another training mode"
    return "other parameters or buffers (names, shapes, dtypes or requires_grad)"


def mark_layers(roots: Iterable[nn.Module]) -> int:
    """Mark every run of alike layers of each module in ``roots`` (see the module docstring).

    Returns:
        How many layers were newly marked (0 when all of them already were).
    """
    marked = 0
    for root in roots:
        for run in layer_runs(root):
            for _, layer in run:
                if layer in _MARKED:
                    continue
                _mark(layer)
                marked += 1
            log.info(
                "scan_layers: %s..%s (%d x %s) marked as nested compile regions",
                run[0][0],
                run[-1][0].rsplit(".", 1)[-1],
                len(run),
                type(run[0][1]).__name__,
            )
    return marked


def marked_layers(roots: Iterable[nn.Module]) -> list[nn.Module]:
    """The marked layers of ``roots``, run by run in order."""
    return [
        layer for root in roots for run in layer_runs(root) for _, layer in run if is_marked(layer)
    ]


def unmark_layers(roots: Iterable[nn.Module]) -> int:
    """Undo :func:`mark_layers` for every layer of ``roots`` (a layer Dynamo cannot trace whole
    as a region: it breaks the graph inside). Returns how many layers were unmarked."""
    count = 0
    for root in roots:
        for layer in root.modules():
            if layer not in _MARKED:
                continue
            own = layer.__dict__.pop(_INNER, None)
            layer.__dict__.pop("forward", None)
            if own is not None:
                layer.__dict__["forward"] = own
            _MARKED.discard(layer)
            count += 1
    return count


def _mark(layer: nn.Module) -> None:
    own = layer.__dict__.get("forward")
    if own is not None:  # e.g. activation checkpointing's wrapper: the region calls it
        layer.__dict__[_INNER] = own
    layer.__dict__["forward"] = types.MethodType(_region(type(layer)), layer)
    _MARKED.add(layer)


def _region(cls: type) -> Any:
    """The one marked ``forward`` of a layer class (the same object for every layer, so
    Dynamo's guards on it hold from call to call)."""
    region = _REGIONS.get(cls)
    if region is None:

        def body(self, *args, **kwargs):
            inner = self.__dict__.get(_INNER)
            out = (
                inner(*args, **kwargs) if inner is not None else cls.forward(self, *args, **kwargs)
            )
            # NOTE: a result that is not only tensors makes Dynamo trace every layer (no reuse
            # of an earlier layer's trace: torch 2.13 reuses one on guards that miss what the
            # layers differ in, see the module docstring); equal traces still share one
            # subgraph, which AOTAutograd traces once.
            return out, None

        marked = torch.compiler.nested_compile_region(body)

        def forward(self, *args, **kwargs):
            return marked(self, *args, **kwargs)[0]

        forward.__qualname__ = f"{cls.__qualname__}.forward"
        region = _REGIONS[cls] = forward
    return region


def is_marked(layer: nn.Module) -> bool:
    """Whether ``layer``'s forward is a nested compile region of ours."""
    return layer in _MARKED


def modules_reached(values: Iterable[Any]) -> list[nn.Module]:
    """The modules among ``values`` and inside their tuples, lists and dicts, the closure cells
    and named globals of the functions among them (their nested functions' too), and one
    attribute level of other objects (``self.model``), each once: where a compiled function's
    model is."""
    found: dict[int, nn.Module] = {}
    seen: set[int] = set()
    todo = list(values)
    while todo:
        v = todo.pop()
        if id(v) in seen or isinstance(v, types.ModuleType | type):
            continue
        seen.add(id(v))
        if isinstance(v, nn.Module):
            found.setdefault(id(v), v)
        elif isinstance(v, types.MethodType):
            todo += [v.__self__, v.__func__]
        elif isinstance(v, types.FunctionType):
            todo += _function_values(v)
        elif isinstance(v, tuple | list):  # a wrapper's *args
            todo += v
        elif isinstance(v, dict):  # its **kwargs
            todo += v.values()
        elif not isinstance(v, torch.Tensor | str | bytes | int | float | bool | type(None)):
            todo += [a for a in getattr(v, "__dict__", {}).values() if isinstance(a, nn.Module)]
    # a model's own submodules are not roots of their own
    inner = {id(m) for root in found.values() for m in root.modules() if m is not root}
    return [m for k, m in found.items() if k not in inner]


def _function_values(fn: types.FunctionType) -> list:
    values = []
    for cell in fn.__closure__ or ():
        try:
            values.append(cell.cell_contents)
        except ValueError:  # an empty cell
            pass
    wrapped = getattr(fn, "__wrapped__", None)
    if wrapped is not None:
        values.append(wrapped)
    codes = [fn.__code__]
    while codes:
        code = codes.pop()
        values += [fn.__globals__[n] for n in code.co_names if n in fn.__globals__]
        codes += [c for c in code.co_consts if isinstance(c, types.CodeType)]
    return values


_RESTARTED: weakref.WeakSet = weakref.WeakSet()  # roots a restart marked (never twice)


def restart_to_mark_layers(gm: torch.fx.GraphModule, tx: Any) -> None:
    """With ``scan_layers``, when the frame Dynamo traced reaches a model whose runs of layers
    are not marked yet (``torch.compile(model)``'s first graph), mark them and have Dynamo trace
    the frame again (raises ``TensorifyScalarRestartAnalysis``), so the layers are traced once.
    Returns without doing anything otherwise (and never twice for one model)."""
    speculation = getattr(tx, "speculation_log", None)
    if tx is None or speculation is None or not hasattr(speculation, "clear"):
        return
    values = list(getattr(tx, "f_locals", {}).values())
    f_globals = getattr(tx, "f_globals", {})
    values += [f_globals[n] for n in tx.f_code.co_names if n in f_globals]
    roots = [m for m in modules_reached(values) if m not in _RESTARTED]
    reason = getattr(gm, "compile_subgraph_reason", None)
    if getattr(reason, "graph_break", False):
        return  # a frame traced in parts: a marked layer might be where it breaks
    paths = _graph_module_paths(gm)
    todo = [r for r in roots if any(_traced(run, paths) for run in layer_runs(r))]
    if not todo:
        return
    _RESTARTED.update(todo)
    if not mark_layers(todo):
        return
    log.info("scan_layers: Dynamo traces %s again with its layers marked", tx.f_code.co_name)
    speculation.clear()
    from torch._dynamo.exc import TensorifyScalarRestartAnalysis

    raise TensorifyScalarRestartAnalysis(restart_reason="tpu-inductor marked repeated layers")


def _graph_module_paths(gm: torch.fx.GraphModule) -> set[str]:
    """Every module path the graph's nodes name (``nn_module_stack``), as Dynamo writes it."""
    paths: set[str] = set()
    for node in gm.graph.nodes:
        for entry in (node.meta.get("nn_module_stack") or {}).values():
            paths.add(str(entry[0] if isinstance(entry, tuple | list) else entry))
    return paths


def _traced(run: list[tuple[str, nn.Module]], paths: set[str]) -> bool:
    """Whether the graph traced the run's layers unmarked (their paths appear in it)."""
    if all(is_marked(layer) for _, layer in run):
        return False
    names = [name for name, _ in run[:2]]
    return all(any(p == n or p.endswith("." + n) for p in paths) for n in names)


class cached_subgraph_schemas:
    """While active, ``invoke_subgraph``'s schema (which inputs a layer's subgraph reads,
    writes or aliases) is worked out once per subgraph and operand layout, not at every call.

    Why: torch 2.13 works it out (``InvokeSubgraphHOP.gen_schema``: the subgraph traced again
    with ``materialize_as_graph``) for every call AOTAutograd traces with gradients on, to refuse
    in-place updates in training, so each layer's call would cost a trace of its layer again,
    a large share of a deep model's compile (measured: ``python -m benchmarks.first_step``).
    The schema depends
    on the subgraph and on its operands' types, shapes, strides, dtypes, devices,
    ``requires_grad`` and which operands are the same tensor, which the key holds. Scope: one
    method of torch's class, for the duration of the backend's AOTAutograd call.
    """

    def __enter__(self):
        self.saved = None
        try:
            from torch._higher_order_ops.invoke_subgraph import InvokeSubgraphHOP
        except ImportError:
            return self
        original = InvokeSubgraphHOP.__dict__.get("gen_schema")
        if original is None or getattr(original, "_tpu_inductor", False):
            return self
        self.saved = (InvokeSubgraphHOP, original)
        InvokeSubgraphHOP.gen_schema = _cached_gen_schema(original)
        return self

    def __exit__(self, *exc):
        if self.saved is not None:
            cls, original = self.saved
            cls.gen_schema = original
        return False


def _cached_gen_schema(original):
    memo: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def gen_schema(self, subgraph, identifier, *operands):
        graph = getattr(subgraph, "subgraph", subgraph)  # a functionalization wrapper's graph
        try:
            per_graph = memo.setdefault(graph, {})
        except TypeError:  # not weak-referenceable: no cache
            return original(self, subgraph, identifier, *operands)
        key = (type(subgraph).__name__, identifier, _operand_layout(operands))
        schema = per_graph.get(key)
        if schema is None:
            schema = per_graph[key] = original(self, subgraph, identifier, *operands)
        return schema

    gen_schema._tpu_inductor = True
    return gen_schema


def _operand_layout(operands) -> tuple:
    first: dict[int, int] = {}
    out = []
    for i, t in enumerate(operands):
        if isinstance(t, torch.Tensor):
            same = first.setdefault(id(t), i)
            out.append(
                (
                    type(t).__name__,
                    str(tuple(t.shape)),
                    str(t.stride()),
                    t.dtype,
                    t.device.type,
                    t.requires_grad,
                    same,
                )
            )
        else:
            out.append(("value", type(t).__name__, repr(t)))
    return tuple(out)

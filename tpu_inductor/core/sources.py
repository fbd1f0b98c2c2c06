"""Where a graph node comes from: the user's source line, for errors and warnings.

Dynamo records each node's ``stack_trace``; nodes AOTAutograd makes without one (a
decomposition's cast, a symbolic float's arithmetic) borrow the nearest traced neighbour's.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re

import torch
import torch.fx as fx


def user_frame(node: fx.Node) -> str:
    """The user's source line for a node: the last frame of its stack trace or, for a node
    AOTAutograd made without one (a decomposition's cast, a symbolic float's arithmetic), of
    the nearest node that consumes it (then that it consumes) that has one. With none at all,
    what the node computes from: ``"from a symbolic size (... )"`` for arithmetic on the
    graph's symbolic sizes, else a note that torch's tracing made it."""
    trace = _nearest_trace(node)
    if not trace:
        return _untraced(node)
    lines = [ln.strip() for ln in trace.strip().splitlines() if ln.strip()]
    for i in range(len(lines) - 1, -1, -1):
        if lines[i].startswith("File "):
            code = (
                lines[i + 1] if i + 1 < len(lines) and not lines[i + 1].startswith("File ") else ""
            )
            return f"{lines[i]}: {code}" if code else lines[i]
    return lines[-1]


def _untraced(node) -> str:
    """Where a node with no stack trace near it comes from, in words."""
    symbols = set()
    if isinstance(node, fx.Node):
        for n in (node, *node.all_input_nodes):
            val = n.meta.get("val")
            vals = val.shape if isinstance(val, torch.Tensor) else [val]
            for v in vals:
                if isinstance(v, torch.SymInt | torch.SymFloat | torch.SymBool):
                    if v.node.maybe_as_int() is None if isinstance(v, torch.SymInt) else True:
                        symbols.update(str(x) for x in getattr(v.node.expr, "free_symbols", ()))
    if symbols:
        return f"from a symbolic size ({', '.join(sorted(symbols))}; no source line in the graph)"
    name = getattr(node, "name", node)
    return f"{name}, made by torch's tracing (no source line in the graph)"


def _nearest_trace(node) -> str | None:
    trace = getattr(node, "meta", {}).get("stack_trace")
    if trace or not isinstance(node, fx.Node):
        return trace
    for step in (lambda n: n.users, lambda n: n.all_input_nodes):
        seen, frontier = {node}, [node]
        while frontier:
            nxt = []
            for n in frontier:
                for m in step(n):
                    if m in seen or m.op == "output":
                        continue
                    if m.meta.get("stack_trace"):
                        return m.meta["stack_trace"]
                    seen.add(m)
                    nxt.append(m)
            frontier = nxt
    return None


# --- Provenance in the program: every lowered op names the user's module and line -------------

_FRAME = re.compile(r'File "(.+?)", line (\d+), in (\S+)')
_GLOBAL = re.compile(r"G\[['\"][^'\"]*['\"]\]\.\w+")
_ROOT = re.compile(r"^(?:L|G)\[['\"][^'\"]*['\"]\](?:\[\d+\])?\.?")


def source_location(node) -> tuple[str, int, str] | None:
    """``(file, line, function)`` of the user's code a node comes from (its stack trace's last
    frame, or its nearest traced neighbour's; for a backward node traced from ``backward()``,
    its forward op's), or ``None``."""
    trace = _nearest_trace(forward_twin(node) or node)
    frames = _FRAME.findall(trace) if trace else []
    if not frames:
        return None
    # our own wrappers (a checkpointed or region-marked layer's forward) are not the user's
    theirs = [f for f in frames if not f[0].startswith(_PACKAGE)] or frames
    file, line, function = theirs[-1]
    return file, int(line), function


_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def forward_twin(node) -> fx.Node | None:
    """The forward node whose module and source line a backward node is named by, where the
    graph traced ``backward()`` itself (``compile_step``) and the node carries no forward
    module of its own. ``None`` for a forward node, or a backward one that already carries its
    forward's module (AOTAutograd's own backward graphs).

    Autograd's number (``seq_nr``) joins a backward op to its forward op where each backward
    op got its own; where the trace gave one number to the whole backward (Dynamo traces
    ``loss.backward()`` as one ``autograd.grad``), the twin is found by data flow instead: the
    forward value of the deepest module the backward op reads (a saved activation), else the
    deepest forward op reading a graph input it reads (token ids), else the twin of the
    backward op it reads. NOTE: by data flow a weight's gradient is named by the
    module that made the activation it multiplies (``mlp`` for ``mlp.down_proj``'s weight).
    """
    meta = getattr(node, "meta", {})
    if not meta.get("autograd_backward") or meta.get("fwd_nn_module_stack"):
        return None
    if meta.get("nn_module_stack"):  # recomputed under checkpointing: its own module
        return None
    twins = getattr(node.graph, "_tpu_inductor_twins", None)
    if twins is None:
        twins = _twins(node.graph)
        node.graph._tpu_inductor_twins = twins
    return twins.get(node)


# A seq_nr shared by more backward ops than one forward op's backward makes names none.
_ONE_OP = 8


def _twins(graph: fx.Graph) -> dict:
    """``forward_twin`` of every backward node of ``graph`` that has one."""
    forward: dict = {}
    backward: dict = {}
    for n in graph.nodes:
        key = n.meta.get("seq_nr")
        if n.meta.get("autograd_backward"):
            backward.setdefault(key, []).append(n)
        elif n.meta.get("nn_module_stack"):
            forward.setdefault(key, []).append(n)
    twins: dict = {}
    for key, nodes in backward.items():
        found = forward.get(key, [])
        stacks = {tuple(map(str, f.meta["nn_module_stack"])) for f in found}
        if key is not None and len(nodes) <= _ONE_OP and len(stacks) == 1:
            twins.update((b, found[0]) for b in nodes)
    for n in graph.nodes:  # by data flow, in graph order: inputs are decided first
        if not n.meta.get("autograd_backward") or n in twins or n.meta.get("nn_module_stack"):
            continue
        reads = [a for a in n.all_input_nodes if a.op == "call_function"]
        made = [a for a in reads if a.meta.get("nn_module_stack")]
        if not made:  # a graph input it reads (token ids): the forward ops that read it too
            inputs = [a for a in n.all_input_nodes if a.op == "placeholder"]
            made = [u for a in inputs for u in a.users if u.meta.get("nn_module_stack")]
        made = [a for a in made if not a.meta.get("autograd_backward")]
        if made:
            twins[n] = max(made, key=lambda a: len(a.meta["nn_module_stack"]))
            continue
        inherited = [twins[a] for a in reads if a in twins]
        if inherited:
            twins[n] = max(inherited, key=lambda a: len(a.meta["nn_module_stack"]))
    return twins


# Attribute chains Dynamo records on the way to a module that name no module of their own:
# a closure's cell, a bound method's ``__self__`` (a wrapped forward's ``_inner`` default), an
# instance's ``__dict__``.
_NOT_MODULES = (
    re.compile(r"(?:^|\.)__closure__\.\d+\.cell_contents(?=\.|$)"),
    re.compile(r"\.\w+\.__kwdefaults__\.\w+\.__self__(?=\.|$)"),
    re.compile(r"\.\w+\.__self__(?=\.|$)"),
    re.compile(r"(?:^|\.)_orig_mod(?=\.|$)"),
    re.compile(r"(?:^|\.)__dict__(?=\.|$)"),
)


def _dotted(path) -> str:
    path = _ROOT.sub("", str(path))
    path = re.sub(r"\._modules\[['\"](\w+)['\"]\]", r".\1", path)
    path = re.sub(r"\[['\"]?(\w+)['\"]?\]", r".\1", path).strip(".")
    for pattern in _NOT_MODULES:
        path = pattern.sub("", path).strip(".")
    return path


def module_path(node) -> str | None:
    """The torch module a node comes from, as the outermost module's ``named_modules()``
    names it (``model.layers.3.mlp.down_proj`` in a ``LlamaForCausalLM``; the outermost
    module's class name for its own code): the innermost entry of Dynamo's
    ``nn_module_stack`` (``fwd_nn_module_stack``, or the forward twin's, for a backward
    node), relative to the outermost. ``None`` outside any module (a compiled function)."""
    twin = forward_twin(node)
    meta = getattr(twin if twin is not None else node, "meta", {})
    stack = meta.get("nn_module_stack") or meta.get("fwd_nn_module_stack")
    if not stack:
        return None
    entries = list(stack.values())
    path, cls = entries[-1][:2]
    path, root = _dotted(path), _dotted(entries[0][0])
    # a step function's global model variable (G['...'].model) is the stack's first entry:
    # its name is not one of the model's modules (a local's or torch.compile's own root,
    # L['...'], is dropped by _ROOT)
    variable = _GLOBAL.fullmatch(str(entries[0][0])) is not None
    if root and variable and (path == root or path.startswith(root + ".")):
        path = path[len(root) :].lstrip(".")
    if not path:
        cls = entries[-1][1]
        return getattr(cls, "__name__", None) or str(cls).rsplit(".", 1)[-1].strip("'>")
    return path


def run_path(first, last) -> str | None:
    """The modules of a run of repeated layers from its first and last node's
    :func:`module_path`: ``model.layers.0-31`` (``None`` when neither has one)."""
    a, b = module_path(first), module_path(last)
    if a is None or b is None or a == b:
        return a or b
    pa, pb = a.split("."), b.split(".")
    for i, (x, y) in enumerate(zip(pa, pb, strict=False)):
        if x != y:
            lo, hi = sorted((x, y), key=lambda v: (len(v), v))
            return ".".join(pa[:i] + [f"{lo}-{hi}"])
    return a


def scope_name(node) -> str:
    """The named scope a node's ops carry into the program: ``model.layers.3.mlp.down_proj/
    aten::mm`` (``backward/`` in front for a backward node), so an op in XLA's HLO or a TPU
    profile reads as the module and the ATen op it was lowered from, as torch's profiler names
    ops."""
    target = getattr(node, "target", None)
    name = getattr(target, "_schema", None)
    op = name.name if name is not None else (getattr(target, "__name__", None) or str(target))
    where = module_path(node)
    backward = "backward/" if getattr(node, "meta", {}).get("autograd_backward") else ""
    return f"{backward}{where}/{op}" if where else f"{backward}{op}"


@functools.cache
def _trampoline(file: str, line: int, function: str):
    """A function whose frame is ``file:line`` in ``function``: called while a node is traced,
    it hands JAX a traceback whose innermost frame is the user's line, which JAX writes into
    the program's op metadata (``stack_frame_id`` -> file, line) instead of ours."""
    from jax._src import source_info_util
    from jax._src.lib import xla_client

    if not source_info_util.is_user_filename(file):
        # JAX drops frames of installed packages (transformers' modeling code) as not the
        # user's; for a file the user's model lives in they are.
        source_info_util.register_inclusion(file)
    name = function if function.isidentifier() else "_at"
    code = "\n" * (line - 1) + f"def {name}(): return _traceback()\n"
    namespace = {"_traceback": xla_client.Traceback.get_traceback}
    exec(compile(code, file, "exec"), namespace)
    return namespace[name]


@functools.cache
def _exclude_ourselves() -> None:
    """JAX attributes an op to the innermost frame that is not its own; ours are not the user's
    either (process-wide, once, on the first lowering that carries a source line)."""
    import os

    from jax._src import source_info_util

    source_info_util.register_exclusion(os.path.dirname(os.path.abspath(__file__)) + os.sep)


@contextlib.contextmanager
def provenance(node, scope: str | None = None):
    """Trace a node's lowering under its :func:`scope_name` (or ``scope``) and with its user
    source line as JAX's current traceback, so both reach the compiled program's op
    metadata."""
    import jax
    from jax._src import source_info_util

    _exclude_ourselves()
    where = source_location(node)
    with jax.named_scope(scope or scope_name(node)):
        if where is None:
            yield
            return
        # What jax's user_context does, without its rewriting of exceptions that pass through
        # (our own errors name the user's line already).
        state = source_info_util._source_info_context
        previous = state.context
        state.context = previous.replace(traceback=_trampoline(*where)())
        try:
            yield
        finally:
            state.context = previous

"""Compiled optimizer steps: torch's capturable Adam repaired, and a hint for float
hyperparameters that change (learning-rate schedulers).

**Why Adam needs a repair.** Dynamo traces every compiled ``opt.step`` with ``capturable=True``
(``torch/_dynamo/variables/optimizer.py``, ``_set_capturable``, sets it in the traced program
whatever the group says) so that a tensor ``step`` never has to be read on the host; on CPU
tensors foreach is off, so Adam and AdamW run ``torch.optim.adam._single_tensor_adam``'s
capturable branch. To pass a tensor step size to ``addcdiv_`` (whose ``value`` must be a
number) that branch folds it into the denominator::

    step_size_neg = -(lr / bias_correction1)
    denom = (exp_avg_sq.sqrt() / (bias_correction2_sqrt * step_size_neg)).add_(eps / step_size_neg)
    param.addcdiv_(exp_avg, denom)

With ``lr == 0`` (the first step of every warmup schedule) ``step_size_neg`` is ``-0.0``, and
wherever ``exp_avg_sq`` is 0 (a gradient that has always been zero: embedding rows no batch
used, a padding row) ``0 / -0.0`` is NaN, which ``addcdiv_`` writes into the parameter; the
next forward is NaN everywhere. Eager's default branch computes
``param - step_size * exp_avg / (sqrt(exp_avg_sq) / bias_correction2_sqrt + eps)``: exactly
``param`` at ``lr == 0``. Any backend shows it (``backend="aot_eager"`` too); upstream it is
pytorch/pytorch#126514 (open; torch 2.13.0's ``adam.py`` still has the formula).
:func:`repair_capturable_adam` rewrites the ATen graph to the numerator form, as eager's::

    addcdiv(param, exp_avg * step_size_neg, exp_avg_sq.sqrt() / bias_correction2_sqrt + eps)

equal for every ``lr != 0`` up to rounding and ``param`` unchanged at ``lr == 0``. A graph that
still holds the capturable formula in a shape it does not recognize (another torch version)
logs a warning naming the bug instead of returning NaN silently.

**Why a hint for float hyperparameters.** A Python-float ``lr`` is a constant in the first
graph; when a scheduler changes it, Dynamo compiles the step again with the float as a 0-d
float64 tensor input (then never again). That costs one recompile, and float64 inputs are
refused on a TPU, so :func:`hint_float_hyperparameters` says once what to do: a tensor ``lr``
(``torch.optim.AdamW(params, lr=torch.tensor(1e-3))``; torch's schedulers ``fill_`` it).
"""

from __future__ import annotations

import logging
import re
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx as fx

from tpu_inductor.runtime import sharding

log = logging.getLogger(__name__)
# The logger that speaks without any logging set up (runtime/call.py: compile progress).
progress_log = logging.getLogger("tpu_inductor.progress")

aten = torch.ops.aten
_ADAM_FRAME = "_single_tensor_adam"
_ISSUE = "pytorch/pytorch#126514"


def repair_capturable_adam(gm: fx.GraphModule) -> int:
    """Rewrite torch's capturable single-tensor Adam/AdamW update so that ``lr == 0`` leaves
    the parameters unchanged instead of NaN (see the module docstring).

    Matches, on the ATen graph AOTAutograd hands a compiler::

        m = mul(c, s); d = div(q, m); e = mul(reciprocal(s), eps); den = add(d, e)
        addcdiv(p, a, den)

    with ``s`` one 0-d tensor (``step_size_neg``) and ``eps`` a number, and replaces the
    ``addcdiv`` by ``addcdiv(p, mul(a, s), add(div(q, c), eps))``. Nodes left without users
    are removed.

    Args:
        gm: a functional ATen graph; changed in place.

    Returns:
        The number of updates rewritten (one per parameter of a compiled Adam step).
    """
    graph = gm.graph
    rewritten = 0
    for node in list(graph.nodes):
        match = _match_adam_update(node)
        if match is None:
            continue
        p, a, q, c, s, eps, den = match
        with graph.inserting_before(node):
            scaled = _new(graph, aten.mul.Tensor, (a, s), like=node)
            corrected = _new(graph, aten.div.Tensor, (q, c), like=den)
            denom = _new(graph, aten.add.Tensor, (corrected, eps), like=den)
        node.args = (p, scaled, denom)
        rewritten += 1
    if rewritten:
        _drop_dead(graph)
        gm.recompile()
        log.debug("capturable Adam: %d parameter updates rewritten (%s)", rewritten, _ISSUE)
    leftover = _unrepaired_adam_nodes(graph)
    if leftover:
        progress_log.warning(
            "tpu-inductor: this compiled optimizer step holds torch's capturable Adam update "
            "(%s) in a form tpu-inductor does not recognize: with lr == 0 (the first step of "
            "a warmup schedule) every parameter whose gradient has been zero becomes NaN "
            "(torch bug %s, also with backend='aot_eager'). What to do: build the optimizer "
            "with foreach=True (that branch adds eps before dividing), or run opt.step() "
            "uncompiled.",
            leftover,
            _ISSUE,
        )
    return rewritten


def _match_adam_update(node: fx.Node):
    """``(p, a, q, c, s, eps, den)`` when ``node`` is the capturable Adam ``addcdiv``."""
    if node.op != "call_function" or node.target is not aten.addcdiv.default:
        return None
    if len(node.args) != 3 or node.kwargs.get("value", 1) != 1:
        return None
    p, a, den = node.args
    if not _is(den, aten.add.Tensor, 2) or den.kwargs.get("alpha", 1) != 1:
        return None
    d, e = den.args
    if not (_is(d, aten.div.Tensor, 2) and _is(e, aten.mul.Tensor, 2)):
        return None
    q, m = d.args
    r, eps = e.args
    if not (_is(r, aten.reciprocal.default, 1) and isinstance(eps, int | float)):
        return None
    s = r.args[0]
    if not (_is(m, aten.mul.Tensor, 2) and s in m.args and _zero_dim(s)):
        return None
    c = m.args[1] if m.args[0] is s else m.args[0]
    if not isinstance(c, fx.Node):
        return None
    return p, a, q, c, s, eps, den


def _is(node, target, nargs: int) -> bool:
    return (
        isinstance(node, fx.Node)
        and node.op == "call_function"
        and node.target is target
        and len(node.args) == nargs
    )


def _zero_dim(node: fx.Node) -> bool:
    val = node.meta.get("val")
    return isinstance(val, torch.Tensor) and val.dim() == 0


def _new(graph: fx.Graph, target, args: tuple, like: fx.Node) -> fx.Node:
    """A node computing ``target(*args)``, its ``val`` from the args' fake tensors, its stack
    trace (the user's line in errors) from ``like``."""
    node = graph.call_function(target, args)
    vals = [a.meta["val"] if isinstance(a, fx.Node) else a for a in args]
    mode = torch._guards.detect_fake_mode(vals)
    with mode if mode is not None else torch._subclasses.fake_tensor.unset_fake_temporarily():
        node.meta["val"] = target(*vals)
    for key in ("stack_trace", "nn_module_stack", "source_fn_stack", "original_aten"):
        if key in like.meta:
            node.meta[key] = like.meta[key]
    return node


def _drop_dead(graph: fx.Graph) -> None:
    """Erase pure nodes nobody reads (the old denominators), newest first."""
    for node in reversed(list(graph.nodes)):
        if node.op == "call_function" and not node.users and not node.is_impure():
            graph.erase_node(node)


def _unrepaired_adam_nodes(graph: fx.Graph) -> int:
    """How many divisions by ``step_size_neg`` from torch's capturable Adam remain."""
    count = 0
    for node in graph.nodes:
        if node.op != "call_function" or node.target is not aten.reciprocal.default:
            continue
        trace = node.meta.get("stack_trace") or ""
        if _ADAM_FRAME in trace and "eps / step_size_neg" in trace:
            count += 1
    return count


# Dynamo's name for an optimizer hyperparameter it made a graph input:
# L['self'].param_groups[0]['lr'], ...['betas'][0]
_GROUP_VALUE = re.compile(r"param_groups\[(\d+)\]\['(\w+)'\](\[\d+\])?$")
HINTED: set[str] = set()  # hyperparameters hinted about (cache.clear empties it)


def hint_float_hyperparameters(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> None:
    """Say once per hyperparameter when Dynamo recompiled an optimizer step because a Python
    float in ``param_groups`` changed (it then passes the float as a float64 tensor).

    Args:
        gm: the torch-level graph Dynamo hands the backend.
        example_inputs: its example inputs.
    """
    for node, value in zip(_placeholders(gm), example_inputs, strict=False):
        source = getattr(node.meta.get("grapharg"), "source", None)
        name = getattr(source, "name", None)
        name = name() if callable(name) else name
        match = _GROUP_VALUE.search(name or "")
        if not match or not _float64_scalar(value):
            continue
        key = match.group(2) + (match.group(3) or "")
        if key in HINTED:
            continue
        HINTED.add(key)
        progress_log.warning(
            "tpu-inductor: the compiled optimizer step was compiled again because "
            "param_groups[%s][%r]%s is a Python float that changed (an lr scheduler); Dynamo "
            "now passes it as a float64 tensor, which a TPU cannot hold. What to do: give the "
            "optimizer tensors, e.g. torch.optim.AdamW(params, lr=torch.tensor(1e-3)) (torch's "
            "and transformers' schedulers update a tensor lr in place: no recompiles)%s.",
            match.group(1),
            match.group(2),
            match.group(3) or "",
            ""
            if match.group(2) == "lr"
            else "; a scheduler that cycles momentum (CyclicLR, OneCycleLR) writes floats "
            "into betas/momentum each step: pass cycle_momentum=False",
        )


def _placeholders(gm: fx.GraphModule) -> list[fx.Node]:
    return [n for n in gm.graph.nodes if n.op == "placeholder"]


def _float64_scalar(value) -> bool:
    return isinstance(value, torch.Tensor) and value.dim() == 0 and value.dtype == torch.float64


# ---------------------------------------------------------------------------------------------
# Traceable steps: torch.optim's Adam, AdamW and SGD steps as Dynamo traces them into the
# caller's program (compile_step, and an optimizer step joining a compiled update: breaks.py).

# optimizer -> its (step, zero_grad) pair: the same function objects every call, so guards hold
TRACEABLE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def unsupported_reason(opt: torch.optim.Optimizer) -> str | None:
    """Why ``opt.step`` can't be traced into the caller's program, or ``None`` when it can."""
    if type(opt) not in STEPS:
        return f"{type(opt).__name__} has no traceable step here"
    if any(g.get("differentiable") for g in opt.param_groups):
        return "differentiable=True"
    if any(g.get("fused") for g in opt.param_groups):
        return "fused=True"
    if opt._optimizer_step_pre_hooks or opt._optimizer_step_post_hooks:
        return "it has step hooks"
    return None


class traceable_steps:
    """While active, each optimizer's ``step``/``zero_grad`` are the traceable equivalents."""

    def __init__(self, optimizers: tuple[torch.optim.Optimizer, ...]):
        self.optimizers = [o for o in optimizers if unsupported_reason(o) is None]
        self.saved: list[dict] = []

    def __enter__(self):
        # An LR scheduler wraps opt.step on the instance (to warn when its own step comes
        # first): kept aside and put back after the call.
        self.saved = [
            {k: opt.__dict__[k] for k in ("step", "zero_grad") if k in opt.__dict__}
            for opt in self.optimizers
        ]
        for opt in self.optimizers:
            step, zero_grad = traceable_methods(opt)
            opt.__dict__["step"] = step
            opt.__dict__["zero_grad"] = zero_grad
        return self

    def __exit__(self, exc_type, *exc):
        for opt, saved in zip(self.optimizers, self.saved, strict=True):
            opt.__dict__.pop("step", None)
            opt.__dict__.pop("zero_grad", None)
            opt.__dict__.update(saved)
            if exc_type is None and getattr(saved.get("step"), "_wrapped_by_lr_sched", False):
                opt._opt_called = True  # what the scheduler's wrapper records of a step
        return False


def traceable_methods(opt: torch.optim.Optimizer) -> tuple[Callable, Callable]:
    """The same two function objects every call, so Dynamo's guards on them hold."""
    pair = TRACEABLE.get(opt)
    if pair is None:
        ref = weakref.ref(opt)

        def step(closure=None):
            o = ref()
            if not torch.compiler.is_compiling() or closure is not None:
                return type(o).step(o, closure)
            with torch.no_grad():
                STEPS[type(o)](o)
            return None

        def zero_grad(set_to_none: bool = True):
            o = ref()
            if not torch.compiler.is_compiling():
                return type(o).zero_grad(o, set_to_none)
            _zero_grad(o, set_to_none)
            return None

        pair = TRACEABLE[opt] = (step, zero_grad)
    return pair


def _zero_grad(opt: torch.optim.Optimizer, set_to_none: bool) -> None:
    # torch.optim.Optimizer.zero_grad without the profiler scope and the foreach grouping.
    for group in opt.param_groups:
        for p in group["params"]:
            if p.grad is not None:
                if set_to_none:
                    p.grad = None
                else:
                    p.grad.requires_grad_(False)
                    p.grad.zero_()


def create_state(optimizers: Sequence[torch.optim.Optimizer]) -> None:
    """Give every parameter that can receive a gradient the optimizer state its first step
    would create, where it has none, so the first traced step is already the steady one.

    Why: a step traced while the state is empty creates it inside the program, and the next
    call, which reads it, is traced and compiled again (two compiles before training runs).
    The values are the first step's own (Adam/AdamW: step 0 and zero moments; SGD with
    momentum and no dampening: a zero buffer, which the first step turns into the gradient
    exactly as eager's copy). A parameter that never gets a gradient keeps zero state that
    eager would not have made; no update reads it. SGD with dampening keeps eager's lazy
    buffer (a copy of the first gradient, not the damped zero buffer).
    """
    for opt in optimizers:
        init = _CREATE.get(type(opt))
        if init is not None and unsupported_reason(opt) is None:
            for group in opt.param_groups:
                for p in group["params"]:
                    if p.requires_grad and len(opt.state[p]) == 0:
                        init(group, p, opt.state[p])
        for p, state in opt.state.items():  # under a mesh, each moment is placed as its param
            for value in state.values():
                if isinstance(value, torch.Tensor) and value.shape == p.shape:
                    sharding.follow(value, p)


def _adam_state(group: dict, p: torch.Tensor, state: dict) -> None:
    # torch.optim.Adam._init_group's state for one parameter
    from torch.optim.optimizer import _get_scalar_dtype

    state["step"] = (
        torch.zeros((), dtype=_get_scalar_dtype(), device=p.device)
        if group["capturable"]
        else torch.tensor(0.0, dtype=_get_scalar_dtype(), device="cpu")
    )
    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
    if group["amsgrad"]:
        state["max_exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)


def _sgd_state(group: dict, p: torch.Tensor, state: dict) -> None:
    # a zero momentum buffer is the first step's clone of the gradient only without dampening
    if group["momentum"] != 0 and group["dampening"] == 0:
        state["momentum_buffer"] = torch.zeros_like(p, memory_format=torch.preserve_format)


# Where compile_step's traced update calls one nested compile region per repeated layer
# (group_updates_by_layer): per param group, per layer, the positions of its parameters.
LAYER_GROUPS = "_tpu_inductor_layer_groups"


def group_updates_by_layer(optimizers: Sequence[torch.optim.Optimizer], layers: Sequence) -> None:
    """Have each optimizer's traced step update each layer of ``layers`` (the repeated layers
    ``regions.mark_layers`` marked) through one nested compile region, so Dynamo and AOTAutograd
    trace one layer's update, not every parameter's, and a run of them becomes one scan.

    The update is torch's own per-parameter one, each parameter's alone: grouping changes no
    number. The grouping is a tuple of positions kept on the instance (what the traced step
    reads: a constant to Dynamo). A parameter is in at most one layer's group.
    """
    for opt in optimizers:
        per_group = []
        for group in opt.param_groups:
            pos = {id(p): k for k, p in enumerate(group["params"])}
            used: set[int] = set()
            chunks = []
            for layer in layers:
                mine = [pos.get(id(p)) for p in layer.parameters()]
                chunk = tuple(k for k in mine if k is not None and k not in used)
                used.update(chunk)
                if chunk:
                    chunks.append(chunk)
            per_group.append(tuple(chunks))
        opt.__dict__[LAYER_GROUPS] = tuple(per_group)


def _region(fn: Callable) -> Callable:
    mark = getattr(torch.compiler, "nested_compile_region", None)  # torch >= 2.8
    return mark(fn) if mark is not None else fn


# The layer regions take flat arguments (a count, the hyperparameters, then the tensors) and
# return the new values instead of updating their inputs: Dynamo then checks a reuse without
# tracing pytree's flattening, and AOTAutograd calls a pure subgraph (a subgraph that updates
# its inputs is re-traced for its schema at every call). The caller copies the values back.
_ADAM_HYPER = (
    "amsgrad",
    "has_complex",
    "beta1",
    "beta2",
    "lr",
    "weight_decay",
    "eps",
    "maximize",
    "foreach",
    "capturable",
    "decoupled_weight_decay",
    "grad_scale",
    "found_inf",
)
_SGD_HYPER = (
    "weight_decay",
    "momentum",
    "lr",
    "dampening",
    "nesterov",
    "maximize",
    "has_sparse_grad",
    "foreach",
    "grad_scale",
    "found_inf",
)


def _adam_layer(n: int, *flat):
    from torch.optim.adam import adam

    hyper = dict(zip(_ADAM_HYPER, flat[: len(_ADAM_HYPER)], strict=True))
    tensors = list(flat[len(_ADAM_HYPER) :])
    lists = [tensors[k : k + n] for k in range(0, len(tensors), n)]
    params, grads, exp_avgs, exp_avg_sqs = lists[:4]
    max_sqs, steps = (lists[4], lists[5]) if hyper["amsgrad"] else ([], lists[4])
    new = [[t.clone() for t in ts] for ts in (params, exp_avgs, exp_avg_sqs, max_sqs, steps)]
    params, exp_avgs, exp_avg_sqs, max_sqs, steps = new
    adam(
        params,
        grads,
        exp_avgs,
        exp_avg_sqs,
        max_sqs,
        steps,
        differentiable=False,
        fused=None,
        **hyper,
    )
    return tuple(t for ts in new for t in ts)


def _sgd_layer(n: int, *flat):
    from torch.optim.sgd import sgd

    hyper = dict(zip(_SGD_HYPER, flat[: len(_SGD_HYPER)], strict=True))
    tensors = list(flat[len(_SGD_HYPER) :])
    params, grads, bufs = tensors[:n], tensors[n : 2 * n], tensors[2 * n :]
    params, bufs = [p.clone() for p in params], [b.clone() for b in bufs]
    sgd(params, grads, bufs, fused=None, **hyper)
    return (*params, *bufs)


_ADAM_LAYER = _region(_adam_layer)
_SGD_LAYER = _region(_sgd_layer)


def _chunks(opt: torch.optim.Optimizer, g: int, rows: dict[int, int]) -> list[tuple]:
    """The traced update's calls for param group ``g``: ``(rows, layer)`` per repeated layer
    (``layer`` True; rows index the lists of parameters with a gradient), then the rest."""
    layer_groups = opt.__dict__.get(LAYER_GROUPS, ())
    calls, done = [], set()
    for chunk in layer_groups[g] if g < len(layer_groups) else ():
        idx = [rows[k] for k in chunk if k in rows]
        if idx:
            calls.append((idx, True))
            done.update(idx)
    rest = [i for i in range(len(rows)) if i not in done]
    return calls + ([(rest, False)] if rest else [])


def _with_grads(group: dict) -> tuple[list, dict[int, int]]:
    """A parameter group's parameters that have a gradient, and each one's row among them by
    its position in the group (``rows[k]``), as ``_chunks`` reads them."""
    params, rows = [], {}
    for k, p in enumerate(group["params"]):
        if p.grad is not None:
            rows[k] = len(params)
            params.append(p)
    return params, rows


def _pick(values: list, idx: list[int]) -> list:
    return [values[i] for i in idx] if values else []


def _adam_step(opt: torch.optim.Adam) -> None:
    # torch.optim.Adam.step (AdamW: decoupled_weight_decay=True) with its _init_group inlined,
    # one call per repeated layer (group_updates_by_layer)
    from torch.optim.adam import adam

    for g, group in enumerate(opt.param_groups):
        params, rows = _with_grads(group)
        grads = [p.grad for p in params]
        exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps = [], [], [], []
        for p in params:
            state = opt.state[p]
            if len(state) == 0:
                _adam_state(group, p, state)
            exp_avgs.append(state["exp_avg"])
            exp_avg_sqs.append(state["exp_avg_sq"])
            if group["amsgrad"]:
                max_exp_avg_sqs.append(state["max_exp_avg_sq"])
            steps.append(state["step"])
        beta1, beta2 = group["betas"]
        for idx, layer in _chunks(opt, g, rows):
            chunk = _pick(params, idx)
            hyper = dict(
                amsgrad=group["amsgrad"],
                has_complex=any(torch.is_complex(p) for p in chunk),
                beta1=beta1,
                beta2=beta2,
                lr=group["lr"],
                weight_decay=group["weight_decay"],
                eps=group["eps"],
                maximize=group["maximize"],
                foreach=group["foreach"],
                capturable=group["capturable"],
                decoupled_weight_decay=group["decoupled_weight_decay"],
                grad_scale=getattr(opt, "grad_scale", None),
                found_inf=getattr(opt, "found_inf", None),
            )
            lists = [_pick(v, idx) for v in (grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps)]
            if layer and not group["foreach"]:  # (a foreach op in a region: torch 2.13 fails)
                updated = [chunk, *lists[1:]]  # everything but the gradients
                flat = [t for ts in (chunk, *lists) for t in ts]
                new = _ADAM_LAYER(len(idx), *(hyper[k] for k in _ADAM_HYPER), *flat)
                torch._foreach_copy_([t for ts in updated for t in ts], list(new))
            else:
                adam(chunk, *lists, differentiable=False, fused=None, **hyper)


def _sgd_step(opt: torch.optim.SGD) -> None:
    # torch.optim.SGD.step with its _init_group inlined, one call per repeated layer
    from torch.optim.sgd import sgd

    for g, group in enumerate(opt.param_groups):
        params, rows = _with_grads(group)
        grads = [p.grad for p in params]
        buffers = []
        if group["momentum"] != 0:
            buffers = [opt.state[p].get("momentum_buffer") for p in params]
        for idx, layer in _chunks(opt, g, rows):
            chunk, bufs = _pick(params, idx), _pick(buffers, idx)
            hyper = dict(
                weight_decay=group["weight_decay"],
                momentum=group["momentum"],
                lr=group["lr"],
                dampening=group["dampening"],
                nesterov=group["nesterov"],
                maximize=group["maximize"],
                has_sparse_grad=any(p.grad.is_sparse for p in chunk),
                foreach=group["foreach"],
                grad_scale=getattr(opt, "grad_scale", None),
                found_inf=getattr(opt, "found_inf", None),
            )
            if layer and not group["foreach"] and all(b is not None for b in bufs):
                flat = [*chunk, *_pick(grads, idx), *bufs]
                new = _SGD_LAYER(len(idx), *(hyper[k] for k in _SGD_HYPER), *flat)
                torch._foreach_copy_([*chunk, *bufs], list(new))
            else:  # no layer, or momentum buffers the first step creates (dampening)
                sgd(chunk, _pick(grads, idx), bufs, fused=None, **hyper)
                if group["momentum"] != 0:
                    for p, buffer in zip(chunk, bufs, strict=True):
                        opt.state[p]["momentum_buffer"] = buffer


STEPS: dict[type, Callable] = {
    torch.optim.Adam: _adam_step,
    torch.optim.AdamW: _adam_step,
    torch.optim.SGD: _sgd_step,
}
_CREATE: dict[type, Callable] = {
    torch.optim.Adam: _adam_state,
    torch.optim.AdamW: _adam_state,
    torch.optim.SGD: _sgd_state,
}


class _OptimizerProfilerNote(logging.Filter):
    """Drops Dynamo's "Profiler record function ... will be ignored" while it traces a frame
    for a tpu-inductor backend: ``Optimizer.step`` opens a profiler range, which a compiled
    program has no use for (its ops carry the user's names as XLA scopes), so every compiled
    ``opt.step`` printed it. Other backends' traces keep the note."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not str(record.msg).startswith("Profiler record function"):
            return True
        try:
            from torch._dynamo.symbolic_convert import InstructionTranslator

            fn = InstructionTranslator.current_tx().output.compiler_fn
        except AttributeError:  # not inside a Dynamo trace
            return True
        for _ in range(4):  # Dynamo's debug wrapper, torch.compile's options wrapper
            if getattr(fn, "__module__", "").startswith("tpu_inductor."):
                return False
            fn = getattr(fn, "compiler_fn", None)
        return True


_PROFILER_NOTE = _OptimizerProfilerNote()


def quiet_profiler_note() -> None:
    """Keep Dynamo's profiler-range note out of tpu-inductor's compiled optimizer steps.

    Called by the backend on first use, never on import: it adds one filter to the logger of
    ``torch._dynamo.variables.ctx_manager`` (once), which drops only that note and only while
    Dynamo traces for this backend.
    """
    logger = logging.getLogger("torch._dynamo.variables.ctx_manager")
    if _PROFILER_NOTE not in logger.filters:
        logger.addFilter(_PROFILER_NOTE)

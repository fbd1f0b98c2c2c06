"""A whole training step as ONE program: ``tpu_inductor.compile_step``.

``torch.compile`` of a function that runs the forward, ``loss.backward()``, ``opt.step()`` and
``opt.zero_grad()`` gives a backend several graphs in torch 2.13: Dynamo breaks the graph at
``.backward()`` (unless ``torch._dynamo.config.trace_autograd_ops`` is set), and ``torch.optim``
breaks it twice more on purpose (``Optimizer.step`` calls ``torch._dynamo.graph_break()``; Dynamo
runs ``_init_group`` eagerly, which needs real gradients; ``zero_grad`` is never traced). XLA can
only fuse and schedule inside one program, so each split costs HBM traffic: saved activations
written by the forward and read back by the backward, gradients written and read again.

``compile_step(fn, opt)`` compiles ``fn`` with ``backend="tpu"`` so that Dynamo traces all of it
into one graph, which the backend compiles to one XLA program with the parameters and the
optimizer state donated (off CPU):

- while the compiled function runs, ``trace_autograd_ops`` is on, so ``loss.backward()`` is traced
  (Dynamo rewrites it as ``autograd.grad`` plus gradient accumulation into ``.grad``);
- while it runs, each optimizer passed has ``step`` and ``zero_grad`` replaced, on the instance,
  by traceable equivalents: torch's own functional update (``torch.optim.adam.adam``,
  ``torch.optim.sgd.sgd``) on the optimizer's own state, initialized as its ``_init_group`` does,
  so the numbers are eager's; outside a compiled region they call the class's methods. The
  instance is restored after each call.

Supported: ``torch.optim.Adam``, ``AdamW`` and ``SGD`` (exactly those classes; not
``differentiable=True``, not with step hooks). Another optimizer keeps its own ``step``, which
Dynamo compiles as a separate program (a warning says so once).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import warnings
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import torch

from tpu_inductor.backend import meta_fakes_as_cpu

log = logging.getLogger(__name__)

_TRACEABLE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def compile_step(
    fn: Callable,
    optimizers: torch.optim.Optimizer | Sequence[torch.optim.Optimizer] = (),
    *,
    options: dict[str, Any] | None = None,
    **compile_kwargs: Any,
) -> Callable:
    """``torch.compile(fn, backend="tpu")`` for a function that runs a whole training step,
    compiled as ONE program.

    Args:
        fn: the step: forward, ``loss.backward()``, ``opt.step()``, ``opt.zero_grad()``. Return
            ``loss.detach()`` (a returned tensor whose graph ``backward()`` consumed makes Dynamo
            split the step, as it says in its graph-break log).
        optimizers: the optimizer(s) ``fn`` steps.
        options: backend options, as for ``torch.compile(..., options=...)``.
        compile_kwargs: other ``torch.compile`` arguments (``fullgraph=True`` turns any split
            into an error that names its cause).

    Returns:
        The compiled step; call it like ``fn``.

    Example:
        >>> opt = torch.optim.AdamW(model.parameters())
        >>> def train_step(ids):
        ...     loss = model(ids, labels=ids).loss
        ...     loss.backward()
        ...     opt.step()
        ...     opt.zero_grad()
        ...     return loss.detach()
        >>> train_step = tpu_inductor.compile_step(train_step, opt)
        >>> loss = train_step(ids)  # one XLA program: forward, backward and AdamW
    """
    if isinstance(optimizers, torch.optim.Optimizer):
        optimizers = (optimizers,)
    optimizers = tuple(optimizers)
    for opt in optimizers:
        if not isinstance(opt, torch.optim.Optimizer):
            raise TypeError(
                f"compile_step: optimizers must be torch.optim.Optimizer instances, got "
                f"{type(opt).__name__}"
            )
        _check_supported(opt)
    compiled = torch.compile(fn, backend="tpu", options=options, **compile_kwargs)
    compile_only = _targets(options)

    @functools.wraps(fn)
    def step(*args, **kwargs):
        # compiling for a TPU target: a meta model is traced as the CPU model it stands for,
        # by Dynamo too, or its backward would not be traced (backend.meta_fakes_as_cpu)
        meta = meta_fakes_as_cpu() if compile_only else contextlib.nullcontext()
        with (
            torch._dynamo.config.patch(trace_autograd_ops=True),
            _traceable(optimizers),
            _deterministic_attention_recompute(),
            meta,
        ):
            return compiled(*args, **kwargs)

    step._compiled = compiled
    return step


# Attention ops that draw random numbers only for dropout: with dropout_p == 0 they are
# deterministic, and recomputing them under activation checkpointing is safe.
_DROPOUT_ATTENTION = frozenset(
    {
        "aten::_scaled_dot_product_flash_attention_for_cpu",
        "aten::_scaled_dot_product_flash_attention",
        "aten::_scaled_dot_product_efficient_attention",
    }
)


class _deterministic_attention_recompute:
    """While active, AOTAutograd's one-graph rematerialization (the pass that serves activation
    checkpointing when the forward, the loss and the backward are one graph, as in
    ``compile_step``) does not count attention without dropout as a random op.

    Why: torch 2.13's ``remat_using_tags_for_fwd_loss_bwd_graph`` refuses any recomputed op
    tagged ``nondeterministic_seeded``, and every SDPA kernel carries that tag for its dropout;
    so a checkpointed transformer block (SDPA at ``dropout_p=0.0``, as in training most LLMs)
    could not be compiled as one step at all. Nodes with a non-zero (or symbolic) dropout_p are
    still refused by torch, with its own message. Scope: the name in that one torch module, for
    the duration of a ``compile_step`` call.
    """

    def __enter__(self):
        from torch._functorch._activation_checkpointing import (
            remat_using_tags_for_fwd_loss_bwd_graph_pass as remat,
        )

        self.module = remat
        self.saved = remat.has_recomputable_rng_ops
        remat.has_recomputable_rng_ops = _has_recomputable_rng_ops
        return self

    def __exit__(self, *exc):
        self.module.has_recomputable_rng_ops = self.saved
        return False


def _has_recomputable_rng_ops(gm) -> bool:
    from torch._functorch.partitioners import must_recompute

    for node in gm.graph.nodes:
        tags = getattr(node.target, "tags", ())
        if not (must_recompute(node) and torch.Tag.nondeterministic_seeded in tags):
            continue
        schema = getattr(node.target, "_schema", None)
        if schema is not None and schema.name in _DROPOUT_ATTENTION:
            names = [a.name for a in schema.arguments]
            i = names.index("dropout_p")
            dropout = node.kwargs.get("dropout_p", node.args[i] if len(node.args) > i else 0.0)
            if dropout == 0.0:
                continue
        return True
    return False


def _targets(options: dict[str, Any] | None) -> bool:
    """Whether these options compile for a TPU target (the option or TPU_INDUCTOR_TARGET)."""
    from tpu_inductor.config import parse_options

    return parse_options(options).target is not None


def _check_supported(opt: torch.optim.Optimizer) -> None:
    why = _unsupported_reason(opt)
    if why is not None:
        warnings.warn(
            f"compile_step: {type(opt).__name__}.step() will be compiled as a separate program "
            f"({why}); Adam, AdamW and SGD join the step's program.",
            stacklevel=3,
        )


def _unsupported_reason(opt: torch.optim.Optimizer) -> str | None:
    if type(opt) not in _STEPS:
        return f"{type(opt).__name__} has no traceable step here"
    if any(g.get("differentiable") for g in opt.param_groups):
        return "differentiable=True"
    if any(g.get("fused") for g in opt.param_groups):
        return "fused=True"
    if opt._optimizer_step_pre_hooks or opt._optimizer_step_post_hooks:
        return "it has step hooks"
    return None


class _traceable:
    """While active, each optimizer's ``step``/``zero_grad`` are the traceable equivalents."""

    def __init__(self, optimizers: tuple[torch.optim.Optimizer, ...]):
        self.optimizers = [o for o in optimizers if _unsupported_reason(o) is None]
        self.saved: list[dict] = []

    def __enter__(self):
        # An LR scheduler wraps opt.step on the instance (to warn when its own step comes
        # first): kept aside and put back after the call.
        self.saved = [
            {k: opt.__dict__[k] for k in ("step", "zero_grad") if k in opt.__dict__}
            for opt in self.optimizers
        ]
        for opt in self.optimizers:
            step, zero_grad = _methods(opt)
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


def _methods(opt: torch.optim.Optimizer) -> tuple[Callable, Callable]:
    """The same two function objects every call, so Dynamo's guards on them hold."""
    pair = _TRACEABLE.get(opt)
    if pair is None:
        ref = weakref.ref(opt)

        def step(closure=None):
            o = ref()
            if not torch.compiler.is_compiling() or closure is not None:
                return type(o).step(o, closure)
            with torch.no_grad():
                _STEPS[type(o)](o)
            return None

        def zero_grad(set_to_none: bool = True):
            o = ref()
            if not torch.compiler.is_compiling():
                return type(o).zero_grad(o, set_to_none)
            _zero_grad(o, set_to_none)
            return None

        pair = _TRACEABLE[opt] = (step, zero_grad)
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


def _adam_step(opt: torch.optim.Adam) -> None:
    # torch.optim.Adam.step (AdamW: decoupled_weight_decay=True) with its _init_group inlined.
    from torch.optim.adam import adam
    from torch.optim.optimizer import _get_scalar_dtype

    for group in opt.param_groups:
        params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps = [], [], [], [], [], []
        has_complex = False
        for p in group["params"]:
            if p.grad is None:
                continue
            has_complex |= torch.is_complex(p)
            params.append(p)
            grads.append(p.grad)
            state = opt.state[p]
            if len(state) == 0:
                state["step"] = (
                    torch.zeros((), dtype=_get_scalar_dtype(), device=p.device)
                    if group["capturable"]
                    else torch.tensor(0.0, dtype=_get_scalar_dtype(), device="cpu")
                )
                state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                if group["amsgrad"]:
                    state["max_exp_avg_sq"] = torch.zeros_like(
                        p, memory_format=torch.preserve_format
                    )
            exp_avgs.append(state["exp_avg"])
            exp_avg_sqs.append(state["exp_avg_sq"])
            if group["amsgrad"]:
                max_exp_avg_sqs.append(state["max_exp_avg_sq"])
            steps.append(state["step"])
        beta1, beta2 = group["betas"]
        adam(
            params,
            grads,
            exp_avgs,
            exp_avg_sqs,
            max_exp_avg_sqs,
            steps,
            amsgrad=group["amsgrad"],
            has_complex=has_complex,
            beta1=beta1,
            beta2=beta2,
            lr=group["lr"],
            weight_decay=group["weight_decay"],
            eps=group["eps"],
            maximize=group["maximize"],
            foreach=group["foreach"],
            capturable=group["capturable"],
            differentiable=False,
            fused=None,
            grad_scale=getattr(opt, "grad_scale", None),
            found_inf=getattr(opt, "found_inf", None),
            decoupled_weight_decay=group["decoupled_weight_decay"],
        )


def _sgd_step(opt: torch.optim.SGD) -> None:
    # torch.optim.SGD.step with its _init_group inlined.
    from torch.optim.sgd import sgd

    for group in opt.param_groups:
        params, grads, buffers = [], [], []
        has_sparse_grad = False
        for p in group["params"]:
            if p.grad is None:
                continue
            params.append(p)
            grads.append(p.grad)
            has_sparse_grad |= p.grad.is_sparse
            if group["momentum"] != 0:
                buffers.append(opt.state[p].get("momentum_buffer"))
        sgd(
            params,
            grads,
            buffers,
            weight_decay=group["weight_decay"],
            momentum=group["momentum"],
            lr=group["lr"],
            dampening=group["dampening"],
            nesterov=group["nesterov"],
            maximize=group["maximize"],
            has_sparse_grad=has_sparse_grad,
            foreach=group["foreach"],
            fused=None,
            grad_scale=getattr(opt, "grad_scale", None),
            found_inf=getattr(opt, "found_inf", None),
        )
        if group["momentum"] != 0:
            for p, buffer in zip(params, buffers, strict=True):
                opt.state[p]["momentum_buffer"] = buffer


_STEPS: dict[type, Callable] = {
    torch.optim.Adam: _adam_step,
    torch.optim.AdamW: _adam_step,
    torch.optim.SGD: _sgd_step,
}

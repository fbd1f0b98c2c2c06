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
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.utils._pytree as pytree

from tpu_inductor.dynamo import optimizers as optimizers_mod
from tpu_inductor.dynamo import regions
from tpu_inductor.dynamo.backend import meta_fakes_as_cpu
from tpu_inductor.dynamo.breaks import ONE_PROGRAM_STEP, StepSplit
from tpu_inductor.dynamo.options import parse_options

log = logging.getLogger(__name__)
progress = logging.getLogger("tpu_inductor.progress")  # speaks without logging set up


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
        fn: the step: forward, ``loss.backward()``, ``opt.step()``, ``opt.zero_grad()``. What
            it returns comes back detached (tensors anywhere in tuples, lists, dicts): a
            returned tensor whose graph ``backward()`` consumed would make Dynamo split the
            step into three programs ("autograd.grad consumed returned tensor's grad_fn"), so
            ``return loss`` and ``return loss.detach()`` compile alike, to one program.
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

    @functools.wraps(fn)
    def whole(*args, **kwargs):
        return pytree.tree_map_only(torch.Tensor, torch.Tensor.detach, fn(*args, **kwargs))

    compiled = torch.compile(whole, backend="tpu", options=options, **compile_kwargs)
    opts = parse_options(options)
    compile_only = opts.target is not None
    unmarked = [opts.scan_layers]  # repeated layers are marked before the first trace

    split = [False]  # the step breaks the graph: backward() runs in eager autograd

    @functools.wraps(fn)
    def step(*args, **kwargs):
        # compiling for a TPU target: a meta model is traced as the CPU model it stands for,
        # by Dynamo too, or its backward would not be traced (backend.meta_fakes_as_cpu)
        meta = meta_fakes_as_cpu() if compile_only else contextlib.nullcontext()
        optimizers_mod.create_state(optimizers)  # one trace: the first step is the steady one
        roots = None
        if unmarked[0]:
            roots = regions.modules_reached([fn])
            regions.mark_layers(roots)
            optimizers_mod.group_updates_by_layer(optimizers, regions.marked_layers(roots))
            unmarked[0] = False
        with (
            torch._dynamo.config.patch(trace_autograd_ops=not split[0]),
            _one_program(not split[0]),
            optimizers_mod.traceable_steps(optimizers),
            _deterministic_attention_recompute(),
            meta,
        ):
            try:
                return compiled(*args, **kwargs)
            except torch._dynamo.exc.UncapturedHigherOrderOpError as e:
                if not roots or "invoke_subgraph" not in str(e):
                    raise
                # a repeated layer Dynamo cannot trace whole (it breaks the graph inside):
                # traced unrolled, as without scan_layers (nothing ran yet)
                regions.unmark_layers(roots)
                optimizers_mod.group_updates_by_layer(optimizers, [])
                log.info("scan_layers: the layers break the graph, so they stay unrolled")
            except torch._dynamo.exc.BackendCompilerFailed as e:
                if not isinstance(getattr(e, "inner_exception", None), StepSplit):
                    raise
                split[0] = True
                progress.warning(
                    "tpu-inductor: compile_step: %s breaks the graph (%s), so it cannot be one "
                    "program: it runs as several, with backward() in eager autograd. Remove the "
                    "break (the warning above names its line) to get one program.",
                    getattr(fn, "__name__", "the step"),
                    e.inner_exception,
                )
        return step(*args, **kwargs)  # unrolled layers, or in parts

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


@contextlib.contextmanager
def _one_program(active: bool):
    from torch._dynamo.utils import graph_break_reasons

    saved = list(ONE_PROGRAM_STEP)
    ONE_PROGRAM_STEP[:] = [active, len(graph_break_reasons), 0]
    try:
        yield
    finally:
        ONE_PROGRAM_STEP[:] = saved


def _check_supported(opt: torch.optim.Optimizer) -> None:
    why = optimizers_mod.unsupported_reason(opt)
    if why is not None:
        warnings.warn(
            f"compile_step: {type(opt).__name__}.step() will be compiled as a separate program "
            f"({why}); Adam, AdamW and SGD join the step's program.",
            stacklevel=3,
        )

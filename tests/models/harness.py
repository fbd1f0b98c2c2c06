"""Run a real model compiled with ``backend="tpu"`` and in CPU eager, and compare.

Shared by the model tests (``tests/models/``) and ``scripts/gen_models_doc.py``: a
:class:`ModelCase` describes one model (how to build it from a tiny random config, which outputs
to compare, the tolerance and why, the ops expected to fall back to eager), and
:func:`run_forward` / :func:`run_training` return what happened, so the tests assert on it and the
report prints it.
"""

from __future__ import annotations

import copy
import dataclasses
import re
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

import tpu_inductor.runtime.cache
from tpu_inductor.core.errors import FallbackWarning

# (model, forward kwargs); the model comes back in eval mode with every dropout probability 0.
Built = tuple[nn.Module, dict[str, Any]]


@dataclasses.dataclass(frozen=True)
class ModelCase:
    """One model of the suite.

    Attributes:
        name: the test id and the report's row name.
        library: ``"transformers"``, ``"timm"`` or ``"diffusers"``.
        build: ``build(train) -> (model, kwargs)``; with ``train=True`` the kwargs carry labels
            so that the model computes its own loss, where it can.
        outputs: attribute names of the outputs to compare (``""``: the output itself).
        atol, rtol: float32 tolerance; anything looser than 1e-4 needs a ``reason``.
        reason: why the tolerance is looser than the default.
        fallback: ATen ops expected to run in torch eager (no lowering yet); checked exactly,
            so a new lowering makes the test fail until the entry is updated.
        train: also run a training step (loss, backward, AdamW x2) against eager.
        slow: only run with ``TPU_INDUCTOR_SLOW=1``.
        train_slow: run the training step only with ``TPU_INDUCTOR_SLOW=1`` (the forward still
            runs by default); keeps the default suite within its time budget.
    """

    name: str
    library: str
    build: Callable[[bool], Built]
    outputs: tuple[str, ...] = ("logits",)
    atol: float = 1e-4
    rtol: float = 1e-4
    reason: str = ""
    fallback: frozenset[str] = frozenset()
    train: bool = False
    slow: bool = False
    train_slow: bool = False


@dataclasses.dataclass
class RunResult:
    """What one compiled run did (forward or training)."""

    fallback_ops: set[str] = dataclasses.field(default_factory=set)
    dynamo_graphs: int = 0
    graph_breaks: int = 0
    backend_graphs: int = 0
    compile_s: float = 0.0
    eager_s: float = 0.0
    compiled_s: float = 0.0
    max_abs_err: float = 0.0
    recompiles: int = 0  # training: Dynamo graphs captured after the first step


_FALLBACK_OP = re.compile(r"^  - ([\w.]+)\(", re.MULTILINE)


def no_dropout(config) -> None:
    """Set every dropout-like probability of a ``transformers`` config (and sub-configs) to 0.

    Compiled random ops draw XLA's streams, not torch's, so dropout must be off for a
    compiled-vs-eager comparison in training mode.
    """
    for key, value in list(vars(config).items()):
        if hasattr(value, "to_dict") and hasattr(value, "model_type"):
            no_dropout(value)
        elif isinstance(value, float) and any(
            s in key for s in ("dropout", "pdrop", "drop_path", "layerdrop", "drop_rate")
        ):
            setattr(config, key, 0.0)
    if hasattr(config, "apply_spec_augment"):
        config.apply_spec_augment = False


def fallback_ops(caught: list[warnings.WarningMessage]) -> set[str]:
    """ATen op names listed by the FallbackWarnings in ``caught``."""
    ops: set[str] = set()
    for w in caught:
        if issubclass(w.category, FallbackWarning):
            ops.update(_FALLBACK_OP.findall(str(w.message)))
    return ops


def select_outputs(out, names: tuple[str, ...]) -> dict[str, torch.Tensor]:
    """The named outputs of a model call (``""`` names the output itself)."""
    picked = {}
    for name in names:
        value = out
        for part in filter(None, name.split(".")):
            value = value[part] if isinstance(value, dict) else getattr(value, part)
        picked[name or "output"] = value
    return picked


def max_abs_err(actual: dict, expected: dict) -> float:
    """Largest absolute difference over matching tensors of two output dicts."""
    return max(
        (float((actual[k].double() - expected[k].double()).abs().max()) for k in expected),
        default=0.0,
    )


def compare(actual: dict, expected: dict, case: ModelCase, what: str) -> None:
    """Same dtype and shape, values within the case's tolerance."""
    for key, exp in expected.items():
        act = actual[key]
        assert act.dtype == exp.dtype, f"{case.name} {what} {key}: {act.dtype} != {exp.dtype}"
        assert act.shape == exp.shape, f"{case.name} {what} {key}: {act.shape} != {exp.shape}"
        torch.testing.assert_close(
            act,
            exp,
            atol=case.atol,
            rtol=case.rtol,
            msg=lambda m, key=key: f"{case.name} {what} {key}: {m}",
        )


class _Counting:
    """Dynamo graph/graph-break counts and backend compile counts over a block."""

    def __enter__(self):
        torch._dynamo.reset()
        torch._dynamo.utils.counters.clear()
        self._graphs = tpu_inductor.runtime.cache.STATS.graphs
        return self

    def __exit__(self, *exc):
        counters = torch._dynamo.utils.counters
        self.dynamo_graphs = int(counters["stats"]["unique_graphs"])
        self.graph_breaks = int(sum(counters["graph_break"].values()))
        self.backend_graphs = tpu_inductor.runtime.cache.STATS.graphs - self._graphs
        return False


def _timeit(fn: Callable[[], Any], repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def run_forward(case: ModelCase, *, timing: int = 0) -> tuple[RunResult, dict, dict]:
    """Inference forward (``model.eval()``, ``no_grad``) compiled and eager.

    Args:
        case: the model.
        timing: if > 0, also time that many steady-state calls of each (best of).

    Returns:
        ``(result, compiled outputs, eager outputs)``; outputs are selected by ``case.outputs``.
    """
    torch.manual_seed(0)
    model, kwargs = case.build(False)
    model.eval()
    result = RunResult()
    with torch.no_grad():
        start = time.perf_counter()
        expected = select_outputs(model(**kwargs), case.outputs)
        result.eager_s = time.perf_counter() - start
        compiled = torch.compile(model, backend="tpu")
        with _Counting() as counts, warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", FallbackWarning)
            start = time.perf_counter()
            actual = select_outputs(compiled(**kwargs), case.outputs)
            result.compile_s = time.perf_counter() - start
        if timing:
            result.eager_s = _timeit(lambda: model(**kwargs), timing)
            result.compiled_s = _timeit(lambda: compiled(**kwargs), timing)
    result.fallback_ops = fallback_ops(caught)
    result.dynamo_graphs = counts.dynamo_graphs
    result.graph_breaks = counts.graph_breaks
    result.backend_graphs = counts.backend_graphs
    result.max_abs_err = max_abs_err(actual, expected)
    return result, actual, expected


def loss_of(out) -> torch.Tensor:
    """The model's own loss when it computed one, else a quadratic loss on its main output."""
    loss = out.get("loss") if isinstance(out, dict) else None
    if loss is not None:
        return loss
    main = out if isinstance(out, torch.Tensor) else next(iter(out.values()))
    return main.float().square().mean()


def make_optimizer(model: nn.Module) -> torch.optim.Optimizer:
    """AdamW with ``lr=1e-3, eps=1e-3``.

    Some parameters have a true gradient of exactly zero (an attention key bias: softmax ignores
    a shift shared by every key), so both sides hold only rounding noise (~1e-9) there; AdamW
    with the default ``eps=1e-8`` divides that noise by its own magnitude and turns it into
    +-lr updates of random sign, and the two runs drift apart for no fault of the backend.
    ``eps=1e-3`` keeps such updates negligible while real gradients still go through AdamW's
    moments and normalization; with ``lr == eps`` a gradient difference ``d`` moves a parameter
    by at most about ``d``, never more (AdamW's first step is ``lr * g / (|g| + eps)``).
    """
    return torch.optim.AdamW(model.parameters(), lr=1e-3, eps=1e-3)


def run_training(case: ModelCase, steps: int = 2) -> RunResult:
    """``steps`` x (forward, loss, backward, AdamW step), compiled vs eager on identical copies.

    Asserts that the loss, every gradient and every parameter after each step match within the
    case's tolerance. Models run in ``train()`` mode with dropout probabilities at 0.
    """
    torch.manual_seed(0)
    eager, kwargs = case.build(True)
    eager.train()
    comp = copy.deepcopy(eager)
    compiled = torch.compile(comp, backend="tpu")
    opt_e, opt_c = make_optimizer(eager), make_optimizer(comp)
    result = RunResult()
    with _Counting() as counts, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", FallbackWarning)
        for step in range(steps):
            loss_e = loss_of(eager(**copy.deepcopy(kwargs)))
            start = time.perf_counter()
            loss_c = loss_of(compiled(**copy.deepcopy(kwargs)))
            loss_e.backward()
            loss_c.backward()
            if step == 0:
                result.compile_s = time.perf_counter() - start
                graphs_after_first = torch._dynamo.utils.counters["stats"]["unique_graphs"]
            compare({"loss": loss_c.detach()}, {"loss": loss_e.detach()}, case, f"step {step}")
            named_c = dict(comp.named_parameters())
            for name, pe in eager.named_parameters():
                pc = named_c[name]
                if pe.grad is None:
                    assert pc.grad is None, f"{case.name} step {step}: {name} grad only compiled"
                    continue
                assert pc.grad is not None, f"{case.name} step {step}: no compiled grad of {name}"
                compare({name: pc.grad}, {name: pe.grad}, case, f"step {step} grad")
                err = float((pc.grad - pe.grad).abs().max())
                result.max_abs_err = max(result.max_abs_err, err)
            opt_e.step()
            opt_c.step()
            opt_e.zero_grad()
            opt_c.zero_grad()
            for name, pe in eager.named_parameters():
                compare({name: named_c[name].detach()}, {name: pe.detach()}, case, "param")
    result.fallback_ops = fallback_ops(caught)
    result.dynamo_graphs = counts.dynamo_graphs
    result.graph_breaks = counts.graph_breaks
    result.backend_graphs = counts.backend_graphs
    result.recompiles = counts.dynamo_graphs - int(graphs_after_first)
    return result


@dataclasses.dataclass
class TargetResult:
    """What compiling one model for a TPU target found (``run_target``).

    Attributes:
        programs: ``tpu_inductor.tpu.programs.Program`` s compiled, in order (forward, backward,
            optimizer for a training step; the inference forward otherwise).
        seconds: wall time of the whole compile-only run (Dynamo, AOTAutograd, lowering and
            every TPU compile).
        shapes_match: every output's shape and dtype equal eager's (values are not compared:
            nothing ran).
    """

    programs: list
    seconds: float
    shapes_match: bool


def run_target(case: ModelCase, target: str, train: bool = False, **options) -> TargetResult:
    """Compile ``case`` for a TPU ``target`` (``options={"target": ...}``): its inference
    forward, or with ``train`` a training step (loss, backward, a compiled AdamW step), and
    compare each output's shape and dtype with CPU eager's. Nothing runs on the target."""
    from tpu_inductor.tpu import programs

    torch.manual_seed(0)
    model, kwargs = case.build(train)
    model.train(train)
    opts = {"target": target, **options}
    with torch.no_grad():
        expected = select_outputs(model(**copy.deepcopy(kwargs)), case.outputs)
    before = len(programs.PROGRAMS)
    start = time.perf_counter()
    compiled = torch.compile(model, backend="tpu", options=opts)
    if train:
        out = compiled(**copy.deepcopy(kwargs))
        loss_of(out).backward()
        opt = make_optimizer(model)
        torch.compile(opt.step, backend="tpu", options=opts)()
    else:
        with torch.no_grad():
            out = compiled(**copy.deepcopy(kwargs))
    seconds = time.perf_counter() - start
    actual = select_outputs(out, case.outputs)
    same = all(
        actual[k].shape == v.shape and actual[k].dtype == v.dtype for k, v in expected.items()
    )
    return TargetResult(list(programs.PROGRAMS[before:]), seconds, same)

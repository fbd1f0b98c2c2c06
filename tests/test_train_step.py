"""``tpu_inductor.compile_step``: a whole training step (forward, ``loss.backward()``,
``opt.step()``, ``opt.zero_grad()``) compiled as ONE program, with eager's numbers: the loss of
every step, every parameter and every optimizer state tensor after it."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from torch import nn

import tpu_inductor
from tests.helpers import lm_train_step, tiny_llama
from tpu_inductor.core.dtypes import tolerance
from tpu_inductor.runtime import cache

ATOL, RTOL = tolerance(torch.float32, level="op")


def _programs_per_call(fn, *args):
    """How many compiled programs one call of ``fn`` runs, and its result."""
    before = {id(c.exes): c.exes.stats.hits + c.exes.stats.misses for c in list(cache.COMPILED)}
    out = fn(*args)
    runs = 0
    seen = set()
    for c in list(cache.COMPILED):
        if id(c.exes) in seen:
            continue
        seen.add(id(c.exes))
        runs += c.exes.stats.hits + c.exes.stats.misses - before.get(id(c.exes), 0)
    return runs, out


def _same_state(opt_c, opt_e, params_c, params_e, what):
    for pc, pe in zip(params_c, params_e, strict=True):
        torch.testing.assert_close(pc.detach(), pe.detach(), atol=ATOL, rtol=RTOL)
        sc, se = opt_c.state[pc], opt_e.state[pe]
        assert set(sc) == set(se), what
        for k in se:
            torch.testing.assert_close(sc[k], se[k], atol=ATOL, rtol=RTOL, msg=f"{what} {k}")


def _run(
    model_e, make_opt, batch, loss_of, steps=3, returns=lambda loss: loss.detach(), fullgraph=True
):
    model_c = copy.deepcopy(model_e)
    opt_e, opt_c = make_opt(model_e), make_opt(model_c)

    def train_step(*b):
        loss = loss_of(model_c, *b)
        loss.backward()
        opt_c.step()
        opt_c.zero_grad()
        return returns(loss)

    step = tpu_inductor.compile_step(train_step, opt_c, fullgraph=fullgraph)
    runs = []
    for i in range(steps):
        n, loss_c = _programs_per_call(step, *batch)
        runs.append(n)
        if isinstance(loss_c, dict):
            assert not loss_c["loss"].requires_grad, "a step's outputs come back detached"
            loss_c = loss_c["loss"]
        loss_e = loss_of(model_e, *batch)
        loss_e.backward()
        opt_e.step()
        opt_e.zero_grad()
        torch.testing.assert_close(loss_c, loss_e.detach(), atol=ATOL, rtol=RTOL)
        _same_state(opt_c, opt_e, list(model_c.parameters()), list(model_e.parameters()), i)
        assert all(p.grad is None for p in model_c.parameters()), "zero_grad ran in the step"
        # Outside the call the optimizer is the user's own again.
        assert "step" not in opt_c.__dict__ and "zero_grad" not in opt_c.__dict__
    return runs


def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.LayerNorm(16), nn.Linear(16, 4))


def _mse(model, x, y):
    return (model(x) - y).square().mean()


@pytest.mark.parametrize(
    "make_opt",
    [
        lambda m: torch.optim.AdamW(m.parameters(), lr=1e-3, eps=1e-3),
        lambda m: torch.optim.Adam(m.parameters(), lr=1e-3, eps=1e-3, weight_decay=0.1),
        lambda m: torch.optim.Adam(m.parameters(), lr=1e-3, eps=1e-3, amsgrad=True),
        lambda m: torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9, nesterov=True),
        lambda m: torch.optim.SGD(m.parameters(), lr=0.1, weight_decay=0.01),
        lambda m: torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9, dampening=0.5),
    ],
    ids=["adamw", "adam-wd", "adam-amsgrad", "sgd-nesterov", "sgd-plain", "sgd-dampening"],
)
def test_mlp_step_is_one_program_with_eager_numbers(make_opt, request):
    g = torch.Generator().manual_seed(1)
    batch = (torch.randn(5, 8, generator=g), torch.randn(5, 4, generator=g))
    runs = _run(_mlp(), make_opt, batch, _mse)
    assert runs == [1, 1, 1]
    # The optimizer state is made before the first trace (optimizers.create_state): one trace
    # and one compile. SGD with dampening keeps eager's lazy momentum buffer (a copy of the
    # first gradient), made by the first program, so the second step is traced again.
    assert cache.STATS.graphs == (2 if "dampening" in request.node.callspec.id else 1)
    # named for what it is (AOTAutograd calls it an "inference" graph: it splits nothing)
    names = [g.name for g in tpu_inductor.report(print_table=False).graphs]
    assert names and all(n.endswith("-training-step") for n in names), names


def test_a_step_returning_the_loss_itself_is_one_program():
    """``return loss`` (not ``loss.detach()``): compile_step detaches what the step returns, or
    Dynamo would split it where backward() consumed the returned tensor's graph (three
    programs; under fullgraph=True, an error)."""
    g = torch.Generator().manual_seed(1)
    batch = (torch.randn(5, 8, generator=g), torch.randn(5, 4, generator=g))
    opt = lambda m: torch.optim.AdamW(m.parameters(), lr=1e-3, eps=1e-3)  # noqa: E731
    runs = _run(_mlp(), opt, batch, _mse, returns=lambda loss: {"loss": loss})
    assert runs == [1, 1, 1]


def test_llama_step_is_one_program_with_eager_numbers():
    model = tiny_llama("sdpa", vocab_size=64).train()
    ids = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(2))
    runs = _run(
        model,
        lambda m: torch.optim.AdamW(m.parameters(), lr=1e-3, eps=1e-3),
        (ids,),
        lambda m, ids: m(ids, labels=ids).loss,
    )
    assert runs == [1, 1, 1]


def test_other_optimizers_warn_and_keep_their_own_step():
    model = _mlp()
    opt = torch.optim.RMSprop(model.parameters(), lr=1e-3)
    with pytest.warns(UserWarning, match=r"RMSprop.step\(\) will be compiled as a separate"):
        tpu_inductor.compile_step(lambda: None, opt)


def test_only_optimizers_are_accepted():
    with pytest.raises(TypeError, match="torch.optim.Optimizer instances"):
        tpu_inductor.compile_step(lambda: None, [nn.Linear(2, 2)])


def test_eager_step_outside_is_untouched():
    """After compiled steps, the optimizer's eager step() is the class's (hooks included)."""
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(3, 8)

    def train_step(x):
        loss = model(x).sum()
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss.detach()

    tpu_inductor.compile_step(train_step, opt)(x)
    called = []
    opt.register_step_post_hook(lambda *a: called.append(1))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model(x).sum().backward()
        opt.step()
    assert called == [1]


def test_lr_scheduler_with_a_tensor_lr_steps_without_recompiling():
    """A scheduler changes a tensor lr in place: no recompile per step, eager's numbers, and the
    scheduler's own wrapper of opt.step is kept (it warns when its step comes first)."""
    model_e = _mlp()
    model_c = copy.deepcopy(model_e)

    def make(m):
        opt = torch.optim.AdamW(m.parameters(), lr=torch.tensor(1e-2), eps=1e-3)
        return opt, torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)

    (opt_e, sched_e), (opt_c, sched_c) = make(model_e), make(model_c)
    x, y = torch.randn(5, 8), torch.randn(5, 4)

    def train_step(x, y):
        loss = _mse(model_c, x, y)
        loss.backward()
        opt_c.step()
        opt_c.zero_grad()
        return loss.detach()

    step = tpu_inductor.compile_step(train_step, opt_c, fullgraph=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "lr_scheduler.step() before optimizer.step()"
        for _ in range(4):
            loss_c = step(x, y)
            sched_c.step()
            loss_e = _mse(model_e, x, y)
            loss_e.backward()
            opt_e.step()
            opt_e.zero_grad()
            sched_e.step()
            torch.testing.assert_close(loss_c, loss_e.detach(), atol=ATOL, rtol=RTOL)
    _same_state(opt_c, opt_e, list(model_c.parameters()), list(model_e.parameters()), "lr")
    assert float(opt_c.param_groups[0]["lr"]) == float(opt_e.param_groups[0]["lr"])
    assert getattr(opt_c.step, "_wrapped_by_lr_sched", False)
    assert cache.STATS.graphs == 1  # the optimizer state exists before the first trace


@pytest.mark.parametrize("choice", ["full", "selective"])
def test_checkpointed_llama_step_is_one_program_with_eager_numbers(choice):
    # Activation checkpointing inside one program: AOTAutograd's one-graph rematerialization
    # refused SDPA (tagged random for its dropout) even at dropout_p=0.0; compile_step tells it
    # attention without dropout is deterministic (train_step._deterministic_attention_recompute).
    from tpu_inductor.training.planning import checkpoint_blocks

    model_e = tiny_llama("sdpa", vocab_size=64).train()
    model_c = copy.deepcopy(model_e)
    assert checkpoint_blocks(model_e, choice) == checkpoint_blocks(model_c, choice) == 2
    opt_e, opt_c = (
        torch.optim.AdamW(m.parameters(), lr=1e-3, eps=1e-3) for m in (model_e, model_c)
    )
    ids = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(2))

    train_step = lm_train_step(model_c, opt_c, use_cache=False)
    step = tpu_inductor.compile_step(train_step, opt_c, fullgraph=True)
    for i in range(2):
        # transformers' `kernels` layers set a context variable in each block's forward, which
        # Dynamo refuses inside a checkpoint unless told to skip it in the recompute
        with torch._dynamo.config.patch(skip_fwd_side_effects_in_bwd_under_checkpoint=True):
            runs, loss_c = _programs_per_call(step, ids)
        loss_e = model_e(ids, labels=ids, use_cache=False).loss
        loss_e.backward()
        opt_e.step()
        opt_e.zero_grad()
        assert runs == 1
        torch.testing.assert_close(loss_c, loss_e.detach(), atol=ATOL, rtol=RTOL)
        _same_state(opt_c, opt_e, list(model_c.parameters()), list(model_e.parameters()), i)


class _BranchOnLoss(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 4)

    def forward(self, x):
        h = self.a(x)
        if h.mean() > 0:  # a branch on a value: Dynamo breaks the graph here
            h = h.relu()
        return self.b(h)


def test_a_step_that_breaks_the_graph_runs_in_parts_with_eager_numbers(caplog):
    """A step Dynamo cannot trace whole is not one program: traced with loss.backward() in it,
    torch 2.13 lost every gradient across the break (the optimizer changed nothing, silently).
    compile_step sees the break before anything runs, says so once, and runs the step in parts
    with backward() in eager autograd: eager's losses, parameters and state."""
    import logging

    g = torch.Generator().manual_seed(3)
    batch = (torch.randn(5, 8, generator=g), torch.randn(5, 4, generator=g))
    torch.manual_seed(0)
    caplog.set_level(logging.WARNING, logger="tpu_inductor.progress")
    _run(
        _BranchOnLoss(),
        lambda m: torch.optim.AdamW(m.parameters(), lr=1e-2, eps=1e-3),
        batch,
        _mse,
        fullgraph=False,
    )
    said = [r.getMessage() for r in caplog.records if "cannot be one program" in r.getMessage()]
    assert len(said) == 1 and "train_step breaks the graph" in said[0], said

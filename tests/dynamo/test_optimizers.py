"""Compiled optimizer steps with learning-rate schedulers (``tpu_inductor/dynamo/optimizers.py``):
every
torch and transformers scheduler, warmup from lr = 0 included, gives eager's parameters with a
compiled ``opt.step`` and never recompiles it; torch's capturable-Adam NaN at lr = 0 is
repaired; a float lr that changes says what to do."""

from __future__ import annotations

import logging

import pytest
import torch
import torch._dynamo.testing
import torch.nn as nn
from torch.optim import lr_scheduler as S

import tpu_inductor
from tests.helpers import assert_same
from tpu_inductor.core.transfers import D2H, H2D, TOTAL
from tpu_inductor.dynamo import optimizers

STEPS = 6


class _Net(nn.Module):
    """An embedding of which each batch uses a few rows: the rows no batch used keep a zero
    gradient and a zero ``exp_avg_sq``, which is what torch's capturable Adam turns into NaN
    at lr = 0."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.emb = nn.Embedding(16, 8)
        self.lin = nn.Linear(8, 4)

    def forward(self, ids):
        return self.lin(self.emb(ids)).square().mean()


def _batch(step: int) -> torch.Tensor:
    return torch.tensor([[step % 3, 1, 2, 3]])  # rows 4..15 are never used


def _train(scheduler_factory, compiled: bool, opt_cls=torch.optim.AdamW, steps=STEPS, **kw):
    """Losses and parameters after each step; the compiled run uses a tensor lr (the README's
    recipe), the eager one a float lr (what eager code writes). Returns (losses, params per
    step, Dynamo frames compiled for the step)."""
    model = _Net()
    lr = torch.tensor(0.05) if compiled else 0.05
    opt = opt_cls(model.parameters(), lr=lr, **kw)
    sched = scheduler_factory(opt)
    counter = torch._dynamo.testing.CompileCounterWithBackend("tpu")
    step = torch.compile(opt.step, backend=counter) if compiled else opt.step
    loss_fn = torch.compile(model, backend="tpu") if compiled else model
    losses, params = [], []
    for i in range(steps):
        loss = loss_fn(_batch(i))
        loss.backward()
        step()
        opt.zero_grad()
        if isinstance(sched, S.ReduceLROnPlateau) or type(sched).__name__ == "GreedyLR":
            sched.step(loss.item())
        else:
            sched.step()
        losses.append(loss.detach())
        params.append([p.detach().clone() for p in model.parameters()])
    return losses, params, counter.frame_count


TORCH_SCHEDULERS = {
    "LambdaLR": lambda o: S.LambdaLR(o, lambda s: s / 2),  # lr = 0 at the first step
    "MultiplicativeLR": lambda o: S.MultiplicativeLR(o, lambda s: 0.8),
    "StepLR": lambda o: S.StepLR(o, step_size=2, gamma=0.5),
    "MultiStepLR": lambda o: S.MultiStepLR(o, milestones=[1, 3], gamma=0.3),
    "ConstantLR": lambda o: S.ConstantLR(o, factor=0.5, total_iters=3),
    "LinearLR": lambda o: S.LinearLR(o, start_factor=0.1, total_iters=4),
    "ExponentialLR": lambda o: S.ExponentialLR(o, gamma=0.7),
    "SequentialLR": lambda o: S.SequentialLR(
        o, [S.ConstantLR(o, factor=0.2, total_iters=2), S.ExponentialLR(o, 0.9)], milestones=[2]
    ),
    "PolynomialLR": lambda o: S.PolynomialLR(o, total_iters=5, power=2.0),
    "CosineAnnealingLR": lambda o: S.CosineAnnealingLR(o, T_max=4, eta_min=0.0),
    "ChainedScheduler": lambda o: S.ChainedScheduler(
        [S.ConstantLR(o, factor=0.5, total_iters=2), S.ExponentialLR(o, gamma=0.9)]
    ),
    "ReduceLROnPlateau": lambda o: S.ReduceLROnPlateau(o, factor=0.5, patience=0),
    "CyclicLR": lambda o: S.CyclicLR(
        o, base_lr=0.0, max_lr=0.1, step_size_up=2, cycle_momentum=False
    ),
    "CosineAnnealingWarmRestarts": lambda o: S.CosineAnnealingWarmRestarts(o, T_0=2),
    "OneCycleLR": lambda o: S.OneCycleLR(o, max_lr=0.1, total_steps=STEPS, cycle_momentum=False),
}


def test_every_torch_scheduler_is_covered():
    """A scheduler added to torch must be added to the table above."""
    names = {
        n
        for n, v in vars(S).items()
        if isinstance(v, type) and issubclass(v, S.LRScheduler | S.ReduceLROnPlateau)
    } - {"LRScheduler", "_LRScheduler"}
    assert names <= set(TORCH_SCHEDULERS), names - set(TORCH_SCHEDULERS)


@pytest.mark.parametrize("name", sorted(TORCH_SCHEDULERS))
def test_torch_scheduler_matches_eager_without_recompiling(name):
    e_losses, e_params, _ = _train(TORCH_SCHEDULERS[name], compiled=False)
    c_losses, c_params, frames = _train(TORCH_SCHEDULERS[name], compiled=True)
    for i in range(STEPS):
        assert_same(c_losses[i], e_losses[i], what=f"{name} step {i} loss")
        assert_same(c_params[i], e_params[i], what=f"{name} step {i} params")
    assert frames == 1, f"{name}: opt.step compiled {frames} times"


def _hf_scheduler(name: str, **kwargs):
    transformers = pytest.importorskip("transformers")

    def make(opt):
        return transformers.get_scheduler(
            name,
            opt,
            num_warmup_steps=2,
            num_training_steps=STEPS,
            scheduler_specific_kwargs=kwargs or None,
        )

    return make


HF_SCHEDULERS = {
    "linear": {},
    "cosine": {},
    "cosine_with_restarts": {"num_cycles": 2},
    "polynomial": {"power": 2.0},
    "constant": {},
    "constant_with_warmup": {},
    "inverse_sqrt": {},
    "reduce_lr_on_plateau": {"factor": 0.5, "patience": 0},
    "cosine_with_min_lr": {"min_lr": 1e-3},
    "cosine_warmup_with_min_lr": {"min_lr": 1e-3},
    "warmup_stable_decay": {"num_decay_steps": 2},
    "greedy": {"patience": 1, "min_lr": 1e-3},
}


def test_every_transformers_scheduler_is_covered():
    transformers = pytest.importorskip("transformers")
    assert {s.value for s in transformers.SchedulerType} <= set(HF_SCHEDULERS)


@pytest.mark.parametrize("name", sorted(HF_SCHEDULERS))
def test_transformers_scheduler_matches_eager(name):
    """Warmup schedules start at lr = 0: the first compiled step used to write NaN."""
    make = _hf_scheduler(name, **HF_SCHEDULERS[name])
    e_losses, e_params, _ = _train(make, compiled=False)
    c_losses, c_params, frames = _train(make, compiled=True)
    for i in range(STEPS):
        assert_same(c_losses[i], e_losses[i], what=f"{name} step {i} loss")
        assert_same(c_params[i], e_params[i], what=f"{name} step {i} params")
    # GreedyLR writes a Python float over the tensor lr (param_group["lr"] = new_lr), so
    # Dynamo compiles the step once more, with the float as an input; every other one fills
    # the tensor in place.
    assert frames == (2 if name == "greedy" else 1), f"{name}: {frames} compiles"


@pytest.mark.parametrize(
    "opt_cls, kw",
    [
        (torch.optim.AdamW, {}),
        (torch.optim.Adam, {}),
        (torch.optim.Adam, {"weight_decay": 0.1, "amsgrad": True}),
        (torch.optim.AdamW, {"maximize": True, "amsgrad": True}),
    ],
    ids=["adamw", "adam", "adam-wd-amsgrad", "adamw-maximize-amsgrad"],
)
def test_adam_at_lr_zero_leaves_parameters_unchanged(opt_cls, kw, monkeypatch):
    """lr = 0 then lr > 0: eager's numbers, no NaN, and the update was rewritten once per
    parameter (the repair found torch's formula)."""
    make = lambda o: S.LambdaLR(o, lambda s: min(s, 1))  # noqa: E731
    rewritten = []
    real = optimizers.repair_capturable_adam

    def spy(gm):
        rewritten.append(real(gm))
        return rewritten[-1]

    monkeypatch.setattr(optimizers, "repair_capturable_adam", spy)
    e_losses, e_params, _ = _train(make, False, opt_cls, steps=3, **kw)
    c_losses, c_params, _ = _train(make, True, opt_cls, steps=3, **kw)
    assert not any(p.isnan().any() for p in c_params[0])
    assert_same(c_params[0], [p.detach() for p in _Net().parameters()], what="after lr = 0")
    for i in range(3):
        assert_same(c_losses[i], e_losses[i], what=f"step {i} loss")
        assert_same(c_params[i], e_params[i], what=f"step {i} params")
    assert sum(rewritten) == 3, rewritten  # emb.weight, lin.weight, lin.bias


def test_torch_still_has_the_capturable_adam_bug():
    """The reason for the repair: ``aot_eager`` (torch alone) writes NaN at lr = 0. When this
    fails, torch has fixed pytorch/pytorch#126514 and ``repair_capturable_adam`` can go."""
    model = _Net()
    opt = torch.optim.AdamW(model.parameters(), lr=torch.tensor(0.0))
    model(_batch(0)).backward()
    torch.compile(opt.step, backend="aot_eager")()
    assert model.emb.weight[4:].isnan().all()


def test_unrecognized_capturable_adam_warns(caplog):
    """A graph holding the formula in a shape the repair does not know says so."""
    from torch.fx.experimental.proxy_tensor import make_fx

    def update(p, a, v, s):
        # the capturable formula, but with the eps term added in the other order
        denom = (v.sqrt() / (s * 2.0)).add_(1e-8 / s)
        return p.addcdiv(a, denom)

    args = (torch.randn(4), torch.randn(4), torch.rand(4), torch.tensor(-0.1))
    gm = make_fx(update)(*args)
    for n in gm.graph.nodes:
        if n.target is torch.ops.aten.reciprocal.default:
            n.meta["stack_trace"] = (
                'File "torch/optim/adam.py", line 521, in _single_tensor_adam\n'
                "    ).add_(eps / step_size_neg)\n"
            )
    with caplog.at_level(logging.WARNING, logger="tpu_inductor.progress"):
        assert optimizers.repair_capturable_adam(gm) == 0
    assert "pytorch/pytorch#126514" in caplog.text and "foreach=True" in caplog.text


def test_float_lr_recompiles_once_and_says_what_to_do(caplog):
    """A float lr a scheduler changes: one recompile (Dynamo then passes it as a float64
    tensor), eager's numbers, and one warning with the tensor-lr recipe."""
    model, ref = _Net(), _Net()
    opt = torch.optim.AdamW(model.parameters(), lr=0.05)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=0.05)
    sched, ref_sched = S.ExponentialLR(opt, 0.5), S.ExponentialLR(ref_opt, 0.5)
    counter = torch._dynamo.testing.CompileCounterWithBackend("tpu")
    step = torch.compile(opt.step, backend=counter)
    with caplog.at_level(logging.WARNING, logger="tpu_inductor.progress"):
        for i in range(4):
            model(_batch(i)).backward()
            ref(_batch(i)).backward()
            step()
            ref_opt.step()
            opt.zero_grad()
            ref_opt.zero_grad()
            sched.step()
            ref_sched.step()
    assert counter.frame_count == 2
    assert_same([p.detach() for p in model.parameters()], [p.detach() for p in ref.parameters()])
    hints = [r for r in caplog.records if "lr=torch.tensor" in r.getMessage()]
    assert len(hints) == 1, caplog.text
    assert "param_groups[0]['lr']" in hints[0].getMessage()


def test_tensor_lr_under_keep_on_device_crosses_four_bytes():
    """keep_on_device + a tensor lr + a warmup scheduler: eager's parameters, and per step the
    lr (4 B, filled in place by the scheduler) and the loss gradient (4 B) go in, the loss
    read (4 B) comes out; transfers='error' finds nothing unexpected."""
    make = lambda o: S.LambdaLR(o, lambda s: s / 2)  # noqa: E731
    _, e_params, _ = _train(make, compiled=False)
    model = _Net()
    opt = torch.optim.AdamW(model.parameters(), lr=torch.tensor(0.05))
    sched = make(opt)
    tpu_inductor.keep_on_device(model, opt)
    options = {"transfers": "error"}
    loss_fn = torch.compile(model, backend="tpu", options=options)
    step = torch.compile(opt.step, backend="tpu", options=options)
    per_step = []
    for i in range(STEPS):
        before = TOTAL.copy()
        loss = loss_fn(_batch(i))
        loss.backward()
        step()
        opt.zero_grad()
        sched.step()
        loss.item()
        per_step.append(TOTAL.copy() - before)
    assert_same([p.detach() for p in model.parameters()], e_params[-1])
    last = per_step[-1]
    # the batch (4 int64 = 32 B), the lr (4 B), the loss gradient (4 B); the loss read back
    assert last.bytes(H2D) == 32 + 4 + 4, str(last)
    assert last.bytes(D2H) == 4, str(last)
    assert last.bytes(H2D, "resident") == 0

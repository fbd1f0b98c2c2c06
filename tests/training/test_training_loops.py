"""Whole training loops as people write them, compiled end to end, against CPU eager: the
README's recommended loop (warmup scheduler with a tensor lr, gradient accumulation, clipping
compiled with the step, keep_on_device), ``torch.autocast`` in bf16 around compiled forward and
backward, and transformers' ``Trainer`` with a model compiled in place."""

from __future__ import annotations

import tempfile

import pytest
import torch

import tpu_inductor
from tests.helpers import assert_same, tiny_llama
from tpu_inductor.core.dtypes import tolerance
from tpu_inductor.core.transfers import D2H, H2D, TOTAL

transformers = pytest.importorskip("transformers")

STEPS = 4
BATCHES = torch.randint(1, 128, (2 * STEPS, 2, 16), generator=torch.Generator().manual_seed(0))


def _loop(compiled: bool, keep: bool = False, accumulate: int = 1, bf16: bool = False):
    """The recommended loop (README "Training loop"); eager when not ``compiled``. Returns
    (losses, params, bytes crossing per step)."""
    torch._dynamo.reset()
    tpu_inductor.reset()
    model = tiny_llama()
    model.config.use_cache = False
    opt = torch.optim.AdamW(model.parameters(), lr=torch.tensor(1e-2) if compiled else 1e-2)
    sched = transformers.get_linear_schedule_with_warmup(opt, 2, 10)
    if compiled and keep:
        tpu_inductor.keep_on_device(model, opt)

    def loss_fn(ids):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            return model(ids, labels=ids).loss

    def update():
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()

    if compiled:
        options = {"fallback": "error"}
        loss_fn = torch.compile(loss_fn, backend="tpu", options=options)
        update = torch.compile(update, backend="tpu", options=options)
    losses, per_step, k = [], [], 0
    for _ in range(STEPS):
        before = TOTAL.copy()
        for _ in range(accumulate):
            loss = loss_fn(BATCHES[k]) / accumulate
            loss.backward()
            k += 1
        update()
        sched.step()
        opt.zero_grad()
        losses.append(loss.item())
        per_step.append(TOTAL.copy() - before)
    return torch.tensor(losses), [p.detach().clone() for p in model.parameters()], per_step


@pytest.mark.parametrize(
    "keep, accumulate",
    [
        pytest.param(False, 1, marks=pytest.mark.slow),  # ~20 s each; the others cover it
        (False, 2),
        (True, 1),
        (True, 2),
    ],
    ids=["plain-1", "plain-2", "keep_on_device-1", "keep_on_device-2"],
)
def test_recommended_loop_matches_eager(keep, accumulate):
    e_losses, e_params, _ = _loop(False, accumulate=accumulate)
    losses, params, _ = _loop(True, keep=keep, accumulate=accumulate)
    atol, rtol = tolerance(torch.float32)
    assert_same(losses, e_losses, atol, rtol, what="losses")
    assert_same(params, e_params, atol, rtol, what="params")


def test_recommended_loop_moves_bytes_not_tensors():
    """keep_on_device, clipping compiled with the step: per step the batch goes in (256 B to
    the forward, 256 B of labels to the backward), the lr the scheduler filled (4 B) and the
    loss gradient (4 B); the loss read comes out (4 B). No parameter, grad or state crosses."""
    _, _, per_step = _loop(True, keep=True)
    last = per_step[-1]
    assert last.bytes(H2D) == 256 + 256 + 4 + 4, str(last)
    assert last.bytes(D2H) == 4, str(last)


def test_autocast_bf16_in_compiled_forward_and_backward():
    """torch.autocast('cpu', bfloat16) inside the compiled loss: eager autocast's loss and
    gradients within bf16 tolerance, different from float32's (autocast took effect), in one
    forward and one backward graph. (Parameters after several AdamW steps are not compared:
    with bf16 gradients an element whose gradient is near zero may take an update of the other
    sign, which AdamW makes a full lr step.)"""

    def grads(compiled: bool, bf16: bool = True):
        torch._dynamo.reset()
        tpu_inductor.reset()
        model = tiny_llama()

        def loss_fn(ids):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                return model(ids, labels=ids).loss

        if compiled:
            loss_fn = torch.compile(loss_fn, backend="tpu", options={"fallback": "error"})
        loss = loss_fn(BATCHES[0])
        loss.backward()
        return loss.detach(), [p.grad for p in model.parameters()]

    atol, rtol = tolerance(torch.bfloat16)
    e_loss, e_grads = grads(False)
    loss, c_grads = grads(True)
    graphs = [g.name.split("-")[1] for g in tpu_inductor.report(False).graphs]
    assert graphs == ["forward", "backward"], graphs
    f32_loss, _ = grads(False, bf16=False)
    assert_same(loss, e_loss, atol, rtol)
    assert_same(c_grads, e_grads, atol, rtol, what="grads")
    assert not torch.allclose(e_loss, f32_loss, atol=1e-6, rtol=0)


class _Rows(torch.utils.data.Dataset):
    """Token rows with an extra column the model does not take (Trainer drops it by the
    model's forward signature, which ``model.compile`` keeps)."""

    def __len__(self):
        return 16

    def __getitem__(self, i):
        ids = BATCHES.reshape(-1, 16)[i]
        return {"input_ids": ids, "labels": ids, "source": "synthetic"}


def _trainer_run(mode: str):
    torch._dynamo.reset()
    tpu_inductor.reset()
    model = tiny_llama()
    args = transformers.TrainingArguments(
        output_dir=tempfile.mkdtemp(),
        max_steps=STEPS,
        per_device_train_batch_size=2,
        gradient_accumulation_steps=2,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        seed=0,
        dataloader_num_workers=0,
    )
    lr = 1e-2
    if mode == "eager":
        opt = torch.optim.AdamW(model.parameters(), lr=lr)
    else:
        model.compile(backend="tpu", options={"fallback": "error"})
        opt = torch.optim.AdamW(model.parameters(), lr=torch.tensor(lr))
    sched = transformers.get_linear_schedule_with_warmup(opt, 2, STEPS)
    if mode == "keep":
        tpu_inductor.keep_on_device(model, opt)
    if mode != "eager":
        opt.step = torch.compile(opt.step, backend="tpu", options={"fallback": "error"})
    trainer = transformers.Trainer(
        model=model, args=args, train_dataset=_Rows(), optimizers=(opt, sched)
    )
    trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    return torch.tensor(losses), [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize("mode", [pytest.param("compiled", marks=pytest.mark.slow), "keep"])
def test_trainer_trains_like_eager(mode):
    """Trainer with a model compiled in place (model.compile keeps the forward signature, so
    remove_unused_columns works) and a compiled opt.step with a tensor lr passed through
    ``optimizers=``: eager Trainer's logged losses and final parameters."""
    pytest.importorskip("accelerate")
    e_losses, e_params = _trainer_run("eager")
    losses, params = _trainer_run(mode)
    assert len(losses) == STEPS
    atol, rtol = tolerance(torch.float32)
    assert_same(losses, e_losses, atol, rtol, what="losses")
    assert_same(params, e_params, atol, rtol, what="params")
    assert not tpu_inductor.report(False).fallback_ops

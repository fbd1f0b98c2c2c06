"""What a split training step saves (``capture/saved.py``): log-softmax's two row statistics
instead of the ``[rows, classes]`` log-probabilities, and under autocast no bf16 copy of the
weights; loss and gradients are eager's. Measured with ``report().graphs[i].saved_bytes`` (what
the forward kept for the backward), each rewrite off against on."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import tpu_inductor
from tests.helpers import assert_same, set_knobs

ROWS, HIDDEN, CLASSES = 12, 16, 96


class _Head(nn.Module):
    """A language model's head: logits returned with the loss, widened to float32 for it (as
    transformers' loss does) when ``widen``."""

    def __init__(self, widen: bool):
        super().__init__()
        torch.manual_seed(0)
        self.body, self.head = nn.Linear(HIDDEN, HIDDEN), nn.Linear(HIDDEN, CLASSES)
        self.widen = widen

    def forward(self, x, labels):
        logits = self.head(torch.tanh(self.body(x)))
        wide = logits.float() if self.widen else logits
        return F.cross_entropy(wide, labels, ignore_index=-100), logits


def _step(model, dtype, compiled: bool):
    torch._dynamo.reset()
    tpu_inductor.reset()
    model = copy.deepcopy(model).to(dtype)
    fn = torch.compile(model, backend="tpu", options={"fallback": "error"}) if compiled else model
    torch.manual_seed(1)
    x = torch.randn(ROWS, HIDDEN, dtype=dtype)
    labels = torch.randint(0, CLASSES, (ROWS,))
    labels[3] = -100
    loss, logits = fn(x, labels)
    loss.backward()
    saved = [g.saved_bytes for g in tpu_inductor.report(False).graphs if g.name.endswith("forward")]
    grads = [p.grad for p in model.parameters()]
    return loss.detach(), logits.detach(), grads, saved


@pytest.mark.parametrize(
    "dtype,widen", [(torch.float32, False), (torch.bfloat16, True), (torch.bfloat16, False)]
)
def test_log_softmax_is_recomputed_from_its_statistics(dtype, widen, monkeypatch):
    model = _Head(widen)
    expected = _step(model, dtype, compiled=False)
    loss, logits, grads, (saved,) = _step(model, dtype, compiled=True)
    tol = {} if dtype == torch.float32 else {"atol": 2e-2, "rtol": 2e-2}
    assert_same(loss, expected[0], **tol)
    assert_same(logits, expected[1], **tol)
    assert_same(grads, expected[2], what="grads", **tol)
    set_knobs(monkeypatch, split_log_softmax=False)
    *_, (saved_before,) = _step(model, dtype, compiled=True)
    # before: the log-probabilities (float32 when widened, else the logits' dtype); now two
    # float32 statistics per row (max and sum of exponentials) in their place
    itemsize = 4 if widen or dtype == torch.float32 else 2
    assert saved_before - saved == ROWS * CLASSES * itemsize - 2 * ROWS * 4, (saved_before, saved)


def test_log_softmax_returned_by_the_model_is_saved_as_it_is(monkeypatch):
    """A log-softmax the model returns is written anyway: it stays saved as it is (no rewrite:
    the same bytes saved as with the rewrite off), and the gradients through it and through the
    loss are eager's."""

    def step(x, w, labels):
        logp = torch.log_softmax(x @ w, -1)
        return F.nll_loss(logp, labels), logp

    torch.manual_seed(0)
    x, w = torch.randn(ROWS, HIDDEN), torch.randn(HIDDEN, CLASSES, requires_grad=True)
    labels = torch.randint(0, CLASSES, (ROWS,))

    def run(fn):
        w.grad = None
        loss, logp = fn(x, w, labels)
        (loss + logp.square().mean()).backward()
        return loss.detach(), logp.detach(), w.grad

    def compiled(split: bool):
        set_knobs(monkeypatch, split_log_softmax=split)
        torch._dynamo.reset()
        tpu_inductor.reset()
        out = run(torch.compile(step, backend="tpu", options={"fallback": "error"}))
        graphs = tpu_inductor.report(False).graphs
        return out, [g.saved_bytes for g in graphs if g.name.endswith("forward")]

    expected = run(step)
    (out, kept), (_, kept_off) = compiled(True), compiled(False)
    assert_same(out, expected)
    assert kept == kept_off


class _MLP(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.up, self.down = nn.Linear(HIDDEN, 64), nn.Linear(64, HIDDEN)

    def forward(self, x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return self.down(F.gelu(self.up(x))).float().square().mean()


def _autocast_step(model, compiled: bool):
    torch._dynamo.reset()
    tpu_inductor.reset()
    model = copy.deepcopy(model)
    fn = torch.compile(model, backend="tpu", options={"fallback": "error"}) if compiled else model
    x = torch.randn(ROWS, HIDDEN, generator=torch.Generator().manual_seed(1), requires_grad=True)
    loss = fn(x)
    loss.backward()
    kept = [g.saved_bytes for g in tpu_inductor.report(False).graphs if g.name.endswith("forward")]
    return loss.detach(), [x.grad, *(p.grad for p in model.parameters())], kept


def test_autocast_casts_of_the_weights_are_recomputed(monkeypatch):
    """The forward keeps no bf16 copy of a float32 weight for the backward's matmuls: the
    backward casts the weight again (on TPUs, where XLA fuses the cast into the matmul;
    switched on for the CPU here)."""
    model = _MLP()
    set_knobs(monkeypatch, recast_platforms=("cpu", "tpu"))
    e_loss, e_grads, _ = _autocast_step(model, compiled=False)
    loss, grads, (kept,) = _autocast_step(model, compiled=True)
    assert_same(loss, e_loss, atol=1e-2, rtol=1e-2)
    assert_same(grads, e_grads, atol=1e-2, rtol=1e-2, what="grads")
    set_knobs(monkeypatch, recast_parameters=False)
    *_, (kept_before,) = _autocast_step(model, compiled=True)
    # both bf16 weight copies (the input's gradient reads the first too)
    weights = sum(m.weight.numel() for m in (model.up, model.down)) * 2
    assert kept_before - kept == weights, (kept_before, kept)

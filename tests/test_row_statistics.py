"""Log-softmax in a split training step (``capture/row_statistics.py``): the forward saves its
two row statistics instead of the ``[rows, classes]`` log-probabilities, the backward recomputes
them from the input, and loss and gradients are eager's. Measured with
``report().graphs[i].saved_bytes`` (what the forward kept for the backward), the rewrite off
against on."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import tpu_inductor
from tests.helpers import assert_same
from tpu_inductor.capture import aot

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
    monkeypatch.setattr(aot, "SPLIT_LOG_SOFTMAX", False)
    *_, (saved_before,) = _step(model, dtype, compiled=True)
    # before: the log-probabilities (float32 when widened, else the logits' dtype); now two
    # float32 statistics per row (max and sum of exponentials) in their place
    itemsize = 4 if widen or dtype == torch.float32 else 2
    assert saved_before - saved == ROWS * CLASSES * itemsize - 2 * ROWS * 4, (saved_before, saved)

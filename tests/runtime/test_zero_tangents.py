"""Zero tangents (``runtime/signatures.py: Zeros``): the gradient autograd fills with zeros for
an output nobody differentiated (a language model's logits returned beside its loss) is a
constant of the backward program, not an argument: nothing of its size is made, held or read
on the device. Gradients are eager's; a later call whose tangent is not zero compiles a
backward that takes it, and says why."""

from __future__ import annotations

import re

import torch
import torch.nn as nn
import torch.nn.functional as F

import tpu_inductor
from tests.helpers import assert_same

ROWS, CLASSES = 32, 1000


class _LM(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.head = nn.Linear(16, CLASSES)

    def forward(self, x, labels):
        logits = self.head(x)
        return F.cross_entropy(logits, labels), logits


def _grads(model, fn, x, labels, logits_grad=None):
    model.zero_grad()
    loss, logits = fn(x, labels)
    if logits_grad is None:
        loss.backward()
    else:
        torch.autograd.backward([loss, logits], [torch.tensor(1.0), logits_grad])
    return [p.grad.clone() for p in model.parameters()]


def _backward_arguments(dump, n: int) -> list[str]:
    """The shapes the backward's executable ``n`` takes (its jaxpr's binders)."""
    jaxpr = next(dump.glob("*backward*")) / f"executable{n}.jaxpr.txt"
    binders = jaxpr.read_text().split(".", 1)[0]
    return re.findall(r"\w+\[[\d,]*\]", binders)


def test_zero_tangent_is_a_constant_of_the_backward(tmp_path):
    torch._dynamo.reset()
    tpu_inductor.reset()
    model = _LM()
    fn = torch.compile(model, backend="tpu", options={"dump_dir": str(tmp_path)})
    x, labels = torch.randn(ROWS, 16), torch.randint(0, CLASSES, (ROWS,))
    for _ in range(2):
        assert_same(_grads(model, fn, x, labels), _grads(model, model, x, labels), what="grads")
    logits = f"f32[{ROWS},{CLASSES}]"
    # the saved logits only (the backward recomputes the log-softmax from them), no tangent
    assert _backward_arguments(tmp_path, 0).count(logits) == 1
    (fw, bw) = tpu_inductor.report(False).graphs
    assert [b[0] for b in bw.builds] == ["first call"], bw.builds

    # a real gradient for the logits: a backward that takes it, eager's gradients
    g = torch.randn(ROWS, CLASSES)
    assert_same(_grads(model, fn, x, labels, g), _grads(model, model, x, labels, g), what="grads")
    assert _backward_arguments(tmp_path, 1).count(logits) == 2
    (fw, bw) = tpu_inductor.report(False).graphs
    assert bw.builds[1][0].endswith("no longer all zeros"), bw.builds
    # and back: the zero-tangent executable is still cached
    assert_same(_grads(model, fn, x, labels), _grads(model, model, x, labels), what="grads")
    assert len(tpu_inductor.report(False).graphs[1].builds) == 2

"""Foreach ops (``lowerings/foreach.py``): every foreach optimizer step, ``clip_grad_norm_`` and
``zero_grad(set_to_none=False)`` compiled with ``fallback='error'`` against CPU eager."""

from __future__ import annotations

import pytest
import torch

from tests.helpers import assert_same

OPTIMIZERS = [
    "Adadelta",
    "Adagrad",
    "Adam",
    "AdamW",
    "Adamax",
    "ASGD",
    "NAdam",
    "RAdam",
    "RMSprop",
    "Rprop",
    "SGD",
]


def _params():
    torch.manual_seed(0)
    return [torch.nn.Parameter(torch.randn(6, 4)), torch.nn.Parameter(torch.randn(3))]


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_foreach_optimizer_step_matches_eager(name):
    kw = {"momentum": 0.9} if name == "SGD" else {}
    results = []
    for compiled in (False, True):
        params = _params()
        opt = getattr(torch.optim, name)(params, lr=0.01, foreach=True, **kw)
        step = opt.step
        if compiled:
            step = torch.compile(opt.step, backend="tpu", options={"fallback": "error"})
        for i in range(3):
            g = torch.Generator().manual_seed(i)
            for p in params:
                p.grad = torch.randn(p.shape, generator=g)
            step()
        results.append([p.detach().clone() for p in params])
    assert_same(results[1], results[0], what=f"{name} params")


def test_clip_grad_norm_and_zero_grad_compile():
    """clip_grad_norm_ takes the foreach path (_foreach_norm, _foreach_mul_) for plain CPU
    tensors; zero_grad(set_to_none=False) is _foreach_zero_."""

    def clip(params):
        return torch.nn.utils.clip_grad_norm_(params, 0.5)

    def zero(params):
        torch.optim.SGD(params, lr=0.1).zero_grad(set_to_none=False)

    expected, actual = _params(), _params()
    for ps in (expected, actual):
        for i, p in enumerate(ps):
            p.grad = torch.full(p.shape, float(i + 1))
    norm = clip(expected)
    got = torch.compile(clip, backend="tpu", options={"fallback": "error"})(actual)
    assert_same(got, norm)
    assert_same([p.grad for p in actual], [p.grad for p in expected], what="clipped grads")
    torch.compile(zero, backend="tpu", options={"fallback": "error"})(actual)
    assert all(p.grad is not None and not p.grad.any() for p in actual)

"""``_foreach_*`` ops and the grad scaler's unscale (``tpu_inductor.capture.foreach``): compiled
with
``fallback="error"`` (so each is lowered, not run in torch) they match CPU eager, and compiled
foreach optimizers are lowered whole."""

from __future__ import annotations

import pytest
import torch

from tests.helpers import assert_same

SHAPES = [(3, 4), (5,), (2, 2, 3)]


def _tensors(seed: int, positive: bool = False) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    ts = [torch.randn(s, generator=gen) for s in SHAPES]
    return [t.abs() + 0.5 for t in ts] if positive else ts


CASES = {
    "mul_.Scalar": lambda a, b, c: torch._foreach_mul_(a, 0.5),
    "mul_.List": lambda a, b, c: torch._foreach_mul_(a, b),
    "mul_.ScalarList": lambda a, b, c: torch._foreach_mul_(a, [0.5, 2.0, -1.0]),
    "mul_.Tensor": lambda a, b, c: torch._foreach_mul_(a, torch.tensor(0.25)),
    "add_.List alpha": lambda a, b, c: torch._foreach_add_(a, b, alpha=-0.3),
    "add.Scalar": lambda a, b, c: torch._foreach_add(a, 1.5),
    "sub_.ScalarList": lambda a, b, c: torch._foreach_sub_(a, [1.0, 2.0, 3.0]),
    "div.List": lambda a, b, c: torch._foreach_div(a, c),
    "lerp_.Scalar": lambda a, b, c: torch._foreach_lerp_(a, b, 0.1),
    "lerp_.List": lambda a, b, c: torch._foreach_lerp_(a, b, c),
    "addcmul_.Scalar": lambda a, b, c: torch._foreach_addcmul_(a, b, c, value=0.5),
    "addcdiv_.ScalarList": lambda a, b, c: torch._foreach_addcdiv_(a, b, c, [0.1, 0.2, 0.3]),
    "norm": lambda a, b, c: torch._foreach_norm(a, 2.0),
    "norm inf": lambda a, b, c: torch._foreach_norm(a, float("inf")),
    "zero_": lambda a, b, c: torch._foreach_zero_(a),
    "sqrt": lambda a, b, c: torch._foreach_sqrt(c),
    "neg_": lambda a, b, c: torch._foreach_neg_(a),
    "pow.ScalarAndTensor": lambda a, b, c: torch._foreach_pow(2.0, a),
    "maximum_.List": lambda a, b, c: torch._foreach_maximum_(a, b),
    "clamp_min_.Scalar": lambda a, b, c: torch._foreach_clamp_min_(a, 0.1),
    "copy_": lambda a, b, c: torch._foreach_copy_(a, b),
}


@pytest.mark.parametrize("name", list(CASES))
def test_foreach_op_matches_eager(name):
    fn = CASES[name]

    def run(a, b, c):
        out = fn(a, b, c)
        return out, a

    want = run(_tensors(0), _tensors(1), _tensors(2, positive=True))
    # fullgraph: Dynamo must capture the op (it can't trace _foreach_max, for one)
    compiled = torch.compile(run, backend="tpu", fullgraph=True, options={"fallback": "error"})
    got = compiled(_tensors(0), _tensors(1), _tensors(2, positive=True))
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bad", [None, float("inf"), float("nan")])
def test_grad_scaler_unscale_matches_eager(dtype, bad):
    def unscale(grads, found_inf, inv_scale):
        torch._amp_foreach_non_finite_check_and_unscale_(grads, found_inf, inv_scale)
        return grads, found_inf

    def inputs():
        grads = [t.to(dtype) for t in _tensors(3)]
        if bad is not None:
            grads[1][2] = bad
        return grads, torch.zeros(()), torch.tensor(1 / 1024)

    want = unscale(*inputs())
    compiled = torch.compile(unscale, backend="tpu", fullgraph=True, options={"fallback": "error"})
    got = compiled(*inputs())
    torch.testing.assert_close(got, want, equal_nan=True)
    assert float(got[1]) == (0.0 if bad is None else 1.0)


# Every foreach optimizer step, clip_grad_norm_ and zero_grad(set_to_none=False) compiled with
# fallback='error' against CPU eager.
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

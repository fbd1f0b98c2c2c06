"""``_foreach_*`` ops and the grad scaler's unscale (``tpu_inductor.foreach``): compiled with
``fallback="error"`` (so each is lowered, not run in torch) they match CPU eager, and compiled
foreach optimizers are lowered whole."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn as nn

import tpu_inductor

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


@pytest.mark.parametrize(
    "opt_cls, kwargs",
    [(torch.optim.AdamW, {}), (torch.optim.SGD, {"momentum": 0.9}), (torch.optim.Adam, {})],
)
def test_compiled_foreach_optimizer_is_lowered_whole(opt_cls, kwargs):
    torch.manual_seed(0)
    ref, dev = nn.Linear(8, 4), nn.Linear(8, 4)
    dev.load_state_dict(ref.state_dict())
    ref_opt = opt_cls(ref.parameters(), lr=1e-2, foreach=True, **kwargs)
    opt = opt_cls(dev.parameters(), lr=1e-2, foreach=True, **kwargs)
    step = torch.compile(opt.step, backend="tpu")
    x = torch.randn(4, 8)
    with warnings.catch_warnings():
        warnings.simplefilter("error", tpu_inductor.FallbackWarning)
        for _ in range(3):
            for m, o, s in ((ref, ref_opt, ref_opt.step), (dev, opt, step)):
                o.zero_grad()
                m(x).square().mean().backward()
                s()
    assert not tpu_inductor.report(print_table=False).fallback_ops
    for a, b in zip(ref.parameters(), dev.parameters(), strict=True):
        torch.testing.assert_close(b, a, atol=1e-6, rtol=1e-5)

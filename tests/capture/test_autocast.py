"""``torch.autocast`` to bfloat16 gives eager's dtypes and values, per op under torch's CPU
autocast policy and through a training step's forward and backward."""

from __future__ import annotations

import copy

import pytest
import torch

from tests.helpers import assert_same, check_fn

aten = torch.ops.aten


_g = torch.Generator().manual_seed(0)

_W = torch.randn(8, 8, generator=_g)
_T = torch.rand(4, 8, generator=_g)
_CW = torch.randn(3, 4, 1, generator=_g)
_LIN = torch.nn.Linear(8, 16)
_LN = torch.nn.LayerNorm(16)

# torch's CPU autocast policy: matmul-like ops in bfloat16, losses/prod/cdist/linalg/fft in
# float32, the rest keep their input's dtype (softmax and layer_norm are not float32 ops on CPU).
AUTOCAST_CASES = {
    "mm": lambda x: x @ _W,
    "linear": lambda x: _LIN(x),
    "linear_softmax": lambda x: torch.softmax(_LIN(x), -1),
    "linear_layer_norm": lambda x: _LN(_LIN(x)),
    "layer_norm_float32_input": lambda x: torch.nn.functional.layer_norm(x, (8,)),
    "bmm": lambda x: torch.bmm(x[None], _W[None]),
    "baddbmm": lambda x: torch.baddbmm(x[None], x[None], _W[None]),
    "addmm": lambda x: torch.addmm(x, x, _W),
    "matmul_plus_float32": lambda x: (x @ _W) + x,
    "conv1d": lambda x: torch.nn.functional.conv1d(x[None], _CW),
    "sdpa": lambda x: torch.nn.functional.scaled_dot_product_attention(
        x[None, None], x[None, None], x[None, None]
    ),
    "log_softmax": lambda x: torch.log_softmax(x @ _W, -1),
    "gelu": lambda x: torch.nn.functional.gelu(x @ _W),
    "group_norm": lambda x: torch.nn.functional.group_norm((x @ _W)[None], 2),
    "cross_entropy": lambda x: torch.nn.functional.cross_entropy(x @ _W, torch.arange(4)),
    "nll_loss": lambda x: torch.nn.functional.nll_loss(
        torch.log_softmax(x @ _W, -1), torch.arange(4)
    ),
    "mse_loss": lambda x: torch.nn.functional.mse_loss(x @ _W, x),
    "bce_with_logits": lambda x: torch.nn.functional.binary_cross_entropy_with_logits(x @ _W, _T),
    "kl_div": lambda x: torch.nn.functional.kl_div(x @ _W, _T, reduction="batchmean"),
    "prod": lambda x: (x @ _W).prod(-1),
    "cdist": lambda x: torch.cdist(x @ _W, x),
    "rfft_abs": lambda x: torch.fft.rfft(x @ _W).abs(),
    "vector_norm": lambda x: torch.linalg.vector_norm(x @ _W, dim=-1),
}


def _autocast(fn):
    def run(x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return fn(x)

    return run


@pytest.mark.parametrize("name", list(AUTOCAST_CASES))
def test_autocast_bfloat16_matches_eager(name):
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(1))
    check_fn(_autocast(AUTOCAST_CASES[name]), x, atol=1e-2, rtol=1e-2)


def test_autocast_training_step_matches_eager():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
    eager, comp = copy.deepcopy(model), copy.deepcopy(model)
    cmodel = torch.compile(comp, backend="tpu")
    x, y = torch.randn(5, 8), torch.arange(5) % 4

    def loss(m):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = m(x)
            return out, torch.nn.functional.cross_entropy(out, y)

    out_e, loss_e = loss(eager)
    out_c, loss_c = loss(cmodel)
    assert_same(out_c, out_e, atol=1e-2, rtol=1e-2)
    assert_same(loss_c, loss_e, atol=1e-2, rtol=1e-2)
    loss_e.backward()
    loss_c.backward()
    for (name, pe), pc in zip(eager.named_parameters(), comp.parameters(), strict=True):
        assert_same(pc.grad, pe.grad, atol=2e-2, rtol=2e-2, what=f"grad of {name}")

"""Donation: on TPU/GPU a graph that overwrites an input in place donates its buffer, so
resident state is not held twice. JAX's CPU client donates too, so these tests run the
accelerators' path on CPU (the knob ``donate_on_cpu``) and check that a donated buffer is
really gone and that no later call, backward or eager read ever touches it."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn

import tpu_inductor
from tests.helpers import set_knobs, tiny_llama
from tpu_inductor.runtime.residency import VALUES


@pytest.fixture
def donating(monkeypatch):
    torch._dynamo.reset()
    tpu_inductor.reset()
    set_knobs(monkeypatch, donate_on_cpu=True)
    yield
    torch._dynamo.reset()
    tpu_inductor.reset()


def _close(a, b):
    torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_batchnorm_statistics_are_donated_and_stay_correct(donating):
    torch.manual_seed(0)
    ref = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU()).train()
    model = copy.deepcopy(ref)
    cm = torch.compile(model, backend="tpu")
    x = torch.randn(2, 3, 8, 8)
    _close(cm(x), ref(x))
    before = VALUES.lookup(model[1].running_mean)
    assert before is not None, "the new running mean is not on the device"
    _close(cm(x), ref(x))
    assert before.is_deleted(), "the overwritten running mean was not donated"
    for _ in range(2):
        out, want = cm(x), ref(x)
        out.sum().backward(), want.sum().backward()
        _close(out, want)
    _close(model[1].running_mean, ref[1].running_mean)
    _close(model[1].running_var, ref[1].running_var)
    _close(model[0].weight.grad, ref[0].weight.grad)


@pytest.mark.parametrize("keep", [False, True], ids=["default", "keep_on_device"])
def test_compiled_optimizer_donates_parameters_and_state(donating, keep):
    torch.manual_seed(0)
    ref = nn.Sequential(nn.Linear(8, 16), nn.LayerNorm(16), nn.Tanh(), nn.Linear(16, 2))
    model = copy.deepcopy(ref)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    if keep:
        tpu_inductor.keep_on_device(model, opt)
    cm = torch.compile(model, backend="tpu")
    step = torch.compile(opt.step, backend="tpu")
    x = torch.randn(6, 8)
    donated = []
    for i in range(4):
        for m, fn, o, s in ((ref, ref, ref_opt, ref_opt.step), (model, cm, opt, step)):
            o.zero_grad()
            loss = fn(x).square().mean()
            loss.backward()
            if m is model and i >= 1:
                inner = tpu_inductor.runtime.device_owned.unwrap(m[0].weight)
                donated.append(VALUES.lookup(inner))
            s()
            if m is ref:
                want = loss.detach()
        _close(loss.detach(), want)
    assert all(a is not None and a.is_deleted() for a in donated), "parameters not donated"
    for a, b in zip(ref.parameters(), model.parameters(), strict=True):
        _close(b * 1, a.detach())
    st_ref, st = ref_opt.state[ref[0].weight], opt.state[model[0].weight]
    _close(st["exp_avg_sq"] * 1, st_ref["exp_avg_sq"])


def test_static_cache_decode_with_donation_matches_eager(donating):
    model = tiny_llama().eval()
    ids = torch.randint(3, 128, (1, 6), generator=torch.Generator().manual_seed(1))
    kwargs = dict(max_new_tokens=6, do_sample=False, pad_token_id=0, cache_implementation="static")
    want = model.generate(input_ids=ids, **kwargs)
    model.forward = torch.compile(model.forward, backend="tpu")
    for _ in range(2):  # the second generate reuses the executables and the donated cache
        assert torch.equal(model.generate(input_ids=ids, **kwargs), want)

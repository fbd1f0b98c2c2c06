"""Eager ops on ``keep_on_device`` state run on the device (``tpu_inductor.runtime.device_eager``).

Every loop here runs twice from the same seed: in CPU eager (the reference) and with the model
and optimizer device-owned, the forward/backward (and where it says so the optimizer step)
compiled, and the eager code between compiled calls (clipping, zero_grad, a grad scaler, EMA
updates, manual SGD, norms for logging) left eager. Losses, norms, gradients and parameters
after N steps must match, and the bytes crossing per steady-state step must be exactly the
Python scalars the loop reads (plus the 4-byte loss gradient every compiled backward takes).
"""

from __future__ import annotations

import copy

import jax.numpy as jnp
import pytest
import torch
import torch.nn as nn

import tpu_inductor
from tests.helpers import kept_llama
from tpu_inductor import DeviceTensor
from tpu_inductor.core import boundary
from tpu_inductor.core.transfers import D2H, H2D, TOTAL
from tpu_inductor.runtime import call as runtime
from tpu_inductor.runtime import device_eager

X = torch.randn(16, 8, generator=torch.Generator().manual_seed(1))


def _model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 32), nn.LayerNorm(32), nn.GELU(), nn.Linear(32, 4))


def _loss(model, x):
    return model(x).square().mean()


@pytest.fixture
def accelerator_imports(monkeypatch):
    """Make every host -> device import a copy, as on a TPU or GPU (on CPU JAX imports through
    DLPack alias host memory, which would hide a stale device value behind the fresh host
    one)."""
    plain = boundary.tensor_to_jax

    def copying(t, device):
        return jnp.array(plain(t, device), copy=True)

    for module in (boundary, runtime, device_eager):
        monkeypatch.setattr(module, "tensor_to_jax", copying)


@pytest.fixture
def eager_ops_on_host():
    with tpu_inductor.config.patch(eager_ops="host"):
        yield


def _moved(before) -> tuple[int, int, dict]:
    d = TOTAL.copy() - before
    return d.bytes(H2D), d.bytes(D2H), {k: v for k, v in d.by_reason.items() if v[1]}


def _clip_loop(dev: bool, steps: int = 5, max_norm: float = 0.05):
    """The loop of the issue: compiled loss and AdamW step, eager clip_grad_norm_ between
    them; returns (losses, norms, model, per-step crossings from step 2 on)."""
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    if dev:
        tpu_inductor.keep_on_device(model, opt)
        loss_fn = torch.compile(lambda x: _loss(model, x), backend="tpu")
        step = torch.compile(opt.step, backend="tpu")
    else:
        loss_fn, step = (lambda x: _loss(model, x)), opt.step
    losses, norms, moved = [], [], []
    for i in range(steps):
        before = TOTAL.copy()
        opt.zero_grad()
        loss = loss_fn(X)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        step()
        losses.append(loss.item())  # the loop reads the loss: 4 bytes
        if i >= 2:
            moved.append(_moved(before))
        norms.append(norm)
    return losses, norms, model, moved


def _assert_same_params(ref: nn.Module, dev: nn.Module, grads: bool = True, **tol):
    tol = tol or {"atol": 1e-5, "rtol": 1e-5}
    for (name, a), b in zip(ref.named_parameters(), dev.parameters(), strict=True):
        torch.testing.assert_close(b.detach() * 1, a.detach(), msg=f"{name} differs", **tol)
        if grads:
            torch.testing.assert_close(b.grad * 1, a.grad, msg=f"{name}.grad differs", **tol)


def test_eager_clip_grad_norm_stays_on_the_device(accelerator_imports):
    want_losses, want_norms, ref, _ = _clip_loop(dev=False)
    losses, norms, dev, moved = _clip_loop(dev=True)
    stats = device_eager.STATS.copy()
    assert stats.device > 0 and stats.host == 0, stats
    torch.testing.assert_close(losses, want_losses, atol=1e-6, rtol=1e-5)
    assert all(isinstance(n, DeviceTensor) for n in norms), "the total norm should be lazy"
    before = TOTAL.copy()
    got_norms = [n.item() for n in norms]  # read now: 4 bytes each, nothing else
    assert _moved(before)[1] == 4 * len(norms)
    torch.testing.assert_close(got_norms, [n.item() for n in want_norms], atol=1e-6, rtol=1e-5)
    _assert_same_params(ref, dev)
    # per steady-state step: the loss gradient in, the loss read out; no gradient crossed
    assert moved == [(4, 4, {(H2D, "input"): [1, 4], (D2H, "sync"): [1, 4]})] * 3, moved
    assert "eager ops on keep_on_device state" in str(tpu_inductor.report(print_table=False))


def test_before_eager_ops_ran_on_the_device_clipping_moved_every_gradient(eager_ops_on_host):
    want_losses, _, ref, _ = _clip_loop(dev=False)
    losses, _, dev, moved = _clip_loop(dev=True)
    torch.testing.assert_close(losses, want_losses, atol=1e-6, rtol=1e-5)
    grads = sum(p.numel() * 4 for p in dev.parameters())
    assert moved[-1][1] == grads + 4 and moved[-1][0] == grads + 4, moved[-1]


def test_foreach_clipping_and_clip_grad_value():
    """clip_grad_norm_'s foreach path (torch refuses foreach=True on CPU tensors, so its ops
    are called as it calls them) and clip_grad_value_."""
    ref, dev = _model(), _model()
    tpu_inductor.keep_on_device(dev)
    loss_fn = torch.compile(lambda x: _loss(dev, x), backend="tpu")
    _loss(ref, X).backward()
    loss_fn(X).backward()
    before = TOTAL.copy()
    for m in (ref, dev):
        grads = [p.grad for p in m.parameters()]
        norms = torch._foreach_norm(grads, 2.0)
        total = torch.linalg.vector_norm(torch.stack(norms), 2.0)
        torch._foreach_mul_(grads, torch.clamp(0.05 / (total + 1e-6), max=1.0))
        torch.nn.utils.clip_grad_value_(m.parameters(), 0.004)
        torch._foreach_add_(grads, grads, alpha=0.5)
    assert _moved(before)[:2] == (0, 0)
    _assert_same_params(ref, dev)


@pytest.mark.parametrize("set_to_none", [True, False])
def test_zero_grad_and_accumulation_move_nothing(set_to_none):
    ref, dev = _model(), _model()
    ref_opt = torch.optim.SGD(ref.parameters(), lr=1e-2)
    opt = torch.optim.SGD(dev.parameters(), lr=1e-2)
    tpu_inductor.keep_on_device(dev, opt)
    loss_fn = torch.compile(lambda x: _loss(dev, x), backend="tpu")
    step = torch.compile(opt.step, backend="tpu")
    micro = [X[:8].clone(), X[8:].clone()]  # the same batches every step (imported once)
    for i in range(4):
        before = TOTAL.copy()
        for o, f, s in ((ref_opt, lambda x: _loss(ref, x), ref_opt.step), (opt, loss_fn, step)):
            o.zero_grad(set_to_none=set_to_none)
            for k in range(2):  # two micro-batches: the second accumulates into p.grad
                f(micro[k]).backward()
            s()
        if i >= 2:
            # two loss gradients in; nothing out (zero_ and the accumulation stay there)
            assert _moved(before)[:2] == (8, 0), _moved(before)
    _assert_same_params(ref, dev)


def test_grad_scaler_unscale_and_ema_updates_match_eager(accelerator_imports):
    """A loop with an eager optimizer step driven by torch.amp.GradScaler, clipping after
    unscale_, a norm for logging, and EMA weights updated three ways (lerp_ with a decay that
    changes every step, torch._foreach_lerp_, mul_/add_ with alpha)."""

    def loop(dev: bool, steps: int = 5):
        model = _model()
        ema = copy.deepcopy(model).requires_grad_(False)
        opt = torch.optim.SGD(model.parameters(), lr=1e-1, momentum=0.9)
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0**4)
        if dev:
            tpu_inductor.keep_on_device(model, opt)
            tpu_inductor.keep_on_device(ema)
            loss_fn = torch.compile(lambda x: _loss(model, x), backend="tpu")
        else:
            loss_fn = lambda x: _loss(model, x)  # noqa: E731
        logged, moved = [], []
        for i in range(steps):
            before = TOTAL.copy()
            opt.zero_grad(set_to_none=False)
            scaler.scale(loss_fn(X)).backward()
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
            gnorm = torch.norm(model[0].weight.grad)  # for a log line, read below
            scaler.step(opt)
            scaler.update()
            decay = min(0.99, (1 + i) / (10 + i))
            with torch.no_grad():
                for e, p in zip(ema.parameters(), model.parameters(), strict=True):
                    e.lerp_(p, 1 - decay)
                torch._foreach_lerp_(list(ema.parameters()), list(model.parameters()), 0.5)
                for e, p in zip(ema.parameters(), model.parameters(), strict=True):
                    e.mul_(decay).add_(p, alpha=1 - decay)
            if i >= 2:
                moved.append(_moved(before))
            logged.append(gnorm)
        return model, ema, [g.item() for g in logged], moved

    ref, ref_ema, want, _ = loop(dev=False)
    dev, dev_ema, got, moved = loop(dev=True)
    assert device_eager.STATS.host == 0, device_eager.STATS
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)
    _assert_same_params(ref, dev)
    _assert_same_params(ref_ema, dev_ema, grads=False)
    # per steady-state step, host -> device: the scale (scaler.scale), the loss gradient,
    # inv_scale and found_inf (unscale_); device -> host: found_inf, which scaler.step reads
    # on the host. Every gradient, parameter, momentum and EMA weight stays on the device.
    for h2d, d2h, by in moved:
        assert (h2d, d2h) == (16, 4), by
    programs = device_eager.STATS.programs
    # a decay that changes every step did not build a program per step
    with torch.no_grad():
        for d in (0.3, 0.7, 0.11):
            for e, p in zip(dev_ema.parameters(), dev.parameters(), strict=True):
                e.lerp_(p, d)
    assert device_eager.STATS.programs == programs


def test_manual_sgd_and_norm_logging_on_owned_parameters():
    ref, dev = _model(), _model()
    tpu_inductor.keep_on_device(dev)
    loss_fn = torch.compile(lambda x: _loss(dev, x), backend="tpu")
    for i in range(3):
        before = TOTAL.copy()
        for m, f in ((ref, lambda x: _loss(ref, x)), (dev, loss_fn)):
            for p in m.parameters():
                p.grad = None
            f(X).backward()
            with torch.no_grad():
                for p in m.parameters():
                    p.add_(p.grad, alpha=-0.1)
        norm = torch.norm(dev[0].weight.grad)
        assert isinstance(norm, DeviceTensor)
        if i:
            assert _moved(before)[:2] == (4, 0), _moved(before)
        torch.testing.assert_close(norm.item(), torch.norm(ref[0].weight.grad).item())
    _assert_same_params(ref, dev)


def test_in_place_keeps_identity_and_versions(accelerator_imports):
    model = _model()
    tpu_inductor.keep_on_device(model)
    loss_fn = torch.compile(lambda x: _loss(model, x), backend="tpu")
    loss_fn(X)  # imports the parameters
    w = model[0].weight
    version = w._version
    alias = w.detach()  # taken before the change: sees it too
    with torch.no_grad():
        out = w.mul_(2.0)
    assert out is w and w._version > version and isinstance(w, nn.Parameter)
    ref = _model()
    with torch.no_grad():
        ref[0].weight.mul_(2.0)
    torch.testing.assert_close(alias * 1, ref[0].weight.detach())
    tol = {"atol": 1e-5, "rtol": 1e-5}
    torch.testing.assert_close(loss_fn(X).item(), _loss(ref, X).item(), **tol)  # next graph
    f = torch.compile(lambda a: a.sum(), backend="tpu")
    torch.testing.assert_close(f(alias).item(), ref[0].weight.sum().item(), **tol)
    # autograd sees the in-place change of a tensor it saved
    y = (w * w).sum()
    with torch.no_grad():
        w.add_(1.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.backward()


def test_ops_without_a_device_path_sync_as_before():
    ref, dev = _model(), _model()
    tpu_inductor.keep_on_device(dev)
    loss_fn = torch.compile(lambda x: _loss(dev, x), backend="tpu")
    _loss(ref, X).backward()
    loss_fn(X).backward()
    g, want = dev[0].weight.grad, ref[0].weight.grad
    before = TOTAL.copy()
    # data-dependent shape: no program; the gradient is synced and the op runs in torch
    torch.testing.assert_close(g.nonzero(), want.nonzero())
    assert _moved(before)[1] == g.numel() * 4
    assert device_eager.STATS.host_ops["aten.nonzero.default"] == 1
    # a host tensor that is not a scalar (an activation-like operand): the host's
    noise = torch.randn(g.shape, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        dev[0].weight.add_(noise)
        ref[0].weight.add_(noise)
    torch.testing.assert_close(loss_fn(X).item(), _loss(ref, X).item(), atol=1e-6, rtol=1e-5)


def test_transformers_llama_with_eager_clipping_matches_eager():
    ref, ref_opt, dev, opt, cm, step, ids = kept_llama()
    for i in range(4):
        before = TOTAL.copy()
        got = []
        for fn, m, o, s in ((ref, ref, ref_opt, ref_opt.step), (cm, dev, opt, step)):
            o.zero_grad()
            loss = fn(input_ids=ids, labels=ids, use_cache=False).loss
            loss.backward()
            norm = torch.nn.utils.clip_grad_norm_(m.parameters(), 0.5)
            s()
            got.append((loss.item(), norm.item()))
        torch.testing.assert_close(got[1], got[0], atol=1e-5, rtol=1e-5)
        if i >= 2:  # the loss gradient in; the loss and the norm read out
            assert _moved(before)[:2] == (4, 8), _moved(before)
    _assert_same_params(ref, dev, atol=1e-5, rtol=1e-4)

"""Registration, options, import hygiene and error reporting."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import warnings

import pytest
import torch

import tpu_inductor
from tests.helpers import assert_same, compiled
from tpu_inductor.core.errors import (
    InvalidOptionError,
    ShapeMismatchError,
    UnsupportedDtypeError,
    UnsupportedOpError,
)
from tpu_inductor.dynamo import backend as backend_mod
from tpu_inductor.dynamo.options import parse_options


def _run(code: str) -> str:
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def test_backend_name_works_without_importing_the_package():
    out = _run(
        """
        import sys, torch
        f = torch.compile(lambda x: x.sin() + 1, backend="tpu")
        x = torch.randn(5)
        torch.testing.assert_close(f(x), x.sin() + 1)
        g = torch.compile(lambda x: x * 2, backend="tpu_inductor")
        torch.testing.assert_close(g(x), x * 2)
        print("tpu_inductor" in sys.modules, "tpu" in torch._dynamo.list_backends(),
              "tpu_inductor" in torch._dynamo.list_backends())
        """
    )
    assert out.split() == ["True", "True", "True"]


def test_import_leaves_global_state_alone():
    out = _run(
        """
        import torch, jax
        name = torch._C._get_privateuse1_backend_name()
        dtype = torch.get_default_dtype()
        import tpu_inductor, tpu_inductor.lowering.lowerings
        from jax._src import xla_bridge
        print(jax.config.jax_enable_x64, torch._C._get_privateuse1_backend_name() == name,
              torch.get_default_dtype() == dtype, len(xla_bridge._backends))
        x = torch.randn(4, 4)
        for be in ("inductor", "aot_eager"):
            torch._dynamo.reset()
            f = torch.compile(lambda t: (t @ t).relu(), backend=be)
            torch.testing.assert_close(f(x), (x @ x).relu())
        print("ok")
        """
    )
    assert out.split() == ["False", "True", "True", "0", "ok"]


def test_name_clash_on_tpu_warns_once(monkeypatch):
    class FakeEP:
        value = "torch_tpu.dynamo:backend"
        dist = type("D", (), {"name": "torch-tpu"})()

    monkeypatch.setattr(backend_mod, "_tpu_entry_points", lambda: [FakeEP()])
    backend_mod._warn_if_tpu_name_taken.cache_clear()
    try:
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            f = torch.compile(lambda x: x + 1, backend=tpu_inductor.tpu_inductor_backend)
            f(torch.ones(2))
            torch._dynamo.reset()
            torch.compile(lambda x: x + 2, backend=tpu_inductor.tpu_inductor_backend)(torch.ones(2))
        msgs = [str(x.message) for x in w if "backend 'tpu'" in str(x.message)]
        assert len(msgs) == 1 and "torch-tpu" in msgs[0] and "tpu_inductor" in msgs[0]
    finally:
        backend_mod._warn_if_tpu_name_taken.cache_clear()


def test_unknown_and_invalid_options_are_listed_together():
    with pytest.raises(InvalidOptionError) as e:
        parse_options({"devcie": "cpu", "device": "quantum", "check_meta": "yes"})
    msg = str(e.value)
    assert "unknown option 'devcie'" in msg
    assert "'device' must be one of" in msg
    assert "'check_meta' must be True or False" in msg
    assert "Known options:" in msg and "fallback" in msg


def test_options_reach_the_backend_through_torch_compile():
    f = torch.compile(lambda x: x + 1, backend="tpu", options={"colour": "blue"})
    with pytest.raises(Exception, match="unknown option 'colour'"):
        f(torch.ones(2))


def test_device_option_cpu_and_env(monkeypatch):
    assert_same(compiled(lambda x: x * 3, device="cpu")(torch.ones(2)), torch.full((2,), 3.0))
    monkeypatch.setenv("TPU_INDUCTOR_DEVICE", "cpu")
    assert parse_options(None).device == "cpu"
    with pytest.raises(InvalidOptionError, match="JAX sees only"):
        from tpu_inductor.core.devices import select_device

        select_device("tpu")


@torch.library.custom_op("tpu_inductor_test::mystery", mutates_args=())
def mystery(x: torch.Tensor) -> torch.Tensor:
    return x.clone()


@mystery.register_fake
def _(x):
    return torch.empty_like(x)


@torch.library.custom_op("tpu_inductor_test::enigma", mutates_args=())
def enigma(x: torch.Tensor, n: int) -> torch.Tensor:
    return x.clone()


@enigma.register_fake
def _(x, n):
    return torch.empty_like(x)


def test_custom_op_without_lowering_names_every_missing_op():
    def fn(x):
        y = torch.ops.tpu_inductor_test.mystery(x) + 1
        return torch.ops.tpu_inductor_test.enigma(y, 3)

    with pytest.raises(UnsupportedOpError) as e:
        compiled(fn, fallback="error")(torch.randn(2, 3))
    err = e.value
    msg = str(err)
    assert "tpu_inductor_test.mystery.default(float32[2, 3])" in msg
    assert "tpu_inductor_test.enigma.default(float32[2, 3], 3)" in msg
    assert "test_backend.py" in msg and "mystery(x)" in msg  # the user's source line
    assert "What to do" in msg
    assert len(err.missing) == 2


def test_check_meta_catches_a_wrong_lowering(monkeypatch):
    from tpu_inductor.lowering.lowerings import LOWERINGS
    from tpu_inductor.lowering.lowerings.registry import Lowering

    op = torch.ops.aten.sin.default
    good = LOWERINGS[op]
    bad = Lowering(op, lambda ctx, x: (x[..., :1] * 0).astype("float16"), None, None, False)
    monkeypatch.setitem(LOWERINGS, op, bad)

    tpu_inductor.reset()
    try:
        with pytest.raises(Exception) as e:
            compiled(lambda x: torch.sin(x) * 2, check_meta=True)(torch.randn(3, 4))
        assert isinstance(e.value, ShapeMismatchError) or "ShapeMismatchError" in repr(e.value)
        assert "aten.sin.default" in str(e.value) and "float16[3, 1]" in str(e.value)
    finally:
        LOWERINGS[op] = good
        tpu_inductor.reset()


def test_float64_on_tpu_is_a_clear_error():
    from torch._dynamo.backends.common import aot_autograd

    from tpu_inductor.lowering.lower import check_dtypes

    seen = []

    def grab(gm, example_inputs):
        seen.append(gm)
        return gm

    f = torch.compile(lambda x: x * 2, backend=aot_autograd(fw_compiler=grab))
    f(torch.randn(3, dtype=torch.float64))
    check_dtypes(seen[0], "cpu")  # fine on CPU
    with pytest.raises(UnsupportedDtypeError, match="(?s)float64.*float32"):
        check_dtypes(seen[0], "tpu")


@torch.library.custom_op("tpu_inductor_test::scaled_flip", mutates_args=())
def scaled_flip(x: torch.Tensor) -> torch.Tensor:
    return x.flip(0) * 3


@scaled_flip.register_fake
def _(x):
    return torch.empty_like(x)


scaled_flip.register_autograd(
    lambda ctx, grad: grad.flip(0) * 3, setup_context=lambda ctx, inputs, output: None
)


def test_eager_fallback_runs_unsupported_ops_in_torch_and_warns_once():
    from tpu_inductor.core.errors import FallbackWarning

    def fn(x, w):
        y = (x @ w).relu()
        z = torch.ops.tpu_inductor_test.scaled_flip(y) + 1
        return z.sum(0), torch.ops.tpu_inductor_test.scaled_flip(z).tanh()

    x, w = torch.randn(4, 5), torch.randn(5, 3)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        out = compiled(fn)(x, w)
    assert_same(out, fn(x, w))
    msgs = [str(r.message) for r in rec if issubclass(r.category, FallbackWarning)]
    assert len(msgs) == 1, msgs
    assert msgs[0].count("tpu_inductor_test.scaled_flip.default(float32[4, 3])") == 2
    assert "test_backend.py" in msgs[0]


def test_eager_fallback_in_training_matches_eager_gradients():
    torch.manual_seed(0)
    lin = torch.nn.Linear(5, 3)

    def fn(x):
        return torch.ops.tpu_inductor_test.scaled_flip(lin(x).sigmoid()).pow(2).mean()

    x = torch.randn(4, 5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loss = torch.compile(fn, backend="tpu")(x)
    loss.backward()
    grads = [p.grad.clone() for p in lin.parameters()]
    lin.zero_grad()
    ref = fn(x)
    ref.backward()
    assert_same(loss, ref)
    for g, p in zip(grads, lin.parameters(), strict=True):
        assert_same(g, p.grad)

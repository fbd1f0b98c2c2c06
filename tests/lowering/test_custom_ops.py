"""tpu_inductor.register_lowering: users' JAX lowerings for custom ops and ATen overloads.

A ``torch.library.custom_op`` with ``register_fake`` and ``register_autograd`` compiled forward and
backward against eager; gradients from ``jax.vjp`` (``differentiable="jax_vjp"``), compiled and
eager, against a pure-torch reference; a Pallas kernel (interpreted on CPU); an ATen overload
tpu-inductor only decomposes, and a built-in lowering replaced and restored; a replaced lowering
is never served from a stale executable; every registration error and every wrong-output error,
with its message; no fallback when the op is registered, the complete UnsupportedOpError when not.
"""

from __future__ import annotations

import functools
import warnings

import jax
import jax.numpy as jnp
import pytest
import torch
from jax.experimental import pallas as pl

import tpu_inductor
from tpu_inductor.capture.aot import decomposition_table
from tpu_inductor.core.errors import (
    FallbackWarning,
    LoweringOutputError,
    RegistrationError,
    UnsupportedOpError,
)
from tpu_inductor.lowering import custom_ops
from tpu_inductor.lowering.lowerings import LOWERINGS
from tpu_inductor.runtime import cache

aten = torch.ops.aten
NO_FALLBACK = {"fallback": "error"}


@pytest.fixture(autouse=True)
def _no_fallback_and_no_leftover_registrations():
    with warnings.catch_warnings():
        warnings.simplefilter("error", FallbackWarning)
        yield
    for op in list(custom_ops.REGISTRY):
        tpu_inductor.unregister_lowering(op)


# --- the test ops -------------------------------------------------------------------------------


@torch.library.custom_op("tpu_inductor_test::scaled_mul_sin", mutates_args=())
def scaled_mul_sin(x: torch.Tensor, y: torch.Tensor, *, scale: float = 1.0) -> torch.Tensor:
    """sin(x) * y * scale, in torch (the eager kernel)."""
    return torch.sin(x) * y * scale


@scaled_mul_sin.register_fake
def _(x, y, *, scale=1.0):
    return torch.empty_like(x)


def _setup(ctx, inputs, keyword_only_inputs, output):
    ctx.save_for_backward(*inputs)
    ctx.scale = keyword_only_inputs["scale"]


def _backward(ctx, grad):
    x, y = ctx.saved_tensors
    return grad * torch.cos(x) * y * ctx.scale, grad * torch.sin(x) * ctx.scale


scaled_mul_sin.register_autograd(_backward, setup_context=_setup)


def scaled_mul_sin_jax(x, y, *, scale):
    return jnp.sin(x) * y * scale


# Two outputs, a Python int argument, no torch autograd formula: gradients come from jax.vjp.
@torch.library.custom_op("tpu_inductor_test::tanh_gate", mutates_args=())
def tanh_gate(x: torch.Tensor, w: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(tanh(x) * w, x * w * n), in torch."""
    return torch.tanh(x) * w, x * w * n


@tanh_gate.register_fake
def _(x, w, n):
    return torch.empty_like(x), torch.empty_like(x)


def tanh_gate_jax(x, w, n):
    return jnp.tanh(x) * w, x * w * n


def tanh_gate_reference(x, w, n):
    return torch.tanh(x) * w, x * w * n


# Only a forward: for Pallas, and for the ops that are never registered.
@torch.library.custom_op("tpu_inductor_test::axpy", mutates_args=())
def axpy(x: torch.Tensor, y: torch.Tensor, alpha: float) -> torch.Tensor:
    """x + alpha * y, in torch."""
    return x + alpha * y


axpy.register_fake(lambda x, y, alpha: torch.empty_like(x))


@torch.library.custom_op("tpu_inductor_test::never_lowered", mutates_args=())
def never_lowered(x: torch.Tensor) -> torch.Tensor:
    """x * 3, with no lowering anywhere."""
    return x * 3


never_lowered.register_fake(lambda x: torch.empty_like(x))


# Defined with torch.library.define rather than custom_op (no CustomOpDef, no autograd formula).
_LIB = torch.library.Library("tpu_inductor_test_lib", "DEF")
_LIB.define("cube(Tensor x, float s) -> Tensor")
_LIB.impl("cube", lambda x, s: x**3 * s, "CompositeExplicitAutograd")
torch.library.register_fake(
    "tpu_inductor_test_lib::cube", lambda x, s: torch.empty_like(x), lib=_LIB
)
cube = torch.ops.tpu_inductor_test_lib.cube


def _grads(fn, *inputs, seed=0):
    """``fn``'s outputs (summed with random weights) and the grads of ``inputs``."""
    inputs = [t.detach().clone().requires_grad_() for t in inputs]
    out = fn(*inputs)
    outs = out if isinstance(out, tuple) else (out,)
    gen = torch.Generator().manual_seed(seed)
    loss = sum((o * torch.randn(o.shape, generator=gen)).sum() for o in outs)
    return [o.detach() for o in outs], torch.autograd.grad(loss, inputs)


def _compiled_ops() -> set[str]:
    return {op for c in cache.COMPILED for op in c.exes.lowered.ops}


# --- lowering, forward and backward -------------------------------------------------------------


def test_custom_op_torch_autograd_forward_and_backward():
    """register_fake + register_autograd + register_lowering: the compiled forward and the
    backward AOTAutograd traces from the torch formula equal eager; the JAX function ran."""
    calls = []

    def lowering(x, y, *, scale):
        calls.append(scale)
        return scaled_mul_sin_jax(x, y, scale=scale)

    tpu_inductor.register_lowering(scaled_mul_sin, lowering)
    x, y = torch.randn(5, 3), torch.randn(5, 3)

    def f(x, y):
        return scaled_mul_sin(x, y, scale=2.5) + 1

    cf = torch.compile(f, backend="tpu", options=NO_FALLBACK)
    (got,), got_grads = _grads(cf, x, y)
    (want,), want_grads = _grads(f, x, y)
    torch.testing.assert_close(got, want)
    for g, w in zip(got_grads, want_grads, strict=True):
        torch.testing.assert_close(g, w)
    assert calls == [2.5]
    assert "tpu_inductor_test.scaled_mul_sin.default" in _compiled_ops()


def test_jax_vjp_backward_compiled_and_eager():
    """differentiable='jax_vjp' on an op without a torch formula: compiled forward + backward,
    and eager torch autograd through the op (which runs the same jax.vjp on JAX's CPU), both
    against a pure-torch reference; the backward graph holds the tpu_inductor_vjp op."""
    tpu_inductor.register_lowering(tanh_gate, tanh_gate_jax, differentiable="jax_vjp")
    x, w = torch.randn(4, 6), torch.randn(4, 6)
    want, want_grads = _grads(lambda x, w: tanh_gate_reference(x, w, 3), x, w)
    ctanh = torch.compile(lambda x, w: tanh_gate(x, w, 3), backend="tpu", options=NO_FALLBACK)
    for fn in (ctanh, lambda x, w: tanh_gate(x, w, 3)):
        got, got_grads = _grads(fn, x, w)
        for g, r in zip(got + list(got_grads), want + list(want_grads), strict=True):
            torch.testing.assert_close(g, r)
    ops = _compiled_ops()
    assert "tpu_inductor_test.tanh_gate.default" in ops
    assert "tpu_inductor_vjp.tpu_inductor_test__tanh_gate__default.default" in ops
    tpu_inductor.unregister_lowering(tanh_gate)  # the op's (absent) formula is back
    with pytest.raises(RuntimeError, match="no autograd formula"):
        _grads(lambda x, w: tanh_gate(x, w, 3), x, w)


def test_jax_vjp_on_a_torch_library_op_and_after_unregistering():
    """differentiable='jax_vjp' on an op from torch.library.define: the autograd formula goes in a
    library of its own, removed by unregister_lowering; the op then compiles again (torch's
    dispatch cache must not keep the removed kernel: it segfaulted)."""
    x = torch.randn(5)
    tpu_inductor.register_lowering(cube, lambda x, s: x**3 * s, differentiable="jax_vjp")
    f = torch.compile(lambda x: cube(x, 2.0), backend="tpu", options=NO_FALLBACK)
    (got,), (grad,) = _grads(f, x)
    torch.testing.assert_close(got, x**3 * 2)
    (want,), (want_grad,) = _grads(lambda x: x**3 * 2, x)
    torch.testing.assert_close(grad, want_grad)
    tpu_inductor.unregister_lowering(cube)
    tpu_inductor.register_lowering(cube, lambda x, s: x**3 * s)
    torch._dynamo.reset()
    torch.testing.assert_close(f(x), x**3 * 2)


def _axpy_kernel(x_ref, y_ref, o_ref, *, alpha):
    o_ref[...] = x_ref[...] + alpha * y_ref[...]


def axpy_pallas(x, y, alpha, *, block_rows=8, interpret=None):
    """x + alpha * y as a Pallas kernel over blocks of ``block_rows`` rows."""
    rows, cols = x.shape
    spec = pl.BlockSpec((block_rows, cols), lambda i: (i, 0))
    return pl.pallas_call(
        functools.partial(_axpy_kernel, alpha=alpha),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        grid=(rows // block_rows,),
        in_specs=[spec, spec],
        out_specs=spec,
        interpret=tpu_inductor.pallas_interpret() if interpret is None else interpret,
    )(x, y)


def test_pallas_kernel_interpreted_on_cpu():
    """A Pallas kernel is a lowering like any other; on CPU pallas_interpret() is True at
    trace time, so pallas_call interprets it."""
    seen = []

    def lowering(x, y, alpha):
        seen.append(tpu_inductor.pallas_interpret())
        return axpy_pallas(x, y, alpha)

    tpu_inductor.register_lowering(axpy, lowering)
    x, y = torch.randn(32, 16), torch.randn(32, 16)

    def f(x, y):
        return axpy(x, y, 0.5) * 2

    got = torch.compile(f, backend="tpu", options=NO_FALLBACK)(x, y)
    torch.testing.assert_close(got, f(x, y))
    assert seen == [True]


def test_aten_overload_without_lowering():
    """aten.gcd.default has only a torch decomposition: registered, the decomposition is skipped
    and the op reaches the user's lowering; unregistered, the decomposition is back."""
    assert aten.gcd.default not in LOWERINGS and aten.gcd.default in decomposition_table()
    calls = []

    def gcd(self, other):
        calls.append(self.shape)
        return jnp.gcd(self, other)

    with tpu_inductor.registered_lowering("aten::gcd.default", gcd):
        assert aten.gcd.default not in decomposition_table()
        a, b = torch.randint(-50, 50, (7,)), torch.randint(-50, 50, (7,))
        got = torch.compile(torch.gcd, backend="tpu", options=NO_FALLBACK)(a, b)
        torch.testing.assert_close(got, torch.gcd(a, b))
        assert calls == [(7,)]
    assert aten.gcd.default not in LOWERINGS and aten.gcd.default in decomposition_table()


def test_builtin_lowering_replaced_and_restored():
    """A built-in lowering is replaced only with replace=True, and unregistering restores it."""
    builtin = LOWERINGS[aten.sin.default]
    with pytest.raises(RegistrationError, match=r"aten\.sin\.default.*built-in.*replace=True"):
        tpu_inductor.register_lowering(aten.sin.default, jnp.cos)
    tpu_inductor.register_lowering(aten.sin.default, lambda self: jnp.cos(self), replace=True)
    x = torch.randn(6)
    torch.testing.assert_close(torch.compile(torch.sin, backend="tpu")(x), torch.cos(x))
    tpu_inductor.unregister_lowering(aten.sin.default)
    assert LOWERINGS[aten.sin.default] is builtin
    torch._dynamo.reset()
    torch.testing.assert_close(torch.compile(torch.sin, backend="tpu")(x), torch.sin(x))


def test_replaced_lowering_is_not_served_from_the_cache():
    """Re-registering (replace=True, then a recompile) gives the new function's results: the
    compiled-code cache keys registrations, so the old executable is not reused."""
    x, y = torch.randn(8, 4), torch.randn(8, 4)
    tpu_inductor.register_lowering(axpy, lambda x, y, alpha: x + alpha * y)
    f = torch.compile(lambda x, y: axpy(x, y, 2.0), backend="tpu", options=NO_FALLBACK)
    torch.testing.assert_close(f(x, y), x + 2 * y)
    with tpu_inductor.registered_lowering(axpy, lambda x, y, alpha: x - alpha * y, replace=True):
        torch._dynamo.reset()
        torch.testing.assert_close(f(x, y), x - 2 * y)
    assert custom_ops.REGISTRY[axpy._opoverload].fn(1.0, 1.0, 2.0) == 3.0  # the first is back


# --- errors ---------------------------------------------------------------------------------------


def _two_positional(x, y):
    return x


def _no_scale(x, y):
    return x


def _extra_argument(x, y, *, scale, bias):
    return x


@pytest.mark.parametrize(
    "op, fn, kwargs, match",
    [
        (scaled_mul_sin, 3, {}, r"scaled_mul_sin.*must be a callable.*got int 3"),
        (
            scaled_mul_sin,
            _no_scale,
            {},
            r"_no_scale\(x, y\) cannot take the arguments of "
            r"tpu_inductor_test::scaled_mul_sin\(Tensor x, Tensor y, \*, float scale=1\.?0?\) "
            r"-> Tensor: got an unexpected keyword argument 'scale'.*fn\(x, y, scale=\.\.\.\)",
        ),
        (
            scaled_mul_sin,
            _extra_argument,
            {},
            r"_extra_argument\(x, y, \*, scale, bias\) cannot take.*missing a required "
            r"argument: 'bias'.*keyword-only where the schema's are",
        ),
        (tanh_gate, _two_positional, {}, r"tanh_gate.*too many positional arguments"),
        (torch.sin, jnp.sin, {}, r"not a torch op.*torch\.ops\.aten\.sin\.default"),
        (42, jnp.sin, {}, r"register_lowering\(42\): not a torch op \(int\)"),
        (
            "tpu_inductor_test::nope",
            jnp.sin,
            {},
            r"torch has no op tpu_inductor_test::nope.*define",
        ),
        ("tpu_inductor_test::axpy.nope", jnp.sin, {}, r"has no overload 'nope'.*\['default'\]"),
        ("not an op", jnp.sin, {}, r"not an op name.*'namespace::op'"),
        (axpy, lambda x, y, alpha: x, {"differentiable": "yes"}, r"axpy.*'yes' is not one of"),
        (
            aten.gcd.default,
            lambda self, other: self,
            {"differentiable": "jax_vjp"},
            r"aten\.gcd\.default, differentiable='jax_vjp'\): .*torch's own ops",
        ),
    ],
)
def test_registration_errors(op, fn, kwargs, match):
    """Each mistake is a RegistrationError (also a TypeError/ValueError) naming the op and the fix,
    raised at registration, and registers nothing."""
    with pytest.raises(RegistrationError, match=match) as info:
        tpu_inductor.register_lowering(op, fn, **kwargs)
    assert isinstance(info.value, TypeError | ValueError)
    assert not custom_ops.REGISTRY


def test_registering_twice_and_unregistering_nothing():
    tpu_inductor.register_lowering(axpy, lambda x, y, alpha: x)
    with pytest.raises(
        RegistrationError,
        match=r"tpu_inductor_test\.axpy\.default\): it already has a lowering, .*<lambda>.*"
        r"replace=True.*unregister_lowering",
    ):
        tpu_inductor.register_lowering("tpu_inductor_test::axpy", lambda x, y, alpha: y)
    tpu_inductor.unregister_lowering(torch.ops.tpu_inductor_test.axpy)
    with pytest.raises(RegistrationError, match=r"unregister_lowering\(.*axpy.*\): no lowering"):
        tpu_inductor.unregister_lowering(axpy)


def _wrong_count(x, y, alpha):
    return x, y


def _wrong_shape(x, y, alpha):
    return x[:2]


def _wrong_dtype(x, y, alpha):
    return x.astype(jnp.bfloat16)


@pytest.mark.parametrize(
    "fn, match",
    [
        (
            _wrong_count,
            r"returned 2 outputs \(float32\[4, 3\], float32\[4, 3\]\), but the op "
            r"returns 1 \(float32\[4, 3\]\)\. Return one array",
        ),
        (_wrong_shape, r"output 0: got float32\[2, 3\], expected float32\[4, 3\]"),
        (_wrong_dtype, r"output 0: got bfloat16\[4, 3\], expected float32\[4, 3\]"),
    ],
)
def test_wrong_outputs_name_op_line_and_fix(fn, match):
    """A lowering returning the wrong number of outputs, shape or dtype is a LoweringOutputError
    at the first call naming the op, the function, the user's line, both specs and the fix."""
    tpu_inductor.register_lowering(axpy, fn)

    def f(x, y):
        return axpy(x, y, 1.0) + 1  # the line the error points at

    with pytest.raises(LoweringOutputError, match=match) as info:
        torch.compile(f, backend="tpu", options=NO_FALLBACK)(torch.randn(4, 3), torch.randn(4, 3))
    msg = str(info.value)
    assert f"registered lowering of tpu_inductor_test.axpy.default ({fn.__module__}." in msg
    assert "test_custom_ops.py" in msg and "the line the error points at" in msg
    assert "What to do:" in msg and "register_fake" in msg


def test_wrong_output_count_of_a_multi_output_op():
    tpu_inductor.register_lowering(tanh_gate, lambda x, w, n: jnp.tanh(x) * w)
    with pytest.raises(LoweringOutputError, match=r"returned 1 output .*returns 2 .*a tuple of"):
        torch.compile(lambda x, w: tanh_gate(x, w, 2)[0], backend="tpu")(
            torch.randn(3), torch.randn(3)
        )


def test_unregistered_custom_op_is_the_complete_unsupported_error():
    """Not registered: fallback='error' lists the op with its arguments and source line, and the
    default fallback warns naming it (the op then runs in torch)."""
    x = torch.randn(3, 2)

    def f(x):
        return never_lowered(x.sin()).cos()

    with pytest.raises(UnsupportedOpError) as info:
        torch.compile(f, backend="tpu", options=NO_FALLBACK)(x)
    (line,) = info.value.missing
    assert "tpu_inductor_test.never_lowered.default(float32[3, 2])" in line
    assert "test_custom_ops.py" in line and "never_lowered(x.sin())" in line
    torch._dynamo.reset()
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always", FallbackWarning)
        torch.testing.assert_close(torch.compile(f, backend="tpu")(x), f(x))
    msgs = [str(r.message) for r in rec if issubclass(r.category, FallbackWarning)]
    assert len(msgs) == 1 and "tpu_inductor_test.never_lowered.default" in msgs[0]


def test_registered_lowering_restores_what_was_there():
    first = lambda x, y, alpha: x  # noqa: E731
    tpu_inductor.register_lowering(axpy, first)
    with tpu_inductor.registered_lowering(axpy, lambda x, y, alpha: y, replace=True):
        assert custom_ops.REGISTRY[axpy._opoverload].fn is not first
    assert custom_ops.REGISTRY[axpy._opoverload].fn is first
    tpu_inductor.unregister_lowering(axpy)
    with tpu_inductor.registered_lowering(axpy, first):
        assert axpy._opoverload in LOWERINGS
    assert axpy._opoverload not in LOWERINGS and not custom_ops.REGISTRY


def test_decorator_form():
    @tpu_inductor.register_lowering("tpu_inductor_test::axpy.default")
    def lowering(x, y, alpha):
        return x + alpha * y

    assert custom_ops.REGISTRY[axpy._opoverload].fn is lowering


def test_pallas_interpret_follows_the_compiled_device():
    """pallas_interpret() reads the platform the graph compiles for (LoweringContext.platform),
    not the host's default backend: False for a TPU or GPU graph, True for a CPU one."""
    import types

    from tpu_inductor.lowering.lowerings import LoweringContext

    seen = []

    def lowering(x, y, alpha):
        seen.append(tpu_inductor.pallas_interpret())
        return x + alpha * y

    tpu_inductor.register_lowering(axpy, lowering)
    node = types.SimpleNamespace(meta={"val": torch.empty(3)}, users={})
    for platform in ("tpu", "gpu", "cpu", None):
        ctx = LoweringContext(node=node, precision=None, arg_metas=(), platform=platform)
        LOWERINGS[axpy._opoverload](ctx, (jnp.ones(3), jnp.ones(3), 2.0), {})
    assert seen == [False, False, True, jax.default_backend() not in ("tpu", "gpu")]

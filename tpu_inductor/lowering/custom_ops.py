"""Lowerings users register for their own ops: ``tpu_inductor.register_lowering``.

A ``torch.library.custom_op`` (or an ATen overload tpu-inductor does not lower, or lowers in a
way you want to replace) gets a JAX function, and compiled graphs call it where the op
appears::

    @torch.library.custom_op("mylib::scaled_sin", mutates_args=())
    def scaled_sin(x: torch.Tensor, *, scale: float) -> torch.Tensor:
        return torch.sin(x) * scale

    @scaled_sin.register_fake
    def _(x, *, scale):
        return torch.empty_like(x)

    tpu_inductor.register_lowering(scaled_sin, lambda x, *, scale: jnp.sin(x) * scale)

The JAX function is a pure function of the op's schema arguments: tensors arrive as
``jax.Array`` (tracers), everything else as the Python value torch passes (a dtype as a
``torch.dtype``); arguments before the schema's ``*`` come by position, keyword-only ones by
name, defaults filled in. It returns one array per tensor output (a tuple for several), with the
shapes and dtypes the op's fake (meta) function gives; a mismatch is a
:class:`~tpu_inductor.core.errors.LoweringOutputError` naming the op, the line and both specs.

Gradients come, by default, from the op's own torch autograd formula
(``torch.library.register_autograd``): AOTAutograd traces its backward into ops that are lowered
in turn. ``differentiable="jax_vjp"`` takes them from ``jax.vjp`` of the JAX function instead;
see :func:`register_lowering` for how that is wired into AOTAutograd.

Nothing here runs at import: the library that holds the backward ops of ``"jax_vjp"``
registrations (``tpu_inductor_vjp``) is created on the first such registration.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import hashlib
import inspect
import itertools
import re
from collections.abc import Callable, Iterator
from typing import Literal

import jax
import jax.numpy as jnp
import torch
from torch._ops import HigherOrderOperator, OpOverload, OpOverloadPacket

from tpu_inductor.core.boundary import is_traced
from tpu_inductor.core.dtypes import describe_tensor, to_jax_dtype
from tpu_inductor.core.errors import LoweringOutputError, RegistrationError
from tpu_inductor.core.shapes import concrete_shape
from tpu_inductor.core.sources import user_frame
from tpu_inductor.lowering.lowerings.registry import (
    LOWERINGS,
    Lowering,
    LoweringContext,
    install,
    uninstall,
)

DIFFERENTIABLE = ("torch", "jax_vjp")
# Namespaces of torch's own ops: their autograd formulas are torch's and stay so.
_TORCH_NAMESPACES = frozenset({"aten", "prims", "prim", "quantized", "_quant", "higher_order"})
_ACCELERATORS = frozenset({"tpu", "gpu", "cuda", "rocm"})
VJP_NAMESPACE = "tpu_inductor_vjp"

# The platform the registered lowering being traced compiles for (read by pallas_interpret).
_PLATFORM: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "tpu_inductor_platform", default=None
)
_generations = itertools.count(1)


@dataclasses.dataclass(kw_only=True)
class Registration:
    """One op's registered lowering.

    Attributes:
        op: the ``OpOverload`` it lowers.
        fn: the user's JAX function.
        differentiable: ``"torch"`` or ``"jax_vjp"``.
        generation: a number no other registration in this process has (cache keys use it, so
            a replaced function is never served from an executable built with the old one).
        fingerprint: the function's qualified name and a hash of its source (warm-start keys).
        previous: the built-in lowering this one shadows (restored by unregistering), if any.
        backward_op: for ``"jax_vjp"``: the ``tpu_inductor_vjp`` op computing the gradients.
        undo_autograd: for ``"jax_vjp"``: restores the op's autograd registration as it was.
    """

    op: OpOverload
    fn: Callable
    differentiable: str
    generation: int
    fingerprint: str
    previous: Lowering | None = None
    backward_op: OpOverload | None = None
    undo_autograd: Callable[[], None] | None = None


REGISTRY: dict[OpOverload, Registration] = {}
_VJP_LIB: list = []  # [torch.library.Library] once the first jax_vjp registration made it
_VJP_OPS: dict[OpOverload, OpOverload] = {}  # forward op -> its backward op (defined once)


def register_lowering(
    op,
    fn: Callable | None = None,
    *,
    differentiable: Literal["torch", "jax_vjp"] = "torch",
    replace: bool = False,
):
    """Lower ``op`` to the JAX function ``fn`` in every graph compiled with ``backend="tpu"``.

    Args:
        op: a ``torch.library.custom_op`` (the ``CustomOpDef`` it returns), an ``OpOverload``
            (``torch.ops.mylib.foo.default``), an ``OpOverloadPacket`` (all its functional
            overloads) or a name, ``"mylib::foo"`` or ``"mylib::foo.overload"``. The op must
            exist (import or define it first). ATen overloads work too: one tpu-inductor does
            not lower (its torch decomposition is then skipped), or, with ``replace=True``, one
            whose built-in lowering you want to replace.
        fn: ``fn(*positional_args, **keyword_only_args) -> jax.Array | tuple[jax.Array, ...]``,
            a pure JAX function of the op's schema arguments (see the module docstring). Its
            signature is checked against the schema here. Omit it to use this as a decorator.
            A Pallas kernel is such a function: call ``pl.pallas_call(...,
            interpret=tpu_inductor.pallas_interpret())`` in it to interpret the kernel where
            no Pallas compiler exists (CPU).
        differentiable: where gradients come from.

            - ``"torch"`` (default): the op's own autograd formula
              (``torch.library.register_autograd``). AOTAutograd traces its backward into
              ATen ops (and other custom ops), which are lowered like any others. An op
              without a formula can still be compiled for inference.
            - ``"jax_vjp"`` (custom ops only): ``jax.vjp(fn)``. tpu-inductor registers, for
              you, an autograd formula for ``op`` (a ``custom_op``'s own formula is set aside
              until :func:`unregister_lowering`; an op made with ``torch.library.define`` must
              have no Autograd kernel) whose backward calls a second custom op,
              ``tpu_inductor_vjp::<ns>__<name>__<overload>(Tensor[] grad_outputs, <op's
              arguments>) -> Tensor[]``, returning one gradient per positional tensor
              argument. That op is lowered to ``jax.vjp`` of ``fn`` at the saved arguments
              (so the backward graph recomputes ``fn``: the forward and backward are separate
              XLA programs); called eagerly (torch autograd outside ``torch.compile``) it runs
              the same ``jax.vjp`` on JAX's CPU device. Its fake function gives each gradient
              its input's shape and dtype; integer and bool inputs get no gradient. Tensor-list
              arguments or outputs and ops that mutate their inputs are refused. ``fn`` must be
              reverse-differentiable: ``pallas_call`` is not (give a Pallas op a torch formula,
              or wrap the kernel in ``jax.custom_vjp``).
        replace: replace a lowering ``op`` already has (one registered here, or a built-in
            one) instead of raising.

    Returns:
        ``fn`` (so this works as a decorator), unchanged.

    Raises:
        RegistrationError: naming the op, for an op that is not a torch op or does not exist,
            an op already lowered (without ``replace=True``), a non-callable ``fn``, an ``fn``
            whose signature cannot take the schema's arguments, or an unknown
            ``differentiable``.

    Graphs already compiled keep the lowering they were compiled with; after replacing one,
    call ``torch._dynamo.reset()`` so Dynamo compiles again. Cache keys (in memory and
    ``cache_dir`` warm starts) hold every registration's op, its function's qualified name and
    a hash of its source, and a registration counter, so a replaced ``fn`` is never served from
    an executable built with the old one.

    Example:
        >>> tpu_inductor.register_lowering(scaled_sin, lambda x, *, scale: jnp.sin(x) * scale)
        >>> torch.compile(lambda x: scaled_sin(x, scale=2.0), backend="tpu")(torch.ones(3))
        tensor([1.6829, 1.6829, 1.6829])
    """
    if fn is None:
        return lambda f: register_lowering(op, f, differentiable=differentiable, replace=replace)
    ops = resolve_ops(op)
    label = _label(op, ops)
    if not callable(fn):
        raise RegistrationError(
            f"register_lowering({label}, ...): the lowering must be a callable JAX function, "
            f"got {type(fn).__name__} {fn!r}. What to do: pass a function taking the op's "
            "arguments as jax.Arrays and Python values and returning jax.Array(s)."
        )
    if differentiable not in DIFFERENTIABLE:
        raise RegistrationError(
            f"register_lowering({label}, ...): differentiable={differentiable!r} is not one of "
            f"{DIFFERENTIABLE}: 'torch' uses the op's torch.library.register_autograd formula, "
            "'jax_vjp' takes gradients from jax.vjp of the lowering."
        )
    for o in ops:
        _check_signature(o, fn)
        if differentiable == "jax_vjp":
            _check_vjp_op(o)
        _check_not_lowered(o, replace)
    for o in ops:
        _install(o, fn, differentiable)
    return fn


def unregister_lowering(op) -> None:
    """Remove the lowering :func:`register_lowering` gave ``op`` (every overload it registered).

    A built-in lowering it replaced comes back, and so does the op's own autograd formula a
    ``"jax_vjp"`` registration replaced; the ``tpu_inductor_vjp`` backward op stays defined
    (torch cannot undefine it) but has no lowering until ``op`` is registered again.

    Raises:
        RegistrationError: if ``op`` has no lowering registered with :func:`register_lowering`.
    """
    ops = resolve_ops(op)
    mine = [o for o in ops if o in REGISTRY]
    if not mine:
        raise RegistrationError(
            f"unregister_lowering({_label(op, ops)}): no lowering was registered for it with "
            "tpu_inductor.register_lowering (built-in lowerings can be replaced, not removed)."
        )
    for o in mine:
        _remove(REGISTRY[o])


@contextlib.contextmanager
def registered_lowering(
    op,
    fn: Callable,
    *,
    differentiable: Literal["torch", "jax_vjp"] = "torch",
    replace: bool = False,
) -> Iterator[Callable]:
    """:func:`register_lowering` for the duration of a ``with`` block (tests, notebooks).

    On exit the op's lowering is what it was before the block: none, its built-in one, or the
    registration ``replace=True`` replaced. Yields ``fn``.
    """
    ops = resolve_ops(op)
    before = {o: REGISTRY.get(o) for o in ops}
    register_lowering(op, fn, differentiable=differentiable, replace=replace)
    try:
        yield fn
    finally:
        for o in ops:
            if o in REGISTRY:
                _remove(REGISTRY[o])
            prev = before[o]
            if prev is not None:
                _install(prev.op, prev.fn, prev.differentiable)


def pallas_interpret() -> bool:
    """Whether a Pallas kernel traced now should run with ``pl.pallas_call(interpret=True)``.

    True unless the registered lowering being traced compiles for a TPU or a GPU (the device
    the backend chose, e.g. ``options={"device": "cpu"}`` on a TPU host gives True); outside a
    lowering, JAX's default backend decides. Call it inside the lowering, at trace time.
    """
    platform = _PLATFORM.get() or jax.default_backend()
    return platform not in _ACCELERATORS


def user_registered_ops() -> frozenset[OpOverload]:
    """The ops that currently have a lowering from :func:`register_lowering`."""
    return frozenset(REGISTRY)


def builtin_lowering(op) -> Lowering | None:
    """``op``'s built-in lowering, whether or not a registration shadows it."""
    reg = REGISTRY.get(op)
    return reg.previous if reg is not None else LOWERINGS.get(op)


def fingerprint() -> tuple:
    """What the current registrations change about compiled code, for cache keys."""
    return tuple(
        sorted(
            (str(r.op), r.differentiable, r.generation, r.fingerprint) for r in REGISTRY.values()
        )
    )


# --- resolving and checking -----------------------------------------------------------------


def resolve_ops(op) -> list[OpOverload]:
    """The ``OpOverload`` s ``op`` names (see :func:`register_lowering`'s ``op``).

    Raises:
        RegistrationError: if ``op`` is not a torch op, or names one that does not exist.
    """
    opdef = _custom_op_def(op)
    if opdef is not None:
        return [opdef._opoverload]
    if isinstance(op, OpOverload):
        return [op]
    if isinstance(op, OpOverloadPacket):
        return _functional_overloads(op, str(op))
    if isinstance(op, str):
        return _resolve_name(op)
    if isinstance(op, HigherOrderOperator):
        raise RegistrationError(
            f"register_lowering({op!r}): {op} is a higher-order operator, which takes graphs "
            "as arguments; only ops with a schema (torch.library.custom_op, ATen overloads) can "
            "get a lowering here."
        )
    hint = ""
    name = getattr(op, "__name__", None)
    if callable(op) and name and hasattr(torch.ops.aten, name):
        hint = f" For torch's {name}, pass the ATen overload, e.g. torch.ops.aten.{name}.default."
    raise RegistrationError(
        f"register_lowering({op!r}): not a torch op ({type(op).__name__}). Pass the object "
        "torch.library.custom_op returns, an OpOverload (torch.ops.mylib.foo.default), an "
        f"OpOverloadPacket (torch.ops.mylib.foo) or a name 'mylib::foo[.overload]'.{hint}"
    )


def _custom_op_def(op):
    try:
        from torch._library.custom_ops import CustomOpDef
    except ImportError:  # pragma: no cover - torch without torch.library.custom_op
        return None
    return op if isinstance(op, CustomOpDef) else None


def _resolve_name(name: str) -> list[OpOverload]:
    m = re.fullmatch(r"(\w+)::(\w+)(?:\.(\w+))?", name)
    if m is None:
        raise RegistrationError(
            f"register_lowering({name!r}): not an op name; write 'namespace::op' or "
            "'namespace::op.overload' (e.g. 'mylib::scaled_sin' or 'aten::gcd.default')."
        )
    ns, opname, overload = m.groups()
    packet = getattr(getattr(torch.ops, ns), opname, None) if opname else None
    if not isinstance(packet, OpOverloadPacket):
        raise RegistrationError(
            f"register_lowering({name!r}): torch has no op {ns}::{opname}. What to do: define "
            "it first (torch.library.custom_op / torch.library.define), or import the library "
            "that defines it, before registering its lowering; check the spelling."
        )
    if overload is None:
        return _functional_overloads(packet, name)
    if overload not in packet.overloads():
        raise RegistrationError(
            f"register_lowering({name!r}): {ns}::{opname} has no overload {overload!r}; its "
            f"overloads are {sorted(packet.overloads())}."
        )
    return [getattr(packet, overload)]


def _functional_overloads(packet: OpOverloadPacket, label: str) -> list[OpOverload]:
    ops = [getattr(packet, name) for name in packet.overloads()]
    functional = [o for o in ops if not _mutates(o)]
    if not functional:
        raise RegistrationError(
            f"register_lowering({label!r}): every overload of {packet} writes to its inputs; "
            "compiled graphs are functional and never contain them. Register the functional op."
        )
    return functional


def _mutates(op: OpOverload) -> bool:
    return any(a.alias_info is not None and a.alias_info.is_write for a in op._schema.arguments)


def _label(op, ops: list[OpOverload]) -> str:
    return str(ops[0]) if len(ops) == 1 else repr(op)


def _schema_text(op: OpOverload) -> str:
    return str(op._schema)


def _fn_name(fn) -> str:
    module = getattr(fn, "__module__", None) or ""
    name = getattr(fn, "__qualname__", None) or type(fn).__name__
    return f"{module}.{name}" if module else name


def _call_pattern(op: OpOverload) -> str:
    args = op._schema.arguments
    pos = [a.name for a in args if not a.kwarg_only]
    kw = [f"{a.name}=..." for a in args if a.kwarg_only]
    return f"fn({', '.join(pos + kw)})"


def _check_signature(op: OpOverload, fn) -> None:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin or C function: nothing to check against
        return
    args = op._schema.arguments
    try:
        sig.bind(
            *[a.name for a in args if not a.kwarg_only],
            **{a.name: a.name for a in args if a.kwarg_only},
        )
    except TypeError as e:
        raise RegistrationError(
            f"register_lowering({op}, {_fn_name(fn)}): {_fn_name(fn)}{sig} cannot take the "
            f"arguments of {_schema_text(op)}: {e}. tpu-inductor calls it as "
            f"{_call_pattern(op)} (arguments before the schema's '*' by position, keyword-only "
            "ones by name, defaults filled in). What to do: give the function one parameter "
            "per schema argument, keyword-only where the schema's are."
        ) from None


def _check_vjp_op(op: OpOverload) -> None:
    schema = op._schema
    problem = None
    if op.namespace in _TORCH_NAMESPACES:
        problem = f"{op} is one of torch's own ops, whose gradients are torch's autograd formulas"
    elif _mutates(op):
        problem = f"{op} writes to its inputs"
    elif any(
        isinstance(a.type, torch.ListType) and _is_tensor_type(a.type.getElementType())
        for a in (*schema.arguments, *schema.returns)
    ):
        problem = f"{op} takes or returns a list of tensors"
    elif not schema.returns or not all(_is_tensor_type(r.type) for r in schema.returns):
        problem = f"{op} does not return only tensors"
    elif any(a.kwarg_only and _is_tensor_type(a.type) for a in schema.arguments):
        problem = f"{op} has keyword-only tensor arguments (torch's register_autograd refuses them)"
    if problem:
        raise RegistrationError(
            f"register_lowering({op}, differentiable='jax_vjp'): {problem}. What to do: use "
            "differentiable='torch' (the default) with the op's own autograd formula "
            "(torch.library.register_autograd)."
        )


def _is_tensor_type(t) -> bool:
    if isinstance(t, torch.OptionalType):
        t = t.getElementType()
    return isinstance(t, torch.TensorType)


def _check_not_lowered(op: OpOverload, replace: bool) -> None:
    if replace:
        return
    reg = REGISTRY.get(op)
    if reg is not None:
        raise RegistrationError(
            f"register_lowering({op}): it already has a lowering, {_fn_name(reg.fn)}, "
            "registered with tpu_inductor.register_lowering. What to do: pass replace=True, or "
            "call tpu_inductor.unregister_lowering(op) first."
        )
    if op in LOWERINGS:
        raise RegistrationError(
            f"register_lowering({op}): tpu-inductor already lowers it (a built-in lowering). "
            "What to do: pass replace=True to use yours instead (unregister_lowering(op) "
            "brings the built-in one back)."
        )


# --- installing ------------------------------------------------------------------------------


def _install(op: OpOverload, fn: Callable, differentiable: str) -> None:
    old = REGISTRY.get(op)
    if old is not None:
        _remove(old)
    reg = Registration(
        op=op,
        fn=fn,
        differentiable=differentiable,
        generation=next(_generations),
        fingerprint=_fn_fingerprint(fn),
        previous=LOWERINGS.get(op),  # binds a pending built-in (registered by name) first
    )
    install(Lowering(op=op, fn=_lowering_of(reg)), replace=True)
    REGISTRY[op] = reg
    if differentiable == "jax_vjp":
        try:
            reg.backward_op = _backward_op(op)
            install(Lowering(op=reg.backward_op, fn=_vjp_lowering_of(reg)), replace=True)
            reg.undo_autograd = _register_vjp_autograd(op, reg.backward_op)
        except Exception:
            _remove(reg)
            raise


def _remove(reg: Registration) -> None:
    op = reg.op
    REGISTRY.pop(op, None)
    if reg.previous is not None:
        install(reg.previous, replace=True)
    else:
        uninstall(op)
    if reg.backward_op is not None:
        uninstall(reg.backward_op)
    if reg.undo_autograd is not None:
        reg.undo_autograd()


def _fn_fingerprint(fn) -> str:
    try:
        source = inspect.getsource(fn)
    except (OSError, TypeError):
        code = getattr(fn, "__code__", None)
        source = code.co_code.hex() if code is not None else repr(fn)
    return f"{_fn_name(fn)}:{hashlib.sha256(source.encode()).hexdigest()[:16]}"


# --- lowering: calling fn and checking what it returns ----------------------------------------


def schema_call(op: OpOverload, args, kwargs) -> tuple[list, dict]:
    """The node's arguments as ``fn`` takes them: positional schema arguments in order,
    keyword-only ones by name, with every default filled in."""
    pos, kw = [], {}
    for i, a in enumerate(op._schema.arguments):
        if not a.kwarg_only and i < len(args):
            v = args[i]
        elif a.name in kwargs:
            v = kwargs[a.name]
        elif a.has_default_value():
            v = a.default_value
        else:
            raise TypeError(f"{op}: no value for argument {a.name!r}")
        if a.kwarg_only:
            kw[a.name] = v
        else:
            pos.append(v)
    return pos, kw


_WIDE = (torch.int64, torch.uint64, torch.float64, torch.complex128)


@contextlib.contextmanager
def _platform(platform: str | None):
    token = _PLATFORM.set(platform)
    try:
        yield
    finally:
        _PLATFORM.reset(token)


@contextlib.contextmanager
def _users_jax(ctx: LoweringContext, args: list):
    """How a user's JAX function is traced: with the graph's platform readable
    (:func:`pallas_interpret`), and with JAX's own default of 32-bit types (``jax_enable_x64``
    off) unless its arrays in or out are 64-bit. The graph is traced with x64 on (int64 stays
    int64); a kernel written for JAX's defaults would otherwise make 64-bit indices: a Pallas
    kernel's ``index_map`` then returns i64, which Mosaic refuses to compile for a TPU ("failed
    to legalize operation 'func.return'"; tests/tpu/test_suite.py)."""
    outs = ctx.out if isinstance(ctx.out, list | tuple) else [ctx.out]
    wide = any(isinstance(o, torch.Tensor) and o.dtype in _WIDE for o in outs) or any(
        is_traced(a) and jnp.dtype(a.dtype).itemsize == 8 for a in jax.tree.leaves(args)
    )
    with _platform(getattr(ctx, "platform", None)), jax.enable_x64(wide):
        yield


def _lowering_of(reg: Registration) -> Callable:
    def lower(ctx: LoweringContext, *args, **kwargs):
        pos, kw = schema_call(reg.op, args, kwargs)
        with _users_jax(ctx, [pos, kw]):
            out = reg.fn(*pos, **kw)
        return check_outputs(reg, ctx, out)

    lower.__name__ = lower.__qualname__ = f"registered_lowering[{reg.op}]"
    return lower


def _spec(x) -> str:
    if isinstance(x, torch.Tensor):
        return describe_tensor(x.dtype, x.shape)
    dtype, shape = getattr(x, "dtype", None), getattr(x, "shape", None)
    if dtype is not None and shape is not None:
        return f"{jnp.dtype(dtype).name}{list(shape)}"
    return f"{type(x).__name__} {x!r}"


def check_outputs(reg: Registration, ctx: LoweringContext, out, *, what: str = "lowering"):
    """``out`` as the node's value, after checking it against the node's FakeTensor spec.

    Raises:
        LoweringOutputError: naming the op, the user's line, expected vs got and the fix, for
            the wrong number of outputs, a non-array, or a wrong shape or dtype.
    """
    spec = ctx.out
    multi = isinstance(spec, tuple | list)
    specs = list(spec) if multi else [spec]
    if multi:
        values = list(out) if isinstance(out, tuple | list) else [out]
    else:
        values = [out[0]] if isinstance(out, tuple | list) and len(out) == 1 else [out]
        if isinstance(out, tuple | list) and len(out) != 1:
            values = list(out)
    problems = []
    if len(values) != len(specs):
        got = f"{len(values)} outputs" if isinstance(out, tuple | list) else "1 output"
        problems.append(
            f"returned {got} ({', '.join(_spec(v) for v in values)}), but the op returns "
            f"{len(specs)} ({', '.join(_spec(s) for s in specs)}). Return "
            + ("a tuple of that many arrays, in the schema's order" if multi else "one array")
        )
    else:
        for i, (s, v) in enumerate(zip(specs, values, strict=True)):
            if not isinstance(s, torch.Tensor):
                continue
            if not (hasattr(v, "shape") and hasattr(v, "dtype")):
                problems.append(f"output {i}: got {_spec(v)}, expected a jax.Array {_spec(s)}")
                continue
            want_shape = concrete_shape(s.shape, ctx.bindings)
            want_dtype = to_jax_dtype(s.dtype)
            if tuple(v.shape) != tuple(want_shape) or v.dtype != want_dtype:
                problems.append(
                    f"output {i}: got {_spec(v)}, expected "
                    f"{jnp.dtype(want_dtype).name}{list(want_shape)}"
                )
    if problems:
        name = _fn_name(reg.fn)
        raise LoweringOutputError(
            f"the registered {what} of {reg.op} ({name}, from tpu_inductor.register_lowering) "
            "returned the wrong outputs:\n  - " + "\n  - ".join(problems) + "\n"
            f"  at {user_frame(ctx.node)}\n"
            f"Expected is what torch's fake (meta) function of {reg.op} gives for these inputs "
            f"({_schema_text(reg.op)}). What to do: make {name} return exactly that (e.g. "
            ".astype(...) to the expected dtype), or fix the op's register_fake if it is the "
            "one that is wrong."
        )
    return tuple(values) if multi else values[0]


# --- differentiable="jax_vjp" -----------------------------------------------------------------


def _vjp(fn: Callable, pos: list, kw: dict, grad_outputs: list) -> list:
    """Gradients of ``fn(*pos, **kw)`` for each array in ``pos`` (zeros for integer ones)."""
    tensors = [i for i, a in enumerate(pos) if is_traced(a)]
    diff = [i for i in tensors if jnp.issubdtype(pos[i].dtype, jnp.inexact)]

    def f(*primals):
        args = list(pos)
        for i, p in zip(diff, primals, strict=True):
            args[i] = p
        return fn(*args, **kw)

    out, pullback = jax.vjp(f, *[pos[i] for i in diff])
    outs = list(out) if isinstance(out, tuple | list) else [out]
    cts = [
        jnp.asarray(g).astype(o.dtype) if g is not None else jnp.zeros_like(o)
        for g, o in zip(grad_outputs, outs, strict=True)
    ]
    ct = type(out)(cts) if isinstance(out, tuple | list) else cts[0]
    grads = iter(pullback(ct))
    return [next(grads) if i in diff else jnp.zeros_like(pos[i]) for i in tensors]


def _vjp_lowering_of(reg: Registration) -> Callable:
    def lower(ctx: LoweringContext, *args, **kwargs):
        pos, kw = schema_call(reg.backward_op, args, kwargs)
        with _users_jax(ctx, [pos, kw]):
            grads = _vjp(reg.fn, pos[1:], kw, list(pos[0]))
        return check_outputs(reg, ctx, grads, what="jax.vjp backward")

    lower.__name__ = lower.__qualname__ = f"registered_vjp[{reg.op}]"
    return lower


def _vjp_library():
    if not _VJP_LIB:
        _VJP_LIB.append(torch.library.Library(VJP_NAMESPACE, "FRAGMENT"))
    return _VJP_LIB[0]


def _backward_op(op: OpOverload) -> OpOverload:
    """The ``tpu_inductor_vjp`` op computing ``op``'s gradients (defined on first use)."""
    if op in _VJP_OPS:
        return _VJP_OPS[op]
    lib = _vjp_library()
    name = f"{op.namespace}__{op._opname}__{op._overloadname}"
    text = str(op._schema)
    args = text[text.index("(") + 1 : text.rindex(") -> ")]
    grad_name = "grad_outputs"
    while any(a.name == grad_name for a in op._schema.arguments):
        grad_name = "_" + grad_name
    lib.define(
        f"{name}(Tensor[] {grad_name}, {args}) -> Tensor[]"
        if args
        else f"{name}(Tensor[] {grad_name}) -> Tensor[]"
    )

    def eager(grad_outputs, *args, **kwargs):
        reg = REGISTRY.get(op)
        if reg is None or reg.differentiable != "jax_vjp":
            raise RuntimeError(
                f"{VJP_NAMESPACE}::{name}: {op} has no differentiable='jax_vjp' lowering "
                "registered any more (tpu_inductor.unregister_lowering); register it again."
            )
        return _eager_vjp(reg.fn, list(grad_outputs), list(args), kwargs)

    def fake(grad_outputs, *args, **kwargs):
        return [torch.empty_like(a) for a in args if isinstance(a, torch.Tensor)]

    lib.impl(name, eager, "CompositeExplicitAutograd")
    torch.library.register_fake(f"{VJP_NAMESPACE}::{name}", fake, lib=lib)
    backward = getattr(getattr(torch.ops, VJP_NAMESPACE), name).default
    _VJP_OPS[op] = backward
    return backward


def _eager_vjp(fn: Callable, grad_outputs: list, args: list, kwargs: dict) -> list:
    """``_vjp`` run eagerly on JAX's CPU device, torch tensors in and out."""
    from tpu_inductor.core.boundary import jax_to_host, quiet_readonly_numpy_warning, tensor_to_host

    def to_jax(x):
        return jnp.asarray(tensor_to_host(x.detach().cpu())) if isinstance(x, torch.Tensor) else x

    quiet_readonly_numpy_warning()
    cpu = jax.devices("cpu")[0]
    with jax.enable_x64(True), jax.default_device(cpu), _platform("cpu"):
        grads = _vjp(fn, [to_jax(a) for a in args], kwargs, [to_jax(g) for g in grad_outputs])
        devices = [a.device for a in args if isinstance(a, torch.Tensor)]
        return [jax_to_host(g)[0].clone().to(d) for g, d in zip(grads, devices, strict=True)]


def _register_vjp_autograd(op: OpOverload, backward_op: OpOverload) -> Callable[[], None]:
    """Give ``op`` an autograd formula whose backward is ``backward_op``; returns its undo."""

    def setup_context(ctx, inputs, output, keyword_only_inputs=None):
        tensors = [a for a in inputs if isinstance(a, torch.Tensor)]
        ctx.save_for_backward(*tensors)
        ctx.tpu_args = [None if isinstance(a, torch.Tensor) else a for a in inputs]
        ctx.tpu_is_tensor = [isinstance(a, torch.Tensor) for a in inputs]
        ctx.tpu_kwargs = dict(keyword_only_inputs or {})
        outs = output if isinstance(output, tuple | list) else (output,)
        ctx.tpu_outs = [(o.shape, o.dtype, o.device) for o in outs]

    def backward(ctx, *grads):
        saved = iter(ctx.saved_tensors)
        args = [
            next(saved) if t else a for a, t in zip(ctx.tpu_args, ctx.tpu_is_tensor, strict=True)
        ]
        grads = [
            g if g is not None else torch.zeros(shape, dtype=dtype, device=device)
            for g, (shape, dtype, device) in zip(grads, ctx.tpu_outs, strict=True)
        ]
        result = iter(backward_op(grads, *args, **ctx.tpu_kwargs))
        out = []
        for a in args:
            if isinstance(a, torch.Tensor):
                g = next(result)
                out.append(g if a.is_floating_point() or a.is_complex() else None)
            else:
                out.append(None)
        return tuple(out)

    opdef = _opdef_of(op)
    if opdef is not None:
        before = (opdef._backward_fn, opdef._setup_context_fn)
        opdef.register_autograd(backward, setup_context=setup_context)

        def undo():
            opdef._backward_fn, opdef._setup_context_fn = before

        return undo
    lib = torch.library.Library(op.namespace, "FRAGMENT")
    try:
        torch.library.register_autograd(op, backward, setup_context=setup_context, lib=lib)
    except Exception as e:
        lib._destroy()
        raise RegistrationError(
            f"register_lowering({op}, differentiable='jax_vjp'): torch refused the autograd "
            f"formula tpu-inductor registers for it: {e}"
        ) from e

    def undo():
        lib._destroy()
        op._dispatch_cache.clear()  # it may hold the destroyed kernel (a segfault on next use)

    return undo


def _opdef_of(op: OpOverload):
    try:
        from torch._library.custom_ops import _maybe_get_opdef
    except ImportError:  # pragma: no cover
        return None
    return _maybe_get_opdef(op._schema.name) if op._overloadname == "default" else None

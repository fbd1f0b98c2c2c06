"""Scalar operands of every pointwise binary and ternary op, against CPU eager (issue 23).

For each op the matrix pairs a full tensor of every dtype with Python int / float / bool /
complex scalars and 0-d tensors of every dtype, on either side (and in every operand position
of the ternary ops), and checks dtype (torch's promotion, including wrapped numbers, which
promote only across categories) and values, with negative, zero, non-integer, large, NaN and
infinite values on both sides. Cases eager rejects are dropped. Each op compiles once: its cases
run as one compiled function (``operand_matrix.run_cases``).

The default run covers every op but the special functions of ``SLOW_ONLY`` with a
representative subset (4 tensor dtypes, 8 scalars, 3 0-d dtypes); ``TPU_INDUCTOR_SLOW=1`` runs
the whole matrix (12 tensor dtypes, 18 scalars, 12 0-d dtypes) for every op.
"""

from __future__ import annotations

import math
import operator

import pytest
import torch

from tests.lowering.operand_matrix import COMPLEX_NONFINITE, Case, run_cases
from tpu_inductor.lowering.lowerings import pointwise, special

aten = torch.ops.aten

ALL_DTYPES = (
    torch.bool,
    torch.uint8,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
    torch.complex64,
    torch.complex128,
)
DEFAULT_DTYPES = (torch.bool, torch.int64, torch.bfloat16, torch.float32)

INF, NAN = math.inf, math.nan
ALL_SCALARS = (-3, 0, 2, 7, 10000, 2**40, -2.5, -0.0, 0.849, 3.0, 1e10, NAN, INF, -INF, True,
               False, 1 - 2j, 0.5j)  # fmt: skip
DEFAULT_SCALARS = (-3, 10000, -2.5, 0.849, NAN, -INF, True, 1 - 2j)
ALL_ZERO_D = ALL_DTYPES
DEFAULT_ZERO_D = (torch.int64, torch.float32, torch.float64)

FLOATS = [-2.5, -1.0, -0.0, 0.0, 0.849, 1.0, 2.0, 3.5, 100.0, 1e10, NAN, INF, -INF]
INTS = [-7, -3, -1, 0, 0, 1, 2, 3, 5, 7, 100, 127, -128]
BOOLS = [True, False, True, True, False, False, True, False, True, False, True, True, False]


def tensor_of(dtype: torch.dtype) -> torch.Tensor:
    """13 values of ``dtype``: negatives, zeros (+-0.0), non-integers, large, NaN, +-inf."""
    if dtype == torch.bool:
        return torch.tensor(BOOLS)
    if dtype.is_complex:
        re = torch.tensor(FLOATS, dtype=torch.float64)
        return torch.complex(re, re.flip(0) * 0.5).to(dtype)
    if dtype.is_floating_point:
        return torch.tensor(FLOATS, dtype=torch.float64).to(dtype)
    return torch.tensor(INTS, dtype=torch.int64).to(dtype)  # wraps for uint8, like a C cast


def zero_d_of(dtype: torch.dtype) -> torch.Tensor:
    """A 0-d tensor of ``dtype``: True, -3 (3 unsigned), 0.849 or 1-2j."""
    if dtype == torch.bool:
        return torch.tensor(True)
    if dtype.is_complex:
        return torch.tensor(1 - 2j, dtype=dtype)
    if dtype.is_floating_point:
        return torch.tensor(0.849, dtype=dtype)
    return torch.tensor(3 if dtype == torch.uint8 else -3, dtype=dtype)


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def pool_of(dtypes, zero_d) -> dict[str, torch.Tensor]:
    """Inputs by name: ``t_<dtype>`` (13 values), ``z_<dtype>`` (0-d), ``cond`` (13 bools)."""
    pool = {f"t_{_name(d)}": tensor_of(d) for d in dtypes}
    pool.update({f"z_{_name(d)}": zero_d_of(d) for d in zero_d})
    pool["cond"] = torch.tensor(BOOLS).logical_not()
    return pool


def _torch_fn(packet) -> callable:
    name = packet.__name__
    if name.startswith("special_"):
        return getattr(torch.special, name.removeprefix("special_"))
    return getattr(torch, name)


# Python operators whose reflected form (``2 ** x``) is how users write a scalar on the left.
REFLECTED = {
    "add": operator.add,
    "sub": operator.sub,
    "mul": operator.mul,
    "div": operator.truediv,
    "floor_divide": operator.floordiv,
    "remainder": operator.mod,
    "pow": operator.pow,
    "bitwise_and": operator.and_,
    "bitwise_or": operator.or_,
    "bitwise_xor": operator.xor,
    "bitwise_left_shift": operator.lshift,
    "bitwise_right_shift": operator.rshift,
    "eq": operator.eq,
    "ne": operator.ne,
    "lt": operator.lt,
    "le": operator.le,
    "gt": operator.gt,
    "ge": operator.ge,
}


def binary_ops() -> dict[str, callable]:
    """Every pointwise binary op of the lowering table: the rows of pointwise.py's binary,
    float and comparison tables, special.py's polynomial table, and the binary ops lowered by
    hand (add, sub, div, floor_divide, pow, shifts, zeta, ldexp)."""
    packets = [
        *pointwise.BINARY_DEFAULT,
        *pointwise.BINARY_FLOAT,
        *pointwise.BINARY_NO_OPMATH,
        *pointwise.COMPARISONS,
        *special.POLYNOMIALS,
        aten.add,
        aten.sub,
        aten.div,
        aten.floor_divide,
        aten.pow,
        aten.bitwise_left_shift,
        aten.bitwise_right_shift,
        aten.special_zeta,
        aten.ldexp,
    ]
    ops = {p.__name__: _torch_fn(p) for p in packets}
    for p in special.POLYNOMIALS:
        # Degrees up to 200: torch's kernels loop n times (1e10 takes eager 20 s per element).
        # No NaN x: there eager reads an uninitialized value (chebyshev_polynomial_u(nan, 200)
        # is 5.6e-45 or NaN from one call to the next), so there is nothing to compare with.
        ops[p.__name__] = lambda x, n, f=ops[p.__name__]: f(_not_nan(x), _degrees(n))
    return ops


def _degrees(n):
    return min(n, 200) if isinstance(n, int | float) else n.clamp(max=200)


def _not_nan(x):
    if isinstance(x, int | float):
        return 0.5 if math.isnan(x) else x
    return torch.nan_to_num(x, nan=0.5)


def _label(x) -> str:
    return repr(x) if not isinstance(x, str) else x


def binary_cases(name: str, fn, dtypes, scalars, zero_d) -> list[Case]:
    """``fn(T, s)``, ``fn(s, T)``, ``s <op> T`` and the same with 0-d tensors, for a full tensor
    ``T`` of each dtype."""
    reflected = REFLECTED.get(name)
    cases = []
    for d in dtypes:
        t = f"t_{_name(d)}"
        for s in scalars:
            cases.append(Case(f"{name}({_name(d)}, {s!r})", lambda p, t=t, s=s: fn(p[t], s)))
            cases.append(Case(f"{name}({s!r}, {_name(d)})", lambda p, t=t, s=s: fn(s, p[t])))
            if reflected is not None:
                cases.append(
                    Case(f"{s!r} {name} {_name(d)}", lambda p, t=t, s=s: reflected(s, p[t]))
                )
        for z in zero_d:
            zn = f"z_{_name(z)}"
            cases.append(
                Case(f"{name}({_name(d)}, 0-d {_name(z)})", lambda p, t=t, z=zn: fn(p[t], p[z]))
            )
            cases.append(
                Case(f"{name}(0-d {_name(z)}, {_name(d)})", lambda p, t=t, z=zn: fn(p[z], p[t]))
            )
    return cases


# Ternary forms: ``{t}`` is a full tensor, ``{x}`` a scalar or 0-d tensor operand.
TERNARY = {
    "where(c, {t}, {x})": lambda p, t, x: torch.where(p["cond"], t, x),
    "where(c, {x}, {t})": lambda p, t, x: torch.where(p["cond"], x, t),
    "clamp({t}, min={x})": lambda p, t, x: torch.clamp(t, min=x),
    "clamp({t}, max={x})": lambda p, t, x: torch.clamp(t, max=x),
    "clamp({t}, {x}, {x} + 3)": lambda p, t, x: torch.clamp(t, x, x + 3),
    "clamp_min({t}, {x})": lambda p, t, x: torch.clamp_min(t, x),
    "clamp_max({t}, {x})": lambda p, t, x: torch.clamp_max(t, x),
    "lerp({t}, {t}.flip, {x})": lambda p, t, x: torch.lerp(t, t.flip(0), x),
    "lerp({t}, {x}, 0.3)": lambda p, t, x: torch.lerp(t, x, 0.3),
    "addcmul({t}, {t}, {x})": lambda p, t, x: torch.addcmul(t, t, x),
    "addcmul({x}, {t}, {t})": lambda p, t, x: torch.addcmul(x, t, t.flip(0)),
    "addcdiv({t}, {x}, {t})": lambda p, t, x: torch.addcdiv(t, x, t),
    "add({t}, {x}, alpha=2)": lambda p, t, x: torch.add(t, x, alpha=2),
    "sub({t}, {x}, alpha=-1.5)": lambda p, t, x: torch.sub(t, x, alpha=-1.5),
}
# Scalar arguments that are not operands: ``{s}`` is a Python number.
SCALAR_ARGS = {
    "addcmul({t}, {t}, {t}.flip, value={s})": lambda p, t, s: torch.addcmul(t, t, t.flip(0), value=s),  # noqa: E501
    "addcdiv({t}, {t}, {t}.flip, value={s})": lambda p, t, s: torch.addcdiv(t, t, t.flip(0), value=s),  # noqa: E501
    "add({t}, {t}.flip, alpha={s})": lambda p, t, s: torch.add(t, t.flip(0), alpha=s),
    "sub({t}, {t}.flip, alpha={s})": lambda p, t, s: torch.sub(t, t.flip(0), alpha=s),
    "where(c, {s}, {s} + 1)": lambda p, t, s: torch.where(p["cond"], s, s + 1),
    "where(c, {s}, 0-d {t})": lambda p, t, s: torch.where(p["cond"], s, t[4]),
    "lerp({t}, {t}.flip, 0-d {t})": lambda p, t, s: torch.lerp(t, t.flip(0), t[4]),
    "div({t}, {s}, rounding_mode='floor')": lambda p, t, s: torch.div(t, s, rounding_mode="floor"),
    "div({t}, {s}, rounding_mode='trunc')": lambda p, t, s: torch.div(t, s, rounding_mode="trunc"),
    "div({s}, {t}, rounding_mode='floor')": lambda p, t, s: torch.div(s, t, rounding_mode="floor"),
}  # fmt: skip


def _operands(scalars, zero_d):
    """(label, getter) of the operands a ternary op's non-tensor positions take."""
    out = [(repr(s), lambda p, s=s: s) for s in scalars]
    names = [f"z_{_name(z)}" for z in zero_d]
    out += [(f"0-d {n[2:]}", lambda p, n=n: p[n]) for n in names]
    return out


def ternary_cases(dtypes, scalars, zero_d) -> list[Case]:
    """where, clamp, lerp, addcmul, addcdiv and add/sub with alpha (:data:`TERNARY`): a full
    tensor of each dtype in one position, scalars and 0-d tensors in the others; and the
    non-operand scalars of :data:`SCALAR_ARGS` (``value``, ``alpha``, ...)."""
    cases = []
    for d in dtypes:
        t = f"t_{_name(d)}"
        for label, get in _operands(scalars, zero_d):
            for form, f in TERNARY.items():
                text = form.format(t=_name(d), x=label)
                cases.append(Case(text, lambda p, f=f, t=t, g=get: f(p, p[t], g(p))))
        for s in scalars:
            for form, f in SCALAR_ARGS.items():
                text = form.format(t=_name(d), s=repr(s))
                cases.append(Case(text, lambda p, f=f, t=t, s=s: f(p, p[t], s)))
    return cases


SLOW = pytest.mark.slow
BINARY = binary_ops()


def _check(cases, pool):
    n, problems = run_cases(cases, pool)
    assert n > 0, "eager accepted none of the cases: the matrix tests nothing"
    # Known, documented (docs/ops.md, "Silent mismatches"): complex results with an infinite
    # or NaN part follow XLA's complex arithmetic, not C99 Annex G as torch's kernels do.
    problems = [p for p in problems if f": {COMPLEX_NONFINITE}:" not in p]
    assert not problems, f"{len(problems)} of {n} cases differ from eager:\n" + "\n".join(
        problems[:40]
    )


# Special functions whose graphs take XLA 10-20 s each to compile: the whole matrix only.
SLOW_ONLY = {p.__name__ for p in special.POLYNOMIALS} | {"special_zeta", "igamma", "igammac"}


@pytest.mark.parametrize("name", sorted(set(BINARY) - SLOW_ONLY))
def test_binary_scalar_operands(name):
    """Each binary op with scalar and 0-d operands on either side, a representative subset."""
    cases = binary_cases(name, BINARY[name], DEFAULT_DTYPES, DEFAULT_SCALARS, DEFAULT_ZERO_D)
    _check(cases, pool_of(DEFAULT_DTYPES, DEFAULT_ZERO_D))


def test_ternary_scalar_operands():
    """where, clamp, lerp, addcmul, addcdiv, alpha, rounding modes: a representative subset."""
    scalars, zero_d = (-3, 0.849, NAN, -INF, True), (torch.float32, torch.int64)
    cases = ternary_cases(DEFAULT_DTYPES, scalars, zero_d)
    _check(cases, pool_of(DEFAULT_DTYPES, zero_d))


@SLOW
@pytest.mark.parametrize("name", sorted(BINARY))
def test_binary_scalar_operands_all(name):
    """The whole matrix: every dtype, every scalar, every 0-d dtype, both sides."""
    cases = binary_cases(name, BINARY[name], ALL_DTYPES, ALL_SCALARS, ALL_ZERO_D)
    _check(cases, pool_of(ALL_DTYPES, ALL_ZERO_D))


@SLOW
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=_name)
def test_ternary_scalar_operands_all(dtype):
    """The whole ternary matrix, one compile per tensor dtype."""
    cases = ternary_cases((dtype,), ALL_SCALARS, ALL_ZERO_D)
    _check(cases, pool_of((dtype,), ALL_ZERO_D))


def test_issue_23_int_base_float_exponent():
    """``torch.pow(10000, x)`` and ``2 ** x`` with a float x: base ** x, not base ** trunc(x)."""
    x = torch.tensor([0.849, -1.5, 2.0, 0.5, -0.0])
    cases = [
        Case("pow(10000, x)", lambda p: torch.pow(10000, p["x"])),
        Case("2 ** x", lambda p: 2 ** p["x"]),
        Case("2 ** x (bf16)", lambda p: 2 ** p["x"].bfloat16()),
    ]
    n, problems = run_cases(cases, {"x": x})
    assert n == 3 and not problems, problems


def test_no_jax_dtype_is_a_clear_error():
    """``float16 + 1j`` is complex32 in torch, which JAX has no dtype for: an
    UnsupportedDtypeError naming the dtype, never a silently different dtype."""
    from tpu_inductor.core.errors import UnsupportedDtypeError

    x = torch.tensor([1.0, 2.0], dtype=torch.float16)
    assert (x + 1j).dtype == torch.complex32
    fn = torch.compile(lambda t: t + 1j, backend="tpu", fullgraph=True)
    with pytest.raises(Exception) as e:
        fn(x)
    cause = e.value
    while cause is not None and not isinstance(cause, UnsupportedDtypeError):
        cause = cause.__cause__ or cause.__context__
    assert cause is not None and "complex32" in str(cause)

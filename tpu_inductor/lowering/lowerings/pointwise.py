"""Elementwise ops: unary math, binary arithmetic, comparisons, logic, casts.

Promotion is declared per row (torch's ELEMENTWISE_TYPE_PROMOTION_KIND); the registry casts
inputs to the computation dtype (float32 for half types, like torch's opmath) and the result to
the result dtype, so the functions here see already-promoted arrays.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax import lax
from jax.scipy import special

from tpu_inductor.core.dtypes import to_jax_dtype
from tpu_inductor.lowering.lowerings.registry import (
    P,
    convert,
    lowers,
    opmath_dtype,
    scalar_array,
    upcast,
)

aten = torch.ops.aten


def _unary(f):
    return lambda ctx, self: f(self)


def _binary(f):
    return lambda ctx, self, other: f(self, other)


# --- unary float math: ints and bools compute in the default float dtype ------------------------
UNARY_FLOAT = {
    aten.exp.default: jnp.exp,
    aten.exp2.default: jnp.exp2,
    aten.expm1.default: jnp.expm1,
    aten.log.default: jnp.log,
    aten.log2.default: jnp.log2,
    aten.log10.default: jnp.log10,
    aten.log1p.default: jnp.log1p,
    aten.sqrt.default: jnp.sqrt,
    aten.rsqrt.default: lax.rsqrt,
    aten.sin.default: jnp.sin,
    aten.cos.default: jnp.cos,
    aten.tan.default: jnp.tan,
    aten.asin.default: jnp.arcsin,
    aten.acos.default: jnp.arccos,
    aten.atan.default: jnp.arctan,
    aten.sinh.default: jnp.sinh,
    aten.cosh.default: jnp.cosh,
    aten.tanh.default: jnp.tanh,
    aten.asinh.default: jnp.arcsinh,
    aten.acosh.default: jnp.arccosh,
    aten.atanh.default: jnp.arctanh,
    aten.sigmoid.default: jax.nn.sigmoid,
    aten.erf.default: special.erf,
    aten.erfc.default: special.erfc,
    aten.erfinv.default: special.erfinv,
    aten.lgamma.default: special.gammaln,
    aten.reciprocal.default: jnp.reciprocal,
    aten.i0.default: special.i0,
    aten.special_i0e.default: special.i0e,
    aten.special_i1.default: special.i1,
    aten.special_i1e.default: special.i1e,
    aten.special_ndtri.default: special.ndtri,
    aten.special_erfcx.default: special.erfcx,
    aten.sinc.default: jnp.sinc,
    aten.deg2rad.default: jnp.deg2rad,
    aten.rad2deg.default: jnp.rad2deg,
}
for _op, _f in UNARY_FLOAT.items():
    lowers(_op, promote=P.INT_TO_FLOAT)(_unary(_f))

# --- unary ops that keep the input dtype ---------------------------------------------------------
UNARY_SAME = {
    aten.neg.default: jnp.negative,
    aten.relu.default: lambda x: jnp.maximum(x, jnp.zeros((), x.dtype)),
    aten.sign.default: lambda x: x if x.dtype == jnp.bool_ else jnp.sign(x),
    aten.floor.default: lambda x: x if jnp.issubdtype(x.dtype, jnp.integer) else jnp.floor(x),
    aten.ceil.default: lambda x: x if jnp.issubdtype(x.dtype, jnp.integer) else jnp.ceil(x),
    aten.trunc.default: lambda x: x if jnp.issubdtype(x.dtype, jnp.integer) else jnp.trunc(x),
    aten.frac.default: lambda x: x - jnp.trunc(x),
    # NOTE: jnp.round rounds half to even, like torch.
    aten.round.default: lambda x: x if jnp.issubdtype(x.dtype, jnp.integer) else jnp.round(x),
    aten.bitwise_not.default: lambda x: jnp.logical_not(x) if x.dtype == jnp.bool_ else ~x,
    aten.positive.default: lambda x: x,
}
for _op, _f in UNARY_SAME.items():
    lowers(_op, promote=P.DEFAULT)(_unary(_f))

# Complex in, real out (|z|); every other dtype is kept. COMPLEX_TO_FLOAT is torch's kind for abs:
# with DEFAULT the registry cast |z| back to complex64.
lowers(aten.abs.default, promote=P.COMPLEX_TO_FLOAT)(_unary(jnp.abs))

# --- predicates -----------------------------------------------------------------------------------
PREDICATES = {
    aten.isnan.default: jnp.isnan,
    aten.isinf.default: jnp.isinf,
    aten.isposinf.default: jnp.isposinf,
    aten.isneginf.default: jnp.isneginf,
    aten.isfinite.default: jnp.isfinite,
    aten.signbit.default: jnp.signbit,
    aten.logical_not.default: jnp.logical_not,
}
for _op, _f in PREDICATES.items():
    lowers(_op)(lambda ctx, self, _f=_f: _f(self))

# --- binary arithmetic ----------------------------------------------------------------------------
BINARY_DEFAULT = {
    aten.mul: jnp.multiply,
    aten.maximum: jnp.maximum,
    aten.minimum: jnp.minimum,
    aten.fmax: jnp.fmax,
    aten.fmin: jnp.fmin,
    aten.bitwise_and: lambda a, b: a & b,
    aten.bitwise_or: lambda a, b: a | b,
    aten.bitwise_xor: lambda a, b: a ^ b,
    # NOTE: torch's remainder takes the divisor's sign (Python %); fmod the dividend's (C).
    aten.remainder: jnp.remainder,
    aten.fmod: jnp.fmod,
}
BINARY_FLOAT = {
    aten.atan2: jnp.arctan2,
    aten.hypot: jnp.hypot,
    aten.copysign: jnp.copysign,
    aten.logaddexp: lambda a, b: (
        _complex_logaddexp(a, b) if _is_complex(a) else jnp.logaddexp(a, b)
    ),
    aten.logaddexp2: jnp.logaddexp2,
    aten.xlogy: special.xlogy,
    aten.special_xlog1py: special.xlog1py,
    aten.igamma: lambda a, x: _igamma(a, x, upper=False),
    aten.igammac: lambda a, x: _igamma(a, x, upper=True),
}
# Computed in the operands' own dtype: nextafter of a bfloat16 steps one bfloat16 ulp.
BINARY_NO_OPMATH = {
    aten.nextafter: jnp.nextafter,
}
COMPARISONS = {
    aten.eq: jnp.equal,
    aten.ne: jnp.not_equal,
    aten.lt: jnp.less,
    aten.le: jnp.less_equal,
    aten.gt: jnp.greater,
    aten.ge: jnp.greater_equal,
    aten.logical_and: jnp.logical_and,
    aten.logical_or: jnp.logical_or,
    aten.logical_xor: jnp.logical_xor,
}


# torch's kernels read a one-element second operand of these at the computation precision
# (``original_scalar_value``): ``bf16 * 0.849`` multiplies by 0.849f, not by bfloat16(0.849).
WIDE_SECOND_OPERAND = {aten.mul}

# Every overload taking (self, other) as tensors or numbers in either position.
BINARY_OVERLOADS = (
    "Tensor",
    "Scalar",
    "default",
    "self",
    "Scalar_Tensor",
    "Tensor_Scalar",
    "Scalar_Self",
    "Scalar_Other",
    "self_scalar",
    "other_scalar",
)


def _overloads(packet, names=BINARY_OVERLOADS):
    """The packet's overloads among ``names`` that return a tensor (``aten.ldexp.default`` is
    Python's ``math.ldexp`` on numbers)."""
    found = [getattr(packet, n) for n in names if n in packet.overloads()]
    return [op for op in found if str(op._schema.returns[0].type) == "Tensor"]


for _table, _kind in (
    (BINARY_DEFAULT, P.DEFAULT),
    (BINARY_FLOAT, P.INT_TO_FLOAT),
    (BINARY_NO_OPMATH, P.NO_OPMATH),
):
    for _packet, _f in _table.items():
        lowers(
            *_overloads(_packet),
            promote=_kind,
            promote_args=(0, 1),
            wide_args=(1,) if _packet in WIDE_SECOND_OPERAND else (),
        )(_binary(_f))
for _packet, _f in COMPARISONS.items():
    # Compare in the promoted dtype; the registry turns the result into bool.
    lowers(*_overloads(_packet), promote=P.ALWAYS_BOOL, promote_args=(0, 1))(_binary(_f))


def _is_complex(x) -> bool:
    return jnp.issubdtype(x.dtype, jnp.complexfloating)


def _complex_logaddexp(x, y):
    """torch's complex logaddexp (LogAddExp.h): ``max + log1p(exp(min - max))`` with min/max
    by real part (``x.real < y.real`` picks y as the max), so the result keeps the larger
    operand's imaginary part unwrapped (jnp's wraps it into (-pi, pi]); a NaN part anywhere
    gives NaN; equal infinite real parts give ``min`` (-inf) or ``log(exp(x) + exp(y))``."""
    nan = jnp.isnan(x.real) | jnp.isnan(x.imag) | jnp.isnan(y.real) | jnp.isnan(y.imag)
    x_is_max = ~(x.real < y.real)
    hi, lo = jnp.where(x_is_max, x, y), jnp.where(x_is_max, y, x)
    out = jnp.log1p(jnp.exp(lo - hi)) + hi
    both_inf = jnp.isinf(lo.real) & (lo.real == hi.real)
    inf_case = jnp.where(lo.real < 0, lo, jnp.log(jnp.exp(lo) + jnp.exp(hi)))
    out = jnp.where(both_inf, inf_case, out)
    return jnp.where(nan, jnp.asarray(complex(jnp.nan, jnp.nan), out.dtype), out)


def _igamma(a, x, upper):
    """Regularized lower (upper) incomplete gamma with torch's special cases (calc_igamma):
    a == 0 gives 1 (0) for x > 0, x == 0 gives 0 (1), a == inf gives 0 (1) for finite x,
    x == inf gives 1 (0), a < 0 or x < 0 gives NaN, a == x == inf gives NaN."""
    f = special.gammaincc if upper else special.gammainc
    lo, hi = (1.0, 0.0) if upper else (0.0, 1.0)
    safe_a = jnp.where((a > 0) & jnp.isfinite(a), a, 1.0)
    safe_x = jnp.where((x > 0) & jnp.isfinite(x), x, 1.0)
    out = f(safe_a, safe_x)
    out = jnp.where(jnp.isinf(x) & (a > 0), hi, out)
    out = jnp.where(jnp.isinf(a), jnp.where(jnp.isinf(x), jnp.nan, lo), out)
    out = jnp.where(x == 0, lo, out)
    out = jnp.where(a == 0, jnp.where(x > 0, hi, jnp.nan), out)
    out = jnp.where((a < 0) | (x < 0) | jnp.isnan(a) | jnp.isnan(x), jnp.nan, out)
    return out.astype(jnp.result_type(a, x))


def _times_alpha(other, alpha):
    """``alpha * other`` as torch's add/sub kernels compute it. NOTE: for complex operands
    torch multiplies by alpha even when it is 1, as a complex product, so an infinite real
    part gives a NaN imaginary part (``0j + complex(inf, 0)`` is ``inf+nanj`` in eager)."""
    if jnp.issubdtype(other.dtype, jnp.complexfloating):
        re, im = jnp.real(other), jnp.imag(other)
        a = jnp.real(jnp.asarray(alpha, other.dtype))
        b = jnp.imag(jnp.asarray(alpha, other.dtype))
        # (a + bi)(re + im i), written out so that XLA does not drop a product by 1 or 0
        return lax.complex(a * re - b * im, a * im + b * re)
    return other * alpha if alpha != 1 else other


# aten::ldexp.Tensor(Tensor self, Tensor other) -> Tensor
@lowers(aten.ldexp.Tensor)
def ldexp(ctx, self, other):
    # torch's kernel (BinaryOps.cpp): an integer exponent with a real floating self is
    # std::ldexp in self's dtype; otherwise self * _pow2(self, other), two ops with their own
    # promotions: pow(2.0, other) for an integer or float32 self (other's dtype, the default
    # float for an integer other), full((), 2.0, self.dtype).pow(other) for the rest. Lowered
    # rather than decomposed: the decomposition raised 2 in self's dtype (a bool tensor with
    # a 0-d bfloat16 exponent came out float32; a 0-d float16 exponent missed the rounding).
    exact_int = not jnp.issubdtype(other.dtype, jnp.inexact)
    if exact_int and jnp.issubdtype(self.dtype, jnp.floating):
        # jnp.ldexp is exact (exp2 of a float rounds: 0.849 * 2**100 was 2e-6 off) and does
        # not overflow halfway (0.849 * 2**128 is finite in float32, 2**128 is not).
        wide = upcast(self)
        exponent = jnp.clip(other.astype(jnp.int64), -4096, 4096).astype(jnp.int32)
        return jnp.ldexp(wide, exponent).astype(self.dtype)
    self_meta, other_meta = ctx.arg_metas[0], ctx.arg_metas[1]
    integral = not (self_meta.dtype.is_floating_point or self_meta.dtype.is_complex)
    if integral or self_meta.dtype == torch.float32:
        base = 2.0  # a Python number: a wrapped scalar, it does not promote
    else:
        base = torch.empty((), dtype=self_meta.dtype, device="meta")
    power_dtype = torch.result_type(base, other_meta)  # the power has other's rank
    power_meta = torch.empty((1,) * other_meta.dim(), dtype=power_dtype, device="meta")
    # NOTE: the result dtype is the eager kernel's (self times the power), not the meta
    # function's: ldexp(bool, 0-d float16) is float16 in eager where the meta says float32.
    out = to_jax_dtype(torch.result_type(self_meta, power_meta))
    power_dtype = to_jax_dtype(power_dtype)
    compute = opmath_dtype(power_dtype)
    if jnp.issubdtype(compute, jnp.complexfloating):
        power = _complex_pow(jnp.asarray(2, compute), other.astype(compute))
    else:
        power = jnp.power(jnp.asarray(2, compute), convert(other, compute))
    power = power.astype(power_dtype)
    product = opmath_dtype(out)
    return (convert(self, product) * power.astype(product)).astype(out)


# aten::add.Tensor(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor
@lowers(aten.add.Tensor, aten.add.Scalar, promote=P.DEFAULT, promote_args=(0, 1))
def add(ctx, self, other, alpha=1):
    other = _times_alpha(other, alpha)
    if self.dtype == jnp.bool_:
        return jnp.logical_or(self, other)
    return jnp.add(self, other)


# aten::sub.Tensor(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor
@lowers(aten.sub.Tensor, aten.sub.Scalar, promote=P.DEFAULT, promote_args=(0, 1))
def sub(ctx, self, other, alpha=1):
    return jnp.subtract(self, _times_alpha(other, alpha))


# aten::rsub.Tensor(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor
@lowers(aten.rsub.Tensor, aten.rsub.Scalar, promote=P.DEFAULT, promote_args=(0, 1))
def rsub(ctx, self, other, alpha=1):
    return jnp.subtract(other, _times_alpha(self, alpha))


# aten::div.Tensor(Tensor self, Tensor other) -> Tensor
# aten::true_divide.Tensor(Tensor self, Tensor other) -> Tensor: what a symbolic float's division
# becomes (``2.0 / math.pi`` under dynamic=True: 0-d float64 tensors)
@lowers(
    aten.div.Tensor,
    aten.div.Scalar,
    aten.true_divide.Tensor,
    aten.true_divide.Scalar,
    promote=P.INT_TO_FLOAT,
    promote_args=(0, 1),
    wide_args=(1,),
)
def div(ctx, self, other):
    if jnp.issubdtype(self.dtype, jnp.complexfloating):
        return complex_divide(self, other)
    return jnp.true_divide(self, other)


def complex_divide(a, b):
    """``a / b`` for complex arrays with c10::complex's algorithm (numpy's scaled division):
    NOTE: a zero divisor gives ``(re / |c|) + (im / |d|) i`` (inf and NaN parts) and infinite
    divisors give signed zeros exactly as eager does; XLA's own complex division differs there."""
    a, b = jnp.broadcast_arrays(a, b)
    ar, ai, c, d = jnp.real(a), jnp.imag(a), jnp.real(b), jnp.imag(b)
    abs_c, abs_d = jnp.abs(c), jnp.abs(d)
    c_big = abs_c >= abs_d
    # |c| >= |d|: rat = d / c, scl = 1 / (c + d * rat); else rat = c / d, scl = 1 / (d + c * rat)
    num, den = jnp.where(c_big, d, c), jnp.where(c_big, c, d)
    rat = num / jnp.where(den == 0, 1.0, den)
    scl = 1.0 / (den + num * rat)
    re = jnp.where(c_big, ar + ai * rat, ar * rat + ai) * scl
    im = jnp.where(c_big, ai - ar * rat, ai * rat - ar) * scl
    zero = (abs_c == 0) & (abs_d == 0)
    re = jnp.where(zero, ar / abs_c, re)
    im = jnp.where(zero, ai / abs_d, im)
    return lax.complex(re, im)


# aten::div.Tensor_mode(Tensor self, Tensor other, *, str? rounding_mode) -> Tensor
@lowers(aten.div.Tensor_mode, aten.div.Scalar_mode)
def div_mode(ctx, self, other, rounding_mode=None):
    dtype = ctx.out_dtype()
    compute = opmath_dtype(dtype)
    other_meta = ctx.arg_metas[1]
    numel = other_meta.numel() if isinstance(other_meta, torch.Tensor) else 1
    other_is_scalar = isinstance(numel, int) and numel == 1  # a symbolic size is not one
    # Like torch's kernels: self (a Python number too: 0.849 // a float16 tensor rounds 0.849
    # to float16 first) is converted to the result dtype, then computed in opmath; a scalar
    # divisor is read at full precision (``original_scalar_value``: bf16 0.8477 // 0.849 is 0).
    a = convert(scalar_array(self, dtype), compute)
    b = convert(scalar_array(other, compute if other_is_scalar else dtype), compute)
    a, b = jnp.broadcast_arrays(a, b)
    if rounding_mode == "trunc" and jnp.issubdtype(compute, jnp.floating) and other_is_scalar:
        # NOTE: XLA rewrites ``x / broadcast(s)`` into ``x * broadcast(1 / s)``, one rounding
        # off, which trunc turns into a whole unit: trunc(0.849 / 0.849) was 0 (eager: 1). The
        # barrier hides the broadcast (one divisor-sized buffer; floor division corrects its
        # quotient with fmod and needs none).
        b = lax.optimization_barrier(b)
    if rounding_mode is None:
        out = a / b
    elif rounding_mode == "floor":
        out = _floor_divide(a, b)
    else:
        # NOTE: integer trunc division is C division (lax.div); float is trunc(a / b).
        out = lax.div(a, b) if jnp.issubdtype(compute, jnp.integer) else jnp.trunc(a / b)
    return out.astype(dtype)


def _floor_divide(a, b):
    if jnp.issubdtype(a.dtype, jnp.integer):
        return jnp.floor_divide(a, b)
    # NOTE: torch's float floor division is floor((a - fmod(a, b)) / b) with a correction.
    mod = jnp.fmod(a, b)
    d = (a - mod) / b
    d = jnp.where((mod != 0) & ((b < 0) != (mod < 0)), d - 1, d)
    fd = jnp.floor(d)
    fd = jnp.where(d - fd > 0.5, fd + 1, fd)
    fd = jnp.where(d == 0, jnp.copysign(jnp.zeros_like(d), a / b), fd)
    return jnp.where(b == 0, a / b, fd)


# aten::floor_divide(Tensor self, Tensor other) -> Tensor
@lowers(
    aten.floor_divide.default,
    aten.floor_divide.Scalar,
    promote=P.DEFAULT,
    promote_args=(0, 1),
    wide_args=(1,),
)
def floor_divide(ctx, self, other):
    return _floor_divide(*jnp.broadcast_arrays(self, other))


# aten::pow.Tensor_Scalar(Tensor self, Scalar exponent) -> Tensor
# aten::pow.Scalar(Scalar self, Tensor exponent) -> Tensor
@lowers(
    aten.pow.Tensor_Tensor,
    aten.pow.Tensor_Scalar,
    aten.pow.Scalar,
    promote=P.DEFAULT,
    promote_args=(0, 1),
)
def pow_(ctx, self, exponent):
    # self and exponent arrive in the computation dtype (a Python base or exponent included);
    # the exponent as written (arg_metas) picks integer_pow for small integral exponents.
    written = ctx.arg_metas[1] if len(ctx.arg_metas) > 1 else None
    if isinstance(written, int | float) and not isinstance(written, bool):
        if float(written).is_integer() and abs(written) <= 64:
            if written >= 0 or jnp.issubdtype(self.dtype, jnp.inexact):
                return lax.integer_pow(self, int(written))
    if jnp.issubdtype(self.dtype, jnp.integer):
        # NOTE: torch rejects negative integer exponents for integer tensors eagerly; here
        # they give 0 (or +-1 for bases of +-1), what C integer pow gives.
        return _int_pow(self, exponent)
    if jnp.issubdtype(self.dtype, jnp.complexfloating):
        return _complex_pow(self, exponent)
    return jnp.power(self, exponent)


def _complex_pow(x, y):
    """C's ``cpow(x, y) = cexp(y * clog(x))``, what torch's complex pow calls, with C99's
    special values: ``0 ** (1-2j)`` is 0 (XLA's pow gives NaN), ``0 ** 0j`` is NaN."""
    x, y = jnp.broadcast_arrays(x, y)
    log = jnp.log(x)
    lr, li, yr, yi = jnp.real(log), jnp.imag(log), jnp.real(y), jnp.imag(y)
    return _cexp(yr * lr - yi * li, yr * li + yi * lr).astype(x.dtype)


def _cexp(re, im):
    """``exp(re + im i)`` with C99 Annex G's special values (glibc's cexp)."""
    e = jnp.exp(re)
    out_re = jnp.where(im == 0, e, e * jnp.cos(im))
    out_im = jnp.where(im == 0, im, e * jnp.sin(im))
    odd_im = ~jnp.isfinite(im)
    to_zero = jnp.isneginf(re) & odd_im  # exp(-inf + inf i): +-0 +-0i
    to_inf = jnp.isposinf(re) & odd_im  # exp(+inf + nan i): +-inf + nan i
    out_re = jnp.where(to_zero, 0.0, jnp.where(to_inf, jnp.inf, out_re))
    out_im = jnp.where(to_zero, 0.0, jnp.where(to_inf, jnp.nan, out_im))
    return lax.complex(out_re, out_im)


def _int_pow(base, exp):
    base, exp = jnp.broadcast_arrays(base, exp)
    neg = exp < 0
    e = jnp.where(neg, 0, exp)
    result = jnp.ones_like(base)

    def body(i, carry):
        result, b, e = carry
        result = jnp.where(e & 1, result * b, result)
        return result, b * b, e >> 1

    bits = base.dtype.itemsize * 8
    result, _, _ = lax.fori_loop(0, bits, body, (result, base, e))
    neg_val = jnp.where(base == 1, 1, jnp.where(base == -1, jnp.where(exp & 1, -1, 1), 0))
    return jnp.where(neg, neg_val.astype(base.dtype), result)


# aten::where.self(Tensor condition, Tensor self, Tensor other) -> Tensor
@lowers(
    aten.where.self,
    aten.where.ScalarSelf,
    aten.where.ScalarOther,
    aten.where.Scalar,
    promote=P.NO_OPMATH,
    promote_args=(1, 2),
)
def where(ctx, condition, self, other):
    return jnp.where(condition, self, other)


# aten::clamp(Tensor self, Scalar? min=None, Scalar? max=None) -> Tensor
@lowers(aten.clamp.default, aten.clamp.Tensor, promote=P.DEFAULT)
def clamp(ctx, self, min=None, max=None):
    # NOTE: NaN in self propagates (maximum/minimum propagate NaN), like torch. A bound out of
    # an integer dtype's range wraps as torch's C cast does (uint8: -3 -> 253).
    out = self
    if min is not None:
        out = jnp.maximum(out, scalar_array(min, out.dtype))
    if max is not None:
        out = jnp.minimum(out, scalar_array(max, out.dtype))
    return out


# aten::clamp_min(Tensor self, Scalar min) -> Tensor
@lowers(aten.clamp_min.default, aten.clamp_min.Tensor, promote=P.DEFAULT)
def clamp_min(ctx, self, min):
    return jnp.maximum(self, scalar_array(min, self.dtype))


# aten::clamp_max(Tensor self, Scalar max) -> Tensor
@lowers(aten.clamp_max.default, aten.clamp_max.Tensor, promote=P.DEFAULT)
def clamp_max(ctx, self, max):
    return jnp.minimum(self, scalar_array(max, self.dtype))


# aten::gelu(Tensor self, *, str approximate="none") -> Tensor
@lowers(aten.gelu.default, promote=P.DEFAULT)
def gelu(ctx, self, approximate="none"):
    if approximate == "tanh":
        return jax.nn.gelu(self, approximate=True)
    return self * 0.5 * (1.0 + special.erf(self * np.float32(1 / np.sqrt(2))).astype(self.dtype))


# aten::silu(Tensor self) -> Tensor
@lowers(aten.silu.default, promote=P.DEFAULT)
def silu(ctx, self):
    return self * jax.nn.sigmoid(self)


# aten::hardtanh(Tensor self, Scalar min_val=-1, Scalar max_val=1) -> Tensor
@lowers(aten.hardtanh.default, promote=P.DEFAULT, promote_args=(0,))
def hardtanh(ctx, self, min_val=-1.0, max_val=1.0):
    # Integer inputs clamp to the bounds converted to the input dtype (truncated), like torch.
    lo, hi = jnp.asarray(min_val).astype(self.dtype), jnp.asarray(max_val).astype(self.dtype)
    return jnp.minimum(jnp.maximum(self, lo), hi)


# aten::leaky_relu(Tensor self, Scalar negative_slope=0.01) -> Tensor
@lowers(aten.leaky_relu.default, promote=P.DEFAULT)
def leaky_relu(ctx, self, negative_slope=0.01):
    return jnp.where(self > 0, self, self * negative_slope)


# aten::elu(Tensor self, Scalar alpha=1, Scalar scale=1, Scalar input_scale=1) -> Tensor
@lowers(aten.elu.default, promote=P.DEFAULT)
def elu(ctx, self, alpha=1.0, scale=1.0, input_scale=1.0):
    return jnp.where(self > 0, self * scale, jnp.expm1(self * input_scale) * alpha * scale)


# aten::softplus(Tensor self, Scalar beta=1, Scalar threshold=20) -> Tensor
@lowers(aten.softplus.default, promote=P.DEFAULT)
def softplus(ctx, self, beta=1.0, threshold=20.0):
    return jnp.where(self * beta > threshold, self, jnp.log1p(jnp.exp(self * beta)) / beta)


# aten::mish(Tensor self) -> Tensor
@lowers(aten.mish.default, promote=P.DEFAULT)
def mish(ctx, self):
    return self * jnp.tanh(jax.nn.softplus(self))


# aten::hardsigmoid(Tensor self) -> Tensor
@lowers(aten.hardsigmoid.default, promote=P.DEFAULT)
def hardsigmoid(ctx, self):
    return jnp.clip(self / 6 + 0.5, 0, 1)


# aten::hardswish(Tensor self) -> Tensor
@lowers(aten.hardswish.default, promote=P.DEFAULT)
def hardswish(ctx, self):
    return self * jnp.clip(self / 6 + 0.5, 0, 1)


# aten::lerp.Scalar(Tensor self, Tensor end, Scalar weight) -> Tensor
@lowers(aten.lerp.Scalar, aten.lerp.Tensor, promote=P.DEFAULT)
def lerp(ctx, self, end, weight):
    # NOTE: torch's two-sided formula, exact at weight 0 and 1.
    diff = end - self
    return jnp.where(jnp.abs(weight) < 0.5, self + weight * diff, end - diff * (1 - weight))


# aten::bitwise_left_shift.Tensor(Tensor self, Tensor other) -> Tensor
@lowers(
    aten.bitwise_left_shift.Tensor,
    aten.bitwise_left_shift.Tensor_Scalar,
    aten.bitwise_left_shift.Scalar_Tensor,
    aten.__lshift__.Tensor,
    aten.__lshift__.Scalar,
    promote=P.DEFAULT,
    promote_args=(0, 1),
)
def left_shift(ctx, self, other):
    a = jnp.asarray(self)
    b = jnp.asarray(other, dtype=a.dtype)
    return lax.shift_left(*jnp.broadcast_arrays(a, b))


# aten::bitwise_right_shift.Tensor(Tensor self, Tensor other) -> Tensor
@lowers(
    aten.bitwise_right_shift.Tensor,
    aten.bitwise_right_shift.Tensor_Scalar,
    aten.bitwise_right_shift.Scalar_Tensor,
    aten.__rshift__.Tensor,
    aten.__rshift__.Scalar,
    promote=P.DEFAULT,
    promote_args=(0, 1),
)
def right_shift(ctx, self, other):
    a = jnp.asarray(self)
    b = jnp.asarray(other, dtype=a.dtype)
    a, b = jnp.broadcast_arrays(a, b)
    if jnp.issubdtype(a.dtype, jnp.signedinteger):
        return lax.shift_right_arithmetic(a, b)
    return lax.shift_right_logical(a, b)


# aten::_to_copy(Tensor self, *, ScalarType? dtype=None, ...) -> Tensor
@lowers(aten._to_copy.default)
def to_copy(
    ctx,
    self,
    dtype=None,
    layout=None,
    device=None,
    pin_memory=None,
    non_blocking=False,
    memory_format=None,
):
    return _cast(self, ctx.out_dtype())


# prims::gcd(Tensor self, Tensor other) -> Tensor: aten.gcd's decomposition (non-negative, like
# torch: gcd(-4, 6) == 2, gcd(0, 0) == 0).
lowers(torch.ops.prims.gcd.default)(_binary(jnp.gcd))


# prims::div(Tensor self, Tensor other) -> Tensor
@lowers(torch.ops.prims.div.default)
def prims_div(ctx, self, other):
    # NOTE: true division for floats, C (truncating) division for integers; aten.lcm
    # decomposes into it (after guarding gcd == 0).
    a, b = jnp.asarray(self), jnp.asarray(other)
    if jnp.issubdtype(a.dtype, jnp.integer) or a.dtype == jnp.bool_:
        return lax.div(a, b)
    return a / b


# prims::convert_element_type(Tensor a, ScalarType dtype) -> Tensor
@lowers(torch.ops.prims.convert_element_type.default)
def convert_element_type(ctx, a, dtype):
    # NOTE: what a float .item() becomes under capture_scalar_outputs (a float32 -> float64 ->
    # float32 round trip).
    return _cast(a, ctx.out_dtype())


def _cast(x, dtype):
    x = jnp.asarray(x)
    if jnp.issubdtype(x.dtype, jnp.complexfloating) and not jnp.issubdtype(
        dtype, jnp.complexfloating
    ):
        x = jnp.real(x)
    return convert(x, dtype)


# aten::clone(Tensor self, *, MemoryFormat? memory_format=None) -> Tensor
@lowers(
    aten.clone.default,
    aten.alias.default,
    aten.lift_fresh_copy.default,
    aten.lift_fresh.default,
    aten.detach.default,
)
def clone(ctx, self, memory_format=None):
    return self


# aten::copy(Tensor self, Tensor src, bool non_blocking=False) -> Tensor
@lowers(aten.copy.default)
def copy(ctx, self, src, non_blocking=False):
    return jnp.broadcast_to(_cast(src, self.dtype), self.shape)


# aten::fill.Scalar(Tensor self, Scalar value) -> Tensor
@lowers(aten.fill.Scalar, aten.fill.Tensor)
def fill(ctx, self, value):
    return jnp.full(self.shape, value, dtype=self.dtype)


# aten::nan_to_num(Tensor self, float? nan=None, float? posinf=None, float? neginf=None) -> Tensor
@lowers(aten.nan_to_num.default, promote=P.DEFAULT)
def nan_to_num(ctx, self, nan=None, posinf=None, neginf=None):
    return jnp.nan_to_num(self, nan=0.0 if nan is None else nan, posinf=posinf, neginf=neginf)


# aten::sgn(Tensor self) -> Tensor
@lowers(aten.sgn.default)
def sgn(ctx, self):
    return self if self.dtype == jnp.bool_ else jnp.sign(self)


# aten::round.decimals(Tensor self, *, int decimals) -> Tensor
@lowers(aten.round.decimals, promote=P.DEFAULT)
def round_decimals(ctx, self, decimals):
    # torch's kernel: scale by 10**|decimals| in the computation dtype, round half to even, undo.
    scale = jnp.asarray(10.0 ** abs(decimals), self.dtype)
    if decimals < 0:
        return jnp.round(self / scale) * scale
    return jnp.round(self * scale) / scale


# aten::frexp.Tensor(Tensor self) -> (Tensor mantissa, Tensor exponent)
@lowers(aten.frexp.Tensor)
def frexp(ctx, self):
    # Half types go through float32, which holds their subnormals as normal numbers.
    # NOTE: float32 subnormal inputs are flushed to zero on XLA (mantissa 0, exponent 0).
    x = upcast(self)
    mantissa, exponent = jnp.frexp(x)
    return mantissa.astype(ctx.out_dtype(0)), exponent.astype(ctx.out_dtype(1))


# aten::angle(Tensor self) -> Tensor
@lowers(aten.angle.default)
def angle(ctx, self):
    # Not a registry promotion kind: complex -> real (like COMPLEX_TO_FLOAT) and int/bool ->
    # the default float (like INT_TO_FLOAT). torch says which in meta["val"].
    out = ctx.out_dtype()
    if jnp.issubdtype(self.dtype, jnp.complexfloating):
        return jnp.angle(self).astype(out)
    self = self.astype(out)
    # Real inputs: pi for negative numbers, 0 otherwise (also for -0.0), NaN stays NaN.
    out = jnp.where(self < 0, jnp.asarray(np.pi, self.dtype), jnp.zeros_like(self))
    return jnp.where(jnp.isnan(self), self, out)


# aten::complex(Tensor real, Tensor imag) -> Tensor
@lowers(aten.complex.default)
def complex_(ctx, real, imag):
    return lax.complex(*jnp.broadcast_arrays(real, imag)).astype(ctx.out_dtype())


# aten::polar(Tensor abs, Tensor angle) -> Tensor
@lowers(aten.polar.default)
def polar(ctx, abs, angle):
    abs, angle = jnp.broadcast_arrays(abs, angle)
    return lax.complex(abs * jnp.cos(angle), abs * jnp.sin(angle)).astype(ctx.out_dtype())


# aten::addcmul(Tensor self, Tensor tensor1, Tensor tensor2, *, Scalar value=1) -> Tensor
@lowers(aten.addcmul.default, promote=P.DEFAULT, promote_args=(0, 1, 2))
def addcmul(ctx, self, tensor1, tensor2, value=1):
    # torch converts value to the computation dtype first: an integer tensor truncates 2.5 to 2.
    return self + scalar_array(value, self.dtype) * tensor1 * tensor2


# aten::addcdiv(Tensor self, Tensor tensor1, Tensor tensor2, *, Scalar value=1) -> Tensor
@lowers(aten.addcdiv.default, promote=P.DEFAULT, promote_args=(0, 1, 2))
def addcdiv(ctx, self, tensor1, tensor2, value=1):
    return self + scalar_array(value, self.dtype) * tensor1 / tensor2


def _register_fma():
    # prims::fma(Tensor a, Tensor b, Tensor c) -> Tensor: a * b + c. Dynamo emits it for
    # addcmul_/addcdiv_/add_ with a value (every Adam/AdamW step). The op is defined by
    # torch._inductor.inductor_prims (not torch._prims), which torch.compile imports anyway.
    import torch._inductor.inductor_prims  # noqa: F401

    lowers(torch.ops.prims.fma.default, promote=P.DEFAULT, promote_args=(0, 1, 2))(
        lambda ctx, a, b, c: a * b + c
    )


_register_fma()

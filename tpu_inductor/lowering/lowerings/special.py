"""Special functions: polygamma and zeta, Bessel and Airy functions, orthogonal polynomials.

Each follows the algorithm of torch's CPU kernel (``ATen/native/Math.h``, derived from the
Cephes Math Library): the same rational and Chebyshev approximations with the same coefficient
tables, the same three-term recurrences and the same special cases, evaluated in the computation
dtype (float32 for half types, like torch's opmath), so results agree with eager to rounding.
Data-dependent loops (series until convergence, recurrences up to a per-element degree) are
``lax.while_loop`` s that stop once every element is done, freezing each element where torch's
scalar loop would have stopped.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import torch
from jax import lax
from jax.scipy import special

from tpu_inductor.lowering.lowerings import special_coefficients as C
from tpu_inductor.lowering.lowerings.registry import P, lowers, opmath_dtype

aten = torch.ops.aten


def _compute_dtype(ctx):
    return opmath_dtype(ctx.out_dtype())


def _horner(coeffs, z):
    """``polevl``: coefficients highest power first, starting from 0 like torch's loops."""
    out = jnp.zeros_like(z)
    for c in coeffs.tolist():  # Python floats stay weakly typed: no float64 promotion
        out = out * z + c
    return out


def _chbevl(coeffs, z):
    """Cephes ``chbevl`` as torch's Bessel kernels unroll it: returns (b0, b2)."""
    p = jnp.zeros_like(z)
    q = jnp.zeros_like(z)
    b = jnp.full_like(z, coeffs[0])
    for c in coeffs[1:]:
        p, q = q, b
        b = z * q - p + c
    return b, p


def _while(cond, body, state):
    """``lax.while_loop`` over per-element state; ``cond`` returns the active mask."""

    def step(s):
        active = cond(s)
        new = body(s)
        return tuple(jnp.where(active, n, o) for n, o in zip(new, s, strict=True))

    return lax.while_loop(lambda s: jnp.any(cond(s)), step, state)


# --- digamma, polygamma, zeta ----------------------------------------------------------------


def _digamma(x):
    # jax gives NaN at 0 too; torch gives -inf at +0, +inf at -0 (NaN at negative integers).
    out = special.digamma(x)
    out = jnp.where(x == 0, jnp.copysign(jnp.asarray(jnp.inf, x.dtype), -x), out)
    return jnp.where((x < 0) & (x == jnp.trunc(x)), jnp.nan, out)


def _trigamma(x):
    neg = x < 0.5
    s = jnp.sin(math.pi * x)
    result = jnp.where(neg, -(math.pi * math.pi) / (s * s), 0.0).astype(x.dtype)
    x = jnp.where(neg, 1 - x, x)
    for _ in range(6):
        result = result + 1 / (x * x)
        x = x + 1
    ixx = 1 / (x * x)
    result = result + (1 + 1 / (2 * x) + ixx * (1.0 / 6 - ixx * (1.0 / 30 - ixx * (1.0 / 42)))) / x
    return jnp.where(neg, -result, result)


def _zeta(x, q):
    """Hurwitz zeta(x, q): direct sum until a > 9, then Euler-Maclaurin (Cephes ``zeta``)."""
    x, q = jnp.broadcast_arrays(x, q)
    # NOTE: torch accumulates in double on CPU, and so do the lowerings (``_accumulate_dtype``)
    # except on TPU (no float64): there float32 results can differ in the last bits, and
    # results below float32's normal range (e.g. zeta(100, 2.5)) come out as 0 or NaN.
    s = jnp.power(q, -x)
    zero = jnp.zeros_like(s)
    i = jnp.zeros(s.shape, jnp.int32)

    def cond(st):
        i, a, b, s, done = st
        return ~done & ((i < 9) | (a <= 9.0))

    def body(st):
        i, a, b, s, done = st
        a = a + 1
        b = jnp.power(a, -x)
        s = s + b
        return i + 1, a, b, s, (-C.MACHEP * s < b) & (b < C.MACHEP * s)

    # Elements whose value is already decided take no loop iterations.
    decided = (x <= 1) | ((q <= 0) & ((q == jnp.floor(q)) | (x != jnp.floor(x))))
    decided = decided | jnp.isnan(x) | jnp.isnan(q)
    i, a, b, s, summed = _while(cond, body, (i, q, zero, s, decided))
    # Euler-Maclaurin tail for the elements the direct sum did not settle.
    w = a
    tail = s + b * w / (x - 1) - 0.5 * b
    done = summed
    a = jnp.ones_like(s)
    k = zero
    for coeff in C.ZETA_A.tolist():
        a = a * (x + k)
        b = b / w
        t = a * b / coeff
        tail = jnp.where(done, tail, tail + t)
        done = done | (jnp.abs(t / tail) < C.MACHEP)
        k = k + 1
        a = a * (x + k)
        b = b / w
        k = k + 1
    out = jnp.where(summed, s, tail)
    # NaN in x or q that passes torch's early returns (below, last to first) reaches its sum:
    # NaN, also where pow(1, -nan) == 1 would have settled it here.
    out = jnp.where(jnp.isnan(x) | jnp.isnan(q), jnp.nan, out)
    out = jnp.where((q <= 0) & (x != jnp.floor(x)), jnp.nan, out)
    out = jnp.where((q <= 0) & (q == jnp.floor(q)), jnp.inf, out)
    out = jnp.where(x < 1, jnp.nan, out)
    return jnp.where(x == 1, jnp.inf, out)


# aten::special_zeta(Tensor self, Tensor other) -> Tensor
@lowers(
    aten.special_zeta.default,
    aten.special_zeta.self_scalar,
    aten.special_zeta.other_scalar,
    promote=P.INT_TO_FLOAT,
    promote_args=(0, 1),
)
def zeta(ctx, self, other):
    dt = _compute_dtype(ctx)
    acc = _accumulate_dtype(ctx, dt)
    return _zeta(jnp.asarray(self, acc), jnp.asarray(other, acc)).astype(dt)


def _accumulate_dtype(ctx, dtype):
    """torch's CPU ``acc_type``: float64 for float32 (and half) math, where the device has it.
    NOTE: a TPU has no float64; there the sum runs in float32 (see ``_zeta``)."""
    return dtype if ctx.platform == "tpu" or dtype == jnp.float64 else jnp.float64


# aten::polygamma(int n, Tensor self) -> Tensor
@lowers(aten.polygamma.default, promote=P.INT_TO_FLOAT, promote_args=(1,))
def polygamma(ctx, n, self):
    x = self.astype(_compute_dtype(ctx))
    if n == 0:
        return _digamma(x)
    if n == 1:
        return _trigamma(x)
    sign = 1.0 if n % 2 else -1.0
    wide = x.astype(_accumulate_dtype(ctx, x.dtype))
    z = _zeta(jnp.full_like(wide, n + 1.0), wide).astype(x.dtype)
    return sign * math.exp(math.lgamma(n + 1.0)) * z


# aten::digamma(Tensor self) -> Tensor
@lowers(aten.digamma.default, promote=P.INT_TO_FLOAT)
def digamma(ctx, self):
    return _digamma(self)


# --- Airy and Bessel functions (Cephes rational approximations) -----------------------------


def _airy_ai(x):
    eps = float(jnp.finfo(x.dtype).eps)
    # x < -2.09: oscillating asymptotic expansion.
    xn = jnp.where(x < -2.09, x, -4.0)
    zeta = -2.0 * xn * jnp.sqrt(-xn) / 3.0
    z = 1.0 / zeta
    zz = z * z
    afn, afd = _horner(C.AIRY_AFN, zz), _horner(C.AIRY_AFD, zz)
    agn, agd = _horner(C.AIRY_AGN, zz), _horner(C.AIRY_AGD, zz)
    t = zeta + 0.25 * math.pi
    neg = (
        C.INV_SQRT_PI
        / jnp.sqrt(jnp.sqrt(-xn))
        * (jnp.sin(t) * (1.0 + zz * afn / afd) - jnp.cos(t) * (z * agn / agd))
    )
    # x >= 2.09: exponentially decaying asymptotic expansion.
    xp = jnp.where(x >= 2.09, x, 4.0)
    zeta = 2.0 * xp * jnp.sqrt(xp) / 3.0
    an, ad = _horner(C.AIRY_AN, 1.0 / zeta), _horner(C.AIRY_AD, 1.0 / zeta)
    pos = C.INV_SQRT_PI * (an / ad) / (2.0 * jnp.sqrt(jnp.sqrt(xp)) * jnp.exp(zeta))
    # Otherwise the Maclaurin series, summed until the term is below epsilon.
    series = (x >= -2.09) & (x < 2.09) | jnp.isnan(x)
    xs = jnp.where(series, x, 0.0)
    one = jnp.ones_like(xs)
    z3 = xs * xs * xs

    def cond(st):
        return st[-1] > eps

    def body(st):
        f, g, k, m, n, t = st
        m = m * z3
        k = k + 1
        m = m / k
        n = n * z3
        k = k + 1
        n = n / k
        m = m / k
        f = f + m
        k = k + 1
        n = n / k
        g = g + n
        return f, g, k, m, n, jnp.abs(m / f)

    f, g, *_ = _while(cond, body, (one, xs, one, one, xs, jnp.where(series, one, 0.0)))
    small = 0.355028053887817239260 * f - 0.258819403792806798405 * g
    out = jnp.where(x < -2.09, neg, jnp.where(x >= 2.09, pos, small))
    out = jnp.where(x > 103.892, 0.0, out)
    return jnp.where(jnp.isinf(x), jnp.nan, out)


def _bessel_asymptotic(x, pp, pq, qp, qq, order, second_kind):
    """The x > 5 Hankel expansion shared by J0/J1/Y0/Y1 (``x`` already safe, i.e. > 5)."""
    # The order-0 and order-1 kernels spell (5/x)^2 differently; keep each one's rounding.
    z = 25.0 / (x * x) if order == 0 else 5.0 / x * (5.0 / x)
    phase = C.PI_4 if order == 0 else _3PI_4
    p = _horner(pp, z) / _horner(pq, z)
    q = _horner(qp, z) / _horner(qq, z)
    s, c = jnp.sin(x - phase), jnp.cos(x - phase)
    if second_kind:
        return (p * s + 5.0 / x * q * c) * C.SQRT_2_PI / jnp.sqrt(x)
    return (p * c - 5.0 / x * q * s) * C.SQRT_2_PI / jnp.sqrt(x)


_3PI_4 = 2.356194490192344928846982537459627163


def _j0_small(x):
    xx = x * x
    out = (xx - 5.78318596294678452118e00) * (xx - 3.04712623436620863991e01)
    out = out * _horner(C.J0_RP, xx) / _horner(C.J0_RQ, xx)
    return jnp.where(x < 0.00001, 1.0 - xx / 4.0, out)


def _bessel_j0(x):
    x = jnp.abs(x)
    small = x <= 5.0
    xs, xl = jnp.where(small, x, 1.0), jnp.where(small, 10.0, x)
    large = _bessel_asymptotic(xl, C.J0_PP, C.J0_PQ, C.J0_QP, C.J0_QQ, 0, False)
    return jnp.where(small, _j0_small(xs), large)


def _j1_small(x):
    xx = x * x
    out = _horner(C.J1_RP, xx) / _horner(C.J1_RQ, xx) * x
    return out * (xx - 1.46819706421238932572e01) * (xx - 4.92184563216946036703e01)


def _bessel_j1(x):
    ax = jnp.abs(x)
    small = ax <= 5.0
    xs, xl = jnp.where(small, ax, 1.0), jnp.where(small, 10.0, ax)
    large = _bessel_asymptotic(xl, C.J1_PP, C.J1_PQ, C.J1_QP, C.J1_QQ, 1, False)
    out = jnp.where(small, _j1_small(xs), large)
    return jnp.where(x < 0, -out, out)


def _bessel_y0(x):
    small = x <= 5.0
    xs, xl = jnp.where(small & (x > 0), x, 1.0), jnp.where(small, 10.0, x)
    xx = xs * xs
    out = _horner(C.Y0_YP, xx) / _horner(C.Y0_YQ, xx) + C.TWO_PI * jnp.log(xs) * _j0_small(xs)
    large = _bessel_asymptotic(xl, C.J0_PP, C.J0_PQ, C.J0_QP, C.J0_QQ, 0, True)
    out = jnp.where(x < 0, jnp.nan, jnp.where(x == 0, -jnp.inf, out))
    return jnp.where(small, out, large)


def _bessel_y1(x):
    small = x <= 5.0
    xs, xl = jnp.where(small & (x > 0), x, 1.0), jnp.where(small, 10.0, x)
    xx = xs * xs
    out = xs * (_horner(C.Y1_YP, xx) / _horner(C.Y1_YQ, xx))
    out = out + C.TWO_PI * (_j1_small(xs) * jnp.log(xs) - 1.0 / xs)
    large = _bessel_asymptotic(xl, C.J1_PP, C.J1_PQ, C.J1_QP, C.J1_QQ, 1, True)
    out = jnp.where(x < 0, jnp.nan, jnp.where(x == 0, -jnp.inf, out))
    return jnp.where(small, out, large)


def _spherical_bessel_j0(x):
    xx = x * x
    poly = 1.0 / 6227020800.0
    for c in (-1.0 / 39916800.0, 1.0 / 362880.0, -1.0 / 5040.0, 1.0 / 120.0, -1.0 / 6.0):
        poly = c + xx * poly
    poly = 1.0 + xx * poly
    out = jnp.where(jnp.abs(x) < 0.5, poly, jnp.sin(x) / x)
    return jnp.where(jnp.isinf(x), 0.0, out)


def _cheb_half(coeffs, z):
    b, p = _chbevl(coeffs.tolist(), z)  # Python floats: no float64 promotion
    return 0.5 * (b - p)


def _modified_bessel_i0(x):
    ax = jnp.abs(x)
    small = jnp.exp(ax) * _cheb_half(C.I0_A, ax / 2.0 - 2.0)
    large = jnp.exp(ax) * _cheb_half(C.I0_B, 32.0 / ax - 2.0) / jnp.sqrt(ax)
    return jnp.where(ax <= 8.0, small, large)


def _modified_bessel_i1(x):
    ax = jnp.abs(x)
    small = _cheb_half(C.I1_A, ax / 2.0 - 2.0) * ax * jnp.exp(ax)
    large = jnp.exp(ax) * _cheb_half(C.I1_B, 32.0 / ax - 2.0) / jnp.sqrt(ax)
    out = jnp.where(ax <= 8.0, small, large)
    return jnp.where(x < 0, -out, out)


def _modified_bessel_k(x, order, scaled):
    """K0/K1 (``order``), times exp(x) when ``scaled``."""
    small = x <= 2.0
    xs = jnp.where(small & (x > 0), x, 1.0)
    xl = jnp.where(small, 4.0, x)
    if order == 0:
        # NOTE: torch evaluates log(0.5 * x) in double here; this uses the compute dtype.
        near = _cheb_half(C.K0_A, xs * xs - 2.0) - jnp.log(0.5 * xs) * _modified_bessel_i0(xs)
        half = _cheb_half(C.K0_B, 8.0 / xl - 2.0)
    else:
        near = jnp.log(0.5 * xs) * _modified_bessel_i1(xs) + _cheb_half(C.K1_A, xs * xs - 2.0) / xs
        half = _cheb_half(C.K1_B, 8.0 / xl - 2.0)
    if scaled:
        out = jnp.where(small, near * jnp.exp(xs), half / jnp.sqrt(xl))
    else:
        out = jnp.where(small, near, jnp.exp(-xl) * half / jnp.sqrt(xl))
    return jnp.where(x < 0, jnp.nan, jnp.where(x == 0, jnp.inf, out))


UNARY_SPECIAL = {
    aten.special_airy_ai.default: _airy_ai,
    aten.special_bessel_j0.default: _bessel_j0,
    aten.special_bessel_j1.default: _bessel_j1,
    aten.special_bessel_y0.default: _bessel_y0,
    aten.special_bessel_y1.default: _bessel_y1,
    aten.special_spherical_bessel_j0.default: _spherical_bessel_j0,
    aten.special_modified_bessel_i0.default: _modified_bessel_i0,
    aten.special_modified_bessel_i1.default: _modified_bessel_i1,
    aten.special_modified_bessel_k0.default: lambda x: _modified_bessel_k(x, 0, False),
    aten.special_modified_bessel_k1.default: lambda x: _modified_bessel_k(x, 1, False),
    aten.special_scaled_modified_bessel_k0.default: lambda x: _modified_bessel_k(x, 0, True),
    aten.special_scaled_modified_bessel_k1.default: lambda x: _modified_bessel_k(x, 1, True),
}
for _op, _f in UNARY_SPECIAL.items():
    lowers(_op, promote=P.INT_TO_FLOAT)(lambda ctx, self, _f=_f: _f(self))


# --- orthogonal polynomials (three-term recurrences) -------------------------------------------


def _degree(n):
    """torch's ``static_cast<int64_t>(n)``; NaN, infinities and out-of-range give -1 (result 0)."""
    ok = jnp.abs(n) < 9.2e18
    return jnp.where(ok, n, -1.0).astype(jnp.int64)


def _recurrence(p, q, step, count, nan_stop=True):
    """Runs ``p, q = q, step(i, p, q)`` ``count`` times per element (fewer once q is NaN)."""

    def cond(st):
        i, p, q = st
        active = i < count
        return active & ~jnp.isnan(q) if nan_stop else active

    def body(st):
        i, p, q = st
        return i + 1, q, step(i, p, q)

    i0 = jnp.zeros(q.shape, jnp.int64)
    return _while(cond, body, (i0, p, q))[2]


def _v_trig(theta, nf, even):
    """Chebyshev V (plain and shifted) for large n: cos((n + 1/2) theta) / cos(theta / 2), and
    its value where cos(theta / 2) is 0 (+-(2n + 1) by n's parity), which it also returns."""
    odd_end = jnp.where(even, nf + nf + 1, -(nf + nf + 1))
    trig = jnp.where(
        jnp.sin(theta / 2.0) != 1.0, jnp.cos((nf + 0.5) * theta) / jnp.cos(theta / 2.0), odd_end
    )
    return trig, odd_end


def _chebyshev(x, n, kind):
    """Chebyshev T/U/V/W of the first..fourth kind, as torch: endpoints, trig form, recurrence."""
    one = jnp.ones_like(x)
    nf = n.astype(x.dtype)
    q0 = {"t": x, "u": x + x, "v": x + x - 1.0, "w": x + x + 1.0}[kind]
    big = (n > (6 if kind == "t" else 8)) & (jnp.abs(x) < 1.0)
    run = (n >= 2) & ~big & (jnp.abs(x) != 1.0)
    rec = _recurrence(one, q0, lambda i, p, q: (x + x) * q - p, jnp.where(run, n - 1, 0))
    even = n % 2 == 0
    theta = jnp.arccos(jnp.where(big, x, 0.0))
    if kind == "t":
        trig = jnp.cos(nf * theta)
        at_one = jnp.where((x > 0) | even, 1.0, -1.0)
    elif kind == "u":
        s = jnp.sin(theta)
        trig = jnp.where(
            s != 0, jnp.sin((nf + 1) * theta) / s, (nf + 1) * jnp.cos((nf + 1) * theta) / x
        )
        at_one = jnp.where((x > 0) | even, nf + 1, -(nf + 1))
    elif kind == "v":
        trig, odd_end = _v_trig(theta, nf, even)
        at_one = jnp.where(x > 0, 1.0, odd_end)
    else:
        sign_end = jnp.where(even, 1.0, -1.0)
        trig = jnp.where(
            jnp.cos(theta / 2.0) != 1.0,
            jnp.sin((nf + 0.5) * theta) / jnp.sin(theta / 2.0),
            jnp.where(x > 0, nf + nf + 1, sign_end),
        )
        at_one = jnp.where(x > 0, nf + nf + 1, sign_end)
    out = jnp.where(n == 0, one, jnp.where(n == 1, q0, rec))
    out = jnp.where(big, trig, out)
    out = jnp.where(jnp.abs(x) == 1.0, at_one, out)
    return jnp.where(n < 0, 0.0, out)


def _shifted_chebyshev(x, n, kind):
    """Shifted Chebyshev polynomials: torch's kernels, with their own endpoint cases at 0 and 1."""
    one = jnp.ones_like(x)
    nf = n.astype(x.dtype)
    y = x + x - 1.0
    q0 = {"t": y, "u": y + y, "v": y + y - 1.0, "w": y + y + 1.0}[kind]
    big = (n > (4 if kind == "w" else 6)) & (jnp.abs(y) < 1.0)
    run = (n >= 2) & ~big & (x != 0.0) & (x != 1.0)
    rec = _recurrence(one, q0, lambda i, p, q: (y + y) * q - p, jnp.where(run, n - 1, 0))
    even = n % 2 == 0
    theta = jnp.arccos(jnp.where(big, y, 0.0))
    if kind == "t":
        trig = jnp.cos(nf * theta)
        at_one, at_zero = one, jnp.where(even, 1.0, -1.0)
    elif kind == "u":
        s = jnp.sin(theta)
        trig = jnp.where(
            s != 0, jnp.sin((nf + 1) * theta) / s, (nf + 1) * jnp.cos((nf + 1) * theta) / y
        )
        at_one, at_zero = nf + 1, jnp.where(even, nf + 1, -(nf + 1))
    elif kind == "v":
        trig, odd_end = _v_trig(theta, nf, even)
        at_one, at_zero = one, odd_end
    else:
        sign_end = jnp.where(even, 1.0, -1.0)
        trig = jnp.where(
            jnp.cos(theta / 2.0) != 1.0,
            jnp.sin((nf + 0.5) * theta) / jnp.sin(theta / 2.0),
            sign_end,
        )
        at_one, at_zero = nf + nf + 1, sign_end
    out = jnp.where(n == 0, one, jnp.where(n == 1, q0, rec))
    out = jnp.where(big, trig, out)
    out = jnp.where(x == 0.0, at_zero, out)
    out = jnp.where(x == 1.0, at_one, out)
    return jnp.where(n < 0, 0.0, out)


def _hermite(x, n, physicists):
    # Degrees above 128 (float32; 512 for float64) give NaN, like torch.
    limit = 128 if x.dtype == jnp.float32 else 512
    one = jnp.ones_like(x)
    q0 = x + x if physicists else x
    run = (n >= 2) & (n <= limit)
    if physicists:
        step = lambda i, p, q: (x + x) * q - (2 * i + 2).astype(x.dtype) * p  # noqa: E731
    else:
        step = lambda i, p, q: x * q - (i + 1).astype(x.dtype) * p  # noqa: E731
    rec = _recurrence(one, q0, step, jnp.where(run, n - 1, 0), nan_stop=False)
    out = jnp.where(n > limit, jnp.nan, rec)
    out = jnp.where(n == 0, one, jnp.where(n == 1, q0, out))
    return jnp.where(n < 0, 0.0, out)


def _laguerre(x, n):
    one = jnp.ones_like(x)
    q0 = 1.0 - x
    run = (n >= 2) & (x != 0)

    def step(i, p, q):
        k = (i + 1).astype(x.dtype)
        return (((k + k) + (1.0 - x)) * q - k * p) / (k + 1)

    rec = _recurrence(one, q0, step, jnp.where(run, n - 1, 0))
    out = jnp.where(n == 0, one, jnp.where(n == 1, q0, rec))
    out = jnp.where(x == 0, one, out)
    return jnp.where(n < 0, 0.0, out)


def _legendre(x, n):
    one = jnp.ones_like(x)
    run = (n >= 2) & (jnp.abs(x) != 1.0)

    def step(i, p, q):
        k = (i + 1).astype(x.dtype)
        return ((k + k + 1) * x * q - k * p) / (k + 1)

    rec = _recurrence(one, x, step, jnp.where(run, n - 1, 0))
    out = jnp.where(n == 0, one, jnp.where(n == 1, x, rec))
    out = jnp.where(jnp.abs(x) == 1.0, jnp.where((x > 0) | (n % 2 == 0), 1.0, -1.0), out)
    return jnp.where(n < 0, 0.0, out)


POLYNOMIALS = {
    aten.special_chebyshev_polynomial_t: lambda x, n: _chebyshev(x, n, "t"),
    aten.special_chebyshev_polynomial_u: lambda x, n: _chebyshev(x, n, "u"),
    aten.special_chebyshev_polynomial_v: lambda x, n: _chebyshev(x, n, "v"),
    aten.special_chebyshev_polynomial_w: lambda x, n: _chebyshev(x, n, "w"),
    aten.special_shifted_chebyshev_polynomial_t: lambda x, n: _shifted_chebyshev(x, n, "t"),
    aten.special_shifted_chebyshev_polynomial_u: lambda x, n: _shifted_chebyshev(x, n, "u"),
    aten.special_shifted_chebyshev_polynomial_v: lambda x, n: _shifted_chebyshev(x, n, "v"),
    aten.special_shifted_chebyshev_polynomial_w: lambda x, n: _shifted_chebyshev(x, n, "w"),
    aten.special_hermite_polynomial_h: lambda x, n: _hermite(x, n, True),
    aten.special_hermite_polynomial_he: lambda x, n: _hermite(x, n, False),
    aten.special_laguerre_polynomial_l: _laguerre,
    aten.special_legendre_polynomial_p: _legendre,
}


def _polynomial(f):
    def lower(ctx, x, n):
        dt = _compute_dtype(ctx)
        x, n = jnp.broadcast_arrays(jnp.asarray(x, dt), jnp.asarray(n, dt))
        return f(x, _degree(n))

    return lower


for _packet, _f in POLYNOMIALS.items():
    lowers(_packet.default, _packet.x_scalar, _packet.n_scalar, promote=P.INT_TO_FLOAT)(
        _polynomial(_f)
    )

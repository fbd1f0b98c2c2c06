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
import numpy as np
import torch
from jax import lax
from jax.scipy import special

from tpu_inductor.lowerings.registry import P, opmath_dtype, register_lowering

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


_ZETA_A = np.array([
    12.0, -720.0, 30240.0, -1209600.0, 47900160.0, -1.8924375803183791606e9, 7.47242496e10,
    -2.950130727918164224e12, 1.1646782814350067249e14, -4.5979787224074726105e15,
    1.8152105401943546773e17, -7.1661652561756670113e18,
])  # fmt: skip
_MACHEP = 1.11022302462515654042e-16


def _zeta(x, q):
    """Hurwitz zeta(x, q): direct sum until a > 9, then Euler-Maclaurin (Cephes ``zeta``)."""
    x, q = jnp.broadcast_arrays(x, q)
    # NOTE: torch accumulates in double on CPU; this runs in the computation dtype (TPUs have
    # no float64), so float32 results can differ in the last bits, and results below float32's
    # normal range (e.g. zeta(100, 2.5)) come out as 0 or NaN instead of a subnormal.
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
        return i + 1, a, b, s, (-_MACHEP * s < b) & (b < _MACHEP * s)

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
    for coeff in _ZETA_A.tolist():
        a = a * (x + k)
        b = b / w
        t = a * b / coeff
        tail = jnp.where(done, tail, tail + t)
        done = done | (jnp.abs(t / tail) < _MACHEP)
        k = k + 1
        a = a * (x + k)
        b = b / w
        k = k + 1
    out = jnp.where(summed, s, tail)
    out = jnp.where((q <= 0) & (x != jnp.floor(x)), jnp.nan, out)
    out = jnp.where((q <= 0) & (q == jnp.floor(q)), jnp.inf, out)
    out = jnp.where(x < 1, jnp.nan, out)
    return jnp.where(x == 1, jnp.inf, out)


# aten::special_zeta(Tensor self, Tensor other) -> Tensor
@register_lowering(
    aten.special_zeta.default,
    aten.special_zeta.self_scalar,
    aten.special_zeta.other_scalar,
    promote=P.INT_TO_FLOAT,
    promote_args=(0, 1),
)
def zeta(ctx, self, other):
    dt = _compute_dtype(ctx)
    return _zeta(jnp.asarray(self, dt), jnp.asarray(other, dt))


# aten::polygamma(int n, Tensor self) -> Tensor
@register_lowering(aten.polygamma.default, promote=P.INT_TO_FLOAT, promote_args=(1,))
def polygamma(ctx, n, self):
    x = self.astype(_compute_dtype(ctx))
    if n == 0:
        return _digamma(x)
    if n == 1:
        return _trigamma(x)
    sign = 1.0 if n % 2 else -1.0
    return sign * math.exp(math.lgamma(n + 1.0)) * _zeta(jnp.full_like(x, n + 1.0), x)


@register_lowering(aten.digamma.default, promote=P.INT_TO_FLOAT)
def digamma(ctx, self):
    return _digamma(self)


# --- Airy and Bessel functions (Cephes rational approximations) -----------------------------

_AIRY_AN = np.array([
    3.46538101525629032477e-01, 1.20075952739645805542e01, 7.62796053615234516538e01,
    1.68089224934630576269e02, 1.59756391350164413639e02, 7.05360906840444183113e01,
    1.40264691163389668864e01, 9.99999999999999995305e-01,
])  # fmt: skip
_AIRY_AD = np.array([
    5.67594532638770212846e-01, 1.47562562584847203173e01, 8.45138970141474626562e01,
    1.77318088145400459522e02, 1.64234692871529701831e02, 7.14778400825575695274e01,
    1.40959135607834029598e01, 1.00000000000000000470e00,
])  # fmt: skip
_AIRY_AFN = np.array([
    -1.31696323418331795333e-01, -6.26456544431912369773e-01, -6.93158036036933542233e-01,
    -2.79779981545119124951e-01, -4.91900132609500318020e-02, -4.06265923594885404393e-03,
    -1.59276496239262096340e-04, -2.77649108155232920844e-06, -1.67787698489114633780e-08,
])  # fmt: skip
_AIRY_AFD = np.array([
    1.33560420706553243746e01, 3.26825032795224613948e01, 2.67367040941499554804e01,
    9.18707402907259625840e00, 1.47529146771666414581e00, 1.15687173795188044134e-01,
    4.40291641615211203805e-03, 7.54720348287414296618e-05, 4.51850092970580378464e-07,
])  # fmt: skip
_AIRY_AGN = np.array([
    1.97339932091685679179e-02, 3.91103029615688277255e-01, 1.06579897599595591108e00,
    9.39169229816650230044e-01, 3.51465656105547619242e-01, 6.33888919628925490927e-02,
    5.85804113048388458567e-03, 2.82851600836737019778e-04, 6.98793669997260967291e-06,
    8.11789239554389293311e-08, 3.41551784765923618484e-10,
])  # fmt: skip
_AIRY_AGD = np.array([
    9.30892908077441974853e00, 1.98352928718312140417e01, 1.55646628932864612953e01,
    5.47686069422975497931e00, 9.54293611618961883998e-01, 8.64580826352392193095e-02,
    4.12656523824222607191e-03, 1.01259085116509135510e-04, 1.17166733214413521882e-06,
    4.91834570062930015649e-09,
])  # fmt: skip
_INV_SQRT_PI = 5.64189583547756286948e-01


def _airy_ai(x):
    eps = float(jnp.finfo(x.dtype).eps)
    # x < -2.09: oscillating asymptotic expansion.
    xn = jnp.where(x < -2.09, x, -4.0)
    zeta = -2.0 * xn * jnp.sqrt(-xn) / 3.0
    z = 1.0 / zeta
    zz = z * z
    afn, afd = _horner(_AIRY_AFN, zz), _horner(_AIRY_AFD, zz)
    agn, agd = _horner(_AIRY_AGN, zz), _horner(_AIRY_AGD, zz)
    t = zeta + 0.25 * math.pi
    neg = (
        _INV_SQRT_PI
        / jnp.sqrt(jnp.sqrt(-xn))
        * (jnp.sin(t) * (1.0 + zz * afn / afd) - jnp.cos(t) * (z * agn / agd))
    )
    # x >= 2.09: exponentially decaying asymptotic expansion.
    xp = jnp.where(x >= 2.09, x, 4.0)
    zeta = 2.0 * xp * jnp.sqrt(xp) / 3.0
    an, ad = _horner(_AIRY_AN, 1.0 / zeta), _horner(_AIRY_AD, 1.0 / zeta)
    pos = _INV_SQRT_PI * (an / ad) / (2.0 * jnp.sqrt(jnp.sqrt(xp)) * jnp.exp(zeta))
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


_J0_PP = np.array([
    7.96936729297347051624e-04, 8.28352392107440799803e-02, 1.23953371646414299388e00,
    5.44725003058768775090e00, 8.74716500199817011941e00, 5.30324038235394892183e00,
    9.99999999999999997821e-01,
])  # fmt: skip
_J0_PQ = np.array([
    9.24408810558863637013e-04, 8.56288474354474431428e-02, 1.25352743901058953537e00,
    5.47097740330417105182e00, 8.76190883237069594232e00, 5.30605288235394617618e00,
    1.00000000000000000218e00,
])  # fmt: skip
_J0_QP = np.array([
    -1.13663838898469149931e-02, -1.28252718670509318512e00, -1.95539544257735972385e01,
    -9.32060152123768231369e01, -1.77681167980488050595e02, -1.47077505154951170175e02,
    -5.14105326766599330220e01, -6.05014350600728481186e00,
])  # fmt: skip
_J0_QQ = np.array([
    6.43178256118178023184e01, 8.56430025976980587198e02, 3.88240183605401609683e03,
    7.24046774195652478189e03, 5.93072701187316984827e03, 2.06209331660327847417e03,
    2.42005740240291393179e02,
])  # fmt: skip
_J0_RP = np.array([
    -4.79443220978201773821e09, 1.95617491946556577543e12, -2.49248344360967716204e14,
    9.70862251047306323952e15,
])  # fmt: skip
_J0_RQ = np.array([
    4.99563147152651017219e02, 1.73785401676374683123e05, 4.84409658339962045305e07,
    1.11855537045356834862e10, 2.11277520115489217587e12, 3.10518229857422583814e14,
    3.18121955943204943306e16, 1.71086294081043136091e18,
])  # fmt: skip
_Y0_YP = np.array([
    1.55924367855235737965e04, -1.46639295903971606143e07, 5.43526477051876500413e09,
    -9.82136065717911466409e11, 8.75906394395366999549e13, -3.46628303384729719441e15,
    4.42733268572569800351e16, -1.84950800436986690637e16,
])  # fmt: skip
_Y0_YQ = np.array([
    1.04128353664259848412e03, 6.26107330137134956842e05, 2.68919633393814121987e08,
    8.64002487103935000337e10, 2.02979612750105546709e13, 3.17157752842975028269e15,
    2.50596256172653059228e17,
])  # fmt: skip
_J1_PP = np.array([
    7.62125616208173112003e-04, 7.31397056940917570436e-02, 1.12719608129684925192e00,
    5.11207951146807644818e00, 8.42404590141772420927e00, 5.21451598682361504063e00,
    1.00000000000000000254e00,
])  # fmt: skip
_J1_PQ = np.array([
    5.71323128072548699714e-04, 6.88455908754495404082e-02, 1.10514232634061696926e00,
    5.07386386128601488557e00, 8.39985554327604159757e00, 5.20982848682361821619e00,
    9.99999999999999997461e-01,
])  # fmt: skip
_J1_QP = np.array([
    5.10862594750176621635e-02, 4.98213872951233449420e00, 7.58238284132545283818e01,
    3.66779609360150777800e02, 7.10856304998926107277e02, 5.97489612400613639965e02,
    2.11688757100572135698e02, 2.52070205858023719784e01,
])  # fmt: skip
_J1_QQ = np.array([
    7.42373277035675149943e01, 1.05644886038262816351e03, 4.98641058337653607651e03,
    9.56231892404756170795e03, 7.99704160447350683650e03, 2.82619278517639096600e03,
    3.36093607810698293419e02,
])  # fmt: skip
_J1_RP = np.array([
    -8.99971225705559398224e08, 4.52228297998194034323e11, -7.27494245221818276015e13,
    3.68295732863852883286e15,
])  # fmt: skip
_J1_RQ = np.array([
    6.20836478118054335476e02, 2.56987256757748830383e05, 8.35146791431949253037e07,
    2.21511595479792499675e10, 4.74914122079991414898e12, 7.84369607876235854894e14,
    8.95222336184627338078e16, 5.32278620332680085395e18,
])  # fmt: skip
_Y1_YP = np.array([
    1.26320474790178026440e09, -6.47355876379160291031e11, 1.14509511541823727583e14,
    -8.12770255501325109621e15, 2.02439475713594898196e17, -7.78877196265950026825e17,
])  # fmt: skip
_Y1_YQ = np.array([
    5.94301592346128195359e02, 2.35564092943068577943e05, 7.34811944459721705660e07,
    1.87601316108706159478e10, 3.88231277496238566008e12, 6.20557727146953693363e14,
    6.87141087355300489866e16, 3.97270608116560655612e18,
])  # fmt: skip
_SQRT_2_PI = 0.797884560802865355879892119868763737
_TWO_PI = 0.636619772367581343075535053490057448


def _bessel_asymptotic(x, pp, pq, qp, qq, order, second_kind):
    """The x > 5 Hankel expansion shared by J0/J1/Y0/Y1 (``x`` already safe, i.e. > 5)."""
    # The order-0 and order-1 kernels spell (5/x)^2 differently; keep each one's rounding.
    z = 25.0 / (x * x) if order == 0 else 5.0 / x * (5.0 / x)
    phase = _PI_4 if order == 0 else _3PI_4
    p = _horner(pp, z) / _horner(pq, z)
    q = _horner(qp, z) / _horner(qq, z)
    s, c = jnp.sin(x - phase), jnp.cos(x - phase)
    if second_kind:
        return (p * s + 5.0 / x * q * c) * _SQRT_2_PI / jnp.sqrt(x)
    return (p * c - 5.0 / x * q * s) * _SQRT_2_PI / jnp.sqrt(x)


_PI_4 = 0.785398163397448309615660845819875721
_3PI_4 = 2.356194490192344928846982537459627163


def _j0_small(x):
    xx = x * x
    out = (xx - 5.78318596294678452118e00) * (xx - 3.04712623436620863991e01)
    out = out * _horner(_J0_RP, xx) / _horner(_J0_RQ, xx)
    return jnp.where(x < 0.00001, 1.0 - xx / 4.0, out)


def _bessel_j0(x):
    x = jnp.abs(x)
    small = x <= 5.0
    xs, xl = jnp.where(small, x, 1.0), jnp.where(small, 10.0, x)
    large = _bessel_asymptotic(xl, _J0_PP, _J0_PQ, _J0_QP, _J0_QQ, 0, False)
    return jnp.where(small, _j0_small(xs), large)


def _j1_small(x):
    xx = x * x
    out = _horner(_J1_RP, xx) / _horner(_J1_RQ, xx) * x
    return out * (xx - 1.46819706421238932572e01) * (xx - 4.92184563216946036703e01)


def _bessel_j1(x):
    ax = jnp.abs(x)
    small = ax <= 5.0
    xs, xl = jnp.where(small, ax, 1.0), jnp.where(small, 10.0, ax)
    large = _bessel_asymptotic(xl, _J1_PP, _J1_PQ, _J1_QP, _J1_QQ, 1, False)
    out = jnp.where(small, _j1_small(xs), large)
    return jnp.where(x < 0, -out, out)


def _bessel_y0(x):
    small = x <= 5.0
    xs, xl = jnp.where(small & (x > 0), x, 1.0), jnp.where(small, 10.0, x)
    xx = xs * xs
    out = _horner(_Y0_YP, xx) / _horner(_Y0_YQ, xx) + _TWO_PI * jnp.log(xs) * _j0_small(xs)
    large = _bessel_asymptotic(xl, _J0_PP, _J0_PQ, _J0_QP, _J0_QQ, 0, True)
    out = jnp.where(x < 0, jnp.nan, jnp.where(x == 0, -jnp.inf, out))
    return jnp.where(small, out, large)


def _bessel_y1(x):
    small = x <= 5.0
    xs, xl = jnp.where(small & (x > 0), x, 1.0), jnp.where(small, 10.0, x)
    xx = xs * xs
    out = xs * (_horner(_Y1_YP, xx) / _horner(_Y1_YQ, xx))
    out = out + _TWO_PI * (_j1_small(xs) * jnp.log(xs) - 1.0 / xs)
    large = _bessel_asymptotic(xl, _J1_PP, _J1_PQ, _J1_QP, _J1_QQ, 1, True)
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


# Chebyshev coefficients of the modified Bessel functions (Cephes i0, i1, k0, k1).
_I0_A = np.array([
    -4.41534164647933937950e-18, 3.33079451882223809783e-17, -2.43127984654795469359e-16,
    1.71539128555513303061e-15, -1.16853328779934516808e-14, 7.67618549860493561688e-14,
    -4.85644678311192946090e-13, 2.95505266312963983461e-12, -1.72682629144155570723e-11,
    9.67580903537323691224e-11, -5.18979560163526290666e-10, 2.65982372468238665035e-09,
    -1.30002500998624804212e-08, 6.04699502254191894932e-08, -2.67079385394061173391e-07,
    1.11738753912010371815e-06, -4.41673835845875056359e-06, 1.64484480707288970893e-05,
    -5.75419501008210370398e-05, 1.88502885095841655729e-04, -5.76375574538582365885e-04,
    1.63947561694133579842e-03, -4.32430999505057594430e-03, 1.05464603945949983183e-02,
    -2.37374148058994688156e-02, 4.93052842396707084878e-02, -9.49010970480476444210e-02,
    1.71620901522208775349e-01, -3.04682672343198398683e-01, 6.76795274409476084995e-01,
])  # fmt: skip
_I0_B = np.array([
    -7.23318048787475395456e-18, -4.83050448594418207126e-18, 4.46562142029675999901e-17,
    3.46122286769746109310e-17, -2.82762398051658348494e-16, -3.42548561967721913462e-16,
    1.77256013305652638360e-15, 3.81168066935262242075e-15, -9.55484669882830764870e-15,
    -4.15056934728722208663e-14, 1.54008621752140982691e-14, 3.85277838274214270114e-13,
    7.18012445138366623367e-13, -1.79417853150680611778e-12, -1.32158118404477131188e-11,
    -3.14991652796324136454e-11, 1.18891471078464383424e-11, 4.94060238822496958910e-10,
    3.39623202570838634515e-09, 2.26666899049817806459e-08, 2.04891858946906374183e-07,
    2.89137052083475648297e-06, 6.88975834691682398426e-05, 3.36911647825569408990e-03,
    8.04490411014108831608e-01,
])  # fmt: skip
_I1_A = np.array([
    2.77791411276104639959e-18, -2.11142121435816608115e-17, 1.55363195773620046921e-16,
    -1.10559694773538630805e-15, 7.60068429473540693410e-15, -5.04218550472791168711e-14,
    3.22379336594557470981e-13, -1.98397439776494371520e-12, 1.17361862988909016308e-11,
    -6.66348972350202774223e-11, 3.62559028155211703701e-10, -1.88724975172282928790e-09,
    9.38153738649577178388e-09, -4.44505912879632808065e-08, 2.00329475355213526229e-07,
    -8.56872026469545474066e-07, 3.47025130813767847674e-06, -1.32731636560394358279e-05,
    4.78156510755005422638e-05, -1.61760815825896745588e-04, 5.12285956168575772895e-04,
    -1.51357245063125314899e-03, 4.15642294431288815669e-03, -1.05640848946261981558e-02,
    2.47264490306265168283e-02, -5.29459812080949914269e-02, 1.02643658689847095384e-01,
    -1.76416518357834055153e-01, 2.52587186443633654823e-01,
])  # fmt: skip
_I1_B = np.array([
    7.51729631084210481353e-18, 4.41434832307170791151e-18, -4.65030536848935832153e-17,
    -3.20952592199342395980e-17, 2.96262899764595013876e-16, 3.30820231092092828324e-16,
    -1.88035477551078244854e-15, -3.81440307243700780478e-15, 1.04202769841288027642e-14,
    4.27244001671195135429e-14, -2.10154184277266431302e-14, -4.08355111109219731823e-13,
    -7.19855177624590851209e-13, 2.03562854414708950722e-12, 1.41258074366137813316e-11,
    3.25260358301548823856e-11, -1.89749581235054123450e-11, -5.58974346219658380687e-10,
    -3.83538038596423702205e-09, -2.63146884688951950684e-08, -2.51223623787020892529e-07,
    -3.88256480887769039346e-06, -1.10588938762623716291e-04, -9.76109749136146840777e-03,
    7.78576235018280120474e-01,
])  # fmt: skip
_K0_A = np.array([
    1.37446543561352307156e-16, 4.25981614279661018399e-14, 1.03496952576338420167e-11,
    1.90451637722020886025e-09, 2.53479107902614945675e-07, 2.28621210311945178607e-05,
    1.26461541144692592338e-03, 3.59799365153615016266e-02, 3.44289899924628486886e-01,
    -5.35327393233902768720e-01,
])  # fmt: skip
_K0_B = np.array([
    5.30043377268626276149e-18, -1.64758043015242134646e-17, 5.21039150503902756861e-17,
    -1.67823109680541210385e-16, 5.51205597852431940784e-16, -1.84859337734377901440e-15,
    6.34007647740507060557e-15, -2.22751332699166985548e-14, 8.03289077536357521100e-14,
    -2.98009692317273043925e-13, 1.14034058820847496303e-12, -4.51459788337394416547e-12,
    1.85594911495471785253e-11, -7.95748924447710747776e-11, 3.57739728140030116597e-10,
    -1.69753450938905987466e-09, 8.57403401741422608519e-09, -4.66048989768794782956e-08,
    2.76681363944501510342e-07, -1.83175552271911948767e-06, 1.39498137188764993662e-05,
    -1.28495495816278026384e-04, 1.56988388573005337491e-03, -3.14481013119645005427e-02,
    2.44030308206595545468e00,
])  # fmt: skip
_K1_A = np.array([
    -7.02386347938628759343e-18, -2.42744985051936593393e-15, -6.66690169419932900609e-13,
    -1.41148839263352776110e-10, -2.21338763073472585583e-08, -2.43340614156596823496e-06,
    -1.73028895751305206302e-04, -6.97572385963986435018e-03, -1.22611180822657148235e-01,
    -3.53155960776544875667e-01, 1.52530022733894777053e00,
])  # fmt: skip
_K1_B = np.array([
    -5.75674448366501715755e-18, 1.79405087314755922667e-17, -5.68946255844285935196e-17,
    1.83809354436663880070e-16, -6.05704724837331885336e-16, 2.03870316562433424052e-15,
    -7.01983709041831346144e-15, 2.47715442448130437068e-14, -8.97670518232499435011e-14,
    3.34841966607842919884e-13, -1.28917396095102890680e-12, 5.13963967348173025100e-12,
    -2.12996783842756842877e-11, 9.21831518760500529508e-11, -4.19035475934189648750e-10,
    2.01504975519703286596e-09, -1.03457624656780970260e-08, 5.74108412545004946722e-08,
    -3.50196060308781257119e-07, 2.40648494783721712015e-06, -1.93619797416608296024e-05,
    1.95215518471351631108e-04, -2.85781685962277938680e-03, 1.03923736576817238437e-01,
    2.72062619048444266945e00,
])  # fmt: skip


def _cheb_half(coeffs, z):
    b, p = _chbevl(coeffs.tolist(), z)  # Python floats: no float64 promotion
    return 0.5 * (b - p)


def _modified_bessel_i0(x):
    ax = jnp.abs(x)
    small = jnp.exp(ax) * _cheb_half(_I0_A, ax / 2.0 - 2.0)
    large = jnp.exp(ax) * _cheb_half(_I0_B, 32.0 / ax - 2.0) / jnp.sqrt(ax)
    return jnp.where(ax <= 8.0, small, large)


def _modified_bessel_i1(x):
    ax = jnp.abs(x)
    small = _cheb_half(_I1_A, ax / 2.0 - 2.0) * ax * jnp.exp(ax)
    large = jnp.exp(ax) * _cheb_half(_I1_B, 32.0 / ax - 2.0) / jnp.sqrt(ax)
    out = jnp.where(ax <= 8.0, small, large)
    return jnp.where(x < 0, -out, out)


def _modified_bessel_k(x, order, scaled):
    """K0/K1 (``order``), times exp(x) when ``scaled``."""
    small = x <= 2.0
    xs = jnp.where(small & (x > 0), x, 1.0)
    xl = jnp.where(small, 4.0, x)
    if order == 0:
        # NOTE: torch evaluates log(0.5 * x) in double here; this uses the compute dtype.
        near = _cheb_half(_K0_A, xs * xs - 2.0) - jnp.log(0.5 * xs) * _modified_bessel_i0(xs)
        half = _cheb_half(_K0_B, 8.0 / xl - 2.0)
    else:
        near = jnp.log(0.5 * xs) * _modified_bessel_i1(xs) + _cheb_half(_K1_A, xs * xs - 2.0) / xs
        half = _cheb_half(_K1_B, 8.0 / xl - 2.0)
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
    register_lowering(_op, promote=P.INT_TO_FLOAT)(lambda ctx, self, _f=_f: _f(self))


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
        odd_end = jnp.where(even, nf + nf + 1, -(nf + nf + 1))
        trig = jnp.where(
            jnp.sin(theta / 2.0) != 1.0,
            jnp.cos((nf + 0.5) * theta) / jnp.cos(theta / 2.0),
            odd_end,
        )
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
        odd_end = jnp.where(even, nf + nf + 1, -(nf + nf + 1))
        trig = jnp.where(
            jnp.sin(theta / 2.0) != 1.0,
            jnp.cos((nf + 0.5) * theta) / jnp.cos(theta / 2.0),
            odd_end,
        )
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
    register_lowering(_packet.default, _packet.x_scalar, _packet.n_scalar, promote=P.INT_TO_FLOAT)(
        _polynomial(_f)
    )

"""Matrix factorizations and what is built on them: Cholesky, LU, QR, eigen- and singular value
decompositions, solves, inverses, determinants, pseudo-inverses, the matrix exponential,
Householder products.

The factorizations call ``jax.lax.linalg``, which on CPU runs the same LAPACK routines as torch
(potrf, getrf, geqrf/orgqr, syevd, geev, gesdd), so outputs follow LAPACK's conventions: 1-based
``int32`` pivots, R with LAPACK's signs, eigenvectors and singular vectors with LAPACK's phases.
Where torch factors ``A^T`` instead of ``A`` (det and slogdet of real inputs) the lowering does
the same, so the auxiliary outputs (``LU``, ``pivots``) match too.

``_ex`` variants return LAPACK's ``info`` (``int32``, one per matrix). ``check_errors`` is always
``False`` in a captured graph: AOTAutograd turns the error check into a separate
``_linalg_check_errors`` node.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax import lax
from jax.scipy.linalg import expm

from tpu_inductor.lowering.lowerings.registry import HALF, lowers

aten = torch.ops.aten
tsolve = lax.linalg.triangular_solve


def _mT(x):
    return jnp.swapaxes(x, -1, -2)


def _mH(x):
    return jnp.conj(_mT(x)) if jnp.iscomplexobj(x) else _mT(x)


def _batch_broadcast(*xs, core=2):
    """Broadcast the batch dimensions (all but the last ``core`` of each array) together."""
    batch = jnp.broadcast_shapes(*(x.shape[: x.ndim - core] for x in xs))
    return [jnp.broadcast_to(x, batch + x.shape[x.ndim - core :]) for x in xs]


def _eye_like(x):
    return jnp.broadcast_to(jnp.eye(x.shape[-1], dtype=x.dtype), x.shape)


def _matmul(ctx, a, b):
    return jnp.matmul(a, b, precision=ctx.precision)


def _empty(ctx, index):
    """An output torch leaves empty (e.g. ``Q`` for ``mode="r"``): zeros of its spec."""
    return jnp.zeros(ctx.out_shape(index), ctx.out_dtype(index))


# --- Cholesky ----------------------------------------------------------------------------------


def _lower_input(a, upper):
    """The triangle LAPACK reads, as the lower triangle of the Hermitian matrix it stands for."""
    return _mH(a) if upper else a


def _cholesky_partial(a):
    """Unblocked Cholesky (LAPACK potf2, lower) that stops at the first non-positive pivot.

    Returns ``(L, info)``: on failure at column ``j`` (1-based ``info``) the columns before it
    are factored, ``L[j, j]`` holds the failed pivot and the rest is the input's lower triangle,
    like LAPACK's partial result. Only used when the blocked factorization failed.
    """
    n = a.shape[-1]
    idx = jnp.arange(n)

    def step(j, carry):
        fac, info = carry
        row = jnp.where(idx < j, fac[j], 0)
        ajj = jnp.real(fac[j, j] - jnp.sum(row * jnp.conj(row)))
        ok = (info == 0) & (ajj > 0)
        ljj = jnp.sqrt(jnp.where(ok, ajj, 1))
        col = (fac[:, j] - _mv(fac, jnp.conj(row))) / ljj
        new_col = jnp.where(idx > j, col, jnp.where(idx == j, ljj.astype(fac.dtype), fac[:, j]))
        fac = fac.at[:, j].set(jnp.where(ok, new_col, fac[:, j]))
        failed_here = (info == 0) & ~(ajj > 0)
        fac = fac.at[j, j].set(jnp.where(failed_here, ajj.astype(fac.dtype), fac[j, j]))
        info = jnp.where(failed_here, j + 1, info)
        return fac, info

    fac, info = lax.fori_loop(0, n, step, (jnp.tril(a), jnp.int32(0)))
    return fac, info


def _mv(m, v):
    return jnp.sum(m * v[None, :], axis=-1)


def _cholesky_ex(a, upper):
    """``(L or U, info)`` like ``linalg_cholesky_ex``."""
    low = _lower_input(a, upper)
    batch = a.shape[:-2]
    if a.shape[-1] == 0:
        return a, jnp.zeros(batch, jnp.int32)
    fac = lax.linalg.cholesky(low, symmetrize_input=False)
    failed = jnp.any(jnp.isnan(fac))

    def partial():
        flat = low.reshape((-1,) + low.shape[-2:])
        lp, info = jax.vmap(_cholesky_partial)(flat)
        return lp.reshape(low.shape), info.reshape(batch)

    # NOTE: on failure JAX's factorization is all NaN; the partial result is recomputed with
    # LAPACK's unblocked algorithm (for the whole batch) so L and info match potf2.
    fac, info = lax.cond(failed, partial, lambda: (fac, jnp.zeros(batch, jnp.int32)))
    return (_mH(fac) if upper else fac), info


# aten::linalg_cholesky_ex(Tensor self, *, bool upper=False, bool check_errors=False) -> (L, info)
@lowers(aten.linalg_cholesky_ex.default)
def linalg_cholesky_ex(ctx, self, upper=False, check_errors=False):
    return _cholesky_ex(self, upper)


# aten::cholesky(Tensor self, bool upper=False) -> Tensor
@lowers(aten.cholesky.default)
def cholesky(ctx, self, upper=False):
    # NOTE: torch raises for a matrix that is not positive definite; a compiled graph cannot
    # raise on data, so the result is LAPACK's partial factorization instead.
    return _cholesky_ex(self, upper)[0]


def _cho_solve(fac, b, upper):
    """Solve ``A X = B`` with ``A = L L^H`` (or ``U^H U``) given the factor's triangle."""
    fac, b = _batch_broadcast(fac, b)
    if upper:
        y = tsolve(fac, b, left_side=True, lower=False, transpose_a=True, conjugate_a=True)
        return tsolve(fac, y, left_side=True, lower=False)
    y = tsolve(fac, b, left_side=True, lower=True)
    return tsolve(fac, y, left_side=True, lower=True, transpose_a=True, conjugate_a=True)


# aten::cholesky_solve(Tensor self, Tensor input2, bool upper=False) -> Tensor
@lowers(aten.cholesky_solve.default)
def cholesky_solve(ctx, self, input2, upper=False):
    if self.size == 0 or input2.size == 0:
        return _empty(ctx, None)
    return _cho_solve(input2, self, upper).astype(ctx.out_dtype())


# aten::cholesky_inverse(Tensor self, bool upper=False) -> Tensor
@lowers(aten.cholesky_inverse.default)
def cholesky_inverse(ctx, self, upper=False):
    if self.size == 0:
        return _empty(ctx, None)
    return _cho_solve(self, _eye_like(self), upper).astype(ctx.out_dtype())


# --- LU ----------------------------------------------------------------------------------------


def _lu(a):
    """``(LU, 0-based pivots, permutation)`` of getrf, for any (batched, rectangular) matrix."""
    m, n = a.shape[-2:]
    if m == 0 or n == 0:
        batch = a.shape[:-2]
        return a, jnp.zeros(batch + (0,), jnp.int32), jnp.broadcast_to(jnp.arange(m), batch + (m,))
    return lax.linalg.lu(a)


def _lu_info(lu):
    """getrf's ``info``: the 1-based index of the first exactly-zero pivot of U, else 0."""
    k = min(lu.shape[-2:])
    if k == 0:
        return jnp.zeros(lu.shape[:-2], jnp.int32)
    zero = jnp.diagonal(lu, axis1=-2, axis2=-1) == 0
    return jnp.where(jnp.any(zero, -1), jnp.argmax(zero, -1) + 1, 0).astype(jnp.int32)


def _permutation(pivots1, m):
    """The row permutation of 1-based LAPACK ``pivots`` (``A[perm] = L U``)."""
    if pivots1.shape[-1] == 0:
        return jnp.broadcast_to(jnp.arange(m, dtype=jnp.int32), pivots1.shape[:-1] + (m,))
    return lax.linalg.lu_pivots_to_permutation(pivots1.astype(jnp.int32) - 1, m)


def _perm_matrix(perm, dtype):
    """``P`` with ``A = P L U`` for ``A[perm] = L U``: ``P[perm[i], i] = 1``."""
    return _mT(jax.nn.one_hot(perm, perm.shape[-1], dtype=dtype))


def _lu_solve(lu, perm, b, adjoint):
    """Solve ``A X = B`` (``A^H X = B`` if ``adjoint``) with ``A[perm] = L U``; B is (.., n, k)."""
    lu, b = _batch_broadcast(lu, b)
    perm = jnp.broadcast_to(perm, lu.shape[:-1])
    if not adjoint:
        x = jnp.take_along_axis(b, perm[..., :, None], axis=-2)
        x = tsolve(lu, x, left_side=True, lower=True, unit_diagonal=True)
        return tsolve(lu, x, left_side=True, lower=False)
    y = tsolve(lu, b, left_side=True, lower=False, transpose_a=True, conjugate_a=True)
    y = tsolve(
        lu, y, left_side=True, lower=True, unit_diagonal=True, transpose_a=True, conjugate_a=True
    )
    inverse = jnp.argsort(perm, axis=-1)
    return jnp.take_along_axis(y, inverse[..., :, None], axis=-2)


def _lu_solve_sided(lu, perm, b, left, adjoint):
    if left:
        return _lu_solve(lu, perm, b, adjoint)
    # X A = B  <=>  A^H X^H = B^H;  X A^H = B  <=>  A X^H = B^H
    return _mH(_lu_solve(lu, perm, _mH(b), not adjoint))


# aten::linalg_lu_factor_ex(Tensor A, *, bool pivot, bool check_errors) -> (LU, pivots, info)
@lowers(aten.linalg_lu_factor_ex.default)
def linalg_lu_factor_ex(ctx, A, pivot=True, check_errors=False):
    # NOTE: pivot=False is refused before tracing (unsupported.REFUSED).
    lu, piv, _ = _lu(A)
    return lu, piv + 1, _lu_info(lu)


# aten::linalg_lu(Tensor A, *, bool pivot=True) -> (Tensor P, Tensor L, Tensor U)
@lowers(aten.linalg_lu.default)
def linalg_lu(ctx, A, pivot=True):
    # NOTE: pivot=False is refused before tracing (unsupported.REFUSED).
    lu, _, perm = _lu(A)
    return _unpack(lu, perm, A.dtype)


def _unpack(lu, perm, dtype):
    m, n = lu.shape[-2:]
    k = min(m, n)
    lower = jnp.tril(lu[..., :, :k], -1) + jnp.eye(m, k, dtype=lu.dtype)
    upper = jnp.triu(lu[..., :k, :])
    return _perm_matrix(perm, dtype), lower, upper


# aten::lu_unpack(Tensor LU_data, Tensor LU_pivots, bool unpack_data, bool unpack_pivots)
@lowers(aten.lu_unpack.default)
def lu_unpack(ctx, LU_data, LU_pivots, unpack_data=True, unpack_pivots=True):
    m = LU_data.shape[-2]
    perm = _permutation(LU_pivots, m)
    p, lower, upper = _unpack(LU_data, perm, LU_data.dtype)
    # torch returns empty tensors for the parts it was told not to unpack.
    p = jnp.broadcast_to(p, ctx.out_shape(0)) if unpack_pivots else _empty(ctx, 0)
    if not unpack_data:
        lower, upper = _empty(ctx, 1), _empty(ctx, 2)
    return p, lower, upper


# aten::linalg_lu_solve(Tensor LU, Tensor pivots, Tensor B, *, bool left, bool adjoint) -> Tensor
@lowers(aten.linalg_lu_solve.default)
def linalg_lu_solve(ctx, LU, pivots, B, left=True, adjoint=False):
    if B.size == 0 or LU.size == 0:
        return _empty(ctx, None)
    perm = _permutation(pivots, LU.shape[-1])
    out = _lu_solve_sided(LU, perm, B, left, adjoint)
    return jnp.broadcast_to(out, ctx.out_shape()).astype(ctx.out_dtype())


def _solve_ex(A, B, left):
    """``(X, LU, pivots, info)`` of ``_linalg_solve_ex``: getrf of A, then getrs."""
    lu, piv, perm = _lu(A)
    vector = B.ndim == 1 or (B.ndim == A.ndim - 1 and B.shape == A.shape[:-1])
    b = B[..., None] if vector else B
    if A.shape[-1] == 0 or b.size == 0:
        x = jnp.zeros(jnp.broadcast_shapes(A.shape[:-2], b.shape[:-2]) + b.shape[-2:], A.dtype)
    else:
        x = _lu_solve_sided(lu, perm, b, left, adjoint=False)
    return (x[..., 0] if vector else x), lu, piv + 1, _lu_info(lu)


# aten::_linalg_solve_ex(Tensor A, Tensor B, *, bool left, bool check_errors) -> (X, LU, piv, info)
@lowers(aten._linalg_solve_ex.default)
def linalg_solve_ex(ctx, A, B, left=True, check_errors=False):
    x, lu, piv, info = _solve_ex(A, B, left)
    return jnp.broadcast_to(x, ctx.out_shape(0)).astype(ctx.out_dtype(0)), lu, piv, info


# aten::linalg_inv_ex(Tensor A, *, bool check_errors=False) -> (Tensor inverse, Tensor info)
@lowers(aten.linalg_inv_ex.default)
def linalg_inv_ex(ctx, A, check_errors=False):
    # torch computes the inverse as solve(A, I).
    x, _, _, info = _solve_ex(A, _eye_like(A), left=True)
    return x, info


def _det_lu(A):
    """getrf of A (of A^T for real A, like torch: same determinant, no copy)."""
    lu, piv, _ = _lu(_mT(A) if not jnp.iscomplexobj(A) else A)
    n = A.shape[-1]
    swaps = jnp.sum(piv != jnp.arange(n, dtype=piv.dtype), axis=-1)
    perm_sign = jnp.where(swaps % 2 == 0, 1, -1).astype(A.dtype)
    return lu, piv, perm_sign, jnp.diagonal(lu, axis1=-2, axis2=-1)


# aten::_linalg_det(Tensor A) -> (Tensor result, Tensor LU, Tensor pivots)
@lowers(aten._linalg_det.default)
def linalg_det(ctx, A):
    lu, piv, perm_sign, diag = _det_lu(A)
    return perm_sign * jnp.prod(diag, axis=-1), lu, piv + 1


# aten::_linalg_slogdet(Tensor A) -> (Tensor sign, Tensor logabsdet, Tensor LU, Tensor pivots)
@lowers(aten._linalg_slogdet.default)
def linalg_slogdet(ctx, A):
    lu, piv, perm_sign, diag = _det_lu(A)
    absdiag = jnp.abs(diag)
    unit = jnp.where(absdiag == 0, 0, diag / jnp.where(absdiag == 0, 1, absdiag))
    sign = perm_sign * jnp.prod(unit, axis=-1)
    logabsdet = jnp.sum(jnp.log(absdiag), axis=-1)
    return sign.astype(ctx.out_dtype(0)), logabsdet.astype(ctx.out_dtype(1)), lu, piv + 1


# --- triangular solves -------------------------------------------------------------------------


# aten::linalg_solve_triangular(Tensor self, Tensor B, *, bool upper, bool left, bool unitriangular)
@lowers(aten.linalg_solve_triangular.default)
def linalg_solve_triangular(ctx, self, B, upper, left=True, unitriangular=False):
    if self.size == 0 or B.size == 0:
        return _empty(ctx, None)
    a, b = _batch_broadcast(self, B)
    # NOTE: like LAPACK trsm, only the triangle named by `upper` is read.
    out = tsolve(a, b, left_side=left, lower=not upper, unit_diagonal=unitriangular)
    return out.astype(ctx.out_dtype())


# aten::triangular_solve(Tensor self, Tensor A, bool upper, bool transpose, bool unitriangular)
@lowers(aten.triangular_solve.default)
def triangular_solve(ctx, self, A, upper=True, transpose=False, unitriangular=False):
    b, a = _batch_broadcast(self, A)
    if a.size == 0 or b.size == 0:
        return _empty(ctx, 0), a
    out = tsolve(
        a, b, left_side=True, lower=not upper, transpose_a=transpose, unit_diagonal=unitriangular
    )
    return out, a


# --- QR and Householder ------------------------------------------------------------------------


# aten::linalg_qr(Tensor A, str mode="reduced") -> (Tensor Q, Tensor R)
@lowers(aten.linalg_qr.default)
def linalg_qr(ctx, A, mode="reduced"):
    if A.size == 0:
        m, n = A.shape[-2:]
        q = jnp.broadcast_to(jnp.eye(*ctx.out_shape(0)[-2:], dtype=A.dtype), ctx.out_shape(0))
        return (q if mode != "r" else _empty(ctx, 0)), _empty(ctx, 1)
    q, r = lax.linalg.qr(A, full_matrices=mode == "complete")
    return (_empty(ctx, 0) if mode == "r" else q), r


def _geqrf(a):
    # jnp.linalg.qr(mode="raw") is geqrf with the reflectors transposed.
    h, tau = jnp.linalg.qr(a, mode="raw")
    return _mT(h), tau


# aten::geqrf(Tensor self) -> (Tensor a, Tensor tau)
@lowers(aten.geqrf.default)
def geqrf(ctx, self):
    if self.size == 0:
        return self, _empty(ctx, 1)
    return _geqrf(self)


# aten::linalg_householder_product(Tensor input, Tensor tau) -> Tensor
@lowers(aten.linalg_householder_product.default)
def linalg_householder_product(ctx, input, tau):
    if input.size == 0:
        return _empty(ctx, None)
    if tau.shape[-1] == 0:
        return jnp.broadcast_to(jnp.eye(*input.shape[-2:], dtype=input.dtype), input.shape)
    return lax.linalg.householder_product(input, tau)


# aten::ormqr(Tensor self, Tensor input2, Tensor input3, bool left=True, bool transpose=False)
@lowers(aten.ormqr.default)
def ormqr(ctx, self, input2, input3, left=True, transpose=False):
    if input3.size == 0:
        return _empty(ctx, None)
    if input2.shape[-1] == 0:
        return input3
    a, c = _batch_broadcast(self, input3)
    tau = jnp.broadcast_to(input2, a.shape[:-2] + input2.shape[-1:])
    k = tau.shape[-1]
    return lax.linalg.ormqr(a[..., :, :k], tau, c, left=left, transpose=transpose)


# --- eigen- and singular value decompositions --------------------------------------------------


# aten::_linalg_eigh(Tensor A, str UPLO="L", bool compute_v=True) -> (eigenvalues, eigenvectors)
@lowers(aten._linalg_eigh.default)
def linalg_eigh(ctx, A, UPLO="L", compute_v=True):
    if A.shape[-1] == 0:
        return _empty(ctx, 0), _empty(ctx, 1)
    v, w = lax.linalg.eigh(A, lower=UPLO.upper() == "L", symmetrize_input=False)
    w = w.astype(ctx.out_dtype(0))
    return w, (v if compute_v else _empty(ctx, 1))


# aten::linalg_eig(Tensor self) -> (Tensor eigenvalues, Tensor eigenvectors)
@lowers(aten.linalg_eig.default)
def linalg_eig(ctx, self):
    if self.shape[-1] == 0:
        return _empty(ctx, 0), _empty(ctx, 1)
    # NOTE: JAX's eig runs on CPU only (LAPACK geev); on TPU/GPU it is a host callback or fails.
    w, v = lax.linalg.eig(self, compute_left_eigenvectors=False, compute_right_eigenvectors=True)
    return w.astype(ctx.out_dtype(0)), v.astype(ctx.out_dtype(1))


# aten::_linalg_svd(Tensor A, bool full_matrices, bool compute_uv, *, str? driver) -> (U, S, Vh)
@lowers(aten._linalg_svd.default)
def linalg_svd(ctx, A, full_matrices=False, compute_uv=True, driver=None):
    # NOTE: `driver` (a CUDA-only choice) is ignored.
    if A.size == 0:

        def eye(i):
            return jnp.broadcast_to(
                jnp.eye(*ctx.out_shape(i)[-2:], dtype=ctx.out_dtype(i)), ctx.out_shape(i)
            )

        return eye(0), _empty(ctx, 1), eye(2)
    if not compute_uv:
        s = lax.linalg.svd(A, full_matrices=False, compute_uv=False)
        return _empty(ctx, 0), s.astype(ctx.out_dtype(1)), _empty(ctx, 2)
    u, s, vh = lax.linalg.svd(A, full_matrices=full_matrices, compute_uv=True)
    return u, s.astype(ctx.out_dtype(1)), vh


# aten::linalg_pinv.atol_rtol_tensor(Tensor self, *, Tensor? atol, Tensor? rtol, bool hermitian)
@lowers(aten.linalg_pinv.atol_rtol_tensor)
def linalg_pinv(ctx, self, atol=None, rtol=None, hermitian=False):
    m, n = self.shape[-2:]
    if self.size == 0:
        return _empty(ctx, None)
    # torch's get_atol_rtol: tolerances are float64; an rtol not given is eps * max(m, n),
    # or 0 when a positive atol was given.
    tol_dtype = jnp.float64 if jax.config.jax_enable_x64 else jnp.float32
    real = jnp.finfo(self.dtype).dtype
    default_rtol = jnp.asarray(np.finfo(real).eps * max(m, n), tol_dtype)
    atol_ = jnp.zeros((), tol_dtype) if atol is None else atol.astype(tol_dtype)
    if rtol is not None:
        rtol_ = rtol.astype(tol_dtype)
    elif atol is not None:
        rtol_ = jnp.where(atol_ > 0, 0, default_rtol)
    else:
        rtol_ = default_rtol
    if hermitian:
        w, u = lax.linalg.eigh(self, symmetrize_input=False)[::-1]
        s_abs = jnp.abs(w)
        max_val = jnp.max(s_abs, axis=-1, keepdims=True)
        tol = jnp.maximum(atol_[..., None], rtol_[..., None] * max_val)
        s_inv = jnp.where(s_abs > tol, 1 / w, 0).astype(self.dtype)
        return _matmul(ctx, u * s_inv[..., None, :], _mH(u))
    u, s, vh = lax.linalg.svd(self, full_matrices=False)
    tol = jnp.maximum(atol_[..., None], rtol_[..., None] * s[..., :1])
    s_inv = jnp.where(s > tol, 1 / s, 0).astype(self.dtype)
    return _matmul(ctx, _mH(vh) * s_inv[..., None, :], _mH(u))


# aten::linalg_matrix_exp(Tensor self) -> Tensor
@lowers(aten.linalg_matrix_exp.default)
def linalg_matrix_exp(ctx, self):
    if self.size == 0:
        return self
    out = ctx.out_dtype()
    x = self.astype(jnp.float32) if out in HALF else self
    # NOTE: Pade approximation with scaling and squaring (scipy's expm); torch uses a Taylor
    # polynomial of degree up to 18: both are accurate to the dtype's precision.
    return expm(x).astype(out)


# --- LDL (Bunch-Kaufman) -----------------------------------------------------------------------

_BK_ALPHA = (1 + 17**0.5) / 8  # Bunch-Kaufman's growth-bounding constant, as in LAPACK


def _sytf2(a):
    """LAPACK's unblocked Bunch-Kaufman factorization (sytf2, lower) of one real matrix.

    Returns ``(LD, pivots, info)`` in LAPACK's layout: D's 1x1 and 2x2 blocks and the columns of
    L in the lower triangle (the upper triangle zeroed, like torch), 1-based pivots (negative,
    repeated, for a 2x2 block), ``info`` the first exactly-zero pivot.
    """
    n = a.shape[-1]
    idx = jnp.arange(n)
    below = idx[:, None] > idx[None, :]

    def symmetric(w, k):
        # Keep the trailing block [k:, k:] a full symmetric matrix (from its lower triangle).
        t = (idx[:, None] >= k) & (idx[None, :] >= k)
        low = jnp.where(below | (idx[:, None] == idx[None, :]), w, _mT(w))
        return jnp.where(t, low, w)

    def step(state):
        w, piv, info, k = state
        absakk = jnp.abs(w[k, k])
        colabs = jnp.where(idx > k, jnp.abs(w[:, k]), -1)
        imax = jnp.argmax(colabs)
        colmax = jnp.where(k < n - 1, jnp.max(colabs), 0)
        rowabs = jnp.where((idx >= k) & (idx != imax), jnp.abs(w[imax]), -1)
        rowmax = jnp.max(rowabs)
        singular = (jnp.maximum(absakk, colmax) == 0) | jnp.isnan(absakk)
        keep = (absakk >= _BK_ALPHA * colmax) | (absakk >= _BK_ALPHA * colmax * (colmax / rowmax))
        one_imax = jnp.abs(w[imax, imax]) >= _BK_ALPHA * rowmax
        kp = jnp.where(singular | keep, k, imax)
        kstep = jnp.where(singular | keep | one_imax, 1, 2)
        kk = k + kstep - 1
        # Interchange rows and columns kk and kp of the trailing block.
        p = idx.at[kk].set(kp).at[kp].set(kk)
        trailing = (idx[:, None] >= k) & (idx[None, :] >= k)
        w = jnp.where(trailing, w[p][:, p], w)
        # Rank-1 update (1x1 pivot) of the trailing block.
        d11 = 1 / jnp.where(singular, 1, w[k, k])
        x = jnp.where(idx > k, w[:, k], 0)
        w1 = w - jnp.where(idx[:, None] > k, x[:, None], 0) * (d11 * x)[None, :]
        w1 = jnp.where(idx[:, None] > k, w1, w).at[:, k].set(jnp.where(idx > k, x * d11, w[:, k]))
        # Rank-2 update (2x2 pivot).
        d21 = jnp.where(kstep == 2, w[k + 1, k], 1)
        e11 = w[k + 1, k + 1] / d21
        e22 = w[k, k] / d21
        t = 1 / (e11 * e22 - 1)
        d21 = t / d21
        ck, ck1 = w[:, k], w[:, jnp.minimum(k + 1, n - 1)]
        wk = d21 * (e11 * ck - ck1)
        wkp1 = d21 * (e22 * ck1 - ck)
        rest = idx > k + 1
        w2 = w - ck[:, None] * wk[None, :] - ck1[:, None] * wkp1[None, :]
        w2 = jnp.where(rest[:, None] & rest[None, :], w2, w)
        w2 = w2.at[:, k].set(jnp.where(rest, wk, ck))
        w2 = w2.at[:, jnp.minimum(k + 1, n - 1)].set(jnp.where(rest, wkp1, ck1))
        w = jnp.where(singular, w, jnp.where(kstep == 1, w1, w2))
        w = symmetric(w, k + kstep)
        info = jnp.where((info == 0) & singular, k + 1, info)
        kp1 = (kp + 1).astype(jnp.int32)
        piv = jnp.where(
            kstep == 1,
            piv.at[k].set(kp1),
            piv.at[k].set(-kp1).at[jnp.minimum(k + 1, n - 1)].set(-kp1),
        )
        return w, piv, info, k + kstep

    w0 = symmetric(a, 0)
    state = (w0, jnp.zeros(n, jnp.int32), jnp.int32(0), jnp.int32(0))
    w, piv, info, _ = lax.while_loop(lambda s: s[3] < n, step, state)
    return jnp.tril(w), piv, info


def _sytrs(ld, piv, b):
    """LAPACK's sytrs (lower): solve ``A X = B`` from sytf2's ``(LD, pivots)``; one matrix."""
    n = ld.shape[-1]
    idx = jnp.arange(n)

    def swap(b, i, j):
        p = idx.at[i].set(j).at[j].set(i)
        return b[p]

    def forward(state):
        b, k = state
        two = piv[k] < 0
        k1 = jnp.minimum(k + 1, n - 1)
        kp = jnp.abs(piv[k]) - 1
        b = swap(b, jnp.where(two, k1, k), kp)
        below = jnp.where(two, idx > k + 1, idx > k)
        b = b - jnp.where(below[:, None], ld[:, k, None] * b[k][None, :], 0)
        b = b - jnp.where((two & below)[:, None], ld[:, k1, None] * b[k1][None, :], 0)
        # 1x1: scale by 1/D(k,k); 2x2: solve the block.
        b1 = b.at[k].set(b[k] * (1 / ld[k, k]))
        akm1k = ld[k1, k]
        akm1 = ld[k, k] / akm1k
        ak = ld[k1, k1] / akm1k
        denom = akm1 * ak - 1
        bkm1, bk = b[k] / akm1k, b[k1] / akm1k
        b2 = b.at[k].set((ak * bkm1 - bk) / denom).at[k1].set((akm1 * bk - bkm1) / denom)
        return jnp.where(two, b2, b1), k + jnp.where(two, 2, 1)

    def backward(state):
        b, k = state
        two = piv[k] < 0
        km1 = jnp.maximum(k - 1, 0)
        below = idx > k
        b = b.at[k].add(-jnp.sum(jnp.where(below[:, None], b * ld[:, k, None], 0), axis=0))
        upd = -jnp.sum(jnp.where(below[:, None], b * ld[:, km1, None], 0), axis=0)
        b = b.at[km1].add(jnp.where(two, upd, 0))
        b = swap(b, k, jnp.abs(piv[k]) - 1)
        return b, k - jnp.where(two, 2, 1)

    b, _ = lax.while_loop(lambda s: s[1] < n, forward, (b, jnp.int32(0)))
    b, _ = lax.while_loop(lambda s: s[1] >= 0, backward, (b, jnp.int32(n - 1)))
    return b


def _over_batch(fn, *xs, core):
    """vmap ``fn`` over the (broadcast) batch dimensions of ``xs``."""
    for _ in range(xs[0].ndim - core[0]):
        fn = jax.vmap(fn)
    return fn(*xs)


# aten::linalg_ldl_factor_ex(Tensor self, *, bool hermitian, bool check_errors) -> (LD, piv, info)
@lowers(aten.linalg_ldl_factor_ex.default)
def linalg_ldl_factor_ex(ctx, self, hermitian=False, check_errors=False):
    # NOTE: complex matrices are refused before tracing (unsupported.REFUSED).
    if self.shape[-1] == 0:
        return self, _empty(ctx, 1), _empty(ctx, 2)
    # NOTE: always LAPACK's unblocked algorithm (sytrf uses it below 64 columns; blocked
    # sytrf picks the same pivots, rounding aside).
    return _over_batch(_sytf2, self, core=(2,))


# aten::linalg_ldl_solve(Tensor LD, Tensor pivots, Tensor B, *, bool hermitian=False) -> Tensor
@lowers(aten.linalg_ldl_solve.default)
def linalg_ldl_solve(ctx, LD, pivots, B, hermitian=False):
    # NOTE: complex matrices are refused before tracing (unsupported.REFUSED).
    if LD.shape[-1] == 0 or B.size == 0:
        return _empty(ctx, None)
    ld, b = _batch_broadcast(LD, B)
    piv = jnp.broadcast_to(pivots, ld.shape[:-1])
    return _over_batch(_sytrs, ld, piv, b, core=(2, 1, 2)).astype(ctx.out_dtype())


# aten::_linalg_check_errors(Tensor info, str api_name, *, bool is_matrix) -> ()
@lowers(aten._linalg_check_errors.default)
def linalg_check_errors(ctx, info, api_name, is_matrix):
    # NOTE: an XLA program can't raise, so a singular or non-positive-definite input gives
    # NaN/inf results (and info != 0 from the *_ex variants) instead of torch's LinAlgError.
    return None

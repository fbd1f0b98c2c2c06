"""Edge cases of the factorization, distance and FFT lowerings that OpInfo's first sample misses.

Each test compiles with ``backend="tpu"`` and compares against CPU eager: LAPACK's auxiliary
outputs (pivots, ``info``, partial factors), pivoting paths, the matmul form of ``cdist``,
transforms over more than three axes.
"""

from __future__ import annotations

import pytest
import torch

from tests.helpers import check_fn


def _sym(n, seed, zero_diag=False):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(n, n, generator=g, dtype=torch.float64)
    a = a + a.T
    if zero_diag:
        a.fill_diagonal_(0)
    return a


@pytest.mark.parametrize("zero_diag", [False, True])
def test_ldl_factor_and_solve_match_lapack_pivots(zero_diag):
    # A zero diagonal forces Bunch-Kaufman's 2x2 pivots and row interchanges.
    a = torch.stack([_sym(6, s, zero_diag) for s in range(3)])
    b = torch.randn(3, 6, 2, dtype=torch.float64)

    def fn(a, b):
        ld, piv, info = torch.linalg.ldl_factor_ex(a)
        return ld, piv, info, torch.linalg.ldl_solve(ld, piv, b)

    ld, piv, _, _ = check_fn(fn, a, b, atol=1e-10, rtol=1e-10)
    if zero_diag:
        assert (piv < 0).any()


def test_cholesky_ex_reports_first_failing_minor():
    a = torch.tensor([[4.0, 2, 1], [2, 1, 3], [1, 3, 5]])  # 2x2 leading minor is singular
    spd = torch.eye(3) * 2
    check_fn(lambda x: torch.linalg.cholesky_ex(x), torch.stack([spd, a]))
    check_fn(lambda x: torch.linalg.cholesky_ex(x, upper=True), a.T.contiguous())


def test_auxiliary_outputs_of_solve_inv_det():
    a = torch.randn(2, 4, 4, dtype=torch.float64)
    a[1, :, 2] = 0  # singular: info > 0
    b = torch.randn(2, 4, 3, dtype=torch.float64)
    check_fn(lambda a, b: torch.ops.aten._linalg_solve_ex(a, b), a[:1], b[:1], atol=1e-10)
    check_fn(lambda a, b: torch.linalg.solve_ex(a, b, left=False)[0], a[:1], b[:1].mT)
    check_fn(lambda a: torch.linalg.inv_ex(a)[1], a)
    check_fn(lambda a: torch.linalg.lu_factor_ex(a), a)
    check_fn(lambda a: torch.ops.aten._linalg_det(a), a, atol=1e-10)
    check_fn(lambda a: torch.ops.aten._linalg_slogdet(a), a, atol=1e-10)


@pytest.mark.parametrize(("left", "adjoint"), [(True, False), (True, True), (False, False)])
def test_lu_solve_sides(left, adjoint):
    a = torch.randn(2, 4, 4, dtype=torch.float64)
    lu, piv = torch.linalg.lu_factor(a)
    b = torch.randn(2, 4, 3, dtype=torch.float64)
    b = b if left else b.mT.contiguous()
    check_fn(
        lambda lu, p, b: torch.linalg.lu_solve(lu, p, b, left=left, adjoint=adjoint), lu, piv, b
    )


@pytest.mark.parametrize(
    "compute_mode", ["use_mm_for_euclid_dist_if_necessary", "donot_use_mm_for_euclid_dist"]
)
def test_cdist_matmul_and_direct_forms(compute_mode):
    x1, x2 = torch.randn(2, 30, 5), torch.randn(2, 27, 5)
    check_fn(lambda a, b: torch.cdist(a, b, compute_mode=compute_mode), x1, x2, atol=1e-4)
    check_fn(lambda a, b: torch.cdist(a, b, p=float("inf")), x1, x2)
    check_fn(lambda a: torch.pdist(a, p=3.0), x1[0])


def test_fftn_over_more_than_three_axes():
    x = torch.randn(3, 4, 5, 6, 2)
    check_fn(lambda x: torch.fft.fftn(x, norm="ortho"), x, atol=1e-4)
    check_fn(lambda x: torch.fft.rfftn(x, dim=(0, 1, 2, 3)), x, atol=1e-4)
    check_fn(lambda x: torch.fft.irfftn(x, s=(3, 4, 5, 8), dim=(0, 1, 2, 3)), x, atol=1e-4)


def test_pinv_tolerances():
    a = torch.randn(5, 4, dtype=torch.float64)
    atol = torch.tensor(0.5, dtype=torch.float64)
    check_fn(lambda a, t: torch.linalg.pinv(a, atol=t), a, atol)
    check_fn(lambda a: torch.linalg.pinv(a @ a.mT, hermitian=True, rtol=0.1), a)


def test_complex_decompositions():
    a = torch.randn(4, 4, dtype=torch.complex64)
    h = a @ a.mH + torch.eye(4)
    check_fn(lambda h: torch.linalg.cholesky_ex(h), h, atol=1e-4)
    check_fn(lambda a: torch.linalg.qr(a), a, atol=1e-4)
    check_fn(lambda a: torch.linalg.slogdet(a), a, atol=1e-4)
    check_fn(lambda a: torch.linalg.eigvals(a), a, atol=1e-4)


def test_refused_arguments_are_sent_to_eager_before_tracing():
    """Arguments a lowering can't take are refused up front (unsupported.REFUSED): with the
    default fallback they run in eager and match it; with fallback="error" the complete
    UnsupportedOpError names the reason."""
    import warnings

    import tpu_inductor

    a = torch.randn(4, 4, dtype=torch.complex64)
    a = a + a.mH
    fn = lambda a: torch.linalg.ldl_factor_ex(a, hermitian=True)  # noqa: E731
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", tpu_inductor.FallbackWarning)
        got = torch.compile(fn, backend="tpu")(a)
    want = fn(a)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w)
    assert any("LDL factorization of a complex matrix" in str(w.message) for w in caught)
    lu = lambda a: torch.linalg.lu_factor_ex(a, pivot=False)  # noqa: E731
    compiled = torch.compile(lu, backend="tpu", options={"fallback": "error"})
    with pytest.raises(tpu_inductor.UnsupportedOpError, match=r"pivot=False.*use pivot=True"):
        compiled(torch.randn(3, 3))

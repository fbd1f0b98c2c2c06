"""Ops whose output dtype is not their input's give eager's dtype, compared with CPU eager."""

from __future__ import annotations

import pytest
import torch

from tests.helpers import check_fn

aten = torch.ops.aten


_g = torch.Generator().manual_seed(0)
C = torch.randn(3, 4, dtype=torch.complex64, generator=_g)
F = torch.randn(3, 4, generator=_g)
I = torch.randint(-5, 5, (3, 4), generator=_g)  # noqa: E741
B = torch.rand(3, 4, generator=_g) > 0.5
H = torch.randn(3, 4, generator=_g).bfloat16()
F[0, 0], F[1, 1], F[2, 2] = float("nan"), float("inf"), -0.0

DTYPE_CASES = {
    # complex -> real
    "abs_complex": (torch.abs, C),
    "angle_complex": (torch.angle, C),
    "abs_angle_real_imag": (lambda t: (t.abs(), t.angle(), t.real, t.imag), C),
    "abs_then_add": (lambda t: t.abs() + 1, C),
    "real": (torch.real, C),
    "imag": (torch.imag, C),
    "view_as_real": (torch.view_as_real, C),
    "vector_norm_complex": (torch.linalg.vector_norm, C),
    "vector_norm_complex_l1_dim": (lambda t: torch.linalg.vector_norm(t, 1, dim=1), C),
    "vector_norm_complex_inf": (lambda t: torch.linalg.vector_norm(t, float("inf")), C),
    "norm_complex": (lambda t: t.norm(), C),
    "var_complex": (lambda t: t.var(dim=1), C),
    "std_complex": (lambda t: t.std(), C),
    # real -> complex
    "view_as_complex": (lambda t: torch.view_as_complex(t.reshape(3, 2, 2)), F.nan_to_num()),
    "complex": (lambda t: torch.complex(t, 2 * t), F),
    "polar": (lambda t: torch.polar(t.abs(), t), F.nan_to_num(0, 0, 0)),
    # int/bool -> float
    "angle_float": (torch.angle, F),
    "angle_int": (torch.angle, I),
    "sqrt_int": (torch.sqrt, I.abs()),
    "sigmoid_bool": (torch.sigmoid, B),
    "div_int": (lambda t: t / 2, I),
    "pow_int_half": (lambda t: t.abs() ** 0.5, I),
    "add_int_float": (lambda t: t + 1.5, I),
    # same dtype kept where it could change
    "abs_int": (torch.abs, I),
    "abs_bfloat16": (torch.abs, H),
    "sgn_complex": (torch.sgn, C),
    "floor_div_int": (lambda t: t // 2, I),
    # -> bool
    "isnan": (torch.isnan, F),
    "isnan_complex": (torch.isnan, C),
    "isinf_int": (torch.isinf, I),
    "isfinite_complex": (torch.isfinite, C),
    "isposinf": (torch.isposinf, F),
    "isneginf": (torch.isneginf, F),
    "signbit_float": (torch.signbit, F),
    "signbit_int": (torch.signbit, I),
    "isreal_complex": (torch.isreal, C),
    "eq_complex": (lambda t: t == t.conj(), C),
    "ne_complex_scalar": (lambda t: t != 1, C),
    "lt_float": (lambda t: t < 0, F),
    "le_int_float_scalar": (lambda t: t <= 0.5, I),
    "gt_bool": (lambda t: t > 0, B),
    "ge_mixed": (lambda t: t >= H, F),
    "logical_not_complex": (torch.logical_not, C),
    "logical_xor_int": (lambda t: torch.logical_xor(t, 1 - t), I),
    "isclose": (lambda t: torch.isclose(t, t + 1e-9), F),
    "any_float": (lambda t: t.any(1), F),
    "all_complex": (lambda t: t.all(), C),
    "to_bool_complex": (lambda t: t.bool(), C),
    # -> int64 (indices, counts)
    "argmax": (lambda t: t.argmax(), F.nan_to_num()),
    "argmax_dim_bfloat16": (lambda t: t.argmax(1), H),
    "argmin_keepdim_int": (lambda t: t.argmin(0, keepdim=True), I),
    "max_dim": (lambda t: t.max(1), F.nan_to_num()),
    "min_dim_int": (lambda t: t.min(0), I),
    "sort": (lambda t: t.sort(dim=1, stable=True), F.nan_to_num()),
    "topk": (lambda t: t.topk(2), F.nan_to_num()),
    "searchsorted": (lambda t: torch.searchsorted(torch.arange(5.0), t), F.nan_to_num()),
    "searchsorted_int32": (
        lambda t: torch.searchsorted(torch.arange(5.0), t, out_int32=True),
        F.nan_to_num(),
    ),
    "bucketize": (lambda t: torch.bucketize(t, torch.arange(3.0)), F.nan_to_num()),
    "count_nonzero": (lambda t: torch.count_nonzero(t, 1), F),
    "sum_bool": (lambda t: t.sum(), B),
    "cumsum_bool": (lambda t: t.cumsum(1), B),
    "prod_bool": (lambda t: t.prod(), B),
    "frexp": (torch.frexp, F.nan_to_num()),
    "to_int32": (lambda t: t.to(torch.int32), F.nan_to_num(0, 0, 0)),
}


@pytest.mark.parametrize("name", list(DTYPE_CASES))
def test_output_dtype_matches_eager(name):
    fn, x = DTYPE_CASES[name]
    check_fn(fn, x)

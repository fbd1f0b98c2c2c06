"""The semantic corners of PyTorch ops that lowerings must get exactly right, one named test
each, compiled with backend="tpu" against CPU eager (dtype, shape and values)."""

from __future__ import annotations

import torch

from tests.helpers import check_fn

NAN = float("nan")


def test_type_promotion_zero_dim_and_python_scalars():
    f16 = torch.randn(4, dtype=torch.float16)
    bf16 = torch.randn(4, dtype=torch.bfloat16)
    i32 = torch.arange(4, dtype=torch.int32)
    i64 = torch.tensor(3)  # 0-dim int64 does not promote an int32 tensor
    f32_0d = torch.tensor(2.5)
    check_fn(
        lambda a, b, c, d, e: (a + e, b * 1.5, c + d, c * 2.5, c / 2, a + b, c + True, d * e),
        f16,
        bf16,
        i32,
        i64,
        f32_0d,
        atol=1e-2,
        rtol=1e-2,
    )


def test_integer_division_rounding_and_signs():
    a = torch.tensor([7, -7, 7, -7, 0, 5], dtype=torch.int64)
    b = torch.tensor([2, 2, -2, -2, 3, -5], dtype=torch.int64)
    check_fn(
        lambda x, y: (
            torch.floor_divide(x, y),
            torch.div(x, y, rounding_mode="trunc"),
            torch.div(x, y, rounding_mode="floor"),
            torch.div(x, y),
            torch.remainder(x, y),
            torch.fmod(x, y),
        ),
        a,
        b,
    )
    fa, fb = a.float() + 0.5, b.float()
    check_fn(lambda x, y: (torch.remainder(x, y), torch.fmod(x, y), x // y), fa, fb)


def test_integer_overflow_wraps_around():
    x = torch.tensor([2**31 - 1, -(2**31)], dtype=torch.int32)
    y = torch.tensor([2**63 - 1, 2**62], dtype=torch.int64)
    u = torch.tensor([250, 3], dtype=torch.uint8)
    check_fn(lambda a, b, c: (a + 1, a * 3, b + 1, b * 4, c + 10, c - 5), x, y, u)


def test_shifts():
    x = torch.tensor([1, -8, 1 << 40, 7], dtype=torch.int64)
    s = torch.tensor([3, 1, 5, 0], dtype=torch.int64)
    u = torch.tensor([128, 1, 255], dtype=torch.uint8)
    check_fn(lambda a, b, c: (a << b, a >> b, a << 2, a >> 1, c >> 3, c << 1), x, s, u)


def test_nan_propagation_in_max_min_clamp_maximum_and_sort():
    x = torch.tensor([[1.0, NAN, 3.0], [2.0, 0.5, -1.0]])
    y = torch.tensor([[NAN, 0.0, 4.0], [1.0, NAN, -2.0]])
    check_fn(
        lambda a, b: (
            a.max(),
            a.min(),
            a.amax(1),
            a.max(dim=1),
            torch.maximum(a, b),
            torch.minimum(a, b),
            torch.fmax(a, b),
            a.clamp(0.0, 2.0),
            torch.sort(a, 1),
            torch.sort(a, 1, descending=True),
            a.argmax(1),
            a.argmin(1),
        ),
        x,
        y,
    )


def test_reductions_over_empty_dimensions():
    e = torch.zeros(3, 0)
    check_fn(lambda a: (a.sum(1), a.prod(1), a.mean(1), a.sum(), a.amax(0), a.any(1), a.all(1)), e)


def test_argmax_argmin_ties_pick_the_first_index():
    x = torch.tensor([[1, 3, 3, 0], [2, 2, 0, 0]], dtype=torch.int64)
    f = torch.tensor([[0.5, 0.5, 0.1], [0.1, 0.9, 0.9]])
    check_fn(lambda a, b: (a.argmax(1), a.argmin(1), b.argmax(), b.max(1), b.min(0)), x, f)


def test_stable_sort_keeps_equal_elements_in_order():
    x = torch.tensor([3, 1, 2, 1, 3, 2, 1, 0] * 4)
    check_fn(
        lambda a: (
            torch.sort(a, stable=True),
            torch.sort(a, stable=True, descending=True),
            torch.argsort(a, stable=True),
        ),
        x,
    )


def test_index_put_duplicates_with_accumulate():
    base = torch.zeros(5)
    idx = torch.tensor([0, 2, 2, 4, 0, 0])
    vals = torch.arange(6, dtype=torch.float32)
    check_fn(lambda b, i, v: b.index_put((i,), v, accumulate=True), base, idx, vals)
    check_fn(lambda b, i, v: b.index_put((i,), v[:1].expand(6), accumulate=False), base, idx, vals)


def test_negative_and_edge_indexing():
    x = torch.arange(24.0).reshape(4, 6)
    i = torch.tensor([-1, 0, -4, 3])
    check_fn(
        lambda a, j: (a[j], a[:, -1], a[-2:, -3:], a[j, -2], a[1:100], a[-100:2], a.select(1, -6)),
        x,
        i,
    )


def test_scatter_reduce_modes():
    src = torch.tensor([1.0, 5.0, -2.0, 3.0, 4.0, 0.5])
    idx = torch.tensor([0, 1, 0, 1, 2, 0])
    base = torch.tensor([2.0, -1.0, 0.0, 7.0])
    for reduce in ("sum", "prod", "mean", "amax", "amin"):
        for include_self in (True, False):
            torch._dynamo.reset()  # one lambda code object, ten variants: no recompile limit
            check_fn(
                lambda b, i, s, r=reduce, inc=include_self: b.scatter_reduce(
                    0, i, s, reduce=r, include_self=inc
                ),
                base,
                idx,
                src,
            )


def test_pow_with_integer_and_negative_exponents():
    i = torch.tensor([2, -3, 0, 5], dtype=torch.int64)
    e = torch.tensor([3, 2, 0, 1], dtype=torch.int64)
    f = torch.tensor([2.0, -3.0, 0.5, 4.0])
    check_fn(
        lambda a, b, c: (a**b, a**2, 2**b, c**-1, c**-2, c**0.5, c**b, torch.pow(c, 3)), i, e, f
    )


def test_round_half_to_even():
    x = torch.tensor([0.5, 1.5, 2.5, -0.5, -1.5, 2.4999, 3.5, 1e8 + 0.5])
    check_fn(lambda a: (torch.round(a), torch.round(a * 10, decimals=-1)), x)


def test_bool_arithmetic():
    a = torch.tensor([True, False, True, False])
    b = torch.tensor([True, True, False, False])
    check_fn(
        lambda x, y: (x + y, x * y, x & y, x | y, x ^ y, ~x, x.sum(), x.float() + y, x + 1),
        a,
        b,
    )

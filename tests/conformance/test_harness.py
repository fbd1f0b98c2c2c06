"""The conformance harness's own checks can fail: ties, eigenvector gauges, failure kinds."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("expecttest", reason="op_db needs expecttest: pip install 'tpu-inductor[test]'")

import opinfo_harness as H  # noqa: E402


def test_tie_indices_accept_another_tie_and_reject_a_wrong_index():
    x = torch.tensor([3, 1, 3, 2])
    eager = torch.sort(x)
    inputs = (x, (), {})
    swapped = torch.return_types.sort((eager.values, eager.indices[[0, 1, 3, 2]]))
    assert not torch.equal(swapped.indices, eager.indices)
    assert H._check_tie_indices(swapped, eager, inputs, H.TIE_INDEX_OPS["sort"], None) is None
    wrong = torch.return_types.sort((eager.values, torch.tensor([1, 0, 3, 2])))
    problem = H._check_tie_indices(wrong, eager, inputs, H.TIE_INDEX_OPS["sort"], None)
    assert problem is not None and "select" in problem
    y = torch.tensor([3, 1, 3, 3])  # index 0 and 3 both hold 3: a repeat is the only problem
    ey = torch.sort(y)
    repeated = torch.return_types.sort((ey.values, torch.tensor([1, 0, 0, 2])))
    problem = H._check_tie_indices(repeated, ey, (y, (), {}), H.TIE_INDEX_OPS["sort"], None)
    assert problem is not None and "repeat" in problem


def test_tie_indices_along_a_dim_without_keepdim():
    x = torch.tensor([[5, 5, 1], [2, 7, 7]])
    eager = torch.kthvalue(x, 3, 1)
    inputs = (x, (3, 1), {})
    other = torch.return_types.kthvalue(
        (eager.values, torch.tensor([1 - eager.indices[0], 3 - eager.indices[1]]))
    )
    assert H._check_tie_indices(other, eager, inputs, H.TIE_INDEX_OPS["kthvalue"], None) is None
    bad = torch.return_types.kthvalue((eager.values, torch.tensor([2, 0])))
    assert H._check_tie_indices(bad, eager, inputs, H.TIE_INDEX_OPS["kthvalue"], None)


def test_eigh_accepts_a_sign_flip_and_rejects_wrong_vectors():
    torch.manual_seed(0)
    a = torch.randn(5, 5)
    a = a + a.T
    lam, q = torch.linalg.eigh(a)
    flipped = (lam, q * torch.tensor([1.0, -1, 1, -1, -1]))
    assert H._check_eigh(flipped, (lam, q), None) is None
    assert H._check_eigh((lam, q.roll(1, dims=1)), (lam, q), None) is not None
    assert H._check_eigh((lam + 0.1, q), (lam, q), None) is not None


def test_failure_kind_is_checked_against_the_error():
    assert H.kind_problem("by design", "unsupported op: aten.nonzero.default") is None
    assert H.kind_problem("by design", "unsupported op: aten.bincount.default") is None
    assert H.kind_problem("by design", "unsupported op: aten.sin.default") is not None
    assert H.kind_problem("capture", "dynamo can't capture: Unsupported: x") is None
    assert H.kind_problem("capture", "mismatch: output 3/4 elements") is not None
    assert H.kind_problem("dtype", "unsupported dtype: torch.complex32 ...") is None
    assert H.kind_problem("dtype", "lowering failed: x") is not None


def test_low_rank_svd_accepts_another_basis_and_rejects_wrong_values():
    torch.manual_seed(0)
    a = torch.randn(5, 2) @ torch.randn(2, 4)
    u, s, v = torch.svd_lowrank(a, q=2)
    flip = torch.tensor([1.0, -1.0])
    assert H._check_svd_factors((u * flip, s, v * flip), (u, s, v), None) is None
    assert H._check_svd_factors((u, s * 1.01, v), (u, s, v), None) is not None
    assert H._check_svd_factors((u, s, v.roll(1, dims=1)), (u, s, v), None) is not None


def test_float64_judge_accepts_eager_sized_errors_and_rejects_larger_ones():
    """Where the exact value cancels, eager and we can both miss each other's entry by more
    than the tolerance; the float64 result decides, and a wrong result still fails."""
    exact = torch.tensor([1e4, 0.15, -2.0], dtype=torch.float64)
    eager = (exact + torch.tensor([0.02, 2e-3, 0.0], dtype=torch.float64)).float()
    ours = (exact + torch.tensor([-0.02, -2e-3, 0.0], dtype=torch.float64)).float()
    assert H._check_values(ours, eager, None) is not None  # 0.15 entry: 4e-3 apart
    assert H._as_close_as_eager(ours, eager, exact.float())
    wrong = ours.clone()
    wrong[1] = 0.2
    assert not H._as_close_as_eager(wrong, eager, exact.float())
    assert not H._as_close_as_eager(ours.double(), eager, exact.float())  # dtype differs


def test_random_samples_are_recognized():
    x = torch.randn(8, 4, 16)
    dropout = torch.nn.functional.scaled_dot_product_attention
    assert H._is_random_sample(dropout, (x, (x, x), {"dropout_p": 0.5}))
    assert not H._is_random_sample(dropout, (x, (x, x), {}))

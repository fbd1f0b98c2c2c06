"""Every decomposition we let AOTAutograd use gives torch's own dtypes, shapes and values.

``capture.decomposition_table()`` hands AOTAutograd torch's decompositions for the ops we do not
lower. A decomposition is a second implementation of the op, and some promote where torch's
kernel does not (``select_scatter`` of an int64 source into an int32 input came out int64,
issue 23). The slow audit runs OpInfo samples (and variants with one tensor argument cast to
another dtype, and the backward of the float samples) in eager under a dispatch mode that, at
every op with a decomposition in our table, also runs the decomposition and compares.
The default run checks the instances the audit found, compiled.
"""

from __future__ import annotations

import collections
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from tests.lowering.operand_matrix import Case, run_cases
from tpu_inductor.capture import aot as capture
from tpu_inductor.core.dtypes import tolerance

aten = torch.ops.aten

# Decompositions known to differ from eager, with why they stay: none may be added without a
# cause (the audit fails on anything else).
KNOWN: dict[str, str] = {
    "aten.native_batch_norm.default": (
        "with float32 parameters and a bfloat16 input, eager's saved mean and invstd are "
        "float32 and the decomposition's bfloat16; reached only by calling the aten op "
        "directly: AOTAutograd turns F.batch_norm into _native_batch_norm_legit_functional / "
        "_no_training, which are lowered with eager's dtypes "
        "(test_batch_norm_mixed_dtypes_through_a_module)"
    ),
}

MIXED = {
    torch.float32: (torch.int64, torch.float64),
    torch.int64: (torch.int32, torch.float32),
    torch.bool: (torch.float32, torch.int64),
    torch.bfloat16: (torch.float32, torch.int64),
    torch.int32: (torch.int64,),
}


class _CrossCheck(TorchDispatchMode):
    """Runs each decomposed op's decomposition next to the op and records every difference."""

    def __init__(self, table, problems):
        super().__init__()
        self.table, self.problems = table, problems

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        decomposition = self.table.get(func)
        if decomposition is None or func._schema.is_mutable:
            return out
        try:
            ref = decomposition(*pytree.tree_map_only(torch.Tensor, torch.clone, args), **kwargs)
        except Exception:
            return out  # the decomposition refuses what the kernel accepts: not a wrong number
        dtypes = [
            a.dtype for a in pytree.tree_leaves((args, kwargs)) if isinstance(a, torch.Tensor)
        ]
        where = f"{func} on {[str(d).removeprefix('torch.') for d in dtypes]}"
        got, want = pytree.tree_leaves(ref), pytree.tree_leaves(out)
        if len(got) != len(want):
            self.problems[str(func)].add(f"{where}: {len(got)} outputs, eager {len(want)}")
            return out
        for g, w in zip(got, want, strict=True):
            if not isinstance(w, torch.Tensor) or not isinstance(g, torch.Tensor):
                continue
            if g.dtype != w.dtype or g.shape != w.shape:
                self.problems[str(func)].add(
                    f"{where}: {g.dtype}{list(g.shape)}, eager {w.dtype}{list(w.shape)}"
                )
                continue
            atol, rtol = tolerance(w.dtype, level="op")
            try:
                torch.testing.assert_close(g, w, atol=10 * atol, rtol=10 * rtol, equal_nan=True)
            except AssertionError:
                self.problems[str(func)].add(f"{where}: values differ beyond 10x tolerance")
        return out


def audit(op_db, dtypes, samples: int) -> dict[str, set[str]]:
    """Differences between decompositions and eager kernels over ``op_db``'s samples."""
    table = capture.decomposition_table()
    problems: dict[str, set[str]] = collections.defaultdict(set)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for op in op_db:
            for dtype in dtypes:
                if dtype not in op.supported_dtypes("cpu"):
                    continue
                grad = dtype.is_floating_point and op.supports_autograd
                try:
                    batch = list(op.sample_inputs("cpu", dtype, requires_grad=grad))[:samples]
                except Exception:
                    continue
                for sample in batch:
                    for inp, args, kwargs, backward in _variants(sample):
                        try:
                            with _CrossCheck(table, problems):
                                out = op.op(inp, *args, **kwargs)
                                if backward:
                                    _backward(out)
                        except Exception:
                            continue
    return problems


def _variants(sample):
    """The sample itself (with its backward), and each tensor argument cast to another dtype."""
    yield sample.input, sample.args, sample.kwargs, True
    flat, spec = pytree.tree_flatten((sample.args, sample.kwargs))
    for i, t in enumerate(flat):
        if isinstance(t, torch.Tensor):
            for other in MIXED.get(t.dtype, ()):
                changed = list(flat)
                changed[i] = t.detach().to(other)
                args, kwargs = pytree.tree_unflatten(changed, spec)
                yield sample.input, args, kwargs, False


def _backward(out):
    leaves = [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor) and t.grad_fn]
    if leaves:
        sum(t.float().sum() for t in leaves).backward()


@pytest.mark.slow
def test_every_decomposition_matches_eager():
    """The audit over op_db (8 samples per entry and dtype, mixed-dtype variants, backward)."""
    pytest.importorskip("expecttest")
    from torch.testing._internal.common_methods_invocations import op_db

    problems = audit(op_db, (torch.float32, torch.bfloat16, torch.int64, torch.bool), 8)
    unknown = {k: sorted(v)[:3] for k, v in problems.items() if k not in KNOWN}
    assert not unknown, f"decompositions that differ from eager: {unknown}"


def test_audit_finds_a_promoting_decomposition():
    """The audit can fail: torch's own select_scatter decomposition (which we no longer use)
    promotes an int32 input with an int64 source."""
    problems: dict[str, set[str]] = collections.defaultdict(set)
    table = {
        aten.select_scatter.default: torch._decomp.decomposition_table[aten.select_scatter.default]
    }
    with _CrossCheck(table, problems):
        torch.select_scatter(torch.zeros(3, 4, dtype=torch.int32), torch.arange(4), 0, 1)
    assert "int64" in " ".join(problems["aten.select_scatter.default"])


def test_instances_the_audit_found():
    """Each op the audit found, compiled, against eager (dtype and values)."""
    pool = {
        "x": torch.randn(6, dtype=torch.bfloat16),
        "t": torch.randn(6),
        "mask": torch.tensor([True, False, True, True, False, True]),
        "e": torch.tensor(3.0, dtype=torch.bfloat16),
        "m": torch.zeros(3, 4, dtype=torch.int32),
        "row": torch.arange(4),
    }
    cases = [
        Case("huber_loss(bf16, f32)", lambda p: F.huber_loss(p["x"], p["t"])),
        Case("huber_loss(f32, bf16)", lambda p: F.huber_loss(p["t"], p["x"], reduction="none")),
        Case("soft_margin_loss(bf16, f32)", lambda p: F.soft_margin_loss(p["x"], p["t"])),
        Case("ldexp(bool, 0-d bf16)", lambda p: torch.ldexp(p["mask"], p["e"])),
        Case("ldexp(bf16, int64)", lambda p: torch.ldexp(p["x"], p["t"].round().long())),
        Case(
            "select_scatter(int32, int64)", lambda p: torch.select_scatter(p["m"], p["row"], 0, 1)
        ),
        Case("take(x, 0-d)", lambda p: torch.take(p["x"], torch.tensor(-2))),
    ]
    n, problems = run_cases(cases, pool, dynamo=True)
    assert n == len(cases) and not problems, problems


def test_batch_norm_mixed_dtypes_through_a_module():
    """bfloat16 input, float32 BatchNorm parameters: output, running stats and grads as eager."""
    torch.manual_seed(0)
    m = torch.nn.BatchNorm1d(3)
    m2 = torch.nn.BatchNorm1d(3)
    m2.load_state_dict(m.state_dict())
    x = torch.randn(4, 3, dtype=torch.bfloat16, requires_grad=True)
    x2 = x.detach().clone().requires_grad_()
    expected, actual = m(x), torch.compile(m2, backend="tpu")(x2)
    expected.float().sum().backward()
    actual.float().sum().backward()
    assert actual.dtype == expected.dtype == torch.bfloat16
    torch.testing.assert_close(actual, expected)
    torch.testing.assert_close(m2.running_mean, m.running_mean)
    torch.testing.assert_close(m2.running_var, m.running_var)
    torch.testing.assert_close(x2.grad, x.grad)
    torch.testing.assert_close(m2.weight.grad, m.weight.grad)

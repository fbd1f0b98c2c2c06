"""Generated case matrices run many cases through one compiled function and check each one.

A case is a label and a function of a pool of input tensors (``fn(pool) -> Tensor``): it may
close over Python scalars, which reach the graph as constants, the way a user's ``2 ** x`` or
``x < 1000`` reaches the backend. :func:`run_cases` keeps the cases that eager accepts, compiles
one function returning every case's result (``fallback="error"``: nothing may fall back to
eager), and compares each result with eager's:
dtype and shape exactly, values within the dtype's "op" tolerance, NaN where eager has NaN. When
the batch fails to compile or run, each case is compiled on its own, so every failing case is
named with its error.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable

import torch
from torch.utils import _pytree as pytree

from tpu_inductor.core.dtypes import TORCH_TO_JAX, tolerance
from tpu_inductor.dynamo.backend import tpu_backend


@dataclasses.dataclass(frozen=True)
class Case:
    """One checked call: ``fn(pool)`` with ``pool`` the name -> tensor dict of inputs."""

    label: str
    fn: Callable


def _clone(pool: dict) -> dict:
    return {k: v.clone() for k, v in pool.items()}


def eager_results(cases: list[Case], pool: dict) -> tuple[list[Case], list]:
    """The cases eager runs without raising, and their results (invalid cases are dropped, and
    so are cases whose result has no JAX dtype: ``float16 + 1j`` is complex32, which the
    backend refuses with an UnsupportedDtypeError, see ``test_no_jax_dtype_is_a_clear_error``)."""
    kept, results = [], []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for case in cases:
            try:
                out = case.fn(_clone(pool))
            except Exception:
                continue
            if not has_jax_dtypes(out):
                continue
            kept.append(case)
            results.append(out)
    return kept, results


def has_jax_dtypes(out) -> bool:
    """Whether every tensor in ``out`` has a JAX dtype (complex32 has none)."""
    leaves = pytree.tree_leaves(out)
    return all(t.dtype in TORCH_TO_JAX for t in leaves if isinstance(t, torch.Tensor))


def compiled_results(cases: list[Case], pool: dict, *, dynamo: bool = False):
    """Every case's result from one compiled function (raises what the compile raises).

    ``dynamo=False`` (the default, 2-3x faster for hundreds of cases) hands the backend an FX
    graph from ``torch.fx.symbolic_trace`` instead of one from Dynamo: the same torch calls with
    the same Python constants, then the same AOTAutograd, lowering and jit as
    ``torch.compile(backend="tpu")``.
    """
    names = sorted(pool)

    def batch(*tensors):
        p = dict(zip(names, tensors, strict=True))
        return [case.fn(p) for case in cases]

    options = {"fallback": "error"}
    inputs = [pool[n].clone() for n in names]
    torch._dynamo.reset()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if dynamo:
                fn = torch.compile(
                    batch, backend="tpu", fullgraph=True, dynamic=False, options=options
                )
            else:
                fn = tpu_backend(_fx_graph(batch, len(names)), _fakes(inputs), options=options)
            return fn(*inputs)
    finally:
        torch._dynamo.reset()


def _fx_graph(batch: Callable, n: int) -> torch.fx.GraphModule:
    args = ", ".join(f"a{i}" for i in range(n))
    namespace = {"batch": batch}
    exec(f"def graph({args}):\n    return batch({args})\n", namespace)  # noqa: S102
    return torch.fx.symbolic_trace(namespace["graph"])


def _fakes(inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    from torch._subclasses.fake_tensor import FakeTensorMode

    mode = FakeTensorMode()
    return [mode.from_tensor(t) for t in inputs]


def mismatch(actual, expected) -> str | None:
    """``None`` if ``actual`` matches eager's ``expected``, else what differs."""
    la, le = pytree.tree_leaves(actual), pytree.tree_leaves(expected)
    if len(la) != len(le):
        return f"{len(la)} outputs, eager gives {len(le)}"
    for a, e in zip(la, le, strict=True):
        if not isinstance(e, torch.Tensor):
            if a != e:
                return f"{a!r}, eager gives {e!r}"
            continue
        if not isinstance(a, torch.Tensor):
            return f"a {type(a).__name__}, eager gives a tensor"
        if a.dtype != e.dtype:
            return f"dtype {a.dtype}, eager gives {e.dtype}"
        if a.shape != e.shape:
            return f"shape {list(a.shape)}, eager gives {list(e.shape)}"
        atol, rtol = tolerance(e.dtype, level="op")
        if e.is_complex():
            problem = _complex_mismatch(a, e, atol, rtol)
            if problem is not None:
                return problem
            continue
        try:
            torch.testing.assert_close(a, e, atol=atol, rtol=rtol, equal_nan=True)
        except AssertionError:
            return f"values {a.tolist()}, eager gives {e.tolist()}"
    return None


COMPLEX_NONFINITE = "complex non-finite"


def _complex_mismatch(a, e, atol, rtol) -> str | None:
    """Complex values compared as numbers (``|a - e| <= atol + rtol |e|``, not part by part:
    a 1e-7 relative error of ``128j`` may put 8e-5 in the real part), and where eager's or our
    value has an infinite or NaN part, part by part. A difference of the second kind only is
    labelled :data:`COMPLEX_NONFINITE` (a known class, see docs/ops.md)."""
    finite = torch.isfinite(a) & torch.isfinite(e)
    close = (a - e).abs() <= atol + rtol * e.abs()
    if not bool((close | ~finite).all()):
        return f"values {a.tolist()}, eager gives {e.tolist()}"
    parts_a, parts_e = torch.view_as_real(a[~finite]), torch.view_as_real(e[~finite])
    same = (parts_a == parts_e) | (parts_a.isnan() & parts_e.isnan())
    if not bool(same.all()):
        return f"{COMPLEX_NONFINITE}: {a[~finite].tolist()}, eager gives {e[~finite].tolist()}"
    return None


def run_cases(cases: list[Case], pool: dict, *, dynamo: bool = False) -> tuple[int, list[str]]:
    """Run ``cases`` compiled (in one function) and in eager; returns (cases compared, problems).

    Each problem is ``"<label>: <what differs>"`` (a silent mismatch) or ``"<label>: raised
    <error>"`` (a clear error). When the batch raises, it is split in halves until the cases
    that raise are found on their own (a few compiles per failing case, not one per case).
    """
    cases, expected = eager_results(cases, pool)
    problems: list[str] = []
    _run_split(list(zip(cases, expected, strict=True)), pool, dynamo, problems)
    return len(cases), problems


def _run_split(pairs: list, pool: dict, dynamo: bool, problems: list[str]) -> None:
    if not pairs:
        return
    try:
        actual = compiled_results([case for case, _ in pairs], pool, dynamo=dynamo)
    except Exception as e:
        if len(pairs) == 1:
            text = " ".join(str(e).split())[:300]
            problems.append(f"{pairs[0][0].label}: raised {type(e).__name__}: {text}")
            return
        half = len(pairs) // 2
        _run_split(pairs[:half], pool, dynamo, problems)
        _run_split(pairs[half:], pool, dynamo, problems)
        return
    for (case, expected), got in zip(pairs, actual, strict=True):
        problem = mismatch(got, expected)
        if problem is not None:
            problems.append(f"{case.label}: {problem}")

"""Run OpInfo entries through ``torch.compile`` and compare against CPU eager.

Shared by ``test_opinfo.py`` (the conformance test) and ``scripts/gen_ops_doc.py`` (the ops
table). Every entry of ``op_db`` is tried for each dtype of :data:`DTYPES` that the OpInfo
supports on CPU; :func:`run_entry` returns an :class:`Outcome` whose ``reason`` is a one-line,
classified description of the first failure (``"unsupported op: aten.x.y"``, ``"mismatch: ..."``,
``"dynamo can't capture: ..."``, ...).
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import runpy
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch.utils import _pytree as pytree

from tpu_inductor.core.dtypes import TOLERANCES

HERE = Path(__file__).resolve().parent
EXPECTED_FAILURES_FILE = HERE / "expected_failures.py"
TOLERANCES_FILE = HERE / "tolerances.py"
# Per-sample results of the all-samples sweep (scripts/opinfo_all_samples.py --merge).
ALL_SAMPLES_FILE = HERE / "all_samples.json"

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "int64": torch.int64,
    "bool": torch.bool,
}

# (atol, rtol) per output dtype (exact for the rest): the "op" level of the one tolerance table,
# tpu_inductor.core.dtypes.TOLERANCES; per-entry overrides live in tolerances.py.
DEFAULT_TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    dtype: levels["op"] for dtype, levels in TOLERANCES.items()
}

# Entries whose values are random: checked for structure, shape, dtype and a few statistics.
RANDOM_OPS = frozenset(
    {
        "bernoulli",
        "cauchy",
        "exponential",
        "geometric",
        "log_normal",
        "multinomial",
        "nn.functional.alpha_dropout",
        "nn.functional.dropout",
        "nn.functional.dropout2d",
        "nn.functional.dropout3d",
        "nn.functional.feature_alpha_dropout.with_train",
        "nn.functional.fractional_max_pool2d",
        "nn.functional.fractional_max_pool3d",
        "nn.functional.rrelu",
        "normal",
        "normal.in_place",
        "normal.number_mean",
        "rand_like",
        "randint",
        "randint_like",
        "randn",
        "randn_like",
        "uniform",
    }
)

# Entries returning uninitialized memory: only structure, shape and dtype are checked.
UNINITIALIZED_OPS = frozenset(
    {"empty", "empty_like", "empty_permuted", "empty_strided", "new_empty", "new_empty_strided"}
)

# Entries returning indices of equal values, where torch leaves the choice among ties open
# ("the order of equivalent elements is not guaranteed", torch.sort; likewise topk/kthvalue):
# entry -> (position of the ``dim`` argument after the input, default dim, index output or None
# when the op returns only indices). Their indices are checked by the values they pick.
TIE_INDEX_OPS: dict[str, tuple[int, int, int | None]] = {
    "sort": (0, -1, 1),
    "argsort": (0, -1, None),
    "topk": (1, -1, 1),
    "kthvalue": (1, -1, 1),
}

# Entries whose outputs are defined only up to a gauge: eigenvectors (each column's sign, or any
# basis of a repeated eigenvalue's space), singular vectors. Checked by what defines them, not
# element by element. svd_lowrank/pca_lowrank draw a random projection (our stream is not
# torch's), but their OpInfo samples are rank-q products, where q columns capture the whole
# range: the singular values and U diag(S) V^H are then deterministic.
GAUGE_OPS = frozenset({"linalg.eigh", "svd_lowrank", "pca_lowrank"})

# Samples tried (eager) to find one that runs, when the first ones raise in eager.
MAX_SAMPLES_TRIED = 20

REASON_MAX_CHARS = 200


@dataclasses.dataclass
class Outcome:
    """The result of one (entry, dtype) run: ``status`` is "pass", "fail" or "skip"."""

    status: str
    reason: str = ""


def entry_key(op) -> str:
    """``name`` or ``name.variant`` of an OpInfo: the key of the expectation table."""
    return f"{op.name}.{op.variant_test_name}" if op.variant_test_name else op.name


def load_op_db() -> list:
    """``op_db``, with the seeding helper replaced by a pass-through Dynamo can trace.

    Random OpInfos call ``wrapper_set_seed(op, *args)`` (a ``freeze_rng_state`` context manager
    plus ``torch.manual_seed``) through lambdas defined in ``common_methods_invocations``; the
    lambdas look the name up at call time, so patching the module global is enough.
    """
    import torch.testing._internal.common_methods_invocations as cmi

    cmi.wrapper_set_seed = _call_through
    return cmi.op_db


def _call_through(op, *args, **kwargs):
    return op(*args, **kwargs)


def cases(op_db) -> list[tuple[Any, str]]:
    """Every (OpInfo, dtype name) pair to run: the dtypes of :data:`DTYPES` the op supports."""
    out = []
    for op in op_db:
        supported = op.supported_dtypes("cpu")
        out.extend((op, name) for name, dt in DTYPES.items() if dt in supported)
    return out


def samples_per_entry() -> int | None:
    """``TPU_INDUCTOR_OPINFO_SAMPLES``: ``all`` (``None``) or a count (default 1)."""
    raw = os.environ.get("TPU_INDUCTOR_OPINFO_SAMPLES", "1").strip().lower()
    if raw == "all":
        return None
    try:
        n = int(raw)
    except ValueError:
        raise ValueError(
            f"TPU_INDUCTOR_OPINFO_SAMPLES must be 'all' or an integer, got {raw!r}"
        ) from None
    if n < 1:
        raise ValueError(f"TPU_INDUCTOR_OPINFO_SAMPLES must be >= 1, got {n}")
    return n


def load_table(path: Path, name: str) -> dict:
    """The dict ``name`` defined in the Python data file ``path`` (empty if it is absent)."""
    if not path.exists():
        return {}
    return runpy.run_path(str(path)).get(name, {})


def tolerance(key: str, dtype_name: str, overrides: dict) -> tuple[float, float] | None:
    """An entry's (atol, rtol) override from tolerances.py, or ``None`` for the defaults."""
    override = overrides.get(key, {}).get(dtype_name)
    return None if override is None else (override[0], override[1])


def run_entry(
    op,
    dtype_name: str,
    *,
    backend: str = "tpu",
    samples: int | None = 1,
    tol: tuple[float, float] | None = None,
) -> Outcome:
    """Compile ``op.op`` with ``backend`` and compare it with eager on the op's samples.

    Args:
        op: an OpInfo.
        dtype_name: a key of :data:`DTYPES`.
        backend: ``"tpu"``, or ``"aot_eager"`` to find out whether Dynamo/AOTAutograd capture it.
        samples: how many samples that run in eager to compare (``None``: all of them).
        tol: (atol, rtol) for every output; ``None``: :data:`DEFAULT_TOLERANCES` of each
            output's dtype, exact for integers and bools.

    Returns:
        ``pass`` if every compared sample matched, ``fail`` with the first failure's reason,
        or ``skip`` if no sample runs in eager.
    """
    results = run_samples(op, dtype_name, backend=backend, samples=samples, tol=tol, stop=True)
    if isinstance(results, Outcome):
        return results
    for r in results:
        if r.status != "pass":
            return Outcome("fail", r.reason)
    return Outcome("pass")


@dataclasses.dataclass
class SampleOutcome:
    """One sample's result: ``status`` is ``pass``, ``silent`` (the compiled function ran and
    gave wrong values, dtype, shape or structure: no error) or ``error`` (it raised);
    ``index`` is the sample's position in ``op.sample_inputs``; ``reason`` the classified
    one-line description of the failure."""

    index: int
    status: str
    reason: str = ""


def run_samples(
    op,
    dtype_name: str,
    *,
    backend: str = "tpu",
    samples: int | None = 1,
    tol: tuple[float, float] | None = None,
    stop: bool = False,
) -> list[SampleOutcome] | Outcome:
    """Every compared sample's :class:`SampleOutcome` (``stop``: up to the first failure).

    Samples that raise in eager are not compared (nor counted towards ``samples``). Returns an
    ``Outcome("skip", ...)`` instead when no sample runs in eager (or none can be made).
    """
    key = entry_key(op)
    dtype = DTYPES[dtype_name]
    check = _checker(key, tol)
    options = (
        {"fallback": "error", "check_meta": True} if backend in ("tpu", "tpu_inductor") else None
    )
    results: list[SampleOutcome] = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.manual_seed(0)
        try:
            sample_iter = iter(op.sample_inputs("cpu", dtype, requires_grad=False))
        except Exception as e:
            return Outcome("skip", f"sample_inputs raised {type(e).__name__}: {_first_line(e)}")
        for tried, sample in enumerate(_safe_iter(sample_iter)):
            if samples is not None and len(results) >= samples:
                break
            if not results and tried >= MAX_SAMPLES_TRIED:
                break
            inputs = (sample.input, tuple(sample.args), dict(sample.kwargs))
            try:
                expected = _call(op.op, _clone(inputs))
            except Exception:
                continue  # the sample is invalid for eager too
            result = _run_sample(op, key, dtype, inputs, expected, backend, options, check, tol)
            results.append(dataclasses.replace(result, index=tried))
            if stop and result.status != "pass":
                break
    if not results:
        return Outcome("skip", "no sample runs in eager")
    return results


def _checker(key: str, tol):
    if key in UNINITIALIZED_OPS:
        return _check_structure
    if key in RANDOM_OPS:
        return _check_statistics
    if key in GAUGE_OPS:
        gauge = _check_eigh if key == "linalg.eigh" else _check_svd_factors
        return lambda actual, expected: gauge(actual, expected, tol)
    return lambda actual, expected: _check_values(actual, expected, tol)


def _run_sample(op, key, dtype, inputs, expected, backend, options, check, tol) -> SampleOutcome:
    torch._dynamo.reset()
    compiled = torch.compile(
        _entry_fn(op.op), backend=backend, fullgraph=True, dynamic=False, options=options
    )
    try:
        actual = compiled(*_clone(inputs))
    except Exception as e:
        return SampleOutcome(0, "error", _truncate(classify(e)))
    finally:
        torch._dynamo.reset()
    if key in TIE_INDEX_OPS and not inputs[2].get("stable", False):
        problem = _check_tie_indices(actual, expected, inputs, TIE_INDEX_OPS[key], tol)
    else:
        problem = check(actual, expected)
    if problem is not None and key not in RANDOM_OPS and _is_random_sample(op.op, inputs):
        # A sample that draws random numbers (dropout_p > 0 in attention, training=True in
        # multi_head_attention_forward): our stream is not torch's, so only its statistics count.
        problem = _check_statistics(actual, expected)
    if problem is not None and (dtype.is_floating_point or dtype.is_complex):
        exact = _rounded_exact(op.op, inputs, expected)
        if exact is not None and (
            check(actual, exact) is None or _as_close_as_eager(actual, expected, exact)
        ):
            problem = None
    if problem is not None:
        return SampleOutcome(0, "silent", _truncate(problem))
    return SampleOutcome(0, "pass")


def _as_close_as_eager(actual, expected, exact) -> bool:
    """Whether every floating output is as close to the float64 result as eager's is.

    A result that misses eager by more than the tolerance can still be right: where the exact
    value cancels (an entry of 0.15 in a matrix exponential whose entries reach 9e4), eager's
    float32 result carries the same absolute error as ours, which the elementwise relative
    tolerance calls a mismatch. Judged like torch's own accuracy checker (``same(fp64_ref=...)``
    in torch._dynamo.utils): the largest error from the float64 result may be at most twice
    eager's, plus the dtype's absolute tolerance. Structure, shape and dtype must already match.
    """
    if _check_structure(actual, expected) is not None:
        return False
    pairs = zip(
        pytree.tree_leaves(actual),
        pytree.tree_leaves(expected),
        pytree.tree_leaves(exact),
        strict=False,
    )
    for a, e, x in pairs:
        if not isinstance(e, torch.Tensor) or not (e.is_floating_point() or e.is_complex()):
            continue
        if a.numel() == 0:
            continue
        atol = DEFAULT_TOLERANCES.get(e.dtype, (0.0, 0.0))[0]
        wide = torch.complex128 if e.is_complex() else torch.float64
        a, e, x = (t.detach().to(wide) for t in (a, e, x))
        if not torch.equal(torch.isnan(a), torch.isnan(e)):
            return False
        finite = torch.isfinite(e) & torch.isfinite(x)
        if not torch.equal(a[~finite].nan_to_num(), e[~finite].nan_to_num()):
            return False
        ours = float((a - x)[finite].abs().max()) if finite.any() else 0.0
        theirs = float((e - x)[finite].abs().max()) if finite.any() else 0.0
        if ours > 2 * theirs + atol:
            return False
    return True


LOW_PRECISION = (torch.bfloat16, torch.float16)


def _is_random_sample(fn: Callable, inputs: tuple) -> bool:
    """Whether eager gives different results for ``inputs`` under two different seeds."""
    with torch.random.fork_rng():
        results = []
        for seed in (1234, 4321):
            torch.manual_seed(seed)
            try:
                results.append(pytree.tree_leaves(_call(fn, _clone(inputs))))
            except Exception:
                return False
    return any(
        isinstance(a, torch.Tensor)
        and isinstance(b, torch.Tensor)
        and a.shape == b.shape
        and not torch.equal(torch.nan_to_num(a.detach()), torch.nan_to_num(b.detach()))
        for a, b in zip(*results, strict=False)
    )


def _rounded_exact(fn: Callable, inputs: tuple, expected):
    """``fn`` on ``inputs`` computed in float64 (complex128) and rounded to ``expected``'s
    dtypes, or ``None``.

    NOTE: eager's half-precision kernels are not one algorithm. Where oneDNN has no bfloat16 path
    (CPUs without AVX512-BF16, such as the 2-core AMD EPYC machines this project runs CI on), eager
    ``conv_transpose{1,2,3}d`` in bfloat16 rounds partial sums and then the bias, so it differs
    by up to 2 ulps from the exact result rounded once, which is what we compute (float32
    accumulation, one rounding). A half-precision output that misses eager but matches the
    float64 result rounded to its dtype is correct, so it passes.
    """

    def up(t: torch.Tensor) -> torch.Tensor:
        if t.is_complex():
            return t.to(torch.complex128)
        return t.to(torch.float64) if t.is_floating_point() else t.clone()

    try:
        wide = _call(fn, pytree.tree_map_only(torch.Tensor, up, inputs))
        flat_wide, spec = pytree.tree_flatten(wide)
        flat_expected, spec_expected = pytree.tree_flatten(expected)
    except Exception:
        return None
    if spec != spec_expected:
        return None
    rounded = [
        w.to(x.dtype) if isinstance(w, torch.Tensor) and isinstance(x, torch.Tensor) else w
        for w, x in zip(flat_wide, flat_expected, strict=True)
    ]
    return pytree.tree_unflatten(rounded, spec)


def _safe_iter(it: Iterator) -> Iterator:
    while True:
        try:
            yield next(it)
        except StopIteration:
            return
        except Exception:
            return  # a sample generator that raises midway: use what it produced so far


def _entry_fn(fn: Callable) -> Callable:
    def entry(inp, args, kwargs):
        return fn(inp, *args, **kwargs)

    return entry


def _call(fn: Callable, inputs: tuple) -> Any:
    inp, args, kwargs = inputs
    return fn(inp, *args, **kwargs)


def _clone(tree):
    return pytree.tree_map_only(torch.Tensor, lambda t: t.clone(), tree)


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0].strip() if text else type(e).__name__


def _truncate(reason: str) -> str:
    reason = re.sub(r"<function (\S+) at 0x[0-9a-fA-F]+>", r"\1", " ".join(reason.split()))
    reason = re.sub(r" at 0x[0-9a-fA-F]+", "", reason)
    return reason if len(reason) <= REASON_MAX_CHARS else reason[: REASON_MAX_CHARS - 3] + "..."


def classify(e: BaseException) -> str:
    """A one-line, classified reason for an exception raised while compiling or running.

    Categories: ``unsupported op:``, ``unsupported dtype:``, ``lowering failed:``,
    ``meta mismatch:`` (our own errors), ``dynamo can't capture:``, ``backend error:``
    (AOTAutograd, decompositions, tracing), ``runtime error:`` (after compilation).
    """
    from torch._dynamo import exc as dexc

    from tpu_inductor.core import errors

    inner = e
    while isinstance(inner, dexc.BackendCompilerFailed):
        inner = inner.inner_exception
    ours = _find_cause(inner, errors.TpuInductorError)
    if isinstance(ours, errors.UnsupportedOpError):
        names = sorted({line.split("(", 1)[0].strip() for line in ours.missing})
        return "unsupported op: " + ", ".join(names)
    if isinstance(ours, errors.UnsupportedDtypeError):
        return "unsupported dtype: " + _first_line(ours)
    if isinstance(ours, errors.ShapeMismatchError):
        return "meta mismatch: " + _first_line(ours).removeprefix("lowering of ")
    if isinstance(ours, errors.LoweringError):
        return "lowering failed: " + _first_line(ours).removeprefix("lowering ")
    if ours is not None:
        return f"{type(ours).__name__}: {_first_line(ours)}"
    if isinstance(e, dexc.BackendCompilerFailed):
        return f"backend error: {type(inner).__name__}: {_first_line(inner)}"
    if isinstance(e, dexc.TorchDynamoException | dexc.UserError):
        return f"dynamo can't capture: {type(e).__name__}: {_first_line(e)}"
    return f"runtime error: {type(e).__name__}: {_first_line(e)}"


def _find_cause(e: BaseException | None, kind: type) -> BaseException | None:
    seen = set()
    while e is not None and id(e) not in seen:
        if isinstance(e, kind):
            return e
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return None


def _check_values(actual, expected, tol: tuple[float, float] | None, where: str = "output"):
    """``None`` if ``actual`` matches ``expected``; else a one-line reason."""
    problem = _check_structure(actual, expected, where)
    if problem is not None:
        return problem
    if isinstance(expected, list | tuple):
        for i, (a, x) in enumerate(zip(actual, expected, strict=True)):
            problem = _check_values(a, x, tol, f"{where}[{i}]")
            if problem is not None:
                return problem
        return None
    if isinstance(expected, torch.Tensor):
        atol, rtol = tol or DEFAULT_TOLERANCES.get(expected.dtype, (0.0, 0.0))
        return _compare_tensors(actual, expected, atol, rtol, where)
    if isinstance(expected, float) and isinstance(actual, int | float):
        atol, rtol = tol or DEFAULT_TOLERANCES[torch.float32]
        if math.isnan(expected) and math.isnan(actual):
            return None
        if math.isclose(actual, expected, rel_tol=max(rtol, 1e-12), abs_tol=atol):
            return None
    elif actual == expected:
        return None
    return f"mismatch: {where} is {actual!r}, eager gives {expected!r}"


def _compare_tensors(actual: torch.Tensor, expected: torch.Tensor, atol, rtol, where):
    try:
        torch.testing.assert_close(
            actual,
            expected,
            atol=atol,
            rtol=rtol,
            equal_nan=True,
            check_device=False,
            check_stride=False,
            check_layout=False,
        )
    except AssertionError:
        pass
    else:
        return None
    a, x = actual.detach(), expected.detach()
    if x.dtype == torch.bool:
        bad = a != x
        return f"mismatch: {where} {int(bad.sum())}/{x.numel()} elements differ (bool)"
    a = a.to(torch.complex128 if x.is_complex() else torch.float64)
    x = x.to(a.dtype)
    both_nan = torch.isnan(a) & torch.isnan(x)
    diff = torch.where(both_nan | (a == x), 0.0, (a - x).abs())
    nan_differs = torch.isnan(a) != torch.isnan(x)
    bad = (diff > atol + rtol * x.abs()) | nan_differs
    nan_pattern = int(nan_differs.sum())
    worst = float(diff.masked_fill(torch.isnan(diff), math.inf).max()) if diff.numel() else 0.0
    text = f"mismatch: {where} {int(bad.sum())}/{x.numel()} elements, max abs diff {worst:.3g}"
    if nan_pattern:
        text += f", {nan_pattern} NaN(s) differ"
    return text


def _check_tie_indices(actual, expected, inputs, spec, tol):
    """Values exactly as :func:`_check_values`; indices by the input values they select.

    Indices may differ from eager's only among equal values: gathering the input at ours and at
    eager's must give the same values, and ours must not repeat an index along ``dim``.
    """
    dim_pos, default_dim, index_out = spec
    inp, args, kwargs = inputs
    dim = args[dim_pos] if len(args) > dim_pos else kwargs.get("dim", default_dim)
    ours = actual if index_out is None else actual[index_out]
    eager = expected if index_out is None else expected[index_out]
    problem = _check_structure(actual, expected)
    if problem is None and index_out is not None:
        rest = [i for i in range(len(expected)) if i != index_out]
        problem = _check_values([actual[i] for i in rest], [expected[i] for i in rest], tol)
    if problem is not None or inp.dim() == 0:
        return problem or _check_values(actual, expected, tol)
    if ours.dim() < inp.dim():  # kthvalue without keepdim
        ours, eager = ours.unsqueeze(dim), eager.unsqueeze(dim)
    picked, wanted = inp.gather(dim, ours), inp.gather(dim, eager)
    if not torch.equal(picked, wanted) and not (picked.isnan() & wanted.isnan()).any():
        bad = int((picked != wanted).sum())
        return f"mismatch: indices select {bad}/{picked.numel()} values eager's do not"
    ordered = ours.sort(dim).values
    if ordered.shape[dim] > 1 and bool((ordered.diff(dim=dim) == 0).any()):
        return "mismatch: indices repeat an index along dim"
    return None


def _check_eigh(actual, expected, tol):
    """``linalg.eigh``: eigenvalues as values; eigenvectors orthonormal and A Q = Q diag(L).

    A is eager's own decomposition recomposed (Q_e diag(L_e) Q_e^H), the Hermitian matrix eager
    read from the input's triangle, so the check needs no UPLO logic.
    """
    problem = _check_structure(actual, expected)
    if problem is None:
        problem = _check_values(actual[0], expected[0], tol, "output[0]")
    if problem is not None:
        return problem
    (lam, q), (lam_e, q_e) = actual, expected
    wide = torch.complex128 if q.is_complex() else torch.float64
    q, q_e, lam, lam_e = q.to(wide), q_e.to(wide), lam.to(wide), lam_e.to(wide)
    a = q_e @ torch.diag_embed(lam_e).to(wide) @ q_e.mH
    eye = torch.eye(q.shape[-1], dtype=wide).expand_as(q)
    atol, rtol = tol or DEFAULT_TOLERANCES[expected[1].dtype]
    scale = 1 + float(lam_e.abs().max()) if lam_e.numel() else 1.0
    for name, got, want, bound in (
        ("Q^H Q = I", q.mH @ q, eye, atol + rtol),
        ("A Q = Q diag(L)", a @ q, q * lam.unsqueeze(-2).to(wide), (atol + rtol) * scale),
    ):
        worst = float((got - want).abs().max()) if got.numel() else 0.0
        if worst > 10 * bound:
            return f"mismatch: output[1] eigenvectors: {name} off by {worst:.3g}"
    return None


def _check_svd_factors(actual, expected, tol):
    """(U, S, V) of a low-rank SVD: S as values, and U diag(S) V^H against eager's product."""
    problem = _check_structure(actual, expected)
    if problem is None:
        problem = _check_values(actual[1], expected[1], (1e-4, 1e-4), "output[1]")
    if problem is not None:
        return problem

    def product(usv):
        u, s, v = (t.to(torch.float64) for t in usv)
        return u @ torch.diag_embed(s).to(u.dtype) @ v.mH

    got, want = product(actual), product(expected)
    scale = 1 + float(want.abs().max()) if want.numel() else 1.0
    worst = float((got - want).abs().max()) if want.numel() else 0.0
    if worst > 1e-4 * scale:
        return f"mismatch: U diag(S) V^H off by {worst:.3g}"
    return None


def _check_structure(actual, expected, where: str = "output"):
    """``None`` if ``actual`` has ``expected``'s structure, types, shapes and dtypes."""
    if isinstance(expected, list | tuple):
        if not isinstance(actual, list | tuple) or len(actual) != len(expected):
            what = (
                f"{type(actual).__name__} of {len(actual)}"
                if isinstance(actual, list | tuple)
                else type(actual).__name__
            )
            want = f"{type(expected).__name__} of {len(expected)}"
            return f"wrong output structure: {where} is {what}, eager gives {want}"
        for i, (a, x) in enumerate(zip(actual, expected, strict=True)):
            problem = _check_structure(a, x, f"{where}[{i}]")
            if problem is not None:
                return problem
        return None
    if isinstance(expected, torch.Tensor):
        if not isinstance(actual, torch.Tensor):
            return (
                f"wrong output structure: {where} is {type(actual).__name__}, eager gives a tensor"
            )
        if actual.dtype != expected.dtype:
            return f"wrong dtype: {where} is {actual.dtype}, eager gives {expected.dtype}"
        if actual.shape != expected.shape:
            return (
                f"wrong shape: {where} is {list(actual.shape)}, eager gives {list(expected.shape)}"
            )
        return None
    if isinstance(actual, torch.Tensor):
        return f"wrong output structure: {where} is a tensor, eager gives {type(expected).__name__}"
    return None


def _check_statistics(actual, expected, where: str = "output"):
    """Structure, shapes and dtypes exactly; for random values a few robust statistics.

    Values: non-finite only where eager can give them; with at least 100 elements, the 10/50/90%
    quantiles (continuous values) or the mean (integers, bools, few distinct values) must agree
    with eager's within a margin several standard errors wide.
    """
    problem = _check_structure(actual, expected, where)
    if problem is not None:
        return problem
    if isinstance(expected, list | tuple):
        for i, (a, x) in enumerate(zip(actual, expected, strict=True)):
            problem = _check_statistics(a, x, f"{where}[{i}]")
            if problem is not None:
                return problem
        return None
    if not isinstance(expected, torch.Tensor) or expected.is_complex() or expected.numel() == 0:
        return None
    a, x = actual.detach().double().flatten(), expected.detach().double().flatten()
    if bool(torch.isfinite(x).all()) and not bool(torch.isfinite(a).all()):
        return f"random: {where} has non-finite values, eager has none"
    n = x.numel()
    if n < 100:
        return None
    a, x = a[torch.isfinite(a)], x[torch.isfinite(x)]
    if a.numel() < n // 2 or x.numel() < n // 2:
        return None
    discrete = not expected.is_floating_point() or x.unique().numel() <= 8
    if discrete:
        scale = 6 * math.sqrt(2 * float(x.var()) / n) + 1e-3 * (1 + abs(float(x.mean())))
        if abs(float(a.mean()) - float(x.mean())) > scale:
            return (
                f"random: {where} mean {float(a.mean()):.4g} vs eager {float(x.mean()):.4g} (n={n})"
            )
        return None
    q = torch.tensor([0.1, 0.5, 0.9], dtype=torch.float64)
    qa, qx = torch.quantile(a, q), torch.quantile(x, q)
    spread = float(qx[2] - qx[0])
    margin = 0.4 * spread + 1e-6 * (1 + float(qx.abs().max()))
    if float((qa - qx).abs().max()) > margin:
        return (
            f"random: {where} 10/50/90% quantiles {[round(v, 4) for v in qa.tolist()]} vs eager "
            f"{[round(v, 4) for v in qx.tolist()]} (n={n})"
        )
    return None


KINDS = ("capture", "by design", "dtype", "gap")


def expected_failure(table: dict, key: str, dtype_name: str) -> tuple[str, str] | None:
    """``(kind, cause)`` of ``key`` in ``dtype_name`` from an EXPECTED_FAILURES table, or None."""
    row = table.get(key)
    if row is None or dtype_name not in row[1]:
        return None
    return row[0], row[2]


def kind_problem(kind: str, reason: str) -> str | None:
    """Why a failure's classified ``reason`` is not of the table's ``kind`` (None if it is)."""
    from tpu_inductor.lowering.lowerings.unsupported import UNSUPPORTED

    if kind == "capture" and not reason.startswith(("dynamo can't capture", "capture:")):
        return "a capture failure fails with aot_eager too, but this fails in tpu-inductor"
    if kind == "by design":
        names = reason.removeprefix("unsupported op: ").split(" (")[0].split(", ")
        refused = {str(op) for op in UNSUPPORTED} | {"aten._local_scalar_dense.default"}
        if not reason.startswith("unsupported op: ") or not set(names) <= refused:
            return "a by-design failure is an op lowerings/unsupported.py refuses"
    if kind == "dtype" and not reason.startswith("unsupported dtype:"):
        return "a dtype failure is an UnsupportedDtypeError"
    return None


def write_expectations(results: dict[tuple[str, str], Outcome], path: Path | None = None) -> Path:
    """Rewrite the expectation file's dtypes from ``results``, keeping every row's cause.

    Rows of entries that did not run are kept as they are; a new failure gets kind ``gap`` and
    its observed reason as a placeholder cause (``capture`` if it starts with ``capture:``).

    Args:
        results: ``(entry key, dtype name) -> Outcome`` of the entries that ran.
        path: the file (default :data:`EXPECTED_FAILURES_FILE`).

    Returns:
        The path written.
    """
    path = path or EXPECTED_FAILURES_FILE
    text = path.read_text()
    failures = load_table(path, "EXPECTED_FAILURES")
    failing: dict[str, list[str]] = {}
    for (key, dtype_name), outcome in results.items():
        if outcome.status == "fail":
            failing.setdefault(key, []).append(dtype_name)
    ran = {key for key, _ in results}
    order = list(DTYPES)
    rows = {}
    for key in sorted(set(failures) | set(failing)):
        if key not in ran:
            rows[key] = failures[key]
            continue
        dtypes = tuple(sorted(failing.get(key, ()), key=order.index))
        if not dtypes:
            continue
        if key in failures:
            rows[key] = (failures[key][0], dtypes, failures[key][2])
        else:
            reason = results[(key, dtypes[0])].reason
            kind = "capture" if reason.startswith("capture:") else "gap"
            rows[key] = (kind, dtypes, "TODO, the cause of: " + reason.removeprefix("capture: "))
    import json

    body = ["EXPECTED_FAILURES: dict[str, tuple[str, tuple[str, ...], str]] = {"]
    for key, (kind, dtypes, cause) in rows.items():
        dt = "ALL" if dtypes == tuple(order) else "(" + ", ".join(map(json.dumps, dtypes)) + ",)"
        body.append(f"    {json.dumps(key)}: ({json.dumps(kind)}, {dt}, {json.dumps(cause)}),")
    body.append("}")
    start = text.index("EXPECTED_FAILURES: dict")
    end = text.index("\n}\n", start) + 3
    path.write_text(text[:start] + "\n".join(body) + "\n" + text[end:])
    return path

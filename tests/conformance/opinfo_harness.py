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

HERE = Path(__file__).resolve().parent
EXPECTED_FAILURES_FILE = HERE / "expected_failures.py"
TOLERANCES_FILE = HERE / "tolerances.py"

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "int64": torch.int64,
    "bool": torch.bool,
}

# (atol, rtol) per output dtype (exact for the rest); per-entry overrides live in tolerances.py.
DEFAULT_TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float64: (1e-7, 1e-7),
    torch.complex128: (1e-7, 1e-7),
    torch.float32: (1e-5, 1e-5),
    torch.complex64: (1e-5, 1e-5),
    torch.float16: (1e-3, 1e-3),
    torch.bfloat16: (1e-2, 1.6e-2),
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
        "pca_lowrank",
        "rand_like",
        "randint",
        "randint_like",
        "randn",
        "randn_like",
        "svd_lowrank",
        "uniform",
    }
)

# Entries returning uninitialized memory: only structure, shape and dtype are checked.
UNINITIALIZED_OPS = frozenset(
    {"empty", "empty_like", "empty_permuted", "empty_strided", "new_empty", "new_empty_strided"}
)

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
    key = entry_key(op)
    dtype = DTYPES[dtype_name]
    if key in UNINITIALIZED_OPS:
        check = _check_structure
    elif key in RANDOM_OPS:
        check = _check_statistics
    else:
        check = lambda actual, expected: _check_values(actual, expected, tol)  # noqa: E731
    options = (
        {"fallback": "error", "check_meta": True} if backend in ("tpu", "tpu_inductor") else None
    )
    compared = 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.manual_seed(0)
        try:
            sample_iter = iter(op.sample_inputs("cpu", dtype, requires_grad=False))
        except Exception as e:
            return Outcome("skip", f"sample_inputs raised {type(e).__name__}: {_first_line(e)}")
        for tried, sample in enumerate(_safe_iter(sample_iter)):
            if samples is not None and compared >= samples:
                break
            if compared == 0 and tried >= MAX_SAMPLES_TRIED:
                break
            inputs = (sample.input, tuple(sample.args), dict(sample.kwargs))
            try:
                expected = _call(op.op, _clone(inputs))
            except Exception:
                continue  # the sample is invalid for eager too
            compared += 1
            torch._dynamo.reset()
            compiled = torch.compile(
                _entry_fn(op.op), backend=backend, fullgraph=True, dynamic=False, options=options
            )
            try:
                actual = compiled(*_clone(inputs))
            except Exception as e:
                return Outcome("fail", _truncate(classify(e)))
            finally:
                torch._dynamo.reset()
            problem = check(actual, expected)
            if problem is not None and dtype in LOW_PRECISION:
                exact = _rounded_exact(op.op, inputs, expected)
                if exact is not None and check(actual, exact) is None:
                    problem = None
            if problem is not None:
                return Outcome("fail", _truncate(problem))
    if compared == 0:
        return Outcome("skip", "no sample runs in eager")
    return Outcome("pass")


LOW_PRECISION = (torch.bfloat16, torch.float16)


def _rounded_exact(fn: Callable, inputs: tuple, expected):
    """``fn`` on ``inputs`` computed in float64 and rounded to ``expected``'s dtypes, or ``None``.

    NOTE: eager's half-precision kernels are not one algorithm. Where oneDNN has no bfloat16 path
    (CPUs without AVX512-BF16, such as the 2-core AMD EPYC machines this project runs CI on), eager
    ``conv_transpose{1,2,3}d`` in bfloat16 rounds partial sums and then the bias, so it differs
    by up to 2 ulps from the exact result rounded once, which is what we compute (float32
    accumulation, one rounding). A half-precision output that misses eager but matches the
    float64 result rounded to its dtype is correct, so it passes.
    """

    def up(t: torch.Tensor) -> torch.Tensor:
        return t.to(torch.float64) if t.dtype in LOW_PRECISION else t.clone()

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

    from tpu_inductor import errors

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


_HEADER = '''"""Expected failures of the OpInfo conformance test (tests/conformance/test_opinfo.py).

EXPECTED_FAILURES maps an op_db entry (``name`` or ``name.variant``) to {dtype: reason}. An
entry listed here that passes fails the test, so the table cannot go stale. Reasons starting
with ``capture:`` fail with ``backend="aot_eager"`` too (Dynamo/AOTAutograd cannot capture
them) and do not count against tpu-inductor. SKIPPED lists entries with no sample that runs in
eager.

Regenerate from the current results (rows of entries that do not run are kept):

    TPU_INDUCTOR_REGEN_XFAIL=1 pytest tests/conformance/test_opinfo.py
"""

# ruff: noqa: E501
'''


def write_expectations(results: dict[tuple[str, str], Outcome], path: Path | None = None) -> Path:
    """Merge ``results`` into the expectation file and rewrite it.

    Args:
        results: ``(entry key, dtype name) -> Outcome`` of the entries that ran.
        path: the file (default :data:`EXPECTED_FAILURES_FILE`).

    Returns:
        The path written.
    """
    path = path or EXPECTED_FAILURES_FILE
    failures = {k: dict(v) for k, v in load_table(path, "EXPECTED_FAILURES").items()}
    skipped = {k: dict(v) for k, v in load_table(path, "SKIPPED").items()}
    for (key, dtype_name), outcome in results.items():
        for table in (failures, skipped):
            table.get(key, {}).pop(dtype_name, None)
        if outcome.status == "fail":
            failures.setdefault(key, {})[dtype_name] = outcome.reason
        elif outcome.status == "skip":
            skipped.setdefault(key, {})[dtype_name] = outcome.reason
    text = _HEADER
    text += "\n" + _format_table("EXPECTED_FAILURES", failures)
    text += "\n" + _format_table("SKIPPED", skipped)
    path.write_text(text)
    return path


def _format_table(name: str, table: dict[str, dict[str, str]]) -> str:
    import json

    order = list(DTYPES)
    lines = [f"{name}: dict[str, dict[str, str]] = {{"]
    for key in sorted(table):
        per = table[key]
        if not per:
            continue
        lines.append(f"    {json.dumps(key)}: {{")
        for d in sorted(per, key=lambda d: order.index(d) if d in order else len(order)):
            lines.append(f"        {json.dumps(d)}: {json.dumps(per[d])},")
        lines.append("    },")
    lines.append("}")
    return "\n".join(lines) + "\n"

"""Numerics against CPU eager, for CI users.

``assert_matches_cpu(model, x)`` compiles a copy of ``model`` with ``backend="tpu"``, runs it and
CPU eager on the same inputs, and compares every output (and, with ``grads=True``, every
parameter and input gradient). Values that miss the dtype's tolerance are judged against the
same computation in float64, as torch's own accuracy checker does: as accurate as eager passes.
On a mismatch the error says which output differs and by how much, and names the first
diverging ATen node with its source line.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch
from torch.utils import _pytree as pytree

from tpu_inductor.core.dtypes import tolerance
from tpu_inductor.debug import _loss, find_divergence


def assert_matches_cpu(
    fn_or_module: Callable,
    *args,
    grads: bool = False,
    atol: float | None = None,
    rtol: float | None = None,
    options: dict | None = None,
    fp64_ref: bool = True,
    **kwargs,
) -> None:
    """Assert that ``fn_or_module(*args, **kwargs)`` compiled with ``backend="tpu"`` matches
    CPU eager.

    Every output (and, with ``grads=True``, every gradient) must have eager's dtype and shape,
    and values within the dtype's tolerance of eager's. A floating tensor that misses that
    tolerance still passes when it is as accurate as eager's: both are compared with the same
    computation run in float64 on the CPU (the model and inputs cast to float64), and the
    compiled result's RMS error may be at most 3x eager's for float16/bfloat16 (2x otherwise)
    plus a tenth of the dtype's absolute tolerance, the rule of torch's own accuracy checker
    (``torch._dynamo.utils.same`` with ``fp64_ref``). A bfloat16 model's gradients, summed over
    long reductions, differ from eager's by more than any fixed tolerance while being just as
    close to the exact values; a lowering bug makes them farther.

    Args:
        fn_or_module: a function or ``nn.Module``; it is deep-copied for each side.
        args, kwargs: inputs (deep-copied for each side).
        grads: also compare gradients of every parameter and of every input that requires grad;
            the loss is the sum of all floating-point outputs.
        atol, rtol: tolerances (default per dtype: float32 1e-4/1e-4, bfloat16 2e-2, ...).
        options: backend options passed to ``torch.compile``.
        fp64_ref: judge values that miss the tolerance against the float64 run (default);
            ``False`` compares with eager's values only.

    Raises:
        AssertionError: naming the output or gradient that differs, by how much (and how far
            both are from the float64 result), and the first ATen node whose lowering diverges
            from torch (op, shapes, source line).

    Example:
        >>> model = torch.nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0).bfloat16()
        >>> assert_matches_cpu(model, torch.randn(8, 2, 64, dtype=torch.bfloat16), grads=True)
    """
    eager_fn, comp_fn = _copy(fn_or_module), _copy(fn_or_module)
    eager_args, comp_args = copy.deepcopy(args), copy.deepcopy(args)
    expected = eager_fn(*eager_args, **kwargs)
    actual = torch.compile(comp_fn, backend="tpu", options=options)(*comp_args, **kwargs)
    results = [("output", actual, expected)]
    if grads:
        le, lc = _loss(expected), _loss(actual)
        if le is not None and lc is not None:
            le.backward()
            lc.backward()
            results += _grad_results(eager_fn, comp_fn, eager_args, comp_args)
    problems = [p for what, a, e in results for p in _diff_tree(what, a, e, atol, rtol)]
    if problems and fp64_ref:
        reference = _float64_results(fn_or_module, args, kwargs, grads)
        if reference is not None:
            problems = [
                p
                for (what, a, e), r in zip(results, reference, strict=True)
                for p in _diff_tree(what, a, e, atol, rtol, r)
            ]
    if not problems:
        return
    message = "compiled result differs from CPU eager:\n  - " + "\n  - ".join(problems)
    divergence = find_divergence(fn_or_module, *args, grads=grads, atol=atol, rtol=rtol, **kwargs)
    if divergence is not None:
        message += f"\n{divergence}"
    else:
        message += "\nno single ATen node diverges on its own: the error accumulates across ops"
    raise AssertionError(message)


def _copy(f):
    return copy.deepcopy(f) if isinstance(f, torch.nn.Module) else f


def _grad_results(eager_fn, comp_fn, eager_args, comp_args) -> list[tuple]:
    """``(what, compiled grad, eager grad)`` for every parameter and input that requires grad."""
    out = []
    if isinstance(eager_fn, torch.nn.Module):
        for (name, pe), pc in zip(eager_fn.named_parameters(), comp_fn.parameters(), strict=True):
            out.append((f"grad of {name}", pc.grad, pe.grad))
    for i, (ae, ac) in enumerate(zip(eager_args, comp_args, strict=True)):
        if isinstance(ae, torch.Tensor) and ae.requires_grad:
            out.append((f"grad of input {i}", ac.grad, ae.grad))
    return out


def _to_float64(tree):
    def wide(t: torch.Tensor) -> torch.Tensor:
        if not t.is_floating_point():
            return t.clone()
        return t.detach().to(torch.float64).requires_grad_(t.requires_grad)

    return pytree.tree_map_only(torch.Tensor, wide, tree)


def _float64_results(fn_or_module, args, kwargs, grads: bool) -> list | None:
    """The outputs (and grads, in ``_grad_results``' order) of ``fn_or_module`` run eagerly in
    float64, or ``None`` when it cannot run there."""
    fn = _copy(fn_or_module)
    if isinstance(fn, torch.nn.Module):
        fn = fn.to(torch.float64)
    wide_args, wide_kwargs = _to_float64(copy.deepcopy(args)), _to_float64(kwargs)
    try:
        out = fn(*wide_args, **wide_kwargs)
        results = [out]
        if grads:
            leaves = [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
            leaves = [t for t in leaves if t.requires_grad and t.is_floating_point()]
            if leaves:
                sum(t.sum() for t in leaves).backward()
                results += [g for _, g, _ in _grad_results(fn, fn, wide_args, wide_args)]
    except Exception:  # an op without a float64 kernel: judge by eager's values alone
        return None
    return results


def _diff_tree(what: str, actual, expected, atol, rtol, ref=None) -> list[str]:
    sub = ref
    if isinstance(expected, dict):
        if not isinstance(actual, dict) or set(actual) != set(expected):
            return [f"{what}: keys differ"]
        return [
            p
            for k in expected
            for p in _diff_tree(f"{what}[{k!r}]", actual[k], expected[k], atol, rtol, _at(sub, k))
        ]
    if isinstance(expected, list | tuple):
        if not isinstance(actual, list | tuple) or len(actual) != len(expected):
            return [f"{what}: structure differs"]
        return [
            p
            for i, (a, e) in enumerate(zip(actual, expected, strict=True))
            for p in _diff_tree(f"{what}[{i}]", a, e, atol, rtol, _at(sub, i))
        ]
    if hasattr(expected, "to_tuple") and hasattr(actual, "to_tuple"):  # HF ModelOutput
        wide = sub.to_tuple() if hasattr(sub, "to_tuple") else None
        return _diff_tree(what, actual.to_tuple(), expected.to_tuple(), atol, rtol, wide)
    if not isinstance(expected, torch.Tensor) and type(actual) is type(expected):
        fields = getattr(expected, "__dict__", None)
        if fields is not None and what.count(".") < 4:  # a cache object (DynamicCache, ...)
            return [
                p
                for k in fields
                for p in _diff_tree(
                    f"{what}.{k}",
                    vars(actual).get(k),
                    fields[k],
                    atol,
                    rtol,
                    vars(sub).get(k) if hasattr(sub, "__dict__") else None,
                )
            ]
    if not isinstance(expected, torch.Tensor):
        return [] if actual == expected else [f"{what}: {actual!r} != {expected!r}"]
    if not isinstance(actual, torch.Tensor):
        return [f"{what}: expected a tensor, got {type(actual).__name__}"]
    if actual.dtype != expected.dtype:
        return [f"{what}: dtype {actual.dtype} != eager's {expected.dtype}"]
    if actual.shape != expected.shape:
        return [f"{what}: shape {list(actual.shape)} != eager's {list(expected.shape)}"]
    at, rt = tolerance(expected.dtype, atol, rtol)
    a, e = actual.detach(), expected.detach()
    if torch.allclose(a, e, atol=at, rtol=rt, equal_nan=True):
        return []
    judged = _against_float64(a, e, ref, at)
    if judged is True:
        return []
    diff = (a.double() - e.double()).abs() if not e.is_complex() else (a - e).abs().double()
    diff = torch.where(torch.isnan(diff), torch.full_like(diff, float("inf")), diff)
    text = (
        f"{what}: max |diff| {diff.max().item():.3g} (atol {at:g}, rtol {rt:g}) at index "
        f"{tuple(int(i) for i in torch.unravel_index(diff.argmax(), diff.shape))}"
    )
    return [text + (f"; {judged}" if isinstance(judged, str) else "")]


def _at(tree, key):
    try:
        return tree[key] if tree is not None else None
    except (KeyError, IndexError, TypeError):
        return None


def _against_float64(actual, expected, ref, atol) -> bool | str | None:
    """torch's accuracy rule (``same(..., fp64_ref)``): True if ``actual``'s RMS error from the
    float64 ``ref`` is at most 3x (half types; 2x otherwise) eager's plus ``atol / 10``; else
    a description of both errors; ``None`` if there is no usable reference."""
    if not isinstance(ref, torch.Tensor) or ref.shape != expected.shape:
        return None
    if not (expected.is_floating_point() or expected.is_complex()):
        return None
    if not torch.equal(torch.isnan(actual), torch.isnan(expected)):
        return None
    finite = torch.isfinite(expected) & torch.isfinite(ref)
    if not torch.equal(actual[~finite].nan_to_num(), expected[~finite].nan_to_num()):
        return None
    wide = ref.detach()[finite].to(torch.complex128 if ref.is_complex() else torch.float64)

    def rmse(x):
        d = x.detach()[finite].to(wide.dtype) - wide
        return float(d.abs().square().mean().sqrt()) if d.numel() else 0.0

    ours, eager = rmse(actual), rmse(expected)
    multiplier = 3.0 if expected.dtype in (torch.float16, torch.bfloat16) else 2.0
    if ours <= multiplier * eager + atol / 10:
        return True
    return (
        f"RMS error from the float64 run {ours:.3g}, eager's {eager:.3g} (allowed {multiplier:g}x)"
    )

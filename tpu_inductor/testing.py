"""Numerics against CPU eager, for CI users.

``assert_matches_cpu(model, x)`` compiles a copy of ``model`` with ``backend="tpu"``, runs it and
CPU eager on the same inputs, and compares every output (and, with ``grads=True``, every
parameter and input gradient). On a mismatch the error says which output differs and by how
much, and names the first diverging ATen node with its source line.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch

from tpu_inductor.debug import _loss, find_divergence
from tpu_inductor.dtypes import tolerance


def assert_matches_cpu(
    fn_or_module: Callable,
    *args,
    grads: bool = False,
    atol: float | None = None,
    rtol: float | None = None,
    options: dict | None = None,
    **kwargs,
) -> None:
    """Assert that ``fn_or_module(*args, **kwargs)`` compiled with ``backend="tpu"`` matches
    CPU eager.

    Args:
        fn_or_module: a function or ``nn.Module``; it is deep-copied for each side.
        args, kwargs: inputs (deep-copied for each side).
        grads: also compare gradients of every parameter and of every input that requires grad;
            the loss is the sum of all floating-point outputs.
        atol, rtol: tolerances (default per dtype: float32 1e-4/1e-4, bfloat16 2e-2, ...).
        options: backend options passed to ``torch.compile``.

    Raises:
        AssertionError: naming the output or gradient that differs, by how much, and the first
            ATen node whose lowering diverges from torch (op, shapes, source line).
    """
    eager_fn, comp_fn = _copy(fn_or_module), _copy(fn_or_module)
    eager_args, comp_args = copy.deepcopy(args), copy.deepcopy(args)
    expected = eager_fn(*eager_args, **kwargs)
    actual = torch.compile(comp_fn, backend="tpu", options=options)(*comp_args, **kwargs)
    problems = _diff_tree("output", actual, expected, atol, rtol)
    if grads and not problems:
        le, lc = _loss(expected), _loss(actual)
        if le is not None and lc is not None:
            le.backward()
            lc.backward()
            problems += _grad_problems(eager_fn, comp_fn, eager_args, comp_args, atol, rtol)
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


def _grad_problems(eager_fn, comp_fn, eager_args, comp_args, atol, rtol) -> list[str]:
    problems = []
    if isinstance(eager_fn, torch.nn.Module):
        for (name, pe), pc in zip(eager_fn.named_parameters(), comp_fn.parameters(), strict=True):
            problems += _diff_tree(f"grad of {name}", pc.grad, pe.grad, atol, rtol)
    for i, (ae, ac) in enumerate(zip(eager_args, comp_args, strict=True)):
        if isinstance(ae, torch.Tensor) and ae.requires_grad:
            problems += _diff_tree(f"grad of input {i}", ac.grad, ae.grad, atol, rtol)
    return problems


def _diff_tree(what: str, actual, expected, atol, rtol) -> list[str]:
    if isinstance(expected, dict):
        if not isinstance(actual, dict) or set(actual) != set(expected):
            return [f"{what}: keys differ"]
        return [
            p
            for k in expected
            for p in _diff_tree(f"{what}[{k!r}]", actual[k], expected[k], atol, rtol)
        ]
    if isinstance(expected, list | tuple):
        if not isinstance(actual, list | tuple) or len(actual) != len(expected):
            return [f"{what}: structure differs"]
        return [
            p
            for i, (a, e) in enumerate(zip(actual, expected, strict=True))
            for p in _diff_tree(f"{what}[{i}]", a, e, atol, rtol)
        ]
    if hasattr(expected, "to_tuple") and hasattr(actual, "to_tuple"):  # HF ModelOutput
        return _diff_tree(what, actual.to_tuple(), expected.to_tuple(), atol, rtol)
    if not isinstance(expected, torch.Tensor) and type(actual) is type(expected):
        fields = getattr(expected, "__dict__", None)
        if fields is not None and what.count(".") < 4:  # a cache object (DynamicCache, ...)
            return [
                p
                for k in fields
                for p in _diff_tree(f"{what}.{k}", vars(actual).get(k), fields[k], atol, rtol)
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
    diff = (a.double() - e.double()).abs() if not e.is_complex() else (a - e).abs().double()
    diff = torch.where(torch.isnan(diff), torch.full_like(diff, float("inf")), diff)
    return [
        f"{what}: max |diff| {diff.max().item():.3g} (atol {at:g}, rtol {rt:g}) at index "
        f"{tuple(int(i) for i in torch.unravel_index(diff.argmax(), diff.shape))}"
    ]

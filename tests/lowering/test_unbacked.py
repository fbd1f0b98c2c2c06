"""Sizes, starts and indices read from tensors in the graph are right or refused (issue 29.4).

Under ``fullgraph=True`` and ``capture_scalar_outputs=True`` a position read from a tensor
(``t.item()``, ``torch.narrow(x, 1, t, 2)``) is an unbacked SymInt. Each case runs in CPU eager
and compiled, with the default ``fallback="eager"`` and with ``fallback="error"``; the compiled
result is either eager's (dtype, shape, values) or a clear refusal: our ``CompileError`` (an
``UnsupportedOpError`` naming the ``.item()`` whose value becomes a size), or torch's own
data-dependent error that ``aot_eager`` raises too. A silently wrong result, or a crash inside a
lowering, fails.

Counts over CASES (47 programs), measured by running ``_outcome`` on every case on the tree
before this change (16826fb) and after, on a 2-core CPU VM:

=====================  ========================  =========================
                       before                    after
=====================  ========================  =========================
fallback="eager"       22 right, 13 WRONG,       38 right, 0 wrong,
                       3 crash in a lowering,    0 crash,
                       9 refused by torch        9 refused by torch
fallback="error"       7 right, 28 refused,      10 right, 28 refused,
                       3 crash in a lowering,    0 crash,
                       9 refused by torch        9 refused by torch
=====================  ========================  =========================

"Refused by torch": AOTAutograd's own ``GuardOnDataDependentSymNode`` (or IndexError), which
``aot_eager`` raises too (tensor_split/split/chunk/unfold by a read size, ``x[t]`` with a 0-d
tensor, ...).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tests.helpers import assert_same, compiled
from tpu_inductor.core.errors import CompileError, LoweringError

X = torch.arange(30.0).reshape(5, 6)
S = torch.tensor(2)


def _set(y, index, value):
    y[index] = value
    return y


def _narrow_write(y, s):
    y.narrow(1, s, 2).copy_(torch.ones(5, 2))
    return y


# name -> fn(x, s): x = X (5 x 6), s = S (a 0-d int64 tensor holding 2)
CASES = {
    "narrow at a tensor": lambda x, s: torch.narrow(x, 1, s, 2),
    "narrow at item": lambda x, s: torch.narrow(x, 1, s.item(), 2),
    "narrow at a constant": lambda x, s: torch.narrow(x, 1, torch.tensor(2), 2),
    "slice i:i+2": lambda x, s: x[:, s.item() : s.item() + 2],
    "slice :i": lambda x, s: x[:, : s.item()],
    "slice i:": lambda x, s: x[s.item() :],
    "select": lambda x, s: x.select(1, s.item()),
    "x[i]": lambda x, s: x[s.item()],
    "x[-i]": lambda x, s: x[-s.item()],
    "tensor_split at tensors": lambda x, s: torch.tensor_split(
        x, torch.stack([s - 1, s + 1]), dim=1
    )[1],
    "tensor_split at constants": lambda x, s: torch.tensor_split(x, torch.tensor([1, 3]), 1)[1],
    "tensor_split sections": lambda x, s: torch.tensor_split(x, s.item(), dim=1)[0],
    "split size": lambda x, s: torch.split(x, s.item(), dim=1)[1],
    "split_with_sizes": lambda x, s: torch.split(x, [s.item(), 6 - s.item()], dim=1)[0],
    "unflatten": lambda x, s: x.reshape(-1).unflatten(0, (s.item() + 3, -1)),
    "reshape": lambda x, s: x.reshape(s.item() + 1, -1),
    "view": lambda x, s: x.view(-1, s.item()),
    "expand": lambda x, s: x[:1].expand(s.item(), -1),
    "repeat": lambda x, s: x.repeat(s.item(), 1),
    "pad": lambda x, s: F.pad(x, (s.item(), 0)),
    "roll": lambda x, s: torch.roll(x, s.item(), 1),
    "roll flat": lambda x, s: torch.roll(x, s.item()),
    "full": lambda x, s: torch.full((s.item(),), 1.5),
    "arange": lambda x, s: torch.arange(s.item()) + x[0, :1],
    "new_zeros": lambda x, s: x.new_zeros(s.item(), 2),
    "as_strided": lambda x, s: x.as_strided((2, 2), (1, 1), s.item()),
    "diagonal offset": lambda x, s: x.diagonal(s.item()),
    "index_select": lambda x, s: x.index_select(1, s.reshape(1)),
    "gather": lambda x, s: x.gather(1, s.expand(5, 1)),
    "x[t]": lambda x, s: x[s],
    "index_fill": lambda x, s: x.index_fill(1, s.reshape(1), -1.0),
    "index_put": lambda x, s: x.clone().index_put_((torch.arange(5), s.expand(5)), torch.zeros(5)),
    "x[:, i:i+2] = v": lambda x, s: _set(
        x.clone(), (slice(None), slice(s.item(), s.item() + 2)), 0.0
    ),
    "x[:, i:i+3:2] = v": lambda x, s: _set(
        x.clone(), (slice(None), slice(s.item(), s.item() + 3, 2)), 0.0
    ),
    "x[:, i] = v": lambda x, s: _set(x.clone(), (slice(None), s.item()), -1.0),
    "narrow(...).copy_": lambda x, s: _narrow_write(x.clone(), s.item()),
    "select_scatter": lambda x, s: torch.select_scatter(x, torch.zeros(5), 1, s.item()),
    "narrow(...).mul_": lambda x, s: x.clone().narrow(1, s.item(), 2).mul_(0),
    "unfold": lambda x, s: x.unfold(1, s.item(), 1),
    "topk k": lambda x, s: torch.topk(x, s.item(), dim=1).values,
    "chunk": lambda x, s: x.chunk(s.item(), 1)[0],
    "movedim": lambda x, s: x.movedim(s.item() - 2, 1),
    "x + i": lambda x, s: x + s.item(),
    "(2x).narrow": lambda x, s: (x * 2).narrow(1, s.item(), 2),
    "x.narrow * 2": lambda x, s: x.narrow(1, s.item(), 2) * 2,
    "2x and its slice": lambda x, s: (x * 2, (x * 2)[:, s.item() :]),
    "narrow at item, bound checked": lambda x, s: _checked_narrow(x, s.item()),
}


def _checked_narrow(x, i):
    torch._check(i >= 0)
    torch._check(i <= 4)
    return x.narrow(1, i, 2)


def _outcome(fn, fallback: str):
    """``("right" | "refused" | "wrong" | "crash", detail)`` of one case."""
    torch._dynamo.reset()
    want = fn(X.clone(), S.clone())
    with torch._dynamo.config.patch(capture_scalar_outputs=True):
        try:
            got = compiled(fn, fallback=fallback)(X.clone(), S.clone())
        except LoweringError as e:  # a lowering that failed mid-trace: not a refusal
            return "crash", str(e)
        except CompileError as e:
            return "refused", str(e)
        except Exception as e:
            torch._dynamo.reset()
            try:  # torch's own refusal, if aot_eager refuses the same program
                torch.compile(fn, backend="aot_eager", fullgraph=True)(X.clone(), S.clone())
            except type(e):
                return "refused", f"torch: {e}"
            return "crash", f"{type(e).__name__}: {e}"
    try:
        assert_same(got, want)
    except AssertionError as e:
        return "wrong", str(e)
    return "right", ""


@pytest.mark.parametrize("fallback", ["eager", "error"])
@pytest.mark.parametrize("name", list(CASES))
def test_right_or_refused(name, fallback):
    outcome, detail = _outcome(CASES[name], fallback)
    assert outcome in ("right", "refused"), f"{name}: {outcome}: {detail}"
    if outcome == "refused" and not detail.startswith("torch:"):
        assert "test_unbacked.py" in detail, detail  # the user's line
    if fallback == "eager" and not detail.startswith("torch:"):
        assert outcome == "right", detail  # the default runs it, in islands around the read


@pytest.mark.parametrize("n", [2, 1, 0])
def test_dynamic_slice_of_an_input(n):
    """A view of an input at a position that is a symbolic size (dynamic=True): AOTAutograd
    rebuilds it from the input with the layout of the tensor handed back."""
    fn = torch.compile(lambda a, k: a[:, k : k + 2], backend="tpu", dynamic=True)
    for k in (n, n + 1):
        assert_same(fn(X, k), X[:, k : k + 2])
    fn = torch.compile(lambda a, k: (a[:k].t(), a.narrow(1, k, 2)), backend="tpu", dynamic=True)
    assert_same(fn(X, n + 2), (X[: n + 2].t(), X.narrow(1, n + 2, 2)))

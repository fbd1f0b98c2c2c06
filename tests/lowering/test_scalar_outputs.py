"""``.item()`` under ``capture_scalar_outputs``: a scalar used as a value is lowered; one that
becomes a tensor size falls back naming the line; ``_assert_scalar`` checks a concrete condition;
a node without a stack trace is reported at its consumer's line."""

from __future__ import annotations

import pytest
import torch
import torch.fx as fx

from tests.helpers import assert_same, check_fn, compiled
from tpu_inductor.core.errors import FallbackWarning, UnsupportedOpError
from tpu_inductor.lowering.lower import user_frame
from tpu_inductor.lowering.lowerings import LOWERINGS, LoweringContext

aten = torch.ops.aten


_g = torch.Generator().manual_seed(0)
X = torch.randn(3, 4, generator=_g)


@pytest.fixture
def capture_scalars(monkeypatch):
    monkeypatch.setattr(torch._dynamo.config, "capture_scalar_outputs", True)


def _float_item(x):
    s = x.sum().item()
    return x * s


def _int_item_checked(x):
    n = (x > 0).sum().item()
    torch._check(n >= 0)
    torch._check(n <= x.numel())
    return x + n


def _item_in_where(x):
    m = x.max().item()
    return torch.where(x > 0, x, m)


@pytest.mark.parametrize("fn", [_float_item, _int_item_checked, _item_in_where])
def test_item_is_lowered(capture_scalars, fn):
    check_fn(fn, X, fallback="error")


def test_item_as_size_falls_back_naming_the_line(capture_scalars):
    def fn(x):
        n = (x > 0).sum().item()
        return torch.ones(n) * 2

    with pytest.raises(UnsupportedOpError) as info:
        compiled(fn, fallback="error")(X)
    (line,) = info.value.missing
    assert line.startswith("aten._local_scalar_dense.default(int64[])")
    assert "n = (x > 0).sum().item()" in line and "becomes a tensor size" in line
    torch._dynamo.reset()
    with pytest.warns(FallbackWarning) as record:
        out = compiled(fn)(X)
    assert_same(out, fn(X))
    text = "\n".join(str(w.message) for w in record)
    assert "_assert_scalar" not in text and "_local_scalar_dense" in text


def test_assert_scalar_checks_a_concrete_condition():
    lowering = LOWERINGS[aten._assert_scalar.default]
    ctx = LoweringContext(node=None, precision=None, arg_metas=())
    assert lowering(ctx, (True, "fine"), {}) is None
    with pytest.raises(RuntimeError, match="u0 >= 0"):
        lowering(ctx, (False, "Runtime assertion failed for expression u0 >= 0"), {})


def test_user_frame_of_a_node_without_stack_trace_is_its_consumers():
    g = fx.Graph()
    a = g.placeholder("a")
    cast = g.call_function(torch.ops.prims.convert_element_type.default, (a, torch.float64))
    back = g.call_function(torch.ops.prims.convert_element_type.default, (cast, torch.float32))
    mul = g.call_function(aten.mul.Tensor, (a, back))
    g.output((mul,))
    mul.meta["stack_trace"] = '  File "model.py", line 7, in forward\n    return x * s\n'
    assert user_frame(cast) == 'File "model.py", line 7, in forward: return x * s'
    # no consumer has one: the nearest producer's
    a.meta["stack_trace"] = '  File "model.py", line 3, in forward\n    s = x.sum().item()\n'
    del mul.meta["stack_trace"]
    assert user_frame(cast) == 'File "model.py", line 3, in forward: s = x.sum().item()'

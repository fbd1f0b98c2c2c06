"""Boolean masks: assignment through a mask is lowered (forward and backward); a read through a
mask has a data-dependent shape, so it falls back with a warning, or with ``fallback="error"`` an
error naming the op, the user's line and the fix."""

from __future__ import annotations

import warnings

import pytest
import torch

from tests.helpers import assert_same, check_fn, compiled
from tpu_inductor.core.errors import FallbackWarning, UnsupportedOpError

aten = torch.ops.aten


_g = torch.Generator().manual_seed(0)

X = torch.randn(3, 4, generator=_g)
MASK = X > 0
ROWS = torch.tensor([True, False, True])


def _put_scalar(x, m):
    x = x.clone()
    x[m] = 2.0
    return x


def _put_0d_tensor(x, m):
    x = x.clone()
    x[m] = torch.tensor(5.0)
    return x


def _put_rows_broadcast(x, m):
    x = x.clone()
    x[m[:, 0]] = torch.arange(4.0)  # one row value for every selected row
    return x


def _put_rows_one_each(x, m):
    x = x.clone()
    x[ROWS] = torch.arange(8.0).reshape(2, 4)  # ROWS has exactly 2 Trues
    return x


def _put_columns(x, m):
    x = x.clone()
    x[:, m[0]] = torch.arange(3.0)[:, None]
    return x


def _put_accumulate(x, m):
    return x.index_put((m,), torch.tensor(1.5), accumulate=True)


def _put_int(x, m):
    y = m.int()
    y[m] = 7
    return y


def _put_bool(x, m):
    y = m.clone()
    y[~m] = True
    return y


def _put_uses_where_of_self(x, m):
    x = x.clone()
    x[x < 0] = 0.0  # relu written the NumPy way
    return x * 2


MASK_PUTS = [
    _put_scalar,
    _put_0d_tensor,
    _put_rows_broadcast,
    _put_rows_one_each,
    _put_columns,
    _put_accumulate,
    _put_int,
    _put_bool,
    _put_uses_where_of_self,
]


@pytest.mark.parametrize("fn", MASK_PUTS, ids=lambda f: f.__name__)
def test_boolean_mask_assignment_is_lowered(fn):
    # fallback="error": the whole graph is one XLA program, nothing runs in torch.
    check_fn(fn, X, MASK, fallback="error")


def test_boolean_mask_assignment_backward():
    def fn(x, m):
        y = x * 3
        y[m] = 0.5
        return y.sum()

    xe = X.clone().requires_grad_()
    xc = X.clone().requires_grad_()
    fn(xe, MASK).backward()
    with warnings.catch_warnings():
        warnings.simplefilter("error", FallbackWarning)
        out = compiled(fn)(xc, MASK)
    out.backward()
    assert_same(out, fn(X.clone(), MASK))
    assert_same(xc.grad, xe.grad)


def _mask_read(x, m):
    return x[m] * 2


def test_boolean_mask_read_fullgraph_falls_back_with_a_clear_warning():
    with pytest.warns(FallbackWarning) as record:
        out = compiled(_mask_read)(X, MASK)
    assert_same(out, _mask_read(X, MASK))
    text = "\n".join(str(w.message) for w in record if isinstance(w.message, FallbackWarning))
    assert "aten.index.Tensor" in text
    assert "test_boolean_masks.py" in text and "return x[m] * 2" in text
    assert "torch.where" in text  # the fix
    assert "_assert_scalar" not in text  # lowered, not a missing op
    assert "Traceback" not in text and "NotImplementedError" not in text


def test_boolean_mask_read_fallback_error_names_op_line_and_fix():
    with pytest.raises(UnsupportedOpError) as info:
        compiled(_mask_read, fallback="error")(X, MASK)
    (line,) = info.value.missing
    assert line.startswith("aten.index.Tensor(float32[3, 4], [bool[3, 4]])")
    assert "return x[m] * 2" in line
    assert "torch.where(mask, x, 0)" in line and "fullgraph=True" in line


def test_boolean_mask_read_without_fullgraph_matches_eager():
    # Dynamo graph-breaks at the data-dependent nonzero and runs x[m] eagerly between graphs.
    def fn(x, m):
        return (x[m] * 2).sum() + x.sum()

    out = torch.compile(fn, backend="tpu")(X, MASK)
    assert_same(out, fn(X, MASK))


def test_boolean_mask_with_other_tensor_index_falls_back():
    def fn(x, m):
        x = x.clone()
        x[ROWS, torch.tensor([1, 3])] = 9.0
        return x

    with pytest.warns(FallbackWarning, match="boolean mask mixed with other tensor indices"):
        out = compiled(fn)(X, MASK)
    assert_same(out, fn(X, MASK))

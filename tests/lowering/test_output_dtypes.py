"""Correctness holes a new user found (issue 12), each compared with CPU eager: output dtypes of
ops whose result dtype is not their input's, boolean-mask assignment and reads, meta-device
inputs, ``.item()`` under ``capture_scalar_outputs``, and autocast to bfloat16."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
import torch.fx as fx

from tests.helpers import assert_same, check_fn, compiled
from tpu_inductor.core.errors import FallbackWarning, UnsupportedInputError, UnsupportedOpError
from tpu_inductor.lowering.lower import user_frame
from tpu_inductor.lowering.lowerings import LOWERINGS, LoweringContext

aten = torch.ops.aten

# --- 1. ops whose output dtype differs from their input's ----------------------------------------

_g = torch.Generator().manual_seed(0)
C = torch.randn(3, 4, dtype=torch.complex64, generator=_g)
F = torch.randn(3, 4, generator=_g)
I = torch.randint(-5, 5, (3, 4), generator=_g)  # noqa: E741
B = torch.rand(3, 4, generator=_g) > 0.5
H = torch.randn(3, 4, generator=_g).bfloat16()
F[0, 0], F[1, 1], F[2, 2] = float("nan"), float("inf"), -0.0

DTYPE_CASES = {
    # complex -> real
    "abs_complex": (torch.abs, C),
    "angle_complex": (torch.angle, C),
    "abs_angle_real_imag": (lambda t: (t.abs(), t.angle(), t.real, t.imag), C),
    "abs_then_add": (lambda t: t.abs() + 1, C),
    "real": (torch.real, C),
    "imag": (torch.imag, C),
    "view_as_real": (torch.view_as_real, C),
    "vector_norm_complex": (torch.linalg.vector_norm, C),
    "vector_norm_complex_l1_dim": (lambda t: torch.linalg.vector_norm(t, 1, dim=1), C),
    "vector_norm_complex_inf": (lambda t: torch.linalg.vector_norm(t, float("inf")), C),
    "norm_complex": (lambda t: t.norm(), C),
    "var_complex": (lambda t: t.var(dim=1), C),
    "std_complex": (lambda t: t.std(), C),
    # real -> complex
    "view_as_complex": (lambda t: torch.view_as_complex(t.reshape(3, 2, 2)), F.nan_to_num()),
    "complex": (lambda t: torch.complex(t, 2 * t), F),
    "polar": (lambda t: torch.polar(t.abs(), t), F.nan_to_num(0, 0, 0)),
    # int/bool -> float
    "angle_float": (torch.angle, F),
    "angle_int": (torch.angle, I),
    "sqrt_int": (torch.sqrt, I.abs()),
    "sigmoid_bool": (torch.sigmoid, B),
    "div_int": (lambda t: t / 2, I),
    "pow_int_half": (lambda t: t.abs() ** 0.5, I),
    "add_int_float": (lambda t: t + 1.5, I),
    # same dtype kept where it could change
    "abs_int": (torch.abs, I),
    "abs_bfloat16": (torch.abs, H),
    "sgn_complex": (torch.sgn, C),
    "floor_div_int": (lambda t: t // 2, I),
    # -> bool
    "isnan": (torch.isnan, F),
    "isnan_complex": (torch.isnan, C),
    "isinf_int": (torch.isinf, I),
    "isfinite_complex": (torch.isfinite, C),
    "isposinf": (torch.isposinf, F),
    "isneginf": (torch.isneginf, F),
    "signbit_float": (torch.signbit, F),
    "signbit_int": (torch.signbit, I),
    "isreal_complex": (torch.isreal, C),
    "eq_complex": (lambda t: t == t.conj(), C),
    "ne_complex_scalar": (lambda t: t != 1, C),
    "lt_float": (lambda t: t < 0, F),
    "le_int_float_scalar": (lambda t: t <= 0.5, I),
    "gt_bool": (lambda t: t > 0, B),
    "ge_mixed": (lambda t: t >= H, F),
    "logical_not_complex": (torch.logical_not, C),
    "logical_xor_int": (lambda t: torch.logical_xor(t, 1 - t), I),
    "isclose": (lambda t: torch.isclose(t, t + 1e-9), F),
    "any_float": (lambda t: t.any(1), F),
    "all_complex": (lambda t: t.all(), C),
    "to_bool_complex": (lambda t: t.bool(), C),
    # -> int64 (indices, counts)
    "argmax": (lambda t: t.argmax(), F.nan_to_num()),
    "argmax_dim_bfloat16": (lambda t: t.argmax(1), H),
    "argmin_keepdim_int": (lambda t: t.argmin(0, keepdim=True), I),
    "max_dim": (lambda t: t.max(1), F.nan_to_num()),
    "min_dim_int": (lambda t: t.min(0), I),
    "sort": (lambda t: t.sort(dim=1, stable=True), F.nan_to_num()),
    "topk": (lambda t: t.topk(2), F.nan_to_num()),
    "searchsorted": (lambda t: torch.searchsorted(torch.arange(5.0), t), F.nan_to_num()),
    "searchsorted_int32": (
        lambda t: torch.searchsorted(torch.arange(5.0), t, out_int32=True),
        F.nan_to_num(),
    ),
    "bucketize": (lambda t: torch.bucketize(t, torch.arange(3.0)), F.nan_to_num()),
    "count_nonzero": (lambda t: torch.count_nonzero(t, 1), F),
    "sum_bool": (lambda t: t.sum(), B),
    "cumsum_bool": (lambda t: t.cumsum(1), B),
    "prod_bool": (lambda t: t.prod(), B),
    "frexp": (torch.frexp, F.nan_to_num()),
    "to_int32": (lambda t: t.to(torch.int32), F.nan_to_num(0, 0, 0)),
}


@pytest.mark.parametrize("name", list(DTYPE_CASES))
def test_output_dtype_matches_eager(name):
    fn, x = DTYPE_CASES[name]
    check_fn(fn, x)


# --- 2. boolean masks -----------------------------------------------------------------------------

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
    assert "test_correctness_holes.py" in text and "return x[m] * 2" in text
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


# --- 3. meta-device inputs ------------------------------------------------------------------------


def test_meta_input_is_a_clear_error_before_jax(monkeypatch):
    import tpu_inductor.dynamo.backend as backend

    def no_compile(*a, **k):
        raise AssertionError("a meta input reached compile_graph")

    monkeypatch.setattr(backend, "compile_graph", no_compile)
    model = torch.nn.Linear(4, 4, device="meta")
    with pytest.raises(UnsupportedInputError) as info:
        torch.compile(model, backend="tpu")(torch.randn(2, 4, device="meta"))
    msg = str(info.value)
    assert "['weight']: float32[4, 4] on device 'meta'" in msg
    assert "['bias']: float32[4] on device 'meta'" in msg
    assert "to_empty(device='cpu')" in msg
    assert "Cannot copy out of meta tensor" not in msg


def test_meta_input_among_cpu_inputs_names_it():
    with pytest.raises(UnsupportedInputError, match=r"L\['y'\]: float32\[3\] on device 'meta'"):
        compiled(lambda x, y: (x * 2, y + 1))(torch.randn(3), torch.randn(3, device="meta"))


# --- 4. .item() under capture_scalar_outputs ------------------------------------------------------


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
    ctx = LoweringContext(None, None, ())
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


# --- 5. autocast ----------------------------------------------------------------------------------

_W = torch.randn(8, 8, generator=_g)
_T = torch.rand(4, 8, generator=_g)
_CW = torch.randn(3, 4, 1, generator=_g)
_LIN = torch.nn.Linear(8, 16)
_LN = torch.nn.LayerNorm(16)

# torch's CPU autocast policy: matmul-like ops in bfloat16, losses/prod/cdist/linalg/fft in
# float32, the rest keep their input's dtype (softmax and layer_norm are not float32 ops on CPU).
AUTOCAST_CASES = {
    "mm": lambda x: x @ _W,
    "linear": lambda x: _LIN(x),
    "linear_softmax": lambda x: torch.softmax(_LIN(x), -1),
    "linear_layer_norm": lambda x: _LN(_LIN(x)),
    "layer_norm_float32_input": lambda x: torch.nn.functional.layer_norm(x, (8,)),
    "bmm": lambda x: torch.bmm(x[None], _W[None]),
    "baddbmm": lambda x: torch.baddbmm(x[None], x[None], _W[None]),
    "addmm": lambda x: torch.addmm(x, x, _W),
    "matmul_plus_float32": lambda x: (x @ _W) + x,
    "conv1d": lambda x: torch.nn.functional.conv1d(x[None], _CW),
    "sdpa": lambda x: torch.nn.functional.scaled_dot_product_attention(
        x[None, None], x[None, None], x[None, None]
    ),
    "log_softmax": lambda x: torch.log_softmax(x @ _W, -1),
    "gelu": lambda x: torch.nn.functional.gelu(x @ _W),
    "group_norm": lambda x: torch.nn.functional.group_norm((x @ _W)[None], 2),
    "cross_entropy": lambda x: torch.nn.functional.cross_entropy(x @ _W, torch.arange(4)),
    "nll_loss": lambda x: torch.nn.functional.nll_loss(
        torch.log_softmax(x @ _W, -1), torch.arange(4)
    ),
    "mse_loss": lambda x: torch.nn.functional.mse_loss(x @ _W, x),
    "bce_with_logits": lambda x: torch.nn.functional.binary_cross_entropy_with_logits(x @ _W, _T),
    "kl_div": lambda x: torch.nn.functional.kl_div(x @ _W, _T, reduction="batchmean"),
    "prod": lambda x: (x @ _W).prod(-1),
    "cdist": lambda x: torch.cdist(x @ _W, x),
    "rfft_abs": lambda x: torch.fft.rfft(x @ _W).abs(),
    "vector_norm": lambda x: torch.linalg.vector_norm(x @ _W, dim=-1),
}


def _autocast(fn):
    def run(x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return fn(x)

    return run


@pytest.mark.parametrize("name", list(AUTOCAST_CASES))
def test_autocast_bfloat16_matches_eager(name):
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(1))
    check_fn(_autocast(AUTOCAST_CASES[name]), x, atol=1e-2, rtol=1e-2)


def test_autocast_training_step_matches_eager():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
    eager, comp = copy.deepcopy(model), copy.deepcopy(model)
    cmodel = torch.compile(comp, backend="tpu")
    x, y = torch.randn(5, 8), torch.arange(5) % 4

    def loss(m):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = m(x)
            return out, torch.nn.functional.cross_entropy(out, y)

    out_e, loss_e = loss(eager)
    out_c, loss_c = loss(cmodel)
    assert_same(out_c, out_e, atol=1e-2, rtol=1e-2)
    assert_same(loss_c, loss_e, atol=1e-2, rtol=1e-2)
    loss_e.backward()
    loss_c.backward()
    for (name, pe), pc in zip(eager.named_parameters(), comp.parameters(), strict=True):
        assert_same(pc.grad, pe.grad, atol=2e-2, rtol=2e-2, what=f"grad of {name}")

"""The torch <-> JAX boundary: dtypes, layouts, odd inputs (a meta-device input is named before
JAX sees it), aliasing, mutation, weight residency, randomness and the executable cache.
Each test compares with CPU eager."""

from __future__ import annotations

import copy

import jax
import pytest
import torch
import torch.nn as nn

import tpu_inductor
from tests.helpers import assert_same, check_fn, compiled
from tpu_inductor.core.errors import UnsupportedInputError
from tpu_inductor.runtime import cache

# --- dtypes ---------------------------------------------------------------------------------------


def test_int64_above_int32_range_survives():
    x = torch.tensor([2**40 + 3, -(2**35), 2**62], dtype=torch.int64)
    out = check_fn(lambda t: t * 2 + 1, x)
    assert out[0].item() == (2**40 + 3) * 2 + 1  # DLPack without x64 would truncate to int32


def test_int64_overflow_wraps_like_torch():
    x = torch.tensor([2**62, 2**63 - 1], dtype=torch.int64)
    check_fn(lambda t: t * 4 + 7, x)


@pytest.mark.parametrize(
    "dtype",
    [
        torch.bool,
        torch.uint8,
        torch.int8,
        torch.int32,
        torch.float16,
        torch.bfloat16,
        torch.float64,
    ],
)
def test_dtypes_round_trip(dtype):
    x = (torch.randn(3, 5) * 4).to(dtype)
    y = (torch.randn(3, 5) * 4).to(dtype)
    tol = {"atol": 1e-2, "rtol": 1e-2} if dtype in (torch.float16, torch.bfloat16) else {}
    if dtype == torch.bool:
        check_fn(lambda a, b: (a & b, a | b, ~a), x, y)
    else:
        check_fn(lambda a, b: (a + b, a * b, a.sum(), a == b), x, y, **tol)


def test_half_with_float_scalar_stays_half():
    # torch: f16 tensor op f32 0-dim -> f16 (jnp would give f32).
    x = torch.randn(4, dtype=torch.float16)
    s = torch.tensor(2.5)
    check_fn(lambda a, b: a * b + 1.5, x, s, atol=1e-3, rtol=1e-3)


def test_float64_on_cpu_keeps_precision():
    x = torch.tensor([1.0 + 1e-12, 2.0], dtype=torch.float64)
    out = check_fn(lambda t: t - 1.0, x, atol=0, rtol=0)
    assert out[0].item() != 0.0


# --- layouts and odd inputs -----------------------------------------------------------------------


def test_non_contiguous_and_channels_last_inputs():
    x = torch.randn(4, 6).t()
    y = torch.randn(2, 3, 5, 5).to(memory_format=torch.channels_last)
    z = torch.randn(10)[::2]
    check_fn(lambda a, b, c: (a * 2, b.sum(dim=(2, 3)), c + 1), x, y, z)


def test_zero_dim_and_empty_tensors():
    check_fn(lambda a, b: (a * 3, b + 1, b.sum()), torch.tensor(2.0), torch.zeros(0, 3))


def test_python_scalars_reach_the_graph():
    def fn(x, n: int, f: float):
        return x * n + f

    x = torch.randn(3)
    expected = fn(x, 3, 0.5)
    got = torch.compile(fn, backend="tpu", dynamic=False)(x, 3, 0.5)
    assert_same(got, expected)


def test_nested_outputs():
    def fn(x):
        return {"a": x + 1, "b": [x * 2, (x.sum(), x.mean())]}

    check_fn(fn, torch.randn(2, 3))


def test_sizes_as_symints_from_input_shapes():
    def fn(x):
        return x.view(x.shape[0] * x.shape[1], -1).sum(0) + x.size(2)

    check_fn(fn, torch.randn(2, 3, 4))


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


# --- aliasing and mutation ------------------------------------------------------------------------


def test_mutating_an_output_does_not_change_the_next_call():
    w = nn.Parameter(torch.randn(3))

    def fn(x):
        return x + w, torch.ones(3), w * 1

    f = compiled(fn)
    x = torch.randn(3)
    first = f(x)
    expected = [t.clone() for t in first]
    for t in first:
        t.detach().add_(100.0) if t.requires_grad else t.add_(100.0)
    second = f(x)
    for a, b in zip(second, expected, strict=True):
        assert_same(a.detach(), b.detach())


def test_returned_input_is_not_aliased_to_backend_buffers():
    f = compiled(lambda x, y: (x, y * 2))
    x = torch.randn(3)
    a, b = f(x, x)
    b.add_(1.0)
    assert_same(f(x, x)[1], x * 2)


def test_in_place_ops_on_inputs():
    def fn(x, y):
        x.add_(1.0)
        y[0] = 5
        x.mul_(y)
        return x.sum()

    check_fn(fn, torch.randn(4), torch.randn(4))


class _CountDirect:
    """Counts calls that reach a graph without AOTAutograd's runtime wrapper."""

    def __init__(self, monkeypatch):
        from tpu_inductor.runtime.call import CompiledGraph

        self.calls = 0
        original = CompiledGraph.call_unboxed

        def spy(graph, *args):
            self.calls += 1
            return original(graph, *args)

        monkeypatch.setattr(CompiledGraph, "call_unboxed", spy)


def test_clean_inference_graph_skips_aotautograd_wrapper(monkeypatch):
    direct = _CountDirect(monkeypatch)
    model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4)).eval()
    x = torch.randn(3, 8)
    with torch.no_grad():
        expected = model(x)
        f = torch.compile(model, backend="tpu")
        assert_same(f(x), expected)
        assert_same(f(x), expected)
    assert direct.calls == 2


@pytest.mark.parametrize(
    "case",
    [
        "input_mutation",
        "buffer_mutation",
        "output_is_input",
        "output_is_view",
        "same_output_twice",
        "grad_enabled_outputs",
    ],
)
def test_graphs_that_need_aotautograd_wrapper_keep_it(monkeypatch, case):
    """Mutations, views of inputs and autograd need AOTAutograd's runtime wrapper: those graphs
    keep it. Every case matches eager: values, aliasing, mutated inputs and buffers. (An input
    returned as is, or one tensor returned twice, never reaches the backend: Dynamo rebuilds
    those outputs itself, so those graphs may be called directly.)"""
    direct = _CountDirect(monkeypatch)
    if case == "buffer_mutation":  # BatchNorm in train mode updates its running stats
        model = nn.BatchNorm1d(4).train()
        eager_model = nn.BatchNorm1d(4).train()
        x = torch.randn(6, 4)
        with torch.no_grad():
            expected = eager_model(x)
            actual = torch.compile(model, backend="tpu")(x)
        assert_same(actual, expected)
        assert_same(model.running_mean, eager_model.running_mean)
        assert_same(model.running_var, eager_model.running_var)
        assert_same(model.num_batches_tracked, eager_model.num_batches_tracked)
        assert direct.calls == 0
        return
    fns = {
        "input_mutation": lambda x: x.mul_(2).sum(),
        "output_is_input": lambda x: (x, x * 2),
        "output_is_view": lambda x: (x.view(-1), x + 1),
        "same_output_twice": lambda x: (lambda y: (y, y))(x * 3),
        "grad_enabled_outputs": lambda x: x * 2,
    }
    fn = fns[case]
    x = torch.randn(2, 3, requires_grad=case == "grad_enabled_outputs")
    x_eager = x.detach().clone().requires_grad_(x.requires_grad)
    grad_ctx = torch.enable_grad() if case == "grad_enabled_outputs" else torch.no_grad()
    with grad_ctx:
        expected = fn(x_eager)
        actual = compiled(fn)(x)
    assert_same(actual, expected)
    assert_same(x, x_eager, what="input after the call")
    if case in ("output_is_input", "output_is_view"):
        assert actual[0].data_ptr() == x.data_ptr()  # eager returns the input's storage too
    if case == "same_output_twice":
        assert actual[0] is actual[1]
    if case == "grad_enabled_outputs":
        actual.sum().backward()
        expected.sum().backward()
        assert_same(x.grad, x_eager.grad)
    if case not in ("output_is_input", "same_output_twice"):
        assert direct.calls == 0


def test_in_place_on_int64_input_beyond_int32():
    def fn(x):
        x.add_(2**33)
        return x

    check_fn(fn, torch.tensor([1, 2**40], dtype=torch.int64))


# --- weights resident on the device ---------------------------------------------------------------


def _resident_imports() -> int:
    from tpu_inductor.core.transfers import H2D, TOTAL

    return TOTAL.count(H2D, "resident")


def test_weights_transferred_once_and_again_after_in_place_change():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    eager = [p.detach().clone() for p in model.parameters()]
    cm = torch.compile(model, backend="tpu")
    x = torch.randn(3, 4)
    with torch.no_grad():
        cm(x)
        before = _resident_imports()
        assert before == 4
        for _ in range(3):
            cm(x)
        assert _resident_imports() == before, "unchanged weights were transferred again"
        with torch.no_grad():
            for p in model.parameters():
                p.mul_(0.5)  # an eager in-place update bumps the version counter
        out = cm(x)
        assert _resident_imports() == before + 4
    ref = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    with torch.no_grad():
        for p, e in zip(ref.parameters(), eager, strict=True):
            p.copy_(e * 0.5)
        assert_same(out, ref(x))


def test_weights_on_cpu_are_not_copied():
    model = nn.Linear(16, 16)
    cm = torch.compile(model, backend="tpu")
    with torch.no_grad():
        cm(torch.randn(2, 16))
    from tpu_inductor.runtime.residency import VALUES

    for p in (model.weight, model.bias):
        arr = VALUES.lookup(p)
        assert arr is not None and arr.unsafe_buffer_pointer() == p.data_ptr()


# --- randomness -----------------------------------------------------------------------------------


def test_dropout_is_repeatable_under_manual_seed_and_differs_between_calls():
    f = compiled(lambda x: nn.functional.dropout(x, 0.5, training=True))
    x = torch.ones(1000)
    torch.manual_seed(123)
    a, b = f(x), f(x)
    torch.manual_seed(123)
    c = f(x)
    assert torch.equal(a, c), "same seed must give the same mask"
    assert not torch.equal(a, b), "successive calls must draw new masks"
    kept = (a != 0).float().mean().item()
    assert 0.4 < kept < 0.6
    assert set(a.unique().tolist()) <= {0.0, 2.0}


def test_rand_and_randn_follow_torch_seed():
    f = compiled(lambda x: (torch.rand(2000) + x, torch.randn(2000)))
    torch.manual_seed(7)
    u1, n1 = f(torch.zeros(()))
    torch.manual_seed(7)
    u2, n2 = f(torch.zeros(()))
    assert torch.equal(u1, u2) and torch.equal(n1, n2)
    assert 0.0 <= u1.min() and u1.max() < 1.0 and abs(u1.mean() - 0.5) < 0.05
    assert abs(n1.mean()) < 0.1 and abs(n1.std() - 1) < 0.1
    assert u1.dtype == torch.float32 and n1.shape == (2000,)


# --- cache ----------------------------------------------------------------------------------------


def test_second_call_with_same_shapes_does_not_retrace():
    f = compiled(lambda x, y: torch.tanh(x @ y))
    x, y = torch.randn(4, 5), torch.randn(5, 6)
    f(x, y)
    traces = cache.STATS.traces
    for _ in range(3):
        f(torch.randn(4, 5), torch.randn(5, 6))
    assert cache.STATS.traces == traces


def test_same_graph_after_dynamo_reset_reuses_the_executable():
    fn = lambda x: torch.sin(x) * 3  # noqa: E731
    x = torch.randn(7, 3)
    compiled(fn)(x)
    hits, traces = cache.STATS.hits, cache.STATS.traces
    torch._dynamo.reset()
    compiled(fn)(x)
    assert cache.STATS.hits == hits + 1
    assert cache.STATS.traces == traces


def test_persistent_cache_dir_warm_start_in_a_new_process(tmp_path):
    import subprocess
    import sys

    code = (
        "import torch, tpu_inductor\n"
        "torch.manual_seed(0)\n"
        "m = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU()).eval()\n"
        "x = torch.randn(3, 8, dtype=torch.float32)\n"
        f"f = torch.compile(m, backend='tpu', options={{'cache_dir': {str(tmp_path)!r}}})\n"
        "with torch.no_grad():\n"
        "    out = f(x); ref = m(x)\n"
        "torch.testing.assert_close(out, ref)\n"
        "print(tpu_inductor.runtime.cache.STATS.exports_loaded)\n"
    )
    runs = []
    for _ in range(2):
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=300
        )
        assert out.returncode == 0, out.stderr[-3000:]
        runs.append(out.stdout.split()[-1])
    assert runs == ["0", "1"], "the second process did not reuse the saved inference graph"
    assert any((tmp_path / "tpu_inductor" / "programs").glob("*.json"))
    assert len(list(tmp_path.iterdir())) > 1, "no XLA executable in the persistent cache"


def test_jax_sees_x64_only_inside_calls():
    compiled(lambda x: x + 1)(torch.ones(2, dtype=torch.int64))
    assert not jax.config.jax_enable_x64


def test_cpu_executables_are_compiled_with_the_cpu_options(monkeypatch):
    from tpu_inductor.core import devices

    seen = []
    original = jax.stages.Lowered.compile

    def spy(self, compiler_options=None, **kw):
        seen.append(compiler_options)
        return original(self, compiler_options=compiler_options, **kw)

    monkeypatch.setattr(jax.stages.Lowered, "compile", spy)
    conv = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU()).eval()
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        assert_same(torch.compile(conv, backend="tpu")(x), conv(x))
    assert seen and all(o == devices.CPU_INFERENCE_OPTIONS for o in seen), seen
    # Training graphs (forward and backward) compile with XLA's defaults.
    seen.clear()
    conv.train()
    torch.compile(conv, backend="tpu")(x.requires_grad_()).sum().backward()
    assert len(seen) == 2 and not any(seen), seen


def test_an_option_this_jaxlib_rejects_is_dropped(monkeypatch):
    from tpu_inductor.core import devices

    monkeypatch.setattr(devices, "CPU_INFERENCE_OPTIONS", {"xla_cpu_no_such_option": "1"})
    monkeypatch.setattr(devices, "_rejected_options", set())
    with torch.no_grad():
        check_fn(lambda x: torch.relu(x) * 2, torch.randn(5))
    assert devices._rejected_options == {"xla_cpu_no_such_option"}


# --- transfers: what crosses host <-> device ------------------------------------------------------


def test_inference_call_moves_exactly_its_input_and_output():
    from tpu_inductor.core.transfers import D2H, H2D, TOTAL

    model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4)).eval()
    cm = torch.compile(model, backend="tpu")
    x = torch.randn(3, 8)
    with torch.no_grad():
        cm(x)
        before = TOTAL.copy()
        out = cm(x)
    d = TOTAL.copy() - before
    assert d.bytes(H2D) == x.numel() * 4 and d.bytes(D2H) == out.numel() * 4
    assert_same(out, model(x))


def test_training_step_sends_nothing_in_steady_state():
    from tpu_inductor.core.transfers import H2D, TOTAL

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.LayerNorm(16), nn.Linear(16, 4))
    ref = copy.deepcopy(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    cm, step = torch.compile(model, backend="tpu"), torch.compile(opt.step, backend="tpu")
    x = torch.randn(5, 8)
    for i in range(4):
        if i == 2:
            before = TOTAL.copy()
        opt.zero_grad()
        cm(x).pow(2).sum().backward()
        step()
        ref_opt.zero_grad()
        ref(x).pow(2).sum().backward()
        ref_opt.step()
    d = TOTAL.copy() - before
    assert d.bytes(H2D) <= 2 * x.numel() * 4 + 64, str(d)
    for p, q in zip(model.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p, q, atol=1e-5, rtol=1e-4)


def test_lazy_call_does_not_read_host_memory_changed_after_it_returns():
    """A keep_on_device call returns before its executable runs; an input passed by host view
    must not be read later: changing it right after the call (a scheduler's ``lr.fill_`` after
    ``step()``) must not change the result. Before inputs of lazy calls were copied, this
    gave the new value in 10 calls of 10 (the graph reads ``x`` after ~40 matmuls)."""
    import tpu_inductor

    class Chain(nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.w = nn.Parameter(torch.randn(384, 384) / 20)

        def forward(self, x):
            h = self.w
            for _ in range(40):
                h = torch.tanh(h @ self.w)
            return h.sum() * x

    expected = Chain()(torch.ones(1)).detach()
    model = tpu_inductor.keep_on_device(Chain())
    fn = torch.compile(model, backend="tpu")
    with torch.no_grad():
        for _ in range(5):
            x = torch.ones(1)
            y = fn(x)
            x.fill_(1000.0)
            assert_same(y.detach(), expected, rtol=1e-4)


@torch.library.custom_op("tpu_inductor_test_stages::flip", mutates_args=())
def _flip(x: torch.Tensor) -> torch.Tensor:
    return x.flip(-1)


@_flip.register_fake
def _(x):
    return torch.empty_like(x)


@pytest.mark.parametrize("fallback", [False, True], ids=["one-program", "eager-island"])
def test_report_splits_the_first_call_by_stage(fallback):
    """report() gives each Dynamo graph's first call by stage: Dynamo and AOTAutograd once per
    Dynamo graph (on its first program, fallback islands included), lowering and XLA per
    program; nothing loaded without cache_dir."""
    lin = torch.nn.Linear(8, 8)

    def fn(x):
        y = torch.nn.functional.gelu(lin(x))
        return torch.ops.tpu_inductor_test_stages.flip(y) if fallback else y

    with torch.no_grad():
        want = fn(torch.ones(2, 8))
        got = torch.compile(fn, backend="tpu")(torch.ones(2, 8))
    torch.testing.assert_close(got, want)
    report = tpu_inductor.report(print_table=False)
    st = report.stage_seconds()
    assert all(st[k] > 0 for k in ("dynamo", "aot", "lower", "xla")) and st["load"] == 0, st
    assert sum(1 for g in report.graphs if g.stages["dynamo"] > 0) == 1
    assert "dynamo s" in str(report) and "xla s" in str(report)

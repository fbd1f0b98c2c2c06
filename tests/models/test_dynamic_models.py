"""Dynamic shapes on real models: ``torch.compile(model, backend="tpu", dynamic=True)`` over
three sequence lengths x two batch sizes is one Dynamo graph, with no op falling back to eager,
one executable per new size and none rebuilt for a size seen before, and matches eager.

The sweep is ``benchmarks/dynamic.py`` (``python -m benchmarks.dynamic`` writes
``docs/dynamic.md``); three representative models run by default, the whole suite with
``TPU_INDUCTOR_SLOW=1``.
"""

from __future__ import annotations

import warnings

import pytest
import torch

from benchmarks import dynamic
from tests.helpers import assert_same
from tests.models.test_transformers import MODELS

pytest.importorskip("transformers")

_BY_NAME = {c.name: c for c in MODELS}

# Models of the full sweep that are not clean, and why (not tpu-inductor's to fix).
KNOWN: dict[str, str] = {}


def _assert_clean(row: dynamic.Row) -> None:
    assert not row.error, f"{row.model}: {row.error}"
    assert row.fallback_ops == [], f"{row.model}: ops fell back to eager: {row.fallback_ops}"
    assert row.dynamo_graphs == 1 and not row.graph_breaks, (
        f"{row.model}: {row.dynamo_graphs} Dynamo graphs, breaks {row.graph_breaks}, "
        f"recompiles {row.recompile_reasons}"
    )
    assert row.executables_per_size == [1] * len(row.sizes), row.executables_per_size
    assert row.rebuilt == 0, f"{row.model}: {row.rebuilt} executables rebuilt for seen sizes"
    assert row.match, f"{row.model}: outputs differ from eager (max {row.max_abs_err})"


@pytest.mark.parametrize("name", ["llama", "gpt2", "bert"])
def test_dynamic_model_one_graph_no_islands_no_rebuilds(name):
    row = dynamic.sweep_case(_BY_NAME[name])
    assert row.sizes == ["2x5", "2x9", "2x17", "3x5", "3x9", "3x17"]
    _assert_clean(row)


def test_pad_to_pow2_decoder_shares_executables():
    import tpu_inductor
    from tpu_inductor.runtime.buckets import PaddingWarning

    case = _BY_NAME["llama"]
    torch.manual_seed(0)
    model, kwargs = case.build(False)
    model.eval()
    sizes = [(2, 5), (2, 7), (3, 6), (2, 12), (4, 9)]  # pow2 buckets: 2x8, 4x8, 2x16, 4x16
    torch._dynamo.reset()
    tpu_inductor.reset()
    cm = torch.compile(model, backend="tpu", dynamic=True, options={"pad_to": "pow2"})
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error", PaddingWarning)
        for i, (b, s) in enumerate(sizes):
            kw = dynamic.resize(kwargs, b, s, None, seed=i)
            torch.testing.assert_close(
                cm(**kw).logits, model(**kw).logits, atol=case.atol, rtol=case.rtol
            )
    graphs = tpu_inductor.report(print_table=False).graphs
    executables = sum(g.executables for g in graphs)
    assert executables == 4 < len(sizes), [(g.name, g.builds) for g in graphs]


@pytest.mark.slow
def test_dynamic_sweep_every_model(tmp_path):
    rows = dynamic.main(["--json", str(tmp_path / "d.json"), "--md", str(tmp_path / "d.md")])
    assert rows
    for row in rows:
        if row.model in KNOWN:
            assert not row.clean, f"{row.model} is clean now: drop it from KNOWN"
            continue
        _assert_clean(row)


def _traced_graph():
    """``x -> cos (no stack trace) -> sin (traced) -> out``: cos stands for an op AOTAutograd
    made without a source line (a cast, a symbolic float's arithmetic)."""
    import torch.fx as fx

    g = fx.Graph()
    x = g.placeholder("x")
    c = g.call_function(torch.ops.aten.cos.default, (x,))
    s = g.call_function(torch.ops.aten.sin.default, (c,))
    s.meta["stack_trace"] = '  File "user.py", line 3, in forward\n    y = torch.sin(h)\n'
    g.output(s)
    return fx.GraphModule(torch.nn.Module(), g), c


def test_untraced_node_takes_its_consumers_source_line():
    from tpu_inductor.lowering.lower import user_frame

    gm, cos = _traced_graph()
    assert user_frame(cos) == 'File "user.py", line 3, in forward: y = torch.sin(h)'
    cos.meta.pop("stack_trace", None)
    next(iter(cos.users)).meta.pop("stack_trace")
    assert "unknown" not in user_frame(cos) and "no source line" in user_frame(cos)


def test_fallback_warning_names_the_consumers_line_not_an_islands():
    from tpu_inductor.capture.partition import split_for_fallback
    from tpu_inductor.core.errors import FallbackWarning

    gm, cos = _traced_graph()
    from tpu_inductor.lowering.lower import user_frame

    with pytest.warns(FallbackWarning) as rec:
        split_for_fallback(
            gm,
            lambda n: n.target is not torch.ops.aten.cos.default,
            lambda sub: lambda args: sub(*args),
            lambda n: f"{n.target} at {user_frame(n)}",
        )
    assert "user.py" in str(rec[0].message) and "torch.sin(h)" in str(rec[0].message)


def test_symbolic_scalar_arithmetic_is_lowered():
    """Float math on sizes (``math.sqrt(n)``, ``2.0 / x.shape[1]``), ``sym_max`` and a size
    used as a tensor: no fallback, one graph, matches eager at three sizes."""
    import math

    from tpu_inductor.core.errors import FallbackWarning

    def f(x, scale: float):
        n = x.shape[1]
        y = x * math.sqrt(n) / (2.0 / scale)
        m = torch.sym_max(n, 4)
        return y.sum(1) / m, torch.full((), n * scale) ** 0.5

    torch._dynamo.reset()
    cf = torch.compile(f, backend="tpu", dynamic=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FallbackWarning)
        for n, scale in ((3, 1.5), (5, 2.5), (9, 0.5)):
            x = torch.randn(2, n)
            for got, want in zip(cf(x, scale), f(x, scale), strict=True):
                torch.testing.assert_close(got, want)


def test_item_of_a_size_becomes_a_size(monkeypatch):
    """``.item()`` of a value built from sizes only is known once the sizes are: it is read
    while tracing and may become a tensor size, in one graph, with no eager op, at three sizes
    (and under ``pad_to``, which it turns off: the item must read the real size)."""
    from torch._dynamo.utils import counters

    monkeypatch.setattr(torch._dynamo.config, "capture_scalar_outputs", True)

    def f(x):
        n = torch.tensor(x.shape[0]).item()
        m = (torch.arange(x.shape[1]) * 2).max().item() + 1
        return torch.ones(n, m) * x.sum(), torch.arange(n * 2).float()

    for options in ({"fallback": "error"}, {"fallback": "error", "pad_to": "pow2"}):
        torch._dynamo.reset()
        counters.clear()
        cf = torch.compile(f, backend="tpu", dynamic=True, options=options)
        for shape in ((3, 2), (5, 4), (9, 3)):
            x = torch.randn(shape)
            for got, want in zip(cf(x), f(x), strict=True):
                assert_same(got, want)
        assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])


def test_assert_async_is_checked_not_reported_missing():
    """``torch._assert_async`` on a size is checked while tracing; on a value, by the host once
    the program has computed it, raising torch's ``RuntimeError`` with the message and the
    user's line. Neither is a missing op (``fallback="error"`` runs). NOTE: torch's own dead-code
    pass drops ``_assert_async`` without a message from ATen graphs (only ``.msg`` is in
    ``torch.fx.node._side_effectful_functions``, torch 2.13), so only the message form reaches a
    backend; its lowering is checked directly."""
    from tpu_inductor.lowering.lowerings import LOWERINGS, LoweringContext

    def f(x):
        torch._assert_async(torch.tensor(x.shape[0] > 2), "too short")
        torch._assert_async(x.min() > -10, "too small")
        torch._assert_async(x.sum() > 0, "sum must be positive")
        return x * 2

    torch._dynamo.reset()
    cf = torch.compile(f, backend="tpu", dynamic=True, options={"fallback": "error"})
    from tpu_inductor.core.transfers import D2H, TOTAL

    for n in (3, 5):
        assert_same(cf(torch.ones(n)), f(torch.ones(n)))
    before = TOTAL.copy()
    cf(torch.ones(5))
    checked = TOTAL.copy() - before
    assert checked.count(D2H, "check") == 2 and checked.bytes(D2H, "check") == 2  # 1 byte each
    with pytest.raises(RuntimeError, match="too short") as eager:
        f(torch.ones(2))
    with pytest.raises(RuntimeError) as info:  # a size assertion fails while tracing
        cf(torch.ones(2))
    assert str(info.value).startswith(str(eager.value)), str(info.value)
    for x, message in (
        (-torch.ones(3), "sum must be positive"),
        (torch.tensor([-20.0, 30.0, 1.0]), "too small"),
        (torch.tensor([-20.0, 30.0, 1.0, 2.0]), "too small"),
    ):
        with pytest.raises(RuntimeError, match=message) as eager:
            f(x)
        with pytest.raises(RuntimeError, match=message) as info:
            cf(x)
        assert str(info.value).startswith(str(eager.value)), (str(info.value), str(eager.value))
        assert "test_dynamic_models.py" in str(info.value), str(info.value)
    lowering = LOWERINGS[torch.ops.aten._assert_async.default]  # concrete: checked now
    ctx = LoweringContext(node=None, precision=None, arg_metas=())
    assert lowering(ctx, (torch.tensor(True).numpy(),), {}) is None
    with pytest.raises(RuntimeError, match="Expected Tensor with single nonzero value"):
        lowering(ctx, (torch.tensor(0.0).numpy(),), {})

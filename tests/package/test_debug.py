"""report(), logging and dumps, assert_matches_cpu and the divergence locator."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import jax.numpy as jnp
import pytest
import torch
import torch.nn as nn

import tpu_inductor
from tpu_inductor.debug import find_divergence
from tpu_inductor.lowering.lowerings import LOWERINGS
from tpu_inductor.lowering.lowerings.registry import Lowering
from tpu_inductor.testing import assert_matches_cpu


class Block(nn.Module):
    def __init__(self, d=16):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 4 * d)
        self.fc2 = nn.Linear(4 * d, d)

    def forward(self, x):
        return x + self.fc2(nn.functional.gelu(self.fc1(self.norm(x))))


@pytest.fixture
def broken_gelu(monkeypatch):
    """gelu lowered as tanh: plausible-looking and wrong."""
    op = torch.ops.aten.gelu.default
    monkeypatch.setitem(
        LOWERINGS,
        op,
        Lowering(op=op, fn=lambda ctx, x, approximate="none": jnp.tanh(x)),
    )
    tpu_inductor.reset()
    yield
    tpu_inductor.reset()


def test_assert_matches_cpu_passes_on_models():
    torch.manual_seed(0)
    assert_matches_cpu(Block(), torch.randn(2, 5, 16), grads=True)
    cnn = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.MaxPool2d(2))
    assert_matches_cpu(cnn.eval(), torch.randn(2, 3, 8, 8))
    layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
    assert_matches_cpu(layer, torch.randn(2, 4, 16), grads=True)


def test_assert_matches_cpu_names_the_broken_op(broken_gelu):
    torch.manual_seed(0)
    with pytest.raises(AssertionError) as e:
        assert_matches_cpu(Block(), torch.randn(2, 5, 16))
    msg = str(e.value)
    assert "output: max |diff|" in msg
    assert "first diverging ATen node (forward graph): aten.gelu.default(float32[2, 5, 64])" in msg
    assert "test_debug.py" in msg and "gelu(self.fc1" in msg


def test_assert_matches_cpu_reports_gradients(broken_gelu):
    torch.manual_seed(0)
    with pytest.raises(AssertionError, match="aten.gelu.default"):
        assert_matches_cpu(Block(), torch.randn(2, 5, 16), grads=True)


def _bf16_transformer():
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, batch_first=True)
    return nn.TransformerEncoder(layer, 2).to(torch.bfloat16), torch.randn(
        2, 16, 64, dtype=torch.bfloat16
    )


def test_assert_matches_cpu_judges_bf16_grads_against_float64(monkeypatch):
    """A bfloat16 transformer's grads miss eager's by more than bfloat16's tolerance (summed over
    long reductions) but are as close to the float64 result as eager's: they pass."""
    from tpu_inductor import testing

    monkeypatch.setattr(testing, "find_divergence", lambda *a, **k: None)  # not needed here
    model, x = _bf16_transformer()
    with pytest.raises(AssertionError, match="grad of layers"):
        assert_matches_cpu(model, x, grads=True, fp64_ref=False)
    assert_matches_cpu(model, x, grads=True)


def test_assert_matches_cpu_bf16_still_catches_a_lowering_bug(monkeypatch):
    """relu 5% too large: farther from the float64 result than eager by more than 3x."""
    from tpu_inductor import testing

    monkeypatch.setattr(testing, "find_divergence", lambda *a, **k: None)
    op = torch.ops.aten.relu.default
    good = LOWERINGS[op]
    bad = Lowering(op=op, fn=lambda ctx, x: good.fn(ctx, x) * 1.05, promote=good.promote)
    monkeypatch.setitem(LOWERINGS, op, bad)
    tpu_inductor.reset()
    model, x = _bf16_transformer()
    try:
        with pytest.raises(AssertionError, match="RMS error from the float64 run"):
            assert_matches_cpu(model, x, grads=True)
    finally:
        tpu_inductor.reset()


def test_find_divergence_returns_none_when_all_ops_match():
    assert find_divergence(Block(), torch.randn(2, 3, 16), grads=True) is None


def test_find_divergence_locates_the_op(broken_gelu):
    d = find_divergence(lambda x: torch.nn.functional.gelu(x.sin()) * 2, torch.randn(8))
    assert d is not None and d.node.startswith("aten.gelu.default(float32[8])")
    assert d.max_abs_error > 1e-3 and "values differ" in d.error


def test_report_lists_graphs_executables_and_fallbacks():
    torch.manual_seed(0)
    model = Block()
    cm = torch.compile(model, backend="tpu", dynamic=True)
    for n in (2, 3):
        cm(torch.randn(n, 16)).sum().backward()
    r = tpu_inductor.report(print_table=False)
    names = [g.name for g in r.graphs]
    assert any(n.endswith("forward") for n in names) and any(n.endswith("backward") for n in names)
    fwd = next(g for g in r.graphs if g.name.endswith("forward"))
    assert fwd.executables == 2 and fwd.misses == 2
    assert fwd.builds[0][0] == "first call" and "-> float32[3, 16]" in fwd.builds[1][0]
    assert fwd.ops["aten.gelu.default"] == 1
    text = str(r)
    assert "executable 1:" in text and "graph" in text


def test_dump_dir_and_logging(tmp_path):
    code = textwrap.dedent(
        """
        import torch
        f = torch.compile(lambda x: torch.relu(x) * 2, backend="tpu")
        print(f(torch.randn(4)).shape)
        """
    )
    env = {
        **__import__("os").environ,
        "TPU_INDUCTOR_DUMP_DIR": str(tmp_path),
        "TPU_INDUCTOR_LOG": "INFO",
    }
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "[tpu_inductor INFO]" in out.stderr and "built executable #1" in out.stderr
    (folder,) = list(tmp_path.iterdir())
    files = {p.name for p in folder.iterdir()}
    assert {"fx_graph.py", "executable0.jaxpr.txt", "executable0.stablehlo.mlir"} <= files
    assert "relu" in (folder / "fx_graph.py").read_text()
    assert "stablehlo" in (folder / "executable0.stablehlo.mlir").read_text()


def test_assert_matches_cpu_compares_a_cache_object_field_by_field():
    """A transformers model with its cache on returns a DynamicCache: compared by its tensors,
    not with == (which is identity for it and always failed)."""
    from tests.helpers import tiny_llama

    model = tiny_llama().eval()
    ids = torch.randint(1, 128, (2, 8))
    with torch.no_grad():
        assert_matches_cpu(model, input_ids=ids, use_cache=True)

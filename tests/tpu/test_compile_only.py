"""Compiling for a TPU target (``options={"target": ...}``) from real and from meta tensors.

What can be compared with CPU eager without running anything: every output's shape and dtype,
that nothing changed (parameters, optimizer state), and XLA's figures against what the model's
shapes say they must be (matmul FLOPs, parameter bytes, donated optimizer state).
"""

from __future__ import annotations

import re

import pytest
import torch

import tpu_inductor
from tests.helpers import tiny_llama
from tpu_inductor.core.errors import TargetCompileError
from tpu_inductor.tpu import programs

pytestmark = pytest.mark.tpu_compile

BATCH, SEQ = 2, 16


def _step(model, ids, target: str, **options):
    opts = {"target": target, **options}
    cm = torch.compile(model, backend="tpu", options=opts)
    out = cm(ids, labels=ids, use_cache=False)
    out.loss.backward()
    opt = torch.optim.AdamW(model.parameters())
    torch.compile(opt.step, backend="tpu", options=opts)()
    return out, opt


def _linear_flops(model, tokens: int) -> float:
    """Matmul FLOPs of every nn.Linear in a forward over ``tokens`` tokens: 2 * in * out each."""
    return sum(
        2.0 * m.in_features * m.out_features * tokens
        for m in model.modules()
        if isinstance(m, torch.nn.Linear)
    )


@pytest.mark.parametrize("target", ["v4", "v5e", "v5p", "v6e"])
def test_training_step_compiles_and_runs_nothing(target):
    model = tiny_llama()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    ids = torch.randint(0, 128, (BATCH, SEQ), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = tiny_llama()(ids, labels=ids, use_cache=False)
    out, opt = _step(model, ids, target)
    # outputs shaped and typed as eager's; nothing computed, nothing updated
    for name in ("loss", "logits"):
        assert out[name].shape == expected[name].shape
        assert out[name].dtype == expected[name].dtype
        assert not out[name].any()
    for k, v in model.state_dict().items():
        torch.testing.assert_close(v, before[k], rtol=0, atol=0)
    report = tpu_inductor.tpu_report(print_table=False)
    assert [p.role for p in report.programs] == ["forward", "backward", "optimizer"]
    assert not report.failed and not report.too_big
    fwd, bwd, step = report.programs
    chip = tpu_inductor.tpu_target(target).chip
    assert fwd.target.chip is chip and fwd.chips == 1
    # the forward's matmuls are exactly the model's linear layers (plus attention's two)
    linear = _linear_flops(model, BATCH * SEQ)
    assert linear <= fwd.total_matmul_flops <= linear * 1.2
    assert bwd.total_matmul_flops == pytest.approx(2 * fwd.total_matmul_flops, rel=0.2)
    # AdamW updates params, exp_avg and exp_avg_sq in place: all donated, all aliased
    params = sum(p.numel() * 4 for p in model.parameters())
    state = sum(t.numel() * t.element_size() for s in opt.state.values() for t in s.values())
    assert step.donated_bytes == params + state
    # the optimizer reads and writes every parameter and moment in HBM, and reads the gradients
    assert step.hbm_traffic >= 2 * (params + state) + params
    assert step.memory["alias"] >= params * 3
    for p in report.programs:
        assert p.peak_bytes > 0 and p.flops > 0 and p.bytes_accessed > 0
        assert 0 < p.hbm_traffic <= p.bytes_moved  # HBM traffic: on-chip values left out
        assert p.roofline_seconds > 0 and p.xla_seconds is None or p.xla_seconds > 0
        assert p.ops and p.ops[0].cycles >= p.ops[-1].cycles
    text = str(report)
    assert "training step (forward + backward + optimizer)" in text and "MFU ceiling" in text
    # the program's ops name the torch module and the user's (here transformers') line
    ops = [op for p in report.programs for op in p.ops]
    assert any(
        "model.layers.0.mlp" in op.scope and "modeling_llama.py" in (op.source or "") for op in ops
    )


def test_meta_model_compiles_the_same_programs_as_a_real_one():
    """A model on the meta device (nothing materialized) gives the same programs, figure for
    figure, as the same model with real weights."""
    ids = torch.randint(0, 128, (BATCH, SEQ), generator=torch.Generator().manual_seed(0))
    _step(tiny_llama(), ids, "v5e")
    real = [(p.role, p.memory, p.flops, p.bytes_accessed) for p in programs.PROGRAMS]
    tpu_inductor.reset()
    torch._dynamo.reset()
    with torch.device("meta"):
        meta_model = tiny_llama()
    out, _ = _step(meta_model, ids.to("meta"), "v5e")
    assert out.loss.device.type == "meta"
    assert all(p.device.type == "meta" for p in meta_model.parameters())
    assert all(p.grad.device.type == "meta" for p in meta_model.parameters())
    meta = [(p.role, p.memory, p.flops, p.bytes_accessed) for p in programs.PROGRAMS]
    assert meta == real


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_the_logits_zero_tangent_is_no_argument_of_the_backward(device):
    """The model returns logits beside the loss; autograd hands the backward zeros as their
    gradient. The backward program takes the logits once (saved: it recomputes the
    log-softmax from them, capture/saved.py) and no tangent of their shape
    (runtime/signatures.py: Zeros), on a real model as on a meta one."""
    with torch.device(device):
        model = tiny_llama()
    ids = torch.randint(0, 128, (BATCH, SEQ), generator=torch.Generator().manual_seed(0))
    _step(model, ids.to(device), "v5e")
    bwd = next(p for p in programs.PROGRAMS if p.role == "backward")
    logits = ((BATCH, SEQ, 128), "float32")
    assert bwd.inputs.count(logits) == 1, bwd.inputs
    assert ((BATCH * SEQ, 128), "float32") not in bwd.inputs, bwd.inputs


def test_a_model_too_big_for_the_chip_says_by_how_much():
    """16 GiB of float32 weights in a v5e's 16 GiB: the forward does not fit, the backward
    (which also writes their 16 GiB gradient) even less. Built on the meta device: nothing is
    allocated here."""
    with torch.device("meta"):
        model = torch.nn.Sequential(torch.nn.Linear(65536, 65536), torch.nn.Linear(65536, 64))
    x = torch.empty(8, 65536, device="meta")
    cm = torch.compile(model, backend="tpu", options={"target": "v5e"})
    cm(x).sum().backward()
    report = tpu_inductor.tpu_report(print_table=False)
    bad = report.failed + report.too_big
    assert bad, str(report)
    assert "does not fit" in str(report)
    with pytest.raises(TargetCompileError) as info:
        report.raise_for_errors()
    message = str(info.value)
    assert re.search(r"graph\d+-forward#0 \(forward\): does not fit: the program needs", message)
    assert "chip has 15.75 GiB usable" in message and "GiB over" in message
    assert "shard it over more chips" in message
    # one figure for usable HBM, in the header and the error; binary units only
    text = str(report)
    assert "15.75 GiB HBM usable by a program (libtpu's figure) of 16.00 GiB" in text
    assert not re.search(r"\d (MB|GB)\b", text.replace("GB/s", "")), text


def test_an_op_the_tpu_cannot_compile_is_named_with_its_line():
    """A general eigendecomposition has no TPU lowering in XLA: the report names the op, the
    user's line and what to do; the rest of the program's outputs still come back shaped."""

    def f(a):
        return torch.linalg.eigvals(a).abs()  # no TPU kernel for this

    line = f.__code__.co_firstlineno + 1
    out = torch.compile(f, backend="tpu", options={"target": "v5e"})(torch.randn(4, 4))
    assert out.shape == (4,) and out.dtype == torch.float32
    report = tpu_inductor.tpu_report(print_table=False)
    (program,) = report.failed
    assert "no lowering for JAX's 'eig'" in program.error
    assert f"line {line}" in program.error and __file__ in program.error
    with pytest.raises(TargetCompileError, match="eig"):
        report.raise_for_errors()


def test_report_plot_draws_memory_against_hbm(tmp_path):
    pytest.importorskip("matplotlib")
    ids = torch.randint(0, 128, (BATCH, SEQ))
    _step(tiny_llama(), ids, "v5e")
    path = tpu_inductor.tpu_report(print_table=False).plot(str(tmp_path / "hbm.png"))
    assert (tmp_path / "hbm.png").stat().st_size > 1000 and path.endswith("hbm.png")


def test_float64_is_refused_for_a_tpu_target_with_its_line():
    f = torch.compile(lambda x: x * 2, backend="tpu", options={"target": "v5e"})
    with pytest.raises(tpu_inductor.UnsupportedDtypeError, match="float64"):
        f(torch.randn(3, dtype=torch.float64))


def test_float64_parameters_are_named_by_module_path():
    """Not ``primals_1`` "made by torch's tracing": the parameter's own name."""
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    model[2].double()
    cm = torch.compile(model.double(), backend="tpu", options={"target": "v5e"})
    with pytest.raises(tpu_inductor.UnsupportedDtypeError) as info:
        cm(torch.randn(2, 4, dtype=torch.float64))
    message = str(info.value)
    for name in ("0.weight", "0.bias", "2.weight", "2.bias"):
        assert f"  - {name}: float64[" in message, message
    assert "primals_" not in message and "model.float()" in message


def test_hbm_peak_is_the_buffer_assignments_hbm_not_vmem():
    """A program's HBM peak is what XLA's buffer assignment places in HBM, plus code. An MLP
    forward (bf16 weights 4 MiB) keeps its intermediates in the on-chip VMEM: its HBM holds the
    arguments and little else, while libtpu's ``peak_memory_in_bytes`` adds the VMEM (the
    report took that figure before: 9.96 MB, 2.0x this program's HBM and code)."""
    torch._dynamo.reset()
    tpu_inductor.reset()
    w1 = torch.nn.Linear(512, 2048, bias=False).to(torch.bfloat16)
    w2 = torch.nn.Linear(2048, 512, bias=False).to(torch.bfloat16)
    model = torch.nn.Sequential(w1, torch.nn.Tanh(), w2)
    x = torch.randn(256, 512, dtype=torch.bfloat16)
    with torch.no_grad():
        out = torch.compile(model, backend="tpu", options={"target": "v5e"})(x)
    assert out.shape == (256, 512) and out.dtype == torch.bfloat16
    (p,) = programs.PROGRAMS
    m = p.memory
    weights = 2 * 512 * 2048 * 2
    assert m["argument"] == weights + 256 * 512 * 2
    assert m["vmem"] > 0 and m["hbm"] >= m["argument"]
    assert m["hbm"] - m["argument"] - m["output"] < 64 * 1024  # no big HBM temporary
    assert p.peak_bytes == m["hbm"] + m["code"]
    assert m["peak"] > p.peak_bytes, m  # XLA's own peak counts the VMEM too

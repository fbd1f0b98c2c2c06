"""Planning a step for a TPU you don't have: every path gives the same programs, the step's
memory counts what stays resident between programs, and collectives are in the roofline.

Compared without running anything: a meta model's programs against the same model's with real
weights (XLA's figures, exactly), the step peak against its parts, and the collectives against
what each sharding plan must exchange.
"""

from __future__ import annotations

import re

import pytest
import torch

import tpu_inductor
from tests.helpers import lm_train_step, tiny_llama
from tpu_inductor.core.errors import TargetCompileError
from tpu_inductor.tpu import programs

pytestmark = pytest.mark.tpu_compile

HIDDEN = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4)


def _compile_step(meta: bool, target: str, plan: str | None):
    """``compile_step`` of a tiny Llama's AdamW step, called twice; its programs' figures."""
    tpu_inductor.reset()
    torch._dynamo.reset()
    if meta:
        with torch.device("meta"):
            model = tiny_llama(**HIDDEN)
        ids = torch.empty(4, 16, dtype=torch.long, device="meta")
    else:
        model = tiny_llama(**HIDDEN)
        ids = torch.randint(0, 128, (4, 16), generator=torch.Generator().manual_seed(0))
    opt = torch.optim.AdamW(model.parameters())

    train_step = lm_train_step(model, opt, use_cache=False)

    options = {"target": target}
    if plan:
        options |= {"mesh": tpu_inductor.tpu_target(target).mesh(("data",)), "shardings": plan}
    step = tpu_inductor.compile_step(train_step, opt, options=options)
    step(ids)
    step(ids)
    return model, [
        (p.name.split("-", 1)[1], p.role, p.memory, p.flops, p.bytes_accessed, p.transcendentals)
        for p in programs.PROGRAMS
    ]


@pytest.mark.parametrize("target, plan", [("v5e", None), ("v5e:2x2", "fsdp")])
def test_compile_step_on_a_meta_model_compiles_the_real_models_programs(target, plan):
    """Before the fix a meta model's step compiled to ONE forward-sized program named
    inference (its loss had no derivative on meta fakes); now the same two programs as real
    weights (one: the AdamW state exists before the trace), figure for figure, named for what
    it is."""
    model, meta = _compile_step(True, target, plan)
    assert all(p.device.type == "meta" for p in model.parameters())  # nothing materialized
    _, real = _compile_step(False, target, plan)
    assert meta == real
    assert [r[1] for r in real] == ["training step"], real
    assert [r[0] for r in real] == ["training-step#0"]
    # the steady program writes every parameter and both AdamW moments
    params = sum(p.numel() * 4 for p in model.parameters())
    chips = tpu_inductor.tpu_target(target).num_devices
    assert real[-1][2]["output"] >= 3 * params / chips
    report = tpu_inductor.tpu_report(print_table=False)
    (step,) = report.steps
    assert step.name == "training step" and len(step.programs) == 1  # the steady program
    assert "training step (training step) on" in str(report)


def test_the_step_peak_counts_what_stays_resident_between_programs(monkeypatch):
    """Compiled model + compiled AdamW (3 programs): the moments are arguments of neither the
    forward nor the backward but stay in HBM while they run. With usable HBM set between the
    largest program's peak and the step's, every program fits and the step does not."""
    with torch.device("meta"):
        model = tiny_llama(
            hidden_size=128, intermediate_size=256, num_attention_heads=4,
            max_position_embeddings=128,
        )  # fmt: skip
    # activations large enough that the backward, not the optimizer, has the largest peak
    ids = torch.empty(8, 128, dtype=torch.long, device="meta")
    opts = {"target": "v5e"}
    cm = torch.compile(model, backend="tpu", options=opts)
    cm(ids, labels=ids, use_cache=False).loss.backward()
    opt = torch.optim.AdamW(model.parameters())
    torch.compile(opt.step, backend="tpu", options=opts)()
    report = tpu_inductor.tpu_report(print_table=False)
    assert [p.role for p in report.programs] == ["forward", "backward", "optimizer"]
    assert not any("inference" in p.name for p in report.programs)
    (step,) = report.steps
    fwd, bwd, upd = report.programs
    params = sum(p.numel() * 4 for p in model.parameters())
    # the AdamW moments (2 x params, plus the step counters) sit beside the forward/backward
    assert 2 * params <= step.held_beside(fwd) <= 2 * params + 4096
    # beside the backward also the parameters it does not read (the embedding's weight: its
    # gradient needs only the token ids)
    unread = step.held_beside(bwd) - step.held_beside(fwd)
    assert unread == model.model.embed_tokens.weight.numel() * 4
    assert step.held_beside(upd) == 0  # the optimizer takes every resident value
    assert step.resident_bytes("parameter") == params
    peak, where = step.peak
    largest = max(p.peak_bytes for p in report.programs)
    assert where is bwd and peak > largest
    assert peak == max(p.peak_bytes + step.held_beside(p) for p in report.programs)
    for p in report.programs:  # the buffer assignment's HBM + code (XLA's peak adds VMEM)
        assert p.memory["peak"] > 0 and p.memory["hbm"] >= p.memory["argument"]
        assert p.peak_bytes == p.memory["hbm"] + p.memory["code"]
    # a chip whose usable HBM lies between the two: each program fits, the step does not
    usable = (largest + peak) // 2
    monkeypatch.setattr(programs.Program, "hbm_bytes", property(lambda self: usable))
    assert all(p.fits for p in report.programs) and not step.fits
    text = str(report)
    assert re.search(r"step peak [\d.]+ MiB during graph\d+-(forward|backward)#0", text), text
    assert "DOES NOT FIT" in step.verdict() and "activation checkpointing" in step.verdict()
    with pytest.raises(TargetCompileError, match="training step on v5e:1x1: step peak"):
        report.raise_for_errors()


@pytest.mark.parametrize("target", ["v5e:2x2x2slices", "tpu7x:2x2x1"])
def test_multi_slice_and_tpu7x_targets_compile_with_their_links(target):
    """Two v5e slices of 4 chips (libtpu's num_slices): dp's gradient all-reduce spans both,
    so it crosses the data-center network. TPU7x: 4 chips, 8 devices (2 per chip)."""
    t = tpu_inductor.tpu_target(target)
    assert t.num_devices == 8
    assert t.num_chips == (4 if target.startswith("tpu7x") else 8)
    opts = {"target": target, "mesh": t.mesh({"data": 8}), "shardings": "dp"}
    model = torch.nn.Sequential(torch.nn.Linear(128, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8))
    cm = torch.compile(model, backend="tpu", options=opts)
    cm(torch.randn(1024, 128)).sum().backward()  # activations >> weights: grads reduce
    report = tpu_inductor.tpu_report(print_table=False)
    assert [p.role for p in report.programs] == ["forward", "backward"]
    bwd = report.programs[1]
    assert bwd.compiled and bwd.chips == 8
    # the gradients (128*256 + 256 + 256*8 + 8 floats) are reduced over every device
    grads = (128 * 256 + 256 + 256 * 8 + 8) * 4
    ici = [c for c in bwd.comms if c.link == "ICI"]
    assert {c.axes for c in ici} == {"data"}, bwd.comms
    assert sum(c.op.bytes for c in ici) >= grads
    dcn = [c for c in bwd.comms if c.link == "DCN"]
    if "slices" in target:
        # XLA reduces within each slice over ICI, then sends across slices over the DCN
        assert dcn and {c.op.kind for c in dcn} == {"dcn-send"}
        assert sum(c.op.bytes for c in dcn) >= grads / 4
        assert bwd.comm_seconds > sum(c.seconds for c in ici)
    else:
        assert not dcn
    assert f"{t.chip.device_kind}" in str(report)

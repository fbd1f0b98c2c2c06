"""A plan at the sizes people train, in small: a Llama with 1024-token sequences, fsdp over a
v5p slice, compiled as one ``compile_step`` program through the planner. What it must hold:
attention without a ``[heads, L, L]`` buffer (splash, inside ``shard_map``), names from the
user's model, a report that agrees with itself, and a predicted step time."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

import tpu_inductor
from tpu_inductor.tpu import hlo, programs, targets
from tpu_inductor.training.planning import _Search, causal_lm_loss, token_ids

pytestmark = pytest.mark.tpu_compile
transformers = pytest.importorskip("transformers")

SEQ, HEADS = 1024, 4
CONFIG = dict(
    hidden_size=128,
    intermediate_size=256,
    num_hidden_layers=2,
    num_attention_heads=HEADS,
    num_key_value_heads=2,
    vocab_size=512,
    max_position_embeddings=SEQ,
)


@pytest.fixture(scope="module")
def plan():
    """``(report, step)`` of one probe: batch 4 x 1024 over 4 v5p devices (fsdp), full
    checkpointing, ``scan_layers``."""
    target = tpu_inductor.tpu_target("v5p-8")
    search = _Search(
        model_fn=lambda: transformers.LlamaForCausalLM(transformers.LlamaConfig(**CONFIG)),
        options={
            "target": "v5p-8",
            "mesh": target.mesh({"data": 4}),
            "shardings": "fsdp",
            "scan_layers": True,
        },
        loss_fn=causal_lm_loss,
        inputs_fn=token_ids,
        optimizer=torch.optim.AdamW,
        dtype=torch.bfloat16,
        over="batch",
        batch=4,
        seq_len=SEQ,
    )
    probe = search.probe("full", 4)
    assert probe.error is None, probe.error
    report = tpu_inductor.tpu_report(print_table=False)
    (step,) = [s for s in report.steps if s.name == "training step"]
    # the planner's figure is the report's: one step, one peak
    assert probe.peak_bytes == step.peak[0]
    return report, step


def _shapes(text: str):
    return [
        tuple(int(d) for d in dims.split(",") if d)
        for dims in re.findall(r"\b(?:bf16|f32|pred|s32|u32)\[([\d,]*)\]", text)
    ]


def test_attention_holds_no_heads_by_length_by_length_buffer(plan):
    report, step = plan
    (program,) = step.programs
    text = program.hlo_text
    assert "tpu_custom_call" in text  # splash's Pallas kernels, forward and backward
    square = [s for s in _shapes(text) if s[-2:] == (SEQ, SEQ)]
    # the causal mask transformers builds, one copy per sequence: never one per head
    assert square and max(int(np.prod(s[:-2])) for s in square) < HEADS, square
    # the kernels run in shard_map: q, k, v are not gathered onto every device
    gathered = re.findall(r"= (\S+) all-gather", text)
    assert not [g for g in gathered if re.match(rf"bf16\[4,{HEADS},{SEQ},", g)], gathered


def test_ops_are_named_by_the_users_modules_and_lines(plan):
    report, step = plan
    (program,) = step.programs
    scopes = {op.scope for op in hlo.top_ops(program.hlo_text)}
    sources = {op.source or "" for op in hlo.top_ops(program.hlo_text)}
    assert "model.layers.0-1/lax::scan" in scopes, scopes
    assert "backward/model.layers.0-1/lax::scan" in scopes, scopes
    assert any(s.startswith("lm_head/") for s in scopes), scopes
    assert any(s.startswith("backward/lm_head/") for s in scopes), scopes
    noise = ("__closure__", "cell_contents", "__self__", "__kwdefaults__", "_orig_mod")
    assert not [s for s in scopes if any(n in s for n in noise)], scopes
    assert any(s.startswith("modeling_llama.py:") for s in sources), sources
    # our own wrappers are not the user's line
    assert not [s for s in sources if s.startswith(("regions.py", "planning.py"))], sources


def test_the_report_agrees_with_itself(plan):
    report, step = plan
    text = str(report)
    for chip in targets.CHIPS.values():
        assert chip.usable_hbm_bytes <= chip.hbm_bytes
    assert "HBM usable by a program (libtpu's figure) of 95.93 GiB" in text
    for p in step.programs:  # the HBM column is a part of the moved column
        assert 0 < p.hbm_traffic <= p.bytes_moved
    # resident: the parameters and AdamW's two moments (bf16, as the parameters)
    params = step.resident_bytes("parameter")
    assert params > 0 and step.resident_bytes("state") >= 2 * params
    assert "optimizer state and buffers updated in place" in text
    parts = dict(step.peak_parts())
    assert sum(parts.values()) == step.peak[0]
    assert parts["parameters"] == params and parts["temporaries"] > 0
    assert "step peak = parameters" in text
    # the largest temporaries, each named by the module that makes it
    (program,) = step.programs
    sizes = [n for n, _, _ in program.temporaries]
    assert sizes and sizes == sorted(sizes, reverse=True) and sizes[0] <= parts["temporaries"]
    assert any(
        scope.split("/")[0] in ("lm_head", "backward") for _, scope, _ in program.temporaries
    )
    assert "its largest temporaries: " in text


def test_the_step_time_is_predicted(plan):
    _, step = plan
    (program,) = step.programs
    assert program.cycles > 0
    assert 1e9 < programs.cycle_rate("v5p") < 3e9  # the compiler's cycles per second
    assert step.predicted_seconds >= step.roofline_seconds > 0
    assert program.op_seconds > 0 and program.kernel_seconds > 0  # splash's matmuls
    assert step.predicted_seconds == pytest.approx(
        max(program.op_seconds + program.kernel_seconds, program.roofline_seconds)
    )
    step.model_flops, step.tokens = 1e12, 4 * SEQ
    assert step.predicted_mfu == pytest.approx(
        1e12 / 4 / (step.predicted_seconds * targets.CHIPS["v5p"].bf16_flops)
    )
    assert step.predicted_tokens_per_s_per_chip == pytest.approx(
        4 * SEQ / step.predicted_seconds / 4
    )

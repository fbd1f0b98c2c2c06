"""The lowering levers of issue 30, each checked on the TPU program it changes (compile only).

Each test compiles a small module for v5e with the lever on and off (its module switch) and
asserts what the lever is for in the optimized HLO; ``benchmarks.tpu_levers --issue 30``
measures the same switches on the full models.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import tpu_inductor
from tests.helpers import set_knobs
from tpu_inductor.tpu import programs


class _Attention(torch.nn.Module):
    """Q, K, V projections viewed as heads and transposed, SDPA, the output projection: what
    attention code writes (``linear(x).view(b, s, h, d).transpose(1, 2)``)."""

    def __init__(self, dim: int = 256, heads: int = 2):
        super().__init__()
        self.heads = heads
        self.q, self.k, self.v, self.o = (torch.nn.Linear(dim, dim, bias=False) for _ in range(4))

    def forward(self, x):
        b, s, d = x.shape

        def split(t):
            return t.view(b, s, self.heads, d // self.heads).transpose(1, 2)

        q, k, v = split(self.q(x)), split(self.k(x)), split(self.v(x))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o(out.transpose(1, 2).reshape(b, s, d))


def _program(module, x):
    """The one program ``module(x)`` compiles to for v5e (inference)."""
    torch._dynamo.reset()
    tpu_inductor.reset()
    with torch.no_grad():
        torch.compile(module, backend="tpu", options={"target": "v5e"})(x)
    (program,) = programs.PROGRAMS
    assert program.compiled, program.error
    return program


def _copies(module, x, opcodes=("copy",)) -> int:
    """Top-level ops of ``opcodes`` (copies) in the program ``module(x)`` compiles to."""
    return sum(1 for op in _program(module, x).ops if op.opcode in opcodes)


@pytest.mark.parametrize("dtype", [torch.bfloat16])
def test_half_precision_projections_need_no_layout_copies(dtype, monkeypatch):
    module = _Attention().to(dtype).eval()
    x = torch.randn(4, 256, 256, dtype=dtype)
    # On the graph as AOTAutograd hands it over: products over unflattened activations
    # (leading_dims.py) leave this module no copy either way (measured: 0 with or without it).
    set_knobs(monkeypatch, leading_dims_platforms=())
    set_knobs(monkeypatch, tpu_half_dots=False)
    before = _copies(module, x)
    set_knobs(monkeypatch, tpu_half_dots=True)
    after = _copies(module, x)
    # Measured: 1 copy without the lever (a projection's float32 result converted, then laid
    # out again for the heads), none with it.
    assert before > 0
    assert after == 0


def test_hand_written_step_split_like_ours(tmp_path):
    """``hand-2prog`` / ``hand-3prog`` (the floor of a split step) compile 2 and 3 programs;
    the split moves more bytes than the one-program step and computes the same FLOPs."""
    import json

    from benchmarks import tpu_programs

    rc = tpu_programs.main(
        [
            "--small",
            "--only", "train-bf16",
            "--contenders", "hand,hand-2prog,hand-3prog",
            "--in-process",
            "--out-dir", str(tmp_path),
            "--name", "split",
        ]
    )  # fmt: skip
    assert rc == 0
    data = json.loads((tmp_path / "split.json").read_text())
    rows, derived = data["rows"]["train-bf16"], data["derived"]["train-bf16"]
    assert [p["name"] for p in rows["hand-2prog"]["programs"]] == [
        "forward-backward",
        "optimizer",
    ]
    assert [p["name"] for p in rows["hand-3prog"]["programs"]] == [
        "forward",
        "backward",
        "optimizer",
    ]
    for split in ("hand-2prog", "hand-3prog"):
        assert derived[split]["bytes"] > 1.0, derived
        assert derived[split]["flops"] == pytest.approx(1.0, rel=0.05), derived


def test_products_over_unaligned_tokens_keep_their_leading_dims(monkeypatch):
    """197 tokens (a ViT's) are not a multiple of the TPU tile's 8 rows: flattening
    ``[4, 197, 256]`` to ``[788, 256]`` for a 2-D product is a physical reshape on each side
    of every linear layer, unless the product reads the activation as it is (leading_dims.py)."""
    mlp = torch.nn.Sequential(
        torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.Linear(512, 256)
    ).to(torch.bfloat16)
    x = torch.randn(4, 197, 256, dtype=torch.bfloat16)
    relayouts = ("copy", "reshape")  # on a TPU a reshape across tiles is physical
    set_knobs(monkeypatch, leading_dims_platforms=())
    before = _copies(mlp, x, relayouts)
    set_knobs(monkeypatch, leading_dims_platforms=("tpu",))
    after = _copies(mlp, x, relayouts)
    # Measured: 2 reshapes and 2 copies (the input's and a view's) without the rewrite; with it,
    # one copy: the result laid out row-major for the caller.
    assert before >= 3, before
    assert after <= 1, after


def test_layers_option_shrinks_the_transformers_for_one_run(tmp_path):
    """``--layers 1`` compiles one-layer models (what the README's per-lever figures read) and
    leaves the workloads' sizes as they were for the rest of the process."""
    import json

    from benchmarks import tpu_programs
    from benchmarks.tpu_workloads import SIZES

    before = SIZES["vit"][1]["layers"]
    rc = tpu_programs.main(
        [
            "--small", "--layers", "1",
            "--only", "vit-train-f32",
            "--contenders", "hand",
            "--in-process",
            "--out-dir", str(tmp_path),
            "--name", "layers",
        ]
    )  # fmt: skip
    assert rc == 0
    data = json.loads((tmp_path / "layers.json").read_text())
    assert data["sizes"]["vit"]["layers"] == 1 != before
    assert "error" not in data["rows"]["vit-train-f32"]["hand"]
    assert SIZES["vit"][1]["layers"] == before


def test_autocast_saves_no_bf16_copy_of_the_weights(monkeypatch):
    """A float32 Llama under bf16 autocast, compiled model + backward for v5e: with the lever,
    the forward hands the backward no bf16 copy of a linear layer's weight (the backward casts
    the resident float32 weight again, fused into its matmuls: capture/saved.py)."""
    from tests.helpers import tiny_llama

    model = tiny_llama()
    linear = sum(m.weight.numel() * 2 for m in model.modules() if isinstance(m, torch.nn.Linear))
    ids = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(0))
    outputs = {}
    for on in (False, True):
        set_knobs(monkeypatch, recast_parameters=on)
        torch._dynamo.reset()
        tpu_inductor.reset()
        cm = torch.compile(model, backend="tpu", options={"target": "v5e"})
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = cm(ids, labels=ids, use_cache=False).loss
        loss.backward()
        (fwd,) = [p for p in programs.PROGRAMS if p.role == "forward"]
        assert fwd.compiled, fwd.error
        # logical bytes (XLA's buffers of these small shapes are padded to the TPU's tiles)
        outputs[on] = sum(math.prod(o.shape) * np.dtype(o.dtype).itemsize for o in fwd.out_info)
    assert outputs[False] - outputs[True] == linear, (outputs, linear)


def _hand_attention_block_bytes(module, x) -> float:
    """The same block hand-written in JAX (``jax.nn.dot_product_attention``), compiled for
    v5e: what the block costs written as a JAX user writes it."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import SingleDeviceSharding

    from tpu_inductor.tpu.targets import tpu_target

    b, s, d = x.shape
    h = module.heads

    def block(x, wq, wk, wv, wo):
        q, k, v = ((x @ w.T).reshape(b, s, h, d // h) for w in (wq, wk, wv))
        out = jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="xla")
        return out.reshape(b, s, d) @ wo.T

    device = tpu_target("v5e").devices[0]
    weights = (module.q.weight, module.k.weight, module.v.weight, module.o.weight)
    args = [
        jax.ShapeDtypeStruct(tuple(t.shape), jnp.bfloat16, sharding=SingleDeviceSharding(device))
        for t in (x, *weights)
    ]
    cost = jax.jit(block).lower(*args).compile().cost_analysis()
    return (cost[0] if isinstance(cost, list) else cost)["bytes accessed"]


def test_bf16_attention_costs_what_jax_attention_costs(monkeypatch):
    """A bf16 attention block (projections, causal SDPA, output projection) for v5e moves the
    bytes ``jax.nn.dot_product_attention`` moves: with the fused-softmax form and no
    ``Precision.HIGHEST`` on bf16 operands, XLA makes scores, row max, exponentials and row sums
    one fusion; torch's form writes the float32 scores and reads them again."""

    module = _Attention(dim=512, heads=8).to(torch.bfloat16).eval()  # the benchmarks' heads
    x = torch.randn(4, 256, 512, dtype=torch.bfloat16)
    hand = _hand_attention_block_bytes(module, x)
    ours = _program(module, x).bytes_accessed
    set_knobs(monkeypatch, fused_softmax_platforms=())
    torch_form = _program(module, x).bytes_accessed
    # Measured (libtpu 0.0.42.1): hand 40.06 MB, ours 40.19 MB, torch's form 48.67 MB.
    assert ours <= 1.01 * hand, (ours, hand)
    assert torch_form > 1.1 * ours, (torch_form, ours)

"""The representative set compiled for two TPU generations (v5e and v6e), as CI runs it.

One model per family of the suite (forward; a training step for a trained row), static-cache
decode, flex attention through splash (Mosaic), MoE grouped GEMM (ragged dot), a Pallas custom
op, and dp/fsdp/tp plans on a 4-chip slice. Each must compile: every program, no error, every
output shaped and typed as CPU eager's. ``python -m benchmarks.tpu_models`` compiles every
model of the suite (docs/models.md's TPU column).
"""

from __future__ import annotations

import functools

import jax
import pytest
import torch
from jax.experimental import pallas as pl

import tpu_inductor
from tests.helpers import tiny_llama
from tests.lowering import test_flex_attention, test_grouped
from tests.models import test_diffusers, test_transformers
from tests.models.harness import run_target
from tpu_inductor.tpu import programs

pytestmark = pytest.mark.tpu_compile

TARGETS = ("v5e", "v6e")
# family -> (suite model, train): encoder, decoder (MHA, GQA), MoE, seq2seq, ViT, CNN, audio,
# text+image, timm, diffusion
FAMILIES = {
    "encoder": ("bert", True),
    "decoder": ("gpt2", True),
    "decoder-gqa": ("llama", True),
    "moe": ("mixtral", False),
    "seq2seq": ("t5", False),
    "vision-transformer": ("vit", True),
    "cnn": ("resnet", False),
    "audio": ("whisper", False),
    "text-image": ("clip", False),
    "timm": ("timm_resnet", True),  # a ResNet training step (libtpu crashed: issue 30.4)
    "diffusion": ("unet2d_condition", False),
}


def _case(name: str):
    cases = [*test_transformers.MODELS, *test_diffusers.MODELS, *test_grouped.model_cases()]
    cases += test_flex_attention.model_cases()
    found = [c for c in cases if c.name == name]
    if not found:
        pytest.skip(f"{name} is not in this suite")
    case = found[0]
    test_transformers._requires(case.library)
    return case


def _assert_compiled(result, roles: set[str]):
    assert result.shapes_match, "outputs differ in shape or dtype from eager's"
    assert result.programs, "nothing was compiled"
    failed = [f"{p.name}: {p.error}" for p in result.programs if not p.compiled]
    assert not failed, "\n".join(failed)
    assert roles <= {p.role for p in result.programs}
    for p in result.programs:
        assert p.peak_bytes > 0 and p.fits


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("family", list(FAMILIES))
def test_family_compiles(family, target):
    name, train = FAMILIES[family]
    result = run_target(_case(name), target, train=train)
    _assert_compiled(result, {"forward", "backward", "optimizer"} if train else {"inference"})


@pytest.mark.parametrize("target", TARGETS)
def test_flex_attention_compiles_splash_with_mosaic(target):
    """A Llama with flex_attention at a sequence splash takes (a multiple of 128): its forward
    and backward programs hold splash attention's Pallas kernels, compiled by Mosaic."""
    model = tiny_llama(attn_implementation="flex_attention", max_position_embeddings=256)
    ids = torch.randint(0, 128, (1, 128), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = model(ids, labels=ids, use_cache=False)
    cm = torch.compile(model, backend="tpu", options={"target": target})
    out = cm(ids, labels=ids, use_cache=False)
    out.loss.backward()
    assert out.logits.shape == expected.logits.shape and out.logits.dtype == expected.logits.dtype
    assert all(p.compiled for p in programs.PROGRAMS)
    for role in ("forward", "backward"):
        assert any("tpu_custom_call" in p.hlo_text for p in programs.PROGRAMS if p.role == role), (
            role
        )


@pytest.mark.parametrize("target", TARGETS)
def test_moe_grouped_gemm_compiles(target):
    result = run_target(_case("qwen3_moe (1 layer)"), target, train=True)
    _assert_compiled(result, {"forward", "backward"})
    assert any("ragged" in p.hlo_text for p in result.programs)


@pytest.mark.parametrize("target", TARGETS)
def test_static_cache_decode_compiles(target):
    model = tiny_llama()
    ids = torch.randint(1, 128, (1, 8), generator=torch.Generator().manual_seed(0))
    model.forward = torch.compile(model.forward, backend="tpu", options={"target": target})
    out = model.generate(
        ids, max_new_tokens=3, min_new_tokens=3, do_sample=False, cache_implementation="static"
    )
    assert out.shape == (1, 11)
    roles = [p.role for p in programs.PROGRAMS]
    assert "decode" in roles, roles
    assert all(p.compiled for p in programs.PROGRAMS)
    decode = next(p for p in programs.PROGRAMS if p.role == "decode")
    assert decode.donated_bytes > 0  # the KV cache is updated in place: donated


@torch.library.custom_op("tpu_suite::axpy", mutates_args=())
def axpy(x: torch.Tensor, y: torch.Tensor, alpha: float) -> torch.Tensor:
    return x + alpha * y


@axpy.register_fake
def _(x, y, alpha):
    return torch.empty_like(x)


def _axpy_kernel(x_ref, y_ref, o_ref, *, alpha):
    o_ref[...] = x_ref[...] + alpha * y_ref[...]


def _axpy_pallas(x, y, alpha):
    spec = pl.BlockSpec((8, x.shape[1]), lambda i: (i, 0))
    return pl.pallas_call(
        functools.partial(_axpy_kernel, alpha=alpha),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        grid=(x.shape[0] // 8,),
        in_specs=[spec, spec],
        out_specs=spec,
        interpret=tpu_inductor.pallas_interpret(),
    )(x, y)


@pytest.mark.parametrize("target", TARGETS)
def test_pallas_custom_op_compiles_with_mosaic(target):
    seen = []

    def lowering(x, y, alpha):
        seen.append(tpu_inductor.pallas_interpret())
        return _axpy_pallas(x, y, alpha)

    tpu_inductor.register_lowering(axpy, lowering)
    try:
        f = torch.compile(lambda x, y: axpy(x, y, 2.0).relu(), backend="tpu",
                          options={"target": target})  # fmt: skip
        out = f(torch.randn(32, 128), torch.randn(32, 128))
    finally:
        tpu_inductor.unregister_lowering(axpy)
    assert out.shape == (32, 128) and out.dtype == torch.float32
    assert seen == [False]  # compiled for the TPU: Mosaic, not interpret mode
    (program,) = programs.PROGRAMS
    assert program.compiled and "tpu_custom_call" in program.hlo_text


@pytest.mark.parametrize("target", ("v5e:2x2", "v6e:2x2"))
def test_sharding_plans_compile_on_a_slice(target):
    """dp, fsdp and tp on a 4-chip slice: every program compiles over the 4 chips; per chip,
    fsdp holds well under half of dp's optimizer-step arguments (each state tensor split 4
    ways; the TPU's (8, 128) tiles pad such small shards) and tp less than dp."""
    topology = tpu_inductor.tpu_target(target)
    ids = torch.randint(0, 128, (4, 16), generator=torch.Generator().manual_seed(0))
    per_chip = {}
    for plan in ("dp", "fsdp", "tp"):
        tpu_inductor.reset()
        torch._dynamo.reset()
        axes = {"data": 2, "model": 2} if plan == "tp" else {"data": 4}
        opts = {"target": target, "mesh": topology.mesh(axes), "shardings": plan}
        model = tiny_llama(hidden_size=64, intermediate_size=128, num_attention_heads=4)
        cm = torch.compile(model, backend="tpu", options=opts)
        cm(ids, labels=ids, use_cache=False).loss.backward()
        opt = torch.optim.AdamW(model.parameters())
        torch.compile(opt.step, backend="tpu", options=opts)()
        report = tpu_inductor.tpu_report(print_table=False)
        assert [p.role for p in report.programs] == ["forward", "backward", "optimizer"], plan
        assert all(p.compiled and p.chips == 4 for p in report.programs), plan
        per_chip[plan] = report.programs[2].memory["argument"]
        # the collectives each plan must have, on the mesh axes it shards, in the roofline
        comms = {(c.op.kind, c.axes) for p in report.programs[:2] for c in p.comms}
        expected = {
            "dp": ("all-reduce", "data"),  # gradients (and the mean loss) over the batch
            "fsdp": ("all-gather", "data"),  # each layer's weights gathered before use
            "tp": ("all-reduce", "model"),  # row-parallel matmuls' partial sums
        }[plan]
        assert expected in comms, (plan, comms)
        for p in report.programs:
            assert p.roofline_seconds >= p.comm_seconds >= 0
        assert report.programs[1].comm_seconds > 0, plan
        assert "communication: the collectives of each optimized program" in str(report)
        # each chip does its share of the matmuls, not all of them
        forward = report.programs[0]
        assert forward.flops < forward.total_matmul_flops * 0.6, plan
    params = sum(p.numel() * 4 for p in model.parameters())
    assert per_chip["dp"] >= 4 * params  # param, grad, exp_avg, exp_avg_sq on every chip
    assert per_chip["fsdp"] < 0.5 * per_chip["dp"]
    assert per_chip["tp"] < per_chip["dp"]

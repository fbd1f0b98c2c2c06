"""A decode step at the bandwidth limit, compiled for TPUs without one.

A transformers Llama (hidden 1024, 4 layers, grouped-query heads 8/2, vocabulary 32,000, bf16)
takes one decode step over a ``StaticCache``. Its HBM traffic must be within 1.1x the minimum
(the weights, the cache read once, the new K/V rows and the logits written), counted by hand
here; the grouped K/V heads are never copied (no ``repeat_kv`` broadcast in the program); the
cache is donated, written in place and reported as resident state; the report gives the
multiple of the minimum and tokens/s/chip. A prefill over the cache runs splash attention
(no ``[heads, L, S]`` buffer). ``serving_plan`` finds the largest batch per mesh plan.
"""

from __future__ import annotations

import pytest
import torch

import tpu_inductor

pytestmark = pytest.mark.tpu_compile
transformers = pytest.importorskip("transformers")

HIDDEN, LAYERS, HEADS, KV_HEADS, VOCAB, FFN = 1024, 4, 8, 2, 32000, 2816
HEAD_DIM = HIDDEN // HEADS
BF16 = 2


def _llama(kv_heads: int = KV_HEADS, **sizes):
    config = transformers.LlamaConfig(
        hidden_size=HIDDEN,
        intermediate_size=FFN,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=kv_heads,
        vocab_size=VOCAB,
        **sizes,
    )
    with torch.device("meta"):
        return transformers.LlamaForCausalLM(config).to(torch.bfloat16).eval()


def _step(target: str, batch: int, context: int, length: int = 1, kv_heads=KV_HEADS, **options):
    """Compile one forward of ``length`` new tokens over a cache of ``context`` positions;
    returns the report and its one program."""
    tpu_inductor.reset()
    torch._dynamo.reset()
    model = _llama(kv_heads)
    cache = transformers.StaticCache(config=model.config, max_cache_len=context)
    cache.early_initialization(batch, kv_heads, HEAD_DIM, torch.bfloat16, "meta")
    ids = torch.zeros(batch, length, dtype=torch.long, device="meta")
    compiled = torch.compile(model, backend="tpu", options={"target": target, **options})
    with torch.no_grad():
        compiled(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
    report = tpu_inductor.tpu_report(print_table=False)
    report.raise_for_errors()
    (program,) = report.programs
    return report, program


def _minimum(batch: int, context: int) -> int:
    """The hand count: every weight but the embedding table once, the table's looked-up rows,
    the KV cache once, the new K/V rows and the logits written."""
    per_layer = (
        HIDDEN * HIDDEN * 2  # q and o
        + 2 * HIDDEN * KV_HEADS * HEAD_DIM  # k and v
        + 3 * HIDDEN * FFN  # gate, up, down
        + 2 * HIDDEN  # the two norms
    )
    weights = (LAYERS * per_layer + HIDDEN + VOCAB * HIDDEN) * BF16  # + final norm, lm_head
    rows = batch * HIDDEN * BF16
    kv = LAYERS * 2 * batch * KV_HEADS * context * HEAD_DIM * BF16
    new = LAYERS * 2 * batch * KV_HEADS * HEAD_DIM * BF16
    logits = batch * VOCAB * BF16
    return weights + rows + kv + new + logits


@pytest.mark.parametrize("target", ["v5e", "v6e"])
@pytest.mark.parametrize("context", [2048, 8192])
@pytest.mark.parametrize("batch", [1, 64])
def test_decode_at_the_minimum(target, batch, context):
    report, p = _step(target, batch, context)
    assert p.role == "decode" and p.tokens == batch
    minimum = _minimum(batch, context)
    # the program's minimum is the hand count (to the small outputs: the index, a counter)
    assert p.minimum_traffic == pytest.approx(minimum, rel=0.002)
    assert p.hbm_traffic <= 1.1 * p.minimum_traffic, (p.hbm_traffic, p.minimum_traffic)
    # GQA's heads are never copied: no broadcast of the cache in the program (small ones, the
    # key-chunk loop's initial max and sums, are fine)
    copies = [o for o in p.ops if "aten::expand" in o.scope or o.opcode == "broadcast"]
    assert not [o for o in copies if o.bytes > 2**20], copies
    kv = LAYERS * 2 * batch * KV_HEADS * context * HEAD_DIM * BF16
    counters = LAYERS * 8  # each layer's int64 position counter, updated in place too
    assert p.donated_bytes == kv + counters  # the cache, written in place
    (step,) = report.steps
    assert step.resident_bytes("state") == kv + counters
    text = str(report)
    assert "KV cache and buffers updated in place" in text
    assert f"{p.hbm_traffic / p.minimum_traffic:.2f}x the minimum" in text
    rates = p.tokens_per_s_per_chip
    limit = batch / (minimum / p.target.chip.hbm_bytes_per_s)
    assert rates["limit"] == pytest.approx(limit, rel=0.003)
    assert rates["roofline"] <= rates["limit"] * 1.001  # to the counter's rounding
    assert f"{rates['limit']:,.0f} at the HBM limit" in text


def test_prefill_runs_splash_over_the_cache():
    report, p = _step("v5e", 1, 8192, length=2048)
    assert p.role == "prefill" and p.tokens == 2048
    assert any("tpu_custom_call" in o.opcode for o in p.ops)  # splash's Pallas kernel
    # nothing of [heads, L, S] (one shared [L, S] mask at most)
    heads_square = HEADS * 2048 * 8192 * BF16
    assert all(size < heads_square for size, _, _ in p.temporaries)
    rates = p.tokens_per_s_per_chip
    assert rates["compute"] >= rates["roofline"] > 0
    assert "at the compute ceiling" in str(report)


def test_tp_places_the_cache_over_heads():
    """Under tp the cache's kv heads are split over ``model``: a quarter per chip on 4."""
    target = tpu_inductor.tpu_target("v5e:2x2")
    mesh = target.mesh({"data": 1, "model": 4})
    report, p = _step("v5e:2x2", 8, 2048, kv_heads=4, mesh=mesh, shardings="tp")
    kv = LAYERS * 2 * 8 * 4 * 2048 * HEAD_DIM * BF16
    (step,) = report.steps
    assert step.resident_bytes("state") == kv // 4 + LAYERS * 8
    assert kv // 4 <= p.memory["alias"] <= kv // 4 + 4096  # written in place, per device


def test_serving_plan_finds_the_largest_batch():
    config = transformers.LlamaConfig(
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=4096,
    )
    plan = tpu_inductor.serving_plan(
        lambda: transformers.LlamaForCausalLM(config),
        "v5e:2x2",
        context=65536,
        prompt=1024,
        meshes=[(2, 2), (4, 1)],
        print_table=False,
    )
    assert [r.plan for r in plan.rows] == ["dp 2 x tp 2", "dp 4"]
    hbm = tpu_inductor.tpu_target("v5e").chip.usable_hbm_bytes
    for row in plan.rows:
        assert row.batch is not None and row.batch % row.data == 0
        probes = {p.size: p for p in row.probes}
        assert probes[row.batch].fits and row.peak_bytes <= hbm
        # the next batch was probed and does not fit (or the line put it over by a margin)
        above = [p for p in row.probes if p.size > row.batch]
        assert above and not any(p.fits for p in above)
        # per chip: its data shard's sequences, its model shard's kv heads (2 layers, K and
        # V, 2 kv heads, 64k positions, head dim 64)
        per_sequence = 2 * 2 * 2 * 65536 * 64 * BF16
        kv = row.batch // row.data * per_sequence // row.model
        assert kv <= row.kv_bytes <= kv + 64  # and the two layers' position counters
        assert row.x_minimum <= 1.1
        # the roofline is at most the limit (to the HBM counter's rounding of tiled layouts)
        assert row.decode["limit"] * 1.001 >= row.decode["roofline"] > 0
        assert row.prefill["compute"] > 0
    text = str(plan)
    assert "dp 2 x tp 2" in text and "decode tok/s/chip" in text

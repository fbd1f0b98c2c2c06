"""A compiled one-token decode step with a transformers ``StaticCache`` matches eager.

A tiny Llama with grouped-query attention (4 heads, 2 KV heads) and a static cache of 64
positions, prefilled eagerly with the same prompt into two caches; then several decode steps in a
row, ``model(input_ids=ids[:, None], cache=cache, use_cache=True)``, eager on one cache and
``torch.compile(model, backend="tpu")`` on the other, both fed eager's greedy tokens. After each
step the logits and every layer's keys, values and ``cumulative_length`` must match eager's:
dtype and shape exactly, values within the dtype's model tolerance. The decode graph is compiled
once: later steps reuse it (the position lives in the cache's ``cumulative_length`` tensor).
"""

from __future__ import annotations

import pytest
import torch

import tpu_inductor.runtime.cache
from tests.helpers import assert_same
from tpu_inductor.core.dtypes import tolerance

transformers = pytest.importorskip("transformers")

CONTEXT = 64
PROMPT = 8
STEPS = 4
HEADS, KV_HEADS, HIDDEN = 4, 2, 64


def _model(dtype: torch.dtype):
    config = transformers.LlamaConfig(
        hidden_size=HIDDEN,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        vocab_size=128,
        max_position_embeddings=CONTEXT,
    )
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).to(dtype).eval()


def _prefilled_cache(model, prompt: torch.Tensor, dtype: torch.dtype):
    """A static cache filled eagerly with ``prompt``, and the greedy next ids."""
    cache = transformers.StaticCache(config=model.config, max_cache_len=CONTEXT)
    cache.early_initialization(prompt.shape[0], KV_HEADS, HIDDEN // HEADS, dtype, "cpu")
    logits = model(input_ids=prompt, cache=cache, use_cache=True).logits
    return cache, logits[:, -1].argmax(-1)


def _state(cache) -> list:
    return [(layer.keys, layer.values, layer.cumulative_length) for layer in cache.layers]


@pytest.mark.parametrize("batch", [1, 8, 64])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_compiled_decode_step_matches_eager(dtype, batch):
    atol, rtol = tolerance(dtype, level="model")
    model = _model(dtype)
    prompt = torch.randint(0, 128, (batch, PROMPT), generator=torch.Generator().manual_seed(1))
    compiled = torch.compile(model, backend="tpu", fullgraph=True)
    with torch.no_grad():
        eager_cache, ids = _prefilled_cache(model, prompt, dtype)
        ours_cache, _ = _prefilled_cache(model, prompt, dtype)
        for step in range(STEPS):
            graphs = tpu_inductor.runtime.cache.STATS.graphs
            expected = model(input_ids=ids[:, None], cache=eager_cache, use_cache=True).logits
            actual = compiled(input_ids=ids[:, None], cache=ours_cache, use_cache=True).logits
            assert_same(actual, expected, atol, rtol, f"logits at step {step}")
            assert_same(_state(ours_cache), _state(eager_cache), atol, rtol, f"cache at {step}")
            assert int(ours_cache.layers[0].cumulative_length) == PROMPT + step + 1
            if step:
                assert tpu_inductor.runtime.cache.STATS.graphs == graphs, "compiled again"
            ids = expected[:, -1].argmax(-1)

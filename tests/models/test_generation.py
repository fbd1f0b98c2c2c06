"""``model.generate()`` with the forward compiled by ``backend="tpu"`` and a static KV cache.

Greedy decoding must produce exactly eager's tokens. Sampling draws its tokens in eager Python
(``torch.multinomial`` outside the compiled forward, from torch's generator), so under the same
``torch.manual_seed`` it must match eager too. A static cache keeps every decode step at the same
shapes, so after the prefill graph and the one-token decode graph nothing may be compiled again,
however many tokens are generated and however many times ``generate`` runs.
"""

from __future__ import annotations

import pytest
import torch

import tpu_inductor.runtime.cache
from tests.models.test_transformers import DECODER

transformers = pytest.importorskip("transformers")

PROMPT = 6
NEW_TOKENS = 12
# Prefill ([batch, prompt]) and decode ([batch, 1]): one Dynamo graph each, no more.
MAX_GRAPHS = 2


def _model(model_type: str):
    config = transformers.AutoConfig.for_model(model_type, **{**DECODER, "use_cache": True})
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()


def _prompt(seed: int) -> dict:
    ids = torch.randint(
        3, DECODER["vocab_size"], (2, PROMPT), generator=torch.Generator().manual_seed(seed)
    )
    mask = torch.ones_like(ids)
    # Left padding on the second row: the masked positions go through the compiled graph too.
    ids[1, :2] = DECODER["pad_token_id"]
    mask[1, :2] = 0
    return {"input_ids": ids, "attention_mask": mask}


def _generate(model, prompt: dict, sample: bool) -> torch.Tensor:
    torch.manual_seed(1234)
    kwargs = (
        {"do_sample": True, "top_k": 20, "temperature": 1.5} if sample else {"do_sample": False}
    )
    return model.generate(
        **prompt,
        max_new_tokens=NEW_TOKENS,
        min_new_tokens=NEW_TOKENS,
        cache_implementation="static",
        pad_token_id=DECODER["pad_token_id"],
        **kwargs,
    )


class _Compiles:
    """Dynamo frames/graphs and backend graphs/traces compiled inside the block."""

    def __enter__(self):
        counters = torch._dynamo.utils.counters
        stats = tpu_inductor.runtime.cache.STATS
        self._start = (
            counters["frames"]["ok"],
            counters["stats"]["unique_graphs"],
            stats.graphs,
            stats.traces,
        )
        return self

    def __exit__(self, *exc):
        counters = torch._dynamo.utils.counters
        stats = tpu_inductor.runtime.cache.STATS
        now = (
            counters["frames"]["ok"],
            counters["stats"]["unique_graphs"],
            stats.graphs,
            stats.traces,
        )
        self.frames, self.graphs, self.backend_graphs, self.traces = (
            b - a for a, b in zip(self._start, now, strict=True)
        )
        return False


@pytest.mark.parametrize("model_type", ["llama", "qwen2"])
def test_generate_static_cache(model_type: str):
    model = _model(model_type)
    runs = [(seed, sample) for sample in (False, True) for seed in (0, 1)]
    expected = {run: _generate(model, _prompt(run[0]), run[1]) for run in runs}

    torch._dynamo.utils.counters.clear()
    model.forward = torch.compile(model.forward, backend="tpu")
    with _Compiles() as first:
        actual = _generate(model, _prompt(0), sample=False)
    assert actual.shape == (2, PROMPT + NEW_TOKENS)
    assert torch.equal(actual, expected[0, False]), f"{actual}\n!=\n{expected[0, False]}"
    # NEW_TOKENS forward calls compiled at most MAX_GRAPHS times: no recompile per token.
    assert 1 <= first.graphs <= MAX_GRAPHS, f"{first.graphs} Dynamo graphs for {NEW_TOKENS} tokens"
    assert first.frames <= MAX_GRAPHS
    assert first.backend_graphs <= MAX_GRAPHS and first.traces <= MAX_GRAPHS

    # Another prompt of the same shape, and sampling, reuse everything.
    with _Compiles() as again:
        for seed, sample in runs[1:]:
            actual = _generate(model, _prompt(seed), sample)
            want = expected[seed, sample]
            assert torch.equal(actual, want), f"prompt {seed} sample={sample}: {actual} != {want}"
    assert (again.frames, again.graphs, again.backend_graphs, again.traces) == (0, 0, 0, 0)

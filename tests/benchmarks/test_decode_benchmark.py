"""``benchmarks.decode`` and its hand-written JAX decode step (``benchmarks.hand_decode``).

The hand-written step must give the transformers model's logits and KV cache from the same
weights (prefill and several decode steps, grouped-query attention); the benchmark must run at a
tiny size, write its results and find its contenders agreeing with eager. Speed is never
asserted.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from benchmarks import decode, hand_decode
from benchmarks.hand_llama import LlamaSizes, params_from_torch
from tpu_inductor.core.dtypes import tolerance

transformers = pytest.importorskip("transformers")

SIZES = LlamaSizes(hidden=64, intermediate=128, layers=2, heads=4, kv_heads=2, vocab=256)
TINY = ["--hidden", "64", "--intermediate", "128", "--layers", "2", "--heads", "4"]
TINY += ["--kv-heads", "2", "--vocab", "256", "--context", "32", "--prompt", "4"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_hand_written_decode_matches_transformers(dtype):
    import jax.numpy as jnp

    atol, rtol = tolerance(dtype, level="model")
    batch, context = 3, 16
    model = decode.build_model(SIZES, dtype)
    cache = decode.static_cache(model, batch, context, dtype)
    params = params_from_torch(model)
    jax_cache = hand_decode.empty_cache(SIZES, batch, context, params["embed"].dtype)
    prefill = hand_decode.jitted_prefill(SIZES)
    step = hand_decode.jitted_decode_step(SIZES, return_logits=True)
    greedy = hand_decode.jitted_decode_step(SIZES)
    prompt = torch.randint(0, SIZES.vocab, (batch, 5), generator=torch.Generator().manual_seed(1))

    def close(actual, expected, what):
        assert actual.dtype == jnp.dtype(str(expected.dtype).removeprefix("torch.")), what
        assert tuple(actual.shape) == tuple(expected.shape), what
        torch.testing.assert_close(
            torch.from_numpy(np.asarray(actual, np.float32)),
            expected.float(),
            atol=atol,
            rtol=rtol,
            msg=lambda m: f"{what}: {m}",
        )

    with torch.no_grad():
        expected = model(input_ids=prompt, cache=cache, use_cache=True).logits[:, -1]
        logits, jax_cache, pos = prefill(params, jax_cache, prompt.numpy().astype(np.int32))
        close(logits, expected, "prefill logits")
        for i in range(3):
            ids = expected.argmax(-1)
            expected = model(input_ids=ids[:, None], cache=cache, use_cache=True).logits[:, -1]
            logits, jax_cache, pos = step(params, jax_cache, ids.numpy().astype(np.int32), pos)
            close(logits, expected, f"logits at step {i}")
            for n, layer in enumerate(cache.layers):
                close(jax_cache[n][0], layer.keys, f"keys of layer {n} at step {i}")
                close(jax_cache[n][1], layer.values, f"values of layer {n} at step {i}")
            assert int(pos) == 5 + i + 1
        # The timed step: the greedy ids of the same logits, as int32.
        ids = expected.argmax(-1)
        expected = model(input_ids=ids[:, None], cache=cache, use_cache=True).logits[:, -1]
        next_ids, _, _ = greedy(params, jax_cache, ids.numpy().astype(np.int32), pos)
    assert next_ids.dtype == jnp.int32
    if dtype == torch.float32:  # bfloat16 logits this close may break ties differently
        assert np.asarray(next_ids).tolist() == expected.argmax(-1).tolist()


def test_a_differing_token_is_a_tie_only_when_eagers_logits_for_both_are_close():
    ref = np.array([[0.0, 2.0, 1.99], [5.0, 0.0, 0.0]], np.float32)
    check = {"tokens_equal": [], "ties": 0, "max_logit_diff": 0.0}
    decode.compare(check, ref, ref, 0.02, 0.02)
    near = ref + np.array([[0.0, 0.0, 0.02], [0.0, 0.0, 0.0]], np.float32)  # row 0 flips
    decode.compare(check, near, ref, 0.02, 0.02)
    assert check["tokens_equal"] == [True, False] and check["ties"] == 1
    assert check["max_logit_diff"] == pytest.approx(0.02, abs=1e-6)
    far = ref + np.array([[0.0, 0.0, 0.0], [0.0, 0.0, 5.5]], np.float32)  # row 1: no tie
    decode.compare(check, far, ref, 0.02, 0.02)
    assert check["tokens_equal"] == [True, False, False] and check["ties"] == 1


def test_decode_benchmark_runs_and_its_contenders_agree(tmp_path):
    argv = [*TINY, "--batches", "2", "--steps", "2", "--repeats", "2", "--warmup", "1"]
    record = decode.main([*argv, "--check-steps", "2", "--results", str(tmp_path)])
    assert json.loads((tmp_path / "decode.json").read_text()) == record
    assert "| 2 |" in (tmp_path / "decode.md").read_text()
    assert record["machine"]["load_avg"] is not None
    assert record["command"].startswith("python -m benchmarks.decode")
    (row,) = record["results"]["rows"]
    assert set(row["contenders"]) == set(decode.CONTENDERS)
    for name, c in row["contenders"].items():
        assert c["check"]["agrees"], (name, c["check"])
        assert len(c["check"]["tokens_equal"]) == 3  # the prefill and two steps
        assert c["check"]["cache_max_diff"] < 1e-5, name
        assert math.isfinite(c["ms_per_token"]) and c["ms_per_token"] > 0, name
        assert len(c["samples_ms"]) == 2
    assert set(row["ratios"]) == {"tpu/eager", "tpu/jax", "tpu-keep/eager", "tpu-keep/jax"}

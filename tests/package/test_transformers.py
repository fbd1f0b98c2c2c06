"""``tpu_inductor.transformers``: transformers' own ``generate(compile_config=...)`` reaches the
backend (under ``enable`` or with ``compile_config()``) with eager's greedy tokens, and
``compile_config`` checks its arguments at once."""

from __future__ import annotations

import pytest
import torch

import tpu_inductor
from tests.helpers import tiny_llama
from tpu_inductor.core.errors import InvalidOptionError

NEW_TOKENS = 8


def _generate(model, ids, **kwargs):
    return model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=NEW_TOKENS,
        min_new_tokens=NEW_TOKENS,
        do_sample=False,
        cache_implementation="static",
        **kwargs,
    )


def _graphs() -> int:
    return tpu_inductor.runtime.cache.STATS.graphs


def _llama_and_prompt():
    model = tiny_llama().eval()
    ids = torch.randint(1, 128, (2, 6), generator=torch.Generator().manual_seed(0))
    return model, ids


def test_generate_with_transformers_compile_config():
    """``CompileConfig(backend="tpu")`` on a CPU model compiles (under ``enable``) and gives
    eager's greedy tokens; without ``enable`` transformers skips it, as it always did, and
    ``compile_config()`` alone (no patching at all) compiles too."""
    transformers = pytest.importorskip("transformers")
    model, ids = _llama_and_prompt()
    expected = _generate(model, ids)
    assert expected.shape == (2, 6 + NEW_TOKENS)

    with tpu_inductor.transformers.enable(model) as handle:
        # transformers' default mode="reduce-overhead" reaches the backend as mode=.
        actual = _generate(model, ids, compile_config=transformers.CompileConfig(backend="tpu"))
        assert torch.equal(actual, expected), f"{actual}\n!=\n{expected}"
        assert _graphs() >= 1, "generate() did not compile through tpu-inductor"
        assert any("inference" in g.name for g in tpu_inductor.report(print_table=False).graphs)
        # options with CompileConfig's default mode: torch alone refuses mode and options.
        with_options = transformers.CompileConfig(backend="tpu", options={"device": "cpu"})
        assert torch.equal(_generate(model, ids, compile_config=with_options), expected)
        # enable() set the model's default compile_config: no argument needed.
        assert model.generation_config.compile_config is handle.config
        assert torch.equal(_generate(model, ids), expected)

    assert "generate" not in model.__dict__
    assert model.generation_config.compile_config is None
    assert not hasattr(model, "_compiled_call")
    torch._dynamo.reset()
    before = _graphs()
    plain = _generate(model, ids, compile_config=transformers.CompileConfig(backend="tpu"))
    assert torch.equal(plain, expected)
    assert _graphs() == before, "transformers compiled a CPU model without enable()"

    helper = tpu_inductor.transformers.compile_config(backend="tpu_inductor")
    assert torch.equal(_generate(model, ids, compile_config=helper), expected)
    assert _graphs() > before
    assert "generate" not in model.__dict__


def test_compile_config_checks_at_once():
    make = tpu_inductor.transformers.compile_config
    with pytest.raises(InvalidOptionError, match="did you mean 'device'"):
        make(options={"devcie": "cpu"})
    with pytest.raises(InvalidOptionError, match="mode or options, not both"):
        make(mode="max-autotune", options={"device": "cpu"})
    with pytest.raises(InvalidOptionError, match="for tpu-inductor's backends"):
        make(backend="inductor")
    with pytest.raises(TypeError, match="enable\\(\\) is for transformers models"):
        tpu_inductor.transformers.enable(torch.nn.Linear(2, 2))


def test_inputs_in_forward_is_scoped_to_the_model_and_undone():
    """It sets two attributes on this model only, which generate then reads (eager here: the
    values are the same either way), and ``disable`` (or ``with``) removes them."""
    model, ids = _llama_and_prompt()
    other = tiny_llama().eval()
    want = _generate(model, ids)
    with tpu_inductor.transformers.inputs_in_forward(model):
        assert "create_masks_for_generate" in model.__dict__
        assert "_prepare_position_ids_for_generation" in model.__dict__
        assert "create_masks_for_generate" not in other.__dict__
        assert torch.equal(_generate(model, ids), want)
    assert "create_masks_for_generate" not in model.__dict__
    assert "_prepare_position_ids_for_generation" not in model.__dict__
    with pytest.raises(TypeError, match="inputs_in_forward\\(\\) is for transformers models"):
        tpu_inductor.transformers.inputs_in_forward(torch.nn.Linear(2, 2))

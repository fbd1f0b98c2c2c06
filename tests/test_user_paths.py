"""The ways users reach the backend besides ``torch.compile(model, backend="tpu")``: transformers'
own ``generate(compile_config=...)``, torch.compile's ``mode=``, and what happens to bad
``options`` (when they are seen, and that every problem is listed at once)."""

from __future__ import annotations

import pytest
import torch

import tpu_inductor
from tests.helpers import assert_same, tiny_llama
from tpu_inductor.core.errors import InvalidOptionError
from tpu_inductor.dynamo.options import MODES, parse_options

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


def _fn(x, w):
    return torch.nn.functional.gelu(x @ w).sin().sum(-1)


@pytest.mark.parametrize("backend", ["tpu", "tpu_inductor"])
@pytest.mark.parametrize("mode", list(MODES))
def test_every_torch_compile_mode(mode, backend):
    x, w = torch.randn(4, 8), torch.randn(8, 8)
    actual = torch.compile(_fn, backend=backend, mode=mode, fullgraph=True)(x, w)
    assert_same(actual, _fn(x, w))
    assert _graphs() == 1


def test_unknown_mode_lists_the_valid_ones():
    f = torch.compile(_fn, backend="tpu", mode="fastest")  # torch doesn't check it for us
    with pytest.raises(InvalidOptionError) as info:
        f(torch.randn(2, 8), torch.randn(8, 8))
    text = str(info.value)
    assert "mode 'fastest' is not a torch.compile mode" in text
    for mode in MODES:
        assert repr(mode) in text


def test_every_option_problem_at_the_first_call():
    """torch.compile() itself never shows options to a custom backend; the first call does,
    and lists every problem: unknown key, bad value, wrong type, a bad mesh."""
    options = {"devcie": "cpu", "device": "quantum", "max_executables": "many", "mesh": "x"}
    f = torch.compile(_fn, backend="tpu", options=options)  # no error yet: torch's design
    with pytest.raises(InvalidOptionError) as info:
        f(torch.randn(2, 8), torch.randn(8, 8))
    text = str(info.value)
    assert "unknown option 'devcie' (did you mean 'device'?)" in text
    assert "option 'device' must be one of ('tpu', 'gpu', 'cpu') or None, got 'quantum'" in text
    assert "option 'max_executables' must be a positive int, got 'many'" in text
    assert "option 'mesh' must be a jax.sharding.Mesh" in text
    assert "Known options:" in text


@pytest.mark.parametrize("options", [["device", "cpu"], "cpu", ("device",)])
def test_options_that_are_not_a_dict(options):
    f = torch.compile(_fn, backend="tpu", options=options)  # torch passes them on as given
    with pytest.raises(InvalidOptionError, match="options must be a dict of option names"):
        f(torch.randn(2, 8), torch.randn(8, 8))


def test_odd_option_keys_are_listed_not_crashed_on():
    with pytest.raises(InvalidOptionError) as info:
        parse_options({1: "x", "colour": "blue"}, mode="turbo")
    text = str(info.value)
    assert "unknown option 1" in text and "unknown option 'colour'" in text
    assert "mode 'turbo'" in text

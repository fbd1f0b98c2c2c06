"""torch.compile's ``mode=`` and ``options=`` as the backend sees them: every mode works, and bad
options are found at the first call with every problem listed at once."""

from __future__ import annotations

import pytest
import torch

import tpu_inductor
from tests.helpers import assert_same
from tpu_inductor.core.errors import InvalidOptionError
from tpu_inductor.dynamo.options import MODES, parse_options


def _graphs() -> int:
    return tpu_inductor.runtime.cache.STATS.graphs


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

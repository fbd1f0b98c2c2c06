"""Recompile hints (``tpu_inductor.core.hints``): a growing input or a last batch of another size is
named once on the progress logger with what to do; a few sizes that come and go are not."""

from __future__ import annotations

import logging

import pytest
import torch
import torch.nn as nn

import tpu_inductor
from tests.helpers import tiny_llama
from tpu_inductor.core import hints

PROGRESS = "tpu_inductor.progress"


def _hints(caplog) -> list[str]:
    """The recompile hints logged (not the long-compile notices)."""
    said = [r.getMessage() for r in caplog.records if r.name == PROGRESS]
    return [m for m in said if "still compiling" not in m and " compiled graph" not in m]


@pytest.fixture
def progress(caplog):
    caplog.set_level(logging.WARNING, logger=PROGRESS)
    return caplog


def _sig(*shapes, scalars=()):
    return (tuple((s, torch.float32) for s in shapes), tuple(scalars))


def test_growing_rule():
    grow = [_sig((1, 2, n, 8), (1, n + 1), scalars=(n,)) for n in (5, 6, 7, 8)]
    found = hints.growing(grow)
    assert found == {(0, 2): [5, 6, 7, 8], (1, 1): [6, 7, 8, 9], ("scalar", 0): [5, 6, 7, 8]}
    assert hints.growing(grow[:3]) is None  # 2-3 sizes are not a pattern
    assert hints.growing([_sig((n, 8)) for n in (64, 128, 96, 64)]) is None
    assert hints.growing([_sig((n, 8)) for n in (8, 16, 32, 64)]) is None  # buckets: no step
    assert hints.growing([_sig((2, n)) for n in (2, 4, 6, 8)]) == {(0, 1): [2, 4, 6, 8]}
    assert hints.growing([_sig((n, n)) for n in (5, 6, 7, 8)]) is not None
    mixed = [_sig((1, n), (m, 3)) for n, m in ((5, 1), (6, 1), (7, 2), (8, 2))]
    assert hints.growing(mixed) is None  # another size changed differently


def test_shrunk_batch_rule():
    old = {"L['x']": (32, 8), "L['y']": (32,), "L['w']": (4, 8), "L['x'].size()[0]": 32}
    new = {"L['x']": (8, 8), "L['y']": (8,), "L['w']": (4, 8), "L['x'].size()[0]": 8}
    assert hints.shrunk_batch(old, new) == (32, 8, ["L['x']", "L['y']"])
    assert hints.shrunk_batch(new, old) is None  # a bigger batch is not a last batch
    assert hints.shrunk_batch(old, {**new, "L['w']": (4, 9)}) is None
    assert hints.shrunk_batch({"L['x']": (2, 64)}, {"L['x']": (2, 32)}) is None  # not dim 0
    assert hints.shrunk_batch(old, {**new, "L['y']": (16,)}) is None  # two batch sizes


def test_a_growing_input_is_named_once_with_the_fix(progress):
    step = torch.compile(lambda cache, x: torch.cat([cache, x], 1), backend="tpu")
    cache = torch.zeros(1, 3, 4)
    for _ in range(10):
        want = torch.cat([cache, torch.ones(1, 1, 4)], 1)
        cache = step(cache, torch.ones(1, 1, 4))
        torch.testing.assert_close(cache, want)
    said = _hints(progress)
    assert len(said) == 1, said
    assert "dimension 1 of L['cache']" in said[0] and "grew 4 -> 5 -> 6 -> 7" in said[0]
    assert 'cache_implementation="static"' in said[0]


def test_a_few_sizes_that_come_and_go_say_nothing(progress):
    f = torch.compile(lambda x: x.sin() * 2, backend="tpu", dynamic=True)
    for n in (64, 128, 96, 64, 128, 96, 64):
        f(torch.randn(2, n))
    model = nn.Linear(8, 2)
    cm = torch.compile(model, backend="tpu")
    for b in (8, 32, 8, 32, 8):  # two batch sizes from the start: not a last batch
        cm(torch.randn(b, 8)).sum().backward()
    assert _hints(progress) == []


@pytest.mark.parametrize("dynamic", [None, True], ids=["default", "dynamic"])
def test_a_last_batch_of_another_size_is_named_once(progress, dynamic):
    torch.manual_seed(0)
    ref = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    model.load_state_dict(ref.state_dict())
    cm = torch.compile(model, backend="tpu", dynamic=dynamic)
    gen = torch.Generator().manual_seed(1)
    for _epoch in range(2):
        for b in (32, 32, 32, 32, 8):
            x = torch.randn(b, 8, generator=gen)
            loss, want = cm(x).square().mean(), ref(x).square().mean()
            loss.backward()
            want.backward()
            torch.testing.assert_close(loss, want, atol=1e-6, rtol=1e-5)
    for a, b in zip(ref.parameters(), model.parameters(), strict=True):
        torch.testing.assert_close(b.grad, a.grad, atol=1e-5, rtol=1e-5)
    said = _hints(progress)
    assert len(said) == 1, said
    assert "L['args'][0]" in said[0] and "32 -> 8 after 4 calls at 32" in said[0]
    assert "drop_last=True" in said[0]


def test_transformers_generate_without_a_static_cache_says_so(progress):
    model = tiny_llama().eval()
    ids = torch.randint(3, 128, (1, 5), generator=torch.Generator().manual_seed(4))
    kwargs = dict(max_new_tokens=6, do_sample=False, pad_token_id=0)
    want = model.generate(input_ids=ids, **kwargs)
    model.forward = torch.compile(model.forward, backend="tpu")
    assert torch.equal(model.generate(input_ids=ids, **kwargs), want)
    said = _hints(progress)
    assert len(said) == 1, said
    assert ".keys" in said[0] and "dimension 2" in said[0]
    assert 'cache_implementation="static"' in said[0]
    torch._dynamo.reset()
    tpu_inductor.reset()
    progress.clear()
    model.forward = torch.compile(model.forward.__wrapped__, backend="tpu")
    out = model.generate(input_ids=ids, cache_implementation="static", **kwargs)
    assert torch.equal(out, want)
    assert _hints(progress) == []

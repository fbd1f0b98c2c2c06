"""Shared pytest setup: a fresh Dynamo cache per test so graphs never leak between tests."""

from __future__ import annotations

import os
import pathlib

import pytest
import torch

TPU_TESTS = pathlib.Path(__file__).parent / "tpu"


def pytest_ignore_collect(collection_path, config):
    """tests/tpu/ runs only when named (`pytest tests/tpu`): the README's second test step, after
    libtpu is installed. A plain `pytest` on a machine that has libtpu would otherwise compile
    every TPU test a second time in CI (its last run: 54 TPU tests inside a 37 min first step)."""
    if collection_path != TPU_TESTS:
        return None
    named = [pathlib.Path(str(a).split("::")[0]).resolve() for a in config.args]
    if any(p == TPU_TESTS or TPU_TESTS in p.parents for p in named):
        return None
    return True


SLOW_LIST = pathlib.Path(__file__).parent / "slow.txt"


def _slow_ids() -> set[str]:
    """Test ids listed in tests/slow.txt (one per line, ``#`` starts a comment)."""
    lines = (line.split("#", 1)[0].strip() for line in SLOW_LIST.read_text().splitlines())
    return {line for line in lines if line}


def pytest_collection_modifyitems(config, items):
    slow = _slow_ids()
    for item in items:
        if item.nodeid in slow:
            item.add_marker(pytest.mark.slow)
    if os.environ.get("TPU_INDUCTOR_SLOW") == "1" or "slow" in (config.getoption("-m") or ""):
        return
    skip = pytest.mark.skip(reason="slow: set TPU_INDUCTOR_SLOW=1 or run with -m slow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    import tpu_inductor

    torch._dynamo.reset()
    tpu_inductor.reset()
    yield
    torch._dynamo.reset()

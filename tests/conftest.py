"""Shared pytest setup: a fresh Dynamo cache per test so graphs never leak between tests."""

from __future__ import annotations

import os

import pytest
import torch


def pytest_collection_modifyitems(config, items):
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

"""Model tests run torch eager with one intra-op thread.

The models are tiny, so intra-op parallelism buys nothing, and on a small shared machine (2 cores,
other jobs running) torch's OpenMP barriers make every eager op wait for a descheduled thread:
measured ~280 ms instead of ~0.7 ms for one tiny Llama forward. One thread keeps the suite's
runtime stable; the previous setting is restored after each test.
"""

from __future__ import annotations

import pytest

from tests.helpers import one_torch_thread


@pytest.fixture(autouse=True)
def _one_torch_thread():
    with one_torch_thread():
        yield

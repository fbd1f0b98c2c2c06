"""tests/tpu/: compiling for TPU topologies without a TPU (libtpu's compiler, nothing runs).

Every test here is marked ``tpu_compile`` and skipped where libtpu is not installed (the default
install leaves it out: it adds ~700 MB). CI runs them in a step of their own:
``pip install -e '.[tpu]' && JAX_PLATFORMS=cpu python -m pytest -q -m tpu_compile tests/tpu``.
"""

from __future__ import annotations

import importlib.util

import pytest

HAS_LIBTPU = importlib.util.find_spec("libtpu") is not None


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "tests/tpu/" in str(item.fspath).replace("\\", "/"):
            item.add_marker(pytest.mark.tpu_compile)
            if not HAS_LIBTPU:
                item.add_marker(pytest.mark.skip(reason="needs libtpu: pip install -e '.[tpu]'"))

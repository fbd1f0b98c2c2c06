"""Shared pytest setup: a fresh Dynamo cache per test so graphs never leak between tests; the
libtpu tests (marker ``tpu_compile``) run only under ``-m tpu_compile`` or when their file is
named; tests/slow.txt's tests are skipped unless asked for."""

from __future__ import annotations

import importlib.util
import os
import pathlib

import pytest
import torch

HAS_LIBTPU = importlib.util.find_spec("libtpu") is not None


def _named_files(config) -> set[pathlib.Path]:
    """The test files named on the command line (a file or a node id in it, not a folder)."""
    paths = (pathlib.Path(str(arg).split("::")[0]).resolve() for arg in config.args)
    return {path for path in paths if path.is_file()}


def _tpu_compile_wanted(config, item, named: set[pathlib.Path]) -> bool:
    """A libtpu test runs when ``-m`` names ``tpu_compile`` or its file is named: a plain
    ``pytest`` leaves them out even where libtpu is installed, so CI compiles each one once."""
    if "tpu_compile" in (config.getoption("-m") or ""):
        return True
    return pathlib.Path(str(item.fspath)).resolve() in named


def _gate_tpu_compile(config, items) -> None:
    """Tests marked ``tpu_compile`` are deselected unless wanted, and skipped where libtpu is
    missing (it adds ~700 MB, so the default install leaves it out)."""
    libtpu = [item for item in items if "tpu_compile" in item.keywords]
    named = _named_files(config)
    dropped = [item for item in libtpu if not _tpu_compile_wanted(config, item, named)]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        gone = set(map(id, dropped))
        items[:] = [item for item in items if id(item) not in gone]
    if HAS_LIBTPU:
        return
    skip = pytest.mark.skip(reason="needs libtpu: pip install -e '.[tpu]'")
    for item in items:
        if "tpu_compile" in item.keywords:
            item.add_marker(skip)


SLOW_LIST = pathlib.Path(__file__).parent / "slow.txt"


def _slow_ids() -> set[str]:
    """Test ids listed in tests/slow.txt (one per line, ``#`` starts a comment)."""
    lines = (line.split("#", 1)[0].strip() for line in SLOW_LIST.read_text().splitlines())
    return {line for line in lines if line}


def _check_slow_ids(config, slow: set[str], items) -> None:
    """A slow.txt id whose test function was collected must match one of its items exactly: a
    renamed parameter would otherwise put a slow test back in the default run unseen (a renamed
    file or function is caught by tests/package/test_layout.py). Not checked when the command
    line names single tests, which collects some of a function's parameters only."""
    if any("::" in str(arg) for arg in config.args):
        return
    collected = {item.nodeid for item in items}
    functions = {item.nodeid.split("[")[0] for item in items}
    stale = sorted(i for i in slow if i not in collected and i.split("[")[0] in functions)
    if stale:
        raise pytest.UsageError(f"tests/slow.txt names tests that do not exist: {stale}")


def pytest_collection_modifyitems(config, items):
    _gate_tpu_compile(config, items)
    slow = _slow_ids()
    _check_slow_ids(config, slow, items)
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

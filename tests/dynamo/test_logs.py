"""Logs: TORCH_LOGS names our loggers the way it names Dynamo's, and long compiles say so."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time

import torch

from tpu_inductor.runtime import call as runtime

SCRIPT = (
    "import torch\n"
    "f = torch.compile(lambda x: x.sin() + 1, backend='tpu')\n"
    "f(torch.ones(3)); f(torch.ones(3))\n"
)


def _logs(setting: str) -> str:
    env = {**os.environ, "TORCH_LOGS": setting}
    env.pop("TPU_INDUCTOR_LOG", None)
    run = subprocess.run(
        [sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr
    return run.stderr


def test_torch_logs_switches_each_topic():
    everything = _logs("+tpu_inductor")
    assert "built executable #1 (first call)" in everything  # tpu_inductor.runtime.call
    assert "inference graph, 4 nodes, lowered in" in everything  # tpu_inductor.dynamo.backend
    assert "host->device 12 B (input)" in everything  # tpu_inductor.core.transfers, first call
    transfers = _logs("tpu_inductor.core.transfers")
    assert "host->device 12 B (input)" in transfers and "built executable" not in transfers
    assert transfers.count("host->device") == 1  # INFO: the first call only, not the second
    executables = _logs("tpu_inductor.runtime.call")
    assert "built executable #1 (first call)" in executables and "->" not in executables


def test_fallbacks_are_logged_by_topic(caplog):
    @torch.library.custom_op("tpu_inductor_test_logs::shuffle", mutates_args=())
    def shuffle(x: torch.Tensor) -> torch.Tensor:
        return x.flip(0)

    shuffle.register_fake(lambda x: torch.empty_like(x))
    f = torch.compile(lambda x: shuffle(x.sin()) * 2, backend="tpu")
    with caplog.at_level(logging.INFO, logger="tpu_inductor.capture.partition"):
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            f(torch.ones(3))
    assert any("run in torch eager" in r.getMessage() for r in caplog.records)


def test_long_compile_reports_progress(caplog, monkeypatch):
    monkeypatch.setattr(runtime, "PROGRESS_AFTER_S", 0.05)
    monkeypatch.setattr(runtime, "PROGRESS_EVERY_S", 0.05)
    with caplog.at_level(logging.WARNING, logger="tpu_inductor.progress"):
        with runtime.compile_progress("graph7-forward", 123):
            time.sleep(0.2)
    said = [r.getMessage() for r in caplog.records]
    assert any("still compiling graph7-forward (123 ops)" in m for m in said), said
    assert said[-1].startswith("tpu-inductor: compiled graph7-forward in")


def test_short_compile_is_quiet(caplog):
    with caplog.at_level(logging.WARNING, logger="tpu_inductor.progress"):
        with runtime.compile_progress("graph8-forward", 3):
            pass
    assert not caplog.records

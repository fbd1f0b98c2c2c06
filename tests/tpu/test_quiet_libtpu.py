"""With libtpu installed and no TPU attached, our entry points start JAX without libtpu's E0000
block: the demo, a plain ``torch.compile(backend="tpu")`` call and a compile-only TPU target."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

from tpu_inductor.core.devices import QUIET_LIBTPU, tpu_attached

ROOT = pathlib.Path(__file__).resolve().parent.parent.parent

# what importing JAX sets in this (the test's) process, which a user's new process lacks
_SET_BY_JAX = ("JAX_PLATFORMS", "TF_CPP_MIN_LOG_LEVEL", "TPU_LIBRARY_PATH")

pytestmark = pytest.mark.skipif(tpu_attached(), reason="checks a machine without a TPU")


def _run(args: list[str], **env_changes) -> subprocess.CompletedProcess:
    """Run ``python args`` as a user would: JAX picks its platforms itself (no JAX_PLATFORMS)
    and libtpu's variables are unset, unless ``env_changes`` says so. One is set: another
    process holding libtpu's lockfile would make libtpu fail before it speaks, hiding the block
    these tests look for."""
    env = {k: v for k, v in os.environ.items() if k not in _SET_BY_JAX and k not in QUIET_LIBTPU}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    env["ALLOW_MULTIPLE_LIBTPU_LOAD"] = "1"
    env.update(env_changes)
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, env=env, cwd=ROOT, timeout=600
    )


def test_libtpu_alone_prints_its_block_so_the_checks_below_can_fail():
    run = _run(["-c", "import jax; jax.devices()"])
    assert "E0000" in run.stdout + run.stderr


def test_the_demo_prints_no_libtpu_block_and_still_matches():
    run = _run(["-m", "tpu_inductor.demo", "--batch", "2", "--seq", "16", "--iters", "5"])
    assert run.returncode == 0, run.stderr[-3000:]
    assert "E0000" not in run.stdout + run.stderr, run.stderr[-3000:]
    assert "MATCH" in run.stdout and "MISMATCH" not in run.stdout


FIRST_CALL = """
import os, jax, torch
f = torch.compile(lambda x: x * 2 + 1, backend="tpu")
print(f(torch.ones(2)).tolist(), jax.devices()[0].platform)
ours = ("TPU_ACCELERATOR_TYPE", "TPU_WORKER_HOSTNAMES")
print("left set:", sorted(k for k in ours if k in os.environ))
"""


def test_a_first_compiled_call_on_cpu_prints_no_libtpu_block_and_leaves_no_variables():
    run = _run(["-c", FIRST_CALL])
    assert run.returncode == 0, run.stderr[-3000:]
    assert "E0000" not in run.stdout + run.stderr, run.stderr[-3000:]
    assert "[3.0, 3.0] cpu" in run.stdout
    assert "left set: []" in run.stdout  # set only while JAX started


TARGET = """
import torch
f = torch.compile(lambda x: x @ x, backend="tpu", options={"target": "v5e"})
f(torch.ones(8, 8))
print("compiled for v5e")
"""


def test_a_compile_only_target_prints_no_libtpu_block():
    run = _run(["-c", TARGET])
    assert run.returncode == 0, run.stderr[-3000:]
    assert "E0000" not in run.stdout + run.stderr, run.stderr[-3000:]
    assert "compiled for v5e" in run.stdout


def test_a_users_jax_platforms_wins():
    run = _run(["-c", FIRST_CALL], JAX_PLATFORMS="cpu")
    assert run.returncode == 0, run.stderr[-3000:]
    assert "[3.0, 3.0] cpu" in run.stdout
    # and a user's own libtpu variable is kept, not replaced and not removed
    code = FIRST_CALL + "print('kept:', os.environ['TPU_ACCELERATOR_TYPE'])\n"
    run = _run(["-c", code], TPU_ACCELERATOR_TYPE="v5litepod-8")
    assert run.returncode == 0, run.stderr[-3000:]
    assert "kept: v5litepod-8" in run.stdout

"""No device array outlives its model: two small Llamas trained under a dp and an fsdp mesh (4
CPU devices, in a subprocess as tests/runtime/test_sharding.py does), deleted, ``gc.collect()`` and
``torch._dynamo.reset()``; then count ``jax.live_arrays()`` (tests/runtime/live_arrays_case.py).

Before the fix 28 arrays stayed (36 in the issue's run), among them logits- ([4, 16, 128]) and
attention-shaped ([4, 2, 16, 8]) zeros: the zero tangents ``residency.device_zeros`` cached in
a module-level dict. They are now cached per graph and dropped on ``torch._dynamo.reset()``,
which also forgets the device copies of tensors only Dynamo's leftover globals keep alive.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _run(mode: str) -> dict:
    pytest.importorskip("transformers")
    env = {
        **os.environ,
        "XLA_FLAGS": "--xla_force_host_platform_device_count=4",
        "JAX_PLATFORMS": "cpu",
        "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
    }
    cmd = [sys.executable, str(ROOT / "tests" / "runtime" / "live_arrays_case.py"), mode]
    run = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, (run.stdout + run.stderr)[-4000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_no_device_array_outlives_models_compiled_without_their_step():
    got = _run("eager-step")
    assert got["while_held"] > 0, got  # the test sees the arrays it then expects gone
    assert got["after"] == 0, got


def test_no_device_array_outlives_models_with_a_compiled_step():
    """A compiled ``opt.step``: ``torch._dynamo.reset()`` does not remove the ``__compiled_fn_*``
    global Dynamo put in ``torch.optim.adam``, whose graph keeps the optimizer state tensors
    alive; their device copies (caches of host-current tensors) are forgotten on reset
    (``residency.VALUES.forget_copies``). Before that, 26 optimizer-state arrays stayed."""
    got = _run("compiled-step")
    assert got["while_held"] > 0, got
    assert got["after"] == 0, got


def _live_executables() -> int:
    import gc

    gc.collect()
    return sum(type(o).__name__ == "MeshExecutable" for o in gc.get_objects())


def _maps() -> int:
    with open("/proc/self/maps") as f:
        return sum(1 for _ in f)


def test_reset_frees_executables():
    """``tpu_inductor.reset()`` frees our executables although Dynamo's ``__compiled_fn_*``
    globals (here in this test module) keep the graphs alive, and so does
    ``torch._dynamo.reset()`` for those our in-memory cache no longer holds (it keeps the
    others for an identical graph handed over again: tests/runtime/test_boundary.py). Before, every
    graph of a pytest process stayed compiled: XLA:CPU's JIT code is ~35 memory maps per
    executable, and the default test run reached Linux's 65,530-map limit and segfaulted in
    XLA's next compile (CI, exit 139 at 99%). The graphs still run after the reset, rebuilt
    on demand."""
    import torch

    import tpu_inductor

    def make(k):
        def f(x):
            return (x * k).sin() + x.cos() * k

        return f

    fns = [torch.compile(make(k), backend="tpu") for k in range(12)]
    xs = [torch.randn(8, 4 + k) for k in range(12)]
    before_exes, before_maps = _live_executables(), _maps()
    for f, x, k in zip(fns, xs, range(12), strict=True):
        torch.testing.assert_close(f(x), make(k)(x))
    held = _live_executables() - before_exes
    assert held >= 12, held  # the count sees the executables it then expects gone
    torch._dynamo.reset()
    assert _live_executables() - before_exes == held  # cached: kept for reuse
    tpu_inductor.reset()
    assert _live_executables() - before_exes == 0
    if pathlib.Path("/proc/self/maps").exists():  # Linux: the JIT code maps went with them
        assert _maps() - before_maps < 12 * 35 // 2, (_maps(), before_maps)
    for f, x, k in zip(fns, xs, range(12), strict=True):  # still right, recompiled
        torch.testing.assert_close(f(x), make(k)(x))

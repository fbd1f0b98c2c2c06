"""Multi-controller SPMD: two processes on this machine train one model over one global mesh.

``tests/runtime/multihost_worker.py`` is started twice (process ids 0 and 1, 2 CPU devices each, a
4-device global mesh), joined by ``jax.distributed.initialize`` over a local coordinator port;
both train the tiny Llama with ``shardings="dp"`` and then ``"fsdp"``, and must reach the losses
of a single-process eager run. The test skips when the distributed runtime cannot start here
(no local TCP, a sandbox), and kills both workers whatever happens.

README text ("Scale out", multi-host subsection):

    Multi-host (TPU pods). On a pod slice every host runs the same script: call
    ``jax.distributed.initialize()`` first on each host, before anything asks JAX for devices
    (no arguments on Cloud TPU: the coordinator, the process count and this host's id come from
    the TPU environment; on GPU clusters and CPU hosts pass
    ``coordinator_address="host0:1234", num_processes=N, process_id=i``, or let SLURM / Open
    MPI fill them in). Then build the mesh over the global devices, ``jax.devices()`` (every
    chip of the slice), not ``jax.local_devices()``:

        jax.distributed.initialize()
        mesh = jax.make_mesh((jax.device_count(),), ("data",))
        opts = {"mesh": mesh, "shardings": "fsdp"}
        model = torch.compile(model, backend="tpu", options=opts)
        step = torch.compile(opt.step, backend="tpu", options=opts)

    Every host builds the same model (same seed) and feeds the same global batch each step;
    each uploads only the shards its own chips hold, and an output sharded across hosts is
    all-gathered so torch sees the whole tensor on every host. Those gathers are collectives,
    so every host must make the same compiled calls in the same order (the usual
    multi-controller rule), and reading only small outputs (the loss) keeps them cheap. On CPU
    the cross-process collectives use gloo (JAX's default). Not yet: per-host input pipelines
    (each host loading only its slice of the batch), and ``keep_on_device`` reads of arrays
    sharded across hosts. ``tests/runtime/test_multihost.py`` runs two processes on one machine.
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time

import pytest
import torch

from tests.helpers import tiny_llama
from tests.runtime.multihost_worker import batch

ROOT = pathlib.Path(__file__).resolve().parents[2]
WORKER = ROOT / "tests" / "runtime" / "multihost_worker.py"
PROCESSES, DEVICES, STEPS = 2, 2, 3
PRESETS = ("dp", "fsdp")
TIMEOUT_S = 120


def _free_port() -> int:
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]
    except OSError as e:
        pytest.skip(f"no local TCP port for jax.distributed's coordinator: {e}")


def _eager_losses() -> list[float]:
    """The same training in one process, in torch eager."""
    model = tiny_llama()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for i in range(STEPS):
        ids = batch(i)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(float(loss.detach()))
    return losses


def _run_workers(tmp_path: pathlib.Path) -> list[str]:
    """Both workers' stdout (each run to the end), or a skip if the runtime never came up."""
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu"}
    env.pop("XLA_FLAGS", None)  # the worker sets its own device count
    procs, logs = [], []
    try:
        for i in range(PROCESSES):
            out, err = tmp_path / f"worker{i}.out", tmp_path / f"worker{i}.err"
            logs.append((out, err))
            cmd = [
                sys.executable, str(WORKER), "--process-id", str(i),
                "--num-processes", str(PROCESSES), "--port", str(port),
                "--devices", str(DEVICES), "--shardings", ",".join(PRESETS),
                "--steps", str(STEPS),
            ]  # fmt: skip
            with out.open("w") as o, err.open("w") as e:
                procs.append(
                    subprocess.Popen(
                        cmd, stdout=o, stderr=e, env=env, cwd=ROOT, start_new_session=True
                    )
                )
        deadline = time.monotonic() + TIMEOUT_S
        timed_out = False
        for p in procs:
            try:
                p.wait(timeout=max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                timed_out = True
                break
    finally:
        for p in procs:  # whatever happened: no worker outlives the test
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    stdouts = [out.read_text() for out, _ in logs]
    tails = "\n".join(
        f"--- worker {i} (rc {p.returncode}) stderr tail:\n" + err.read_text()[-2000:]
        for i, (p, (_, err)) in enumerate(zip(procs, logs, strict=True))
    )
    if not all("READY" in s for s in stdouts):
        pytest.skip(
            "jax.distributed could not start two local processes here"
            + (f" within {TIMEOUT_S} s" if timed_out else "")
            + f":\n{tails}"
        )
    assert not timed_out, f"the workers did not finish within {TIMEOUT_S} s:\n{tails}"
    assert all(p.returncode == 0 for p in procs), tails
    return stdouts


def _results(stdout: str) -> list[dict]:
    return [json.loads(line[len("RESULT ") :]) for line in stdout.splitlines()
            if line.startswith("RESULT ")]  # fmt: skip


def test_two_processes_train_like_eager(tmp_path):
    """dp and fsdp over a 4-device mesh of two processes: each process's losses are eager's."""
    per_process = [_results(s) for s in _run_workers(tmp_path)]
    expected = _eager_losses()
    for i, results in enumerate(per_process):
        assert [r["shardings"] for r in results] == list(PRESETS), results
        for r in results:
            assert r["process_id"] == i and r["process_count"] == PROCESSES
            assert r["devices"] == PROCESSES * DEVICES and len(r["local_devices"]) == DEVICES
            assert r["losses"] == pytest.approx(expected, abs=1e-4), r
            # each process reports only its own devices
            assert sorted(r["resident_bytes_per_device"]) == sorted(r["local_devices"])
        dp, fsdp = (max(r["resident_bytes_per_device"].values()) for r in results)
        assert fsdp < 0.5 * dp, "fsdp splits parameters and optimizer state over the 4 devices"
    # both processes end with the same model
    assert [r["param_sum"] for r in per_process[0]] == [r["param_sum"] for r in per_process[1]]

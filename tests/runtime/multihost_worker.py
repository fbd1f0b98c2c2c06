"""One process of a multi-controller run, launched by ``tests/runtime/test_multihost.py``.

``python tests/runtime/multihost_worker.py --process-id I --num-processes N --port P --devices D
--shardings dp --steps S`` starts JAX's distributed runtime (coordinator ``127.0.0.1:P``, the
process with id 0 hosts it), builds a global mesh over all N * D CPU devices, trains the tiny
Llama of ``tests.helpers.tiny_llama`` for S steps (compiled forward and backward, compiled AdamW
step) and prints one line ``RESULT {"losses": [...], ...}`` on stdout per preset of
``--shardings`` (``dp,fsdp``: one after the other, in the same process). Every process runs
this same program on the same global batch (multi-controller SPMD); each uploads only the
shards its own devices hold.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys


def parse_args(argv=None) -> argparse.Namespace:
    """The command line (see the module docstring)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--process-id", type=int, required=True)
    p.add_argument("--num-processes", type=int, default=2)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--devices", type=int, default=2, help="CPU devices per process")
    p.add_argument("--shardings", default="dp", help="presets, comma-separated: dp,fsdp")
    p.add_argument("--steps", type=int, default=3)
    return p.parse_args(argv)


def batch(step: int):
    """The global batch of training step ``step`` (the same on every process)."""
    import torch

    gen = torch.Generator().manual_seed(100 + step)
    return torch.randint(1, 128, (8, 16), generator=gen)


def main(argv=None) -> int:
    """Initialize the distributed runtime, train, print the losses."""
    args = parse_args(argv)
    # Before JAX's backends start (they read XLA_FLAGS once).
    flags = os.environ.get("XLA_FLAGS", "")
    os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={args.devices}"
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))
    import jax

    jax.config.update("jax_platforms", "cpu")
    # Cross-process collectives on CPU: gloo is JAX 0.10's default (DEFAULT_CPU_COLLECTIVES_IMPL
    # in jax/_src/config.py); set anyway for older releases, whose CPU client had none.
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
        coordinator_address=f"127.0.0.1:{args.port}",
        num_processes=args.num_processes,
        process_id=args.process_id,
        initialization_timeout=60,
    )
    n = jax.device_count()  # starts the CPU client: the global device list, gloo
    print("READY", flush=True)  # the distributed runtime is up (the test skips if it never is)
    import torch

    import tpu_inductor
    from tests.helpers import tiny_llama

    assert n == args.num_processes * args.devices, (n, jax.devices())
    assert jax.local_device_count() == args.devices
    mesh = jax.make_mesh((n,), ("data",))
    for preset in args.shardings.split(","):
        torch._dynamo.reset()
        tpu_inductor.reset()
        model = tiny_llama()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        opts = {"mesh": mesh, "shardings": preset}
        f = torch.compile(model, backend="tpu", options=opts)
        step = torch.compile(opt.step, backend="tpu", options=opts)
        losses = []
        for i in range(args.steps):
            ids = batch(i)
            loss = f(input_ids=ids, labels=ids).loss
            loss.backward()
            step()
            opt.zero_grad()
            losses.append(float(loss.detach()))
        result = {
            "shardings": preset,
            "process_id": jax.process_index(),
            "process_count": jax.process_count(),
            "devices": n,
            "local_devices": [str(d) for d in jax.local_devices()],
            "resident_bytes_per_device": tpu_inductor.report(
                print_table=False
            ).resident_bytes_per_device,
            "losses": losses,
            "param_sum": float(sum(p.detach().double().sum() for p in model.parameters())),
        }
        print("RESULT " + json.dumps(result), flush=True)
    jax.distributed.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

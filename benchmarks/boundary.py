"""Cost of each way across the torch <-> JAX boundary, per tensor, on the default JAX device.

``python -m benchmarks.boundary`` prints microseconds per conversion for each path, side by side
in one process, so the runtime's choice (tpu_inductor/runtime/call.py) can be checked on any
machine.
"""

from __future__ import annotations

import time

import jax
import numpy as np
import torch


def _us(fn, n=2000):
    fn()
    start = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - start) / n * 1e6


def main() -> None:
    """Print the table."""
    device = jax.devices()[0]
    print(f"device: {device.platform}  (us per tensor, lower is better)")
    print(
        f"{'dtype':>10} {'shape':>12} | {'t->j dlpack':>11} {'t->j put(np)':>12} |"
        f" {'j->t dlpack':>11} {'j->t from_numpy':>15}"
    )
    with jax.enable_x64(True):
        for dtype in (torch.float32, torch.int64, torch.bfloat16):
            for shape in ((64,), (256, 1024)):
                t = torch.randn(shape).to(dtype)
                a = jax.device_put(jax.dlpack.from_dlpack(t), device) + 0
                rows = [
                    _us(lambda t=t: jax.device_put(jax.dlpack.from_dlpack(t), device)),
                    _us(lambda t=t: jax.device_put(t.numpy(), device))
                    if dtype != torch.bfloat16
                    else float("nan"),
                    _us(lambda a=a: torch.from_dlpack(a))
                    if device.platform == "cpu"
                    else float("nan"),
                    _us(lambda a=a: torch.from_numpy(np.asarray(a)))
                    if dtype != torch.bfloat16
                    else float("nan"),
                ]
                print(
                    f"{str(dtype)[6:]:>10} {str(shape):>12} | {rows[0]:11.1f} {rows[1]:12.1f} |"
                    f" {rows[2]:11.1f} {rows[3]:15.1f}"
                )


if __name__ == "__main__":
    main()

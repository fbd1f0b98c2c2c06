"""Why the ResNet benchmark is slower than eager on CPU: ``python -m benchmarks.convs``.

Times each distinct convolution of the benchmark's ResNet-18 (batch 2, 128x128 images, the
``--quick`` shapes) alone: torch's ``conv2d`` (oneDNN on CPU, which eager and inductor both
call) against the one ``lax.conv_general_dilated`` the backend lowers ``aten.convolution`` to,
under ``jax.jit`` on XLA:CPU. Both run on one pinned CPU thread, one after the other, in this
process (``--threads`` to change). No backend code is involved: the ratio is XLA:CPU's
convolution against oneDNN's.
"""

from __future__ import annotations

import argparse
import statistics

from benchmarks.suite import _interleaved, limit_threads

# (in channels, out channels, spatial size, kernel, stride) of ResNet-18's convolutions at
# 128x128 input; each appears in the network as often as ``count`` says (quick depths 1,1,1,1).
SHAPES = (
    (3, 64, 128, 7, 2, 1),
    (64, 64, 32, 3, 1, 2),
    (64, 128, 32, 3, 2, 1),
    (128, 128, 16, 3, 1, 1),
    (64, 128, 32, 1, 2, 1),
    (128, 256, 16, 3, 2, 1),
    (256, 256, 8, 3, 1, 1),
    (128, 256, 16, 1, 2, 1),
    (256, 512, 8, 3, 2, 1),
    (512, 512, 4, 3, 1, 1),
    (256, 512, 8, 1, 2, 1),
)


def measure(batch: int = 2, rounds: int = 7, target_s: float = 0.05) -> list[dict]:
    """One row per shape: ``torch_ms``, ``xla_ms`` (medians of interleaved rounds), ``count``."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    import torch
    from jax import lax

    rows = []
    rng = np.random.default_rng(0)
    for cin, cout, size, k, stride, count in SHAPES:
        x = rng.standard_normal((batch, cin, size, size), dtype=np.float32)
        w = rng.standard_normal((cout, cin, k, k), dtype=np.float32)
        pad = k // 2
        xla = jax.jit(
            lambda x, w, stride=stride, pad=pad: lax.conv_general_dilated(
                x,
                w,
                (stride, stride),
                [(pad, pad)] * 2,
                dimension_numbers=("NCHW", "OIHW", "NCHW"),
                precision=lax.Precision.HIGHEST,
            )
        )
        xj, wj = jnp.asarray(x), jnp.asarray(w)
        xt, wt = torch.from_numpy(x), torch.from_numpy(w)
        with torch.no_grad():
            ref = torch.nn.functional.conv2d(xt, wt, stride=stride, padding=pad)
            err = float(np.abs(np.asarray(xla(xj, wj)) - ref.numpy()).max())
            times = _interleaved(
                {
                    "torch": lambda xt=xt, wt=wt, s=stride, p=pad: torch.nn.functional.conv2d(
                        xt, wt, stride=s, padding=p
                    ),
                    "xla": lambda xj=xj, wj=wj, f=xla: f(xj, wj).block_until_ready(),
                },
                target_s=target_s,
                rounds=rounds,
            )
        rows.append(
            {
                "shape": f"{cin}->{cout} {k}x{k}/{stride} at {size}x{size}",
                "count": count,
                "torch_ms": statistics.median(times["torch"]) * 1e3,
                "xla_ms": statistics.median(times["xla"]) * 1e3,
                "max_abs_err": err,
            }
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    """Print the table and the whole network's convolution time, torch vs XLA:CPU."""
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    limit_threads(args.threads)
    rows = measure()
    print(f"ResNet-18 convolutions, batch 2, 128x128 input, {args.threads} thread(s), ms/call:\n")
    print("| convolution | times in net | torch (oneDNN) | XLA:CPU | XLA/torch |")
    print("| --- | --- | --- | --- | --- |")
    for r in rows:
        print(
            f"| {r['shape']} | {r['count']} | {r['torch_ms']:.3f} | {r['xla_ms']:.3f} | "
            f"{r['xla_ms'] / r['torch_ms']:.2f}x |"
        )
    torch_total = sum(r["torch_ms"] * r["count"] for r in rows)
    xla_total = sum(r["xla_ms"] * r["count"] for r in rows)
    print(
        f"\nAll convolutions of one forward: torch {torch_total:.2f} ms, XLA:CPU "
        f"{xla_total:.2f} ms ({xla_total / torch_total:.2f}x)."
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

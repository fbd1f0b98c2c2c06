"""A pure-JAX reproducer for libtpu's crash on timm ResNet's training backward (issue 30.4).

``JAX_PLATFORMS=cpu python -m benchmarks.tpu_resnet_stem v6e`` compiles (deviceless, needs
libtpu) ``jax.grad`` of a ResNet stem: a 7x7 stride-2 convolution of a 3-channel image, batch
norm in training mode, ReLU. The weight gradient is the convolution JAX's own transpose rule
writes (``[f, b, 0, 1] x [i, o, 0, 1]``, the output gradient as a 2x-dilated window over the
image), the same one tpu-inductor's backward holds. Run it in a process of its own: a crash of
the TPU compiler ends the process. Prints the compile seconds or dies with libtpu's SIGSEGV.
"""

from __future__ import annotations

import sys
import time

import jax
import jax.numpy as jnp
from jax.sharding import SingleDeviceSharding


def stem_loss(w, x):
    """sum(relu(batch_norm(conv7x7/2(x, w)))), float32 at HIGHEST precision (torch's)."""
    y = jax.lax.conv_general_dilated(
        x, w, (2, 2), [(3, 3), (3, 3)], dimension_numbers=("NCHW", "OIHW", "NCHW"),
        precision=jax.lax.Precision.HIGHEST,
    )  # fmt: skip
    mean = y.mean((0, 2, 3), keepdims=True)
    var = y.var((0, 2, 3), keepdims=True)
    return jnp.sum(jax.nn.relu((y - mean) * jax.lax.rsqrt(var + 1e-5)))


def main(argv: list[str]) -> int:
    from tpu_inductor.targets import tpu_target

    target = argv[0] if argv else "v6e"
    size = int(argv[1]) if len(argv) > 1 else 64
    on = SingleDeviceSharding(tpu_target(target).devices[0])
    w = jax.ShapeDtypeStruct((64, 3, 7, 7), jnp.float32, sharding=on)
    x = jax.ShapeDtypeStruct((2, 3, size, size), jnp.float32, sharding=on)
    start = time.perf_counter()
    jax.jit(jax.grad(stem_loss)).lower(w, x).compile()
    sys.stdout.write(f"{target} {size}px: compiled in {time.perf_counter() - start:.1f} s\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

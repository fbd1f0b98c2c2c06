"""Which JAX device a graph compiles for, and with which XLA compiler options.

One job: the runtime calls executables, this picks where they run and how they are built.
"""

from __future__ import annotations

import functools
import logging

import jax

from tpu_inductor.core.errors import InvalidOptionError

log = logging.getLogger(__name__)  # TORCH_LOGS="+tpu_inductor.core.devices"


@functools.cache
def select_device(name: str | None) -> jax.Device:
    """The JAX device to compile for: the named kind, else TPU, then GPU, then CPU.

    Args:
        name: ``"tpu"``, ``"gpu"``, ``"cpu"`` or ``None`` for the best one present.

    Raises:
        InvalidOptionError: if the named kind is not present, listing what is.
    """
    kinds = [name] if name else ["tpu", "gpu", "cpu"]
    for kind in kinds:
        try:
            devices = jax.devices(kind)
        except RuntimeError:
            continue
        if devices:
            return devices[0]
    have = sorted({d.platform for d in jax.devices()})
    raise InvalidOptionError(
        f"device={name!r} was asked for but JAX sees only {have}; install the matching extra "
        "(pip install 'tpu-inductor[tpu]' or '[cuda]') or drop the 'device' option"
    )


# NOTE: XLA:CPU hands convolutions and the ops around them to YNNPACK as one large fusion that
# re-lays-out every NCHW weight on each call. Keeping YNNPACK to single matmuls speeds up
# convolutional inference but slows a training step, so only inference executables on CPU get
# this option (measured: ``python -m benchmarks.suite``, resnet). It is per executable, never set
# globally, and dropped (once, with a log line) by a jaxlib that doesn't know it.
CPU_INFERENCE_OPTIONS = {
    "xla_cpu_experimental_ynn_fusion_type": "LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT",
}
_rejected_options: set[str] = set()


def compiler_options(platform: str, kind: str) -> dict:
    """XLA compiler options for one executable: ``kind`` is the graph's kind (``"inference"``,
    ``"forward"``, ``"backward"``, with an ``-island`` suffix for fallback pieces)."""
    if platform != "cpu" or not kind.startswith("inference"):
        return {}
    return {k: v for k, v in CPU_INFERENCE_OPTIONS.items() if k not in _rejected_options}


def compile_lowered(lowered, options: dict):
    """``lowered.compile()`` with ``options``; without them if this jaxlib rejects them."""
    if not options:
        return lowered.compile()
    try:
        return lowered.compile(compiler_options=options)
    except Exception as e:
        # Only an error naming one of our options means this jaxlib doesn't know it; any other
        # compile error is the user's and propagates unchanged.
        unknown = {k for k in options if k in str(e)}
        if not unknown:
            raise
        _rejected_options.update(unknown)
        log.info("compiling without %s: %s", sorted(unknown), e)
        return lowered.compile(
            compiler_options={k: v for k, v in options.items() if k not in unknown} or None
        )


def platform_of(device: jax.Device) -> str:
    """``"tpu"``, ``"gpu"`` or ``"cpu"`` (CUDA and ROCm devices both count as ``"gpu"``)."""
    return "gpu" if device.platform in ("gpu", "cuda", "rocm") else device.platform

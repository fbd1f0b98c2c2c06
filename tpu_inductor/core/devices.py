"""Which JAX device a graph compiles for, and with which XLA compiler options.

One job: the runtime calls executables, this picks where they run and how they are built.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os

import jax

from tpu_inductor.core.errors import InvalidOptionError
from tpu_inductor.core.graph_kind import GraphKind

log = logging.getLogger(__name__)  # TORCH_LOGS="+tpu_inductor.core.devices"


# libtpu, loaded by JAX wherever it is installed, looks for the TPU it runs on and, on a machine
# without one, prints a 5-line E0000 block before JAX goes on without it. These say "no TPU here,
# a single host, others may load libtpu too" so that it fails quietly and takes no lockfile.
QUIET_LIBTPU = {
    "TPU_SKIP_MDS_QUERY": "1",
    "TPU_WORKER_HOSTNAMES": "localhost",
    "TPU_ACCELERATOR_TYPE": "v5litepod-4",
    "ALLOW_MULTIPLE_LIBTPU_LOAD": "1",
}


def tpu_attached() -> bool:
    """Whether this machine has a TPU chip on its PCI bus (JAX's own check; ``True`` where this
    JAX lacks it, so nothing is quieted that might be a TPU)."""
    try:
        from jax._src.hardware_utils import num_available_tpu_chips_and_device_id
    except ImportError:
        return True
    try:
        return num_available_tpu_chips_and_device_id()[0] > 0
    except OSError:
        return True


@contextlib.contextmanager
def quiet_libtpu():
    """Let libtpu load without its search for a TPU, where none is attached.

    Each variable of :data:`QUIET_LIBTPU` is set only where unset (a user's own value wins) and
    only for the ``with`` block; nothing changes on a machine with a TPU.
    """
    if tpu_attached():
        yield
        return
    added = {k: v for k, v in QUIET_LIBTPU.items() if k not in os.environ}
    os.environ.update(added)
    try:
        yield
    finally:
        for k in added:
            os.environ.pop(k, None)


@functools.cache
def start_jax() -> None:
    """Start JAX's backends once, the first time tpu-inductor needs a device.

    JAX starts every backend it can on its first device query, libtpu's included; this does it
    under :func:`quiet_libtpu`, so a machine without a TPU shows no libtpu error block. JAX still
    reads ``JAX_PLATFORMS`` itself: ``JAX_PLATFORMS=cpu`` never loads libtpu. Where the user's
    code started JAX first, this changes nothing.
    """
    with quiet_libtpu():
        jax.devices()


@functools.cache
def select_device(name: str | None) -> jax.Device:
    """The JAX device to compile for: the named kind, else TPU, then GPU, then CPU.

    Args:
        name: ``"tpu"``, ``"gpu"``, ``"cpu"`` or ``None`` for the best one present.

    Raises:
        InvalidOptionError: if the named kind is not present, listing what is.
    """
    start_jax()
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


def compiler_options(platform: str, kind: GraphKind) -> dict:
    """XLA compiler options for one executable of a graph of ``kind`` (an island's too)."""
    if platform != "cpu" or kind is not GraphKind.INFERENCE:
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

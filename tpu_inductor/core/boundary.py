"""The torch <-> JAX crossing: how one tensor becomes an array and back.

Per-call inputs cross as zero-copy numpy views handed straight to the XLA executable, and
outputs come back as numpy views of fresh XLA buffers: both are cheaper than DLPack on the CPU
(measured: ``python -m benchmarks.boundary``); on TPU/GPU the executable does the host -> device
copy. Values that should stay on the device (parameters, saved activations, values a graph
returned) are kept by ``residency.py``; this module only crosses.
"""

from __future__ import annotations

import functools
import warnings

import jax
import numpy as np
import torch

from tpu_inductor.core.dtypes import to_jax_dtype


def nbytes(t) -> int:
    """Bytes a tensor or array occupies (what a crossing of it moves)."""
    if isinstance(t, torch.Tensor):
        return t.numel() * t.element_size()
    return int(getattr(t, "nbytes", 0))


def _materialize(t: torch.Tensor) -> torch.Tensor:
    """A detached, contiguous, CPU tensor with conj/neg bits resolved (same values)."""
    if t.requires_grad:
        t = t.detach()
    if t.is_conj() or t.is_neg():
        t = t.resolve_conj().resolve_neg()
    if not t.is_contiguous():
        t = t.contiguous()
    if t.device.type != "cpu":
        t = t.cpu()
    return t


# Dtypes numpy knows only through ml_dtypes: cross as same-width unsigned ints.
_BITCAST = {
    torch.bfloat16: (torch.uint16, np.dtype(jax.numpy.bfloat16)),
    torch.float8_e4m3fn: (torch.uint8, np.dtype(jax.numpy.float8_e4m3fn)),
    torch.float8_e5m2: (torch.uint8, np.dtype(jax.numpy.float8_e5m2)),
}
_BITCAST_BACK = {np_dt: tdt for tdt, (_, np_dt) in _BITCAST.items()}

EFFECT_TOKEN = np.zeros((0,), np.float32)


def tensor_to_host(t: torch.Tensor | None) -> np.ndarray:
    """A zero-copy numpy view of a tensor, for passing straight to an XLA executable.

    Handing executables numpy arrays is the cheapest way in, cheaper than
    ``jax.dlpack.from_dlpack`` (measured: ``python -m benchmarks.boundary``); on TPU/GPU the
    executable copies it to the device.
    """
    if t is None:
        return EFFECT_TOKEN  # AOTAutograd passes None for an effect token (float32[0])
    t = _materialize(t)
    special = _BITCAST.get(t.dtype)
    if special is not None:
        return t.view(special[0]).numpy().view(special[1])
    return t.numpy()


def tensor_to_jax(t: torch.Tensor, device: jax.Device) -> jax.Array:
    """Move one torch tensor to ``device`` as a ``jax.Array`` with the same dtype and values.

    Zero-copy on CPU for contiguous tensors (DLPack). Non-contiguous, channels_last,
    conjugated or negated views are materialized first. Must run with
    ``jax.enable_x64(True)`` so 64-bit dtypes survive.

    The import is of an alias (``detach()``): an array imported from ``t`` itself would hold
    ``t``'s TensorImpl, and torch keeps a tensor's Python object alive while C++ holds its
    impl, so ``t`` (and a residency entry keyed on its life) could never be freed.
    """
    t = _materialize(t.detach())
    if t.numel() == 0:
        arr = jax.numpy.zeros(tuple(t.shape), dtype=to_jax_dtype(t.dtype))
    else:
        arr = jax.dlpack.from_dlpack(t)
    if device.platform != "cpu":
        # Wait for the copy: device_put reads host memory asynchronously, and torch may write
        # the tensor in place right after (see Plan.put in sharding.py, where this raced).
        arr = jax.block_until_ready(jax.device_put(arr, device))
    return arr


def jax_to_host(arr) -> tuple[torch.Tensor, np.ndarray]:
    """One output array as a CPU torch tensor, and the numpy array its storage holds.

    On CPU the tensor is a zero-copy view of the (fresh, never reused) output buffer, cheaper
    than ``torch.from_dlpack`` (measured: ``python -m benchmarks.boundary``); elsewhere
    ``np.asarray`` is the device-to-host copy. The numpy array lives exactly as long as the
    tensor's storage (``torch.from_numpy`` holds it), which is what ``residency.DeviceValues``
    keys a device copy's lifetime on.

    In a multi-controller run (``jax.distributed``, more than one process) an array sharded
    over devices of other processes is gathered first (every process gets the whole value, as
    torch expects; every process runs the same program, so they all gather it together).
    """
    # jax.process_count() is cached by JAX (~30 ns): the single-process path is as it was.
    host = _gather(arr) if jax.process_count() > 1 else np.asarray(arr)
    if getattr(arr, "_npy_value", None) is host:
        # JAX keeps a host copy it made on the array (a sharded array's assembled value; on
        # TPU/GPU, by jax/_src/array.py, any copy), so ``host`` lives as long as ``arr``, which
        # residency.VALUES keeps until ``host`` dies: every output would stay resident for good
        # (fsdp on 2 CPU devices kept every step's gradients and logits). A view is an owner
        # ``arr`` doesn't hold (~60 ns, only here).
        host = host.view()
    back = _BITCAST_BACK.get(host.dtype)
    if back is not None:
        host = host.view(f"u{host.dtype.itemsize}")
        return torch.from_numpy(host).view(back), host
    return torch.from_numpy(host), host


def _gather(arr) -> np.ndarray:
    """The whole value of ``arr`` on this process: its own copy when it holds one (addressable
    or replicated), else an all-gather over the processes (a collective every process joins)."""
    if arr.is_fully_addressable or arr.is_fully_replicated:
        return np.asarray(arr)
    from jax.experimental import multihost_utils

    return multihost_utils.process_allgather(arr, tiled=True)


def is_traced(x) -> bool:
    """Whether a Python-level value is a JAX value (an array, or a tracer inside a trace: a
    scalar read with ``.item()``, a position read in the program) rather than a constant."""
    return isinstance(x, jax.Array | jax.core.Tracer)


@functools.cache
def quiet_readonly_numpy_warning() -> None:
    """Outputs are views of read-only numpy arrays over fresh XLA buffers that nothing else
    holds, so torch's one-time "non-writable NumPy array" warning doesn't apply; spend it."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ro = np.zeros(1)
        ro.flags.writeable = False
        torch.from_numpy(ro)

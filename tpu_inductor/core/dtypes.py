"""torch <-> JAX dtype mapping, shared by the runtime and the lowerings."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import torch

from tpu_inductor.core.errors import UnsupportedDtypeError

TORCH_TO_JAX: dict[torch.dtype, np.dtype] = {
    torch.bool: jnp.dtype(jnp.bool_),
    torch.uint8: jnp.dtype(jnp.uint8),
    torch.int8: jnp.dtype(jnp.int8),
    torch.int16: jnp.dtype(jnp.int16),
    torch.int32: jnp.dtype(jnp.int32),
    torch.int64: jnp.dtype(jnp.int64),
    torch.uint16: jnp.dtype(jnp.uint16),
    torch.uint32: jnp.dtype(jnp.uint32),
    torch.uint64: jnp.dtype(jnp.uint64),
    torch.float16: jnp.dtype(jnp.float16),
    torch.bfloat16: jnp.dtype(jnp.bfloat16),
    torch.float32: jnp.dtype(jnp.float32),
    torch.float64: jnp.dtype(jnp.float64),
    torch.complex64: jnp.dtype(jnp.complex64),
    torch.complex128: jnp.dtype(jnp.complex128),
    torch.float8_e4m3fn: jnp.dtype(jnp.float8_e4m3fn),
    torch.float8_e5m2: jnp.dtype(jnp.float8_e5m2),
}

JAX_TO_TORCH: dict[np.dtype, torch.dtype] = {v: k for k, v in TORCH_TO_JAX.items()}

# Dtypes a TPU cannot hold natively. XLA:TPU would silently compute them in 32 bits.
TPU_UNSUPPORTED = (torch.float64, torch.complex128)


# The one tolerance table: (atol, rtol) per dtype for comparing a compiled result with torch
# eager's, exact for integers and bools. "op": one op (the OpInfo conformance test, the test
# helpers); "model": a whole model or training step, where rounding adds up over many ops
# (testing.assert_matches_cpu, the divergence locator in debug.py, buckets.py's check).
TOLERANCES: dict[torch.dtype, dict[str, tuple[float, float]]] = {
    torch.float16: {"op": (1e-3, 1e-3), "model": (1e-2, 1e-2)},
    torch.bfloat16: {"op": (1e-2, 1.6e-2), "model": (2e-2, 2e-2)},
    torch.float32: {"op": (1e-5, 1e-4), "model": (1e-4, 1e-4)},
    torch.float64: {"op": (1e-7, 1e-7), "model": (1e-7, 1e-7)},
    torch.complex64: {"op": (1e-5, 1e-4), "model": (1e-4, 1e-4)},
    torch.complex128: {"op": (1e-7, 1e-7), "model": (1e-7, 1e-7)},
}


def tolerance(
    dtype: torch.dtype, atol: float | None = None, rtol: float | None = None, level: str = "model"
) -> tuple[float, float]:
    """(atol, rtol) for ``dtype`` at ``level`` (``"op"`` or ``"model"``), explicit values
    winning; exact for ints and bools."""
    a, r = TOLERANCES.get(dtype, {}).get(level, (0.0, 0.0))
    return (a if atol is None else atol), (r if rtol is None else rtol)


def to_jax_dtype(dtype: torch.dtype) -> np.dtype:
    """Return the JAX dtype for a torch dtype, or raise naming the dtype."""
    try:
        return TORCH_TO_JAX[dtype]
    except KeyError:
        raise UnsupportedDtypeError(
            f"torch dtype {dtype} has no JAX equivalent; convert the tensor (e.g. .float()) "
            "before the compiled region"
        ) from None


def describe_tensor(dtype: torch.dtype, shape) -> str:
    """How messages and reports name a tensor: ``float32[2, 3]``."""
    return f"{str(dtype).removeprefix('torch.')}{list(shape)}"


def reject_tpu_64bit(bad: list[str], what: str) -> None:
    """Raise one :class:`UnsupportedDtypeError` listing ``bad`` (descriptions of ``what``: the
    graph's values or the compiled region's inputs) when it is not empty: a TPU holds no
    float64/complex128, and every such value is named at once so one fix covers them all."""
    if not bad:
        return
    raise UnsupportedDtypeError(
        f"TPUs have no 64-bit floating point; {what} are float64/complex128:\n  - "
        + "\n  - ".join(bad)
        + "\nWhat to do: convert them to float32 (model.float(), tensor.float(), or "
        "torch.set_default_dtype(torch.float32) before building the model) or compile with "
        "options={'device': 'cpu'}."
    )

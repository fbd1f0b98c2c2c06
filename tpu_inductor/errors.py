"""Every exception tpu-inductor raises on purpose lives here.

Each error names what went wrong (the op, the tensor, the option), where it came from in the
user's code when that is known, and what to do about it.
"""

from __future__ import annotations


class TpuInductorError(RuntimeError):
    """Base class of all tpu-inductor errors."""


class InvalidOptionError(TpuInductorError, ValueError):
    """An option passed through ``torch.compile(..., options={...})`` is unknown or invalid."""


class UnsupportedOpError(TpuInductorError):
    """One or more ATen ops of a graph have no lowering to JAX.

    ``missing`` holds one line per offending node: the op, its argument shapes and dtypes and
    the user's source line.
    """

    def __init__(self, message: str, missing: list[str] | None = None):
        super().__init__(message)
        self.missing = list(missing or [])


class UnsupportedDtypeError(TpuInductorError, TypeError):
    """A tensor has a dtype that the target device (or JAX) cannot represent."""


class LoweringError(TpuInductorError):
    """A lowering raised while translating one FX node; the message names the node."""


class ShapeMismatchError(TpuInductorError):
    """A lowered value's shape or dtype differs from the node's ``meta["val"]``.

    Raised only with ``options={"check_meta": True}``; it points at a bug in a lowering.
    """

"""Every exception tpu-inductor raises on purpose lives here.

Each error names what went wrong (the op, the tensor, the option), where it came from in the
user's code when that is known, and what to do about it.
"""

from __future__ import annotations

try:
    # Dynamo re-raises ShortenTraceback subclasses from a backend as they are (with Dynamo's
    # frames trimmed) instead of wrapping them in BackendCompilerFailed, so users can write
    # ``except UnsupportedOpError``.
    from torch._dynamo.exc import ShortenTraceback as _DynamoPassThrough
except ImportError:  # older torch: the error arrives wrapped, as BackendCompilerFailed's cause
    _DynamoPassThrough = RuntimeError


class TpuInductorError(RuntimeError):
    """Base class of all tpu-inductor errors."""


class CompileError(TpuInductorError, _DynamoPassThrough):
    """An error found while compiling a graph; reaches the user unwrapped through Dynamo."""

    def __init__(self, *args):
        RuntimeError.__init__(self, *args)
        self.first_useful_frame = None


class InvalidOptionError(CompileError, ValueError):
    """An option passed through ``torch.compile(..., options={...})`` is unknown or invalid."""


class UnsupportedOpError(CompileError):
    """One or more ATen ops of a graph have no lowering to JAX.

    ``missing`` holds one line per offending node: the op, its argument shapes and dtypes and
    the user's source line.
    """

    def __init__(self, message: str, missing: list[str] | None = None):
        super().__init__(message)
        self.missing = list(missing or [])


class UnsupportedDtypeError(CompileError, TypeError):
    """A tensor has a dtype that the target device (or JAX) cannot represent."""


class UnsupportedInputError(CompileError, TypeError):
    """A graph input holds no data the device can run on (a tensor on the ``meta`` device).

    The message names each such input (as Dynamo sources it: ``L['x']``,
    ``L['self']._parameters['weight']``) and what to do instead.
    """


class LoweringError(TpuInductorError):
    """A lowering raised while translating one FX node; the message names the node."""


class ShapeMismatchError(TpuInductorError):
    """A lowered value's shape or dtype differs from the node's ``meta["val"]``.

    Raised only with ``options={"check_meta": True}``; it points at a bug in a lowering.
    """


class FallbackWarning(UserWarning):
    """Some ops of a graph run in torch on the CPU because they have no lowering."""


class PaddingWarning(UserWarning):
    """Padding to shape buckets (``pad_to``) changed a graph's results, so that graph runs at
    exact shapes from then on; padding is only safe where padded positions can't affect real
    ones (e.g. the sequence end of a causal decoder)."""


class TransferError(TpuInductorError):
    """A value crossed between host and device in steady state where nothing should cross.

    Raised only with ``options={"transfers": "error"}``; the message names the graph, the value
    (its position, shape and dtype), the bytes, why it crossed and what avoids it.
    """


class RegistrationError(TpuInductorError, TypeError, ValueError):
    """``tpu_inductor.register_lowering`` cannot register what it was given.

    The message names the op and what is wrong: not a torch op or an unknown name, a lowering
    already registered (without ``replace=True``), a non-callable, or a function whose signature
    does not take the op's schema arguments. It is a ``TypeError`` and a ``ValueError`` too.
    """


class LoweringOutputError(LoweringError):
    """A lowering registered with ``tpu_inductor.register_lowering`` returned the wrong number
    of outputs, or an output whose shape or dtype differs from the op's fake (meta) function.

    Raised while the graph is traced (its first call); the message names the op, the function,
    the user's source line, expected vs got, and the fix.
    """


class ShardingError(CompileError, ValueError):
    """A sharding plan that does not fit the model (``options["shardings"]``): every tensor a
    rule cannot shard and every pattern that matches nothing, with the fix."""


# A failed torch._assert_async on a value: the host callback that checks it raises this prefix
# (JAX wraps it in a JaxRuntimeError, with its traceback); the runtime raises the rest alone.
ASSERT_FAILED = "torch._assert_async failed: "


def raise_failed_assert(error: Exception) -> None:
    """Re-raise a JAX runtime error from a failed ``torch._assert_async`` as torch's own
    ``RuntimeError(msg)`` (with the user's source line); return for any other error."""
    text = str(error)
    if ASSERT_FAILED in text:
        raise RuntimeError(text[text.rindex(ASSERT_FAILED) + len(ASSERT_FAILED) :]) from None


class TargetCompileError(TpuInductorError):
    """Programs compiled for a TPU target (``options={"target": ...}``) were refused by the TPU
    compiler or do not fit in the chip's HBM.

    Raised by :meth:`tpu_inductor.tpu_report` ``(...).raise_for_errors()``; the message lists
    every such program, why (with the user's source line) and by how much it is over.
    """


class EagerRefusalError(CompileError):
    """Eager PyTorch refuses this program, so the compiled one does too.

    Torch's fake tensors (what Dynamo and AOTAutograd trace with) skip checks its CPU kernels
    make: operand dtypes that must agree (``mm``, ``conv``, ``index_put_``), in-place results
    that can't be cast back (an integer ``mul_`` by a float), ops eager implements for
    floating types only. The message quotes eager's own error for each such op, with the
    user's source line; ``refused`` holds ``(op, eager's message, source line)`` triples.
    """

    def __init__(self, message: str, refused: list[tuple[str, str, str]] | None = None):
        super().__init__(message)
        self.refused = list(refused or [])

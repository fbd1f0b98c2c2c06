"""Every error and warning tpu-inductor raises on purpose, in one namespace.

``except tpu_inductor.errors.CompileError`` catches what a compile refuses (Dynamo hands these
to the user unwrapped); ``TpuInductorError`` is the base of every error. The classes are
defined in ``tpu_inductor.core.errors``, where each docstring says when it fires and what to
do.
"""

from tpu_inductor.core.errors import (
    CompileError,
    EagerRefusalError,
    FallbackWarning,
    InvalidOptionError,
    LoweringError,
    LoweringOutputError,
    PaddingWarning,
    RegistrationError,
    ShapeMismatchError,
    ShardingError,
    TargetCompileError,
    TpuInductorError,
    TransferError,
    UnsupportedDtypeError,
    UnsupportedInputError,
    UnsupportedOpError,
)

__all__ = [
    "CompileError",
    "EagerRefusalError",
    "FallbackWarning",
    "InvalidOptionError",
    "LoweringError",
    "LoweringOutputError",
    "PaddingWarning",
    "RegistrationError",
    "ShapeMismatchError",
    "ShardingError",
    "TargetCompileError",
    "TpuInductorError",
    "TransferError",
    "UnsupportedDtypeError",
    "UnsupportedInputError",
    "UnsupportedOpError",
]

"""What identifies one executable of a graph: its call's signature (every tensor input's shape
and dtype, the static inputs, shardings under a plan) and the backward's tangents that are all
zeros (:class:`Zeros`, constants of the program)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
import torch

from tpu_inductor.core.dtypes import to_jax_dtype


@dataclasses.dataclass(frozen=True)
class Zeros:
    """A backward's tangent that is all zeros (autograd's stand-in for the gradient of an
    output nobody differentiated: a language model's logits beside its loss). It is a static
    argument of the executable, made inside the program as a constant, so XLA folds it away
    (``g + 0`` is ``g``) instead of holding an array of zeros in HBM and reading it."""

    shape: tuple
    dtype: np.dtype

    @classmethod
    def like(cls, t: torch.Tensor) -> Zeros:
        """The zeros standing for tangent ``t``."""
        return cls(tuple(t.shape), np.dtype(to_jax_dtype(t.dtype)))

    sharding = None  # placed nowhere: it is not an argument of the program


def without_zeros(arrays: Sequence) -> list:
    """A call's arrays as its executable takes them: the :class:`Zeros` are its constants."""
    return [a for a in arrays if type(a) is not Zeros]


def zero_positions(arrays: Sequence) -> tuple[int, ...]:
    """Which of a call's arrays are :class:`Zeros` (part of its signature)."""
    return tuple(k for k, a in enumerate(arrays) if type(a) is Zeros)


def signature_of(arrays: Sequence, statics: Sequence, shardings: bool = False) -> tuple:
    """The executable-cache key of a call: every tensor input's (shape, dtype), the static
    inputs, their shardings under a plan, and which inputs are :class:`Zeros` (last, tagged)."""
    signature = (tuple((x.shape, x.dtype) for x in arrays), tuple(statics))
    if shardings:
        signature += (tuple(getattr(x, "sharding", None) for x in arrays),)
    zeros = zero_positions(arrays)
    return signature + ((_ZEROS, zeros),) if zeros else signature


_ZEROS = object()  # tags a signature's Zeros positions (no static input can equal it)


def zeros_of(signature: tuple) -> tuple[int, ...]:
    """The positions :func:`signature_of` marked as :class:`Zeros`."""
    last = signature[-1]
    return last[1] if len(last) == 2 and last[0] is _ZEROS else ()


def fmt_spec(spec) -> str:
    """``float32[2, 3]`` for a signature's ``(shape, dtype)``."""
    shape, dtype = spec
    return f"{dtype}{list(shape)}"


def python_scalar(v):
    """SymInts/SymFloats that reach a graph are concrete here; make them plain Python."""
    if isinstance(v, torch.SymInt):
        return int(v)
    if isinstance(v, torch.SymFloat):
        return float(v)
    if isinstance(v, torch.SymBool):
        return bool(v)
    if isinstance(v, torch.Tensor):
        return v.item()
    return v

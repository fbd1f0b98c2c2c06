"""The ATen -> JAX lowering table and the decorator that fills it (:func:`lowers`).

A lowering is a pure function ``fn(ctx, *args, **kwargs)``: ``ctx`` is a
:class:`LoweringContext`, the rest are the ATen schema's arguments by their schema names, with
tensors as ``jax.Array`` and everything else as plain Python values. Type promotion is declared
at registration (``promote=``) with torch's own rules, so lowerings never rely on ``jnp``'s
implicit promotion.
"""

from __future__ import annotations

import dataclasses
import math
import operator
import re
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import torch
from torch._ops import HigherOrderOperator, OpOverload, OpOverloadPacket
from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND, elementwise_dtypes

from tpu_inductor.core.dtypes import to_jax_dtype
from tpu_inductor.core.shapes import concrete_shape

P = ELEMENTWISE_TYPE_PROMOTION_KIND


@dataclasses.dataclass(kw_only=True)
class LoweringContext:
    """What a lowering may know besides its arguments.

    Attributes:
        node: the FX node being lowered (``node.meta["val"]`` is the output spec).
        precision: the ``jax.lax.Precision`` for float32 matmuls and convolutions.
        arg_metas: the node's positional arguments with FX nodes replaced by their
            ``meta["val"]`` (FakeTensors / SymInts), for promotion decisions.
        make_key: returns a fresh, per-node ``jax.random`` key (only valid while tracing).
        bindings: values of the graph's size symbols in the call being traced (dynamic shapes).
        platform: ``"tpu"``, ``"gpu"`` or ``"cpu"``, the device the graph is compiled for
            (``None`` when not known, e.g. a subgraph lowered on its own).
        seed, draws: the graph's random seed and the number of its next draw (a list, shared
            with the subgraphs it calls; only valid while tracing).
    """

    node: Any
    precision: Any
    arg_metas: tuple
    make_key: Callable[[], jax.Array] | None = None
    bindings: dict | None = None
    platform: str | None = None
    seed: Any = None  # the graph's seed and its draw counter, for a subgraph's call to share
    draws: list | None = None

    @property
    def out(self):
        """The node's ``meta["val"]``: a FakeTensor, or a tuple of them."""
        return self.node.meta.get("val")

    def matmul_precision(self, *operands):
        """:func:`matmul_precision` of ``operands`` at this graph's float32 precision."""
        return matmul_precision(self.precision, *operands)

    def out_dtype(self, index: int | None = None):
        """The JAX dtype torch gives this node's output (``index`` for multi-output ops)."""
        val = self.out if index is None else self.out[index]
        return to_jax_dtype(val.dtype)

    def out_shape(self, index: int | None = None) -> tuple[int, ...]:
        """The concrete shape torch gives this node's output (symbolic sizes evaluated)."""
        val = self.out if index is None else self.out[index]
        return concrete_shape(val.shape, self.bindings)

    def uses_output(self, index: int) -> bool:
        """Whether anything in the graph reads output ``index`` of this multi-output node (a
        lowering may then skip computing an unread output, e.g. pooling indices in inference)."""
        users = getattr(self.node, "users", None)
        if users is None:  # not a plain FX node (a with_effects view): assume it is read
            return True
        return any(u.target is not operator.getitem or u.args[1] == index for u in users)

    def key(self) -> jax.Array:
        """A fresh PRNG key derived from torch's generator for this call and this node."""
        if self.make_key is None:
            raise RuntimeError("random lowering called outside a traced graph")
        return self.make_key()


@dataclasses.dataclass(frozen=True, kw_only=True)
class Lowering:
    """One row of the op table: an op, its lowering and how the lowering is called.

    Attributes:
        op: an ``OpOverload``, a higher-order op, a function of ours that a graph rewrite
            inserts, or a custom op's qualified name (``str``: registered by name, not yet
            bound to its op).
        fn: ``fn(ctx, *args, **kwargs)``.
        promote / promote_args / wide_args: see :func:`lowers`.
        random: whether the op draws random numbers, or a predicate of the node (a
            higher-order op draws when what it calls draws).
        wraps: for a wrapper op (``with_effects(token, op, *args)``), the position of the op it
            wraps among its arguments: the graph walk then describes the node to ``fn`` (its
            ``ctx``) and to the refusal rules as that op, and ``fn`` calls that op's row.
    """

    op: Any
    fn: Callable[..., Any]
    promote: ELEMENTWISE_TYPE_PROMOTION_KIND | None = None
    promote_args: tuple[int, ...] | None = None
    random: bool | Callable[[Any], bool] = False
    wide_args: tuple[int, ...] = ()
    wraps: int | None = None

    def __call__(self, ctx: LoweringContext, args: Sequence, kwargs: dict) -> Any:
        if self.promote is None:
            return self.fn(ctx, *args, **kwargs)
        idx = (
            self.promote_args
            if self.promote_args is not None
            else [i for i, a in enumerate(ctx.arg_metas) if _is_promotable(a)]
        )
        metas = [ctx.arg_metas[i] for i in idx if i < len(ctx.arg_metas)]
        metas = [m for m in metas if _is_promotable(m)]
        compute, result = elementwise_dtypes(*metas, type_promotion_kind=self.promote)
        if self.promote in (P.ALWAYS_BOOL, P.COMPLEX_TO_FLOAT):
            common = elementwise_dtypes(*metas, type_promotion_kind=P.NO_OPMATH)[1]
        else:
            common = result
        # complex32 has no JAX dtype. An op whose result is not complex32 but computes in it
        # (``eq(float16, 1j)`` is bool) computes in complex64 on operands rounded to half
        # first: the same numbers. A complex32 result stays the clear UnsupportedDtypeError.
        half_complex = common == torch.complex32 and result != torch.complex32
        if half_complex:
            compute = common = torch.complex64
        compute, common = to_jax_dtype(compute), to_jax_dtype(common)
        args = list(args)
        for i in idx:
            if i >= len(args):
                continue
            # Like torch's TensorIterator: every operand is first converted to the common dtype
            # (so a 0-d float32 tensor or a Python 0.849 meeting a bfloat16 tensor is rounded to
            # bfloat16: ``bf16 == 0.849`` holds where the tensor holds 0.84765625), then computed
            # in the computation dtype (float32 for half types). Kernels that read a one-element
            # operand at full precision instead (mul, div: ``original_scalar_value``) declare
            # that position in ``wide_args``.
            via = compute if i in self.wide_args else common
            if isinstance(args[i], jax.Array | jax.core.Tracer):
                args[i] = convert(convert(args[i], via), compute)
            elif self.promote_args is not None and _is_number(args[i]):
                # A declared operand given as a Python number (``2 ** x``, ``x < 1000``) is a
                # "wrapped number" to torch: it takes part in promotion by category only and is
                # then converted like a tensor. Left a Python number, the lowering would see
                # JAX's dtype for it (int64 for ``10000`` in ``torch.pow(10000, x)``).
                args[i] = convert(scalar_array(args[i], via), compute)
            if half_complex and i < len(args) and not _is_number(args[i]):
                args[i] = _round_to_complex_half(args[i])
        out = self.fn(ctx, *args, **kwargs)
        return convert(out, to_jax_dtype(result))


def _round_to_complex_half(x: jax.Array) -> jax.Array:
    """A complex64 ``x`` with both parts rounded to float16, as a complex32 value would be."""
    half = jnp.float16
    return jax.lax.complex(
        x.real.astype(half).astype(jnp.float32), x.imag.astype(half).astype(jnp.float32)
    )


def convert(x, dtype) -> jax.Array:
    """``x.astype(dtype)``, except that bools become floats through a select: XLA rewrites
    ``convert(pred) * y`` into ``select(pred, y, 0)``, which loses ``0 * nan = nan`` and
    ``0 * inf = nan`` (torch: ``mask.float() * inf`` is NaN where the mask is False)."""
    if x.dtype == jnp.bool_ and jnp.issubdtype(dtype, jnp.inexact):
        return jnp.where(x, jnp.ones((), dtype), jnp.zeros((), dtype))
    return x.astype(dtype)


def _is_promotable(meta) -> bool:
    return isinstance(meta, torch.Tensor | bool | int | float | complex | torch.SymInt)


def _is_number(x) -> bool:
    return isinstance(x, bool | int | float | complex | np.number | np.bool_)


def scalar_array(value, dtype) -> jax.Array:
    """A Python number as a 0-d array of ``dtype``, converted the way torch converts a Scalar
    (C casts): integers wrap modulo 2**bits (``int8``: 1000 -> -24), floats round to nearest
    (overflow -> inf), a complex number to a real dtype keeps its real part, a float to an
    integer dtype truncates.
    """
    dtype = np.dtype(dtype)
    if not _is_number(value):  # already an array (a symbolic scalar under dynamic=True)
        return convert(jnp.asarray(value), dtype)
    if isinstance(value, complex | np.complexfloating) and dtype.kind != "c":
        value = value.real
    if dtype.kind == "b":
        return jnp.asarray(bool(value))
    if dtype.kind in "iu":
        if isinstance(value, float | np.floating):
            value = math.trunc(value) if math.isfinite(value) else 0
        bits = dtype.itemsize * 8
        value = int(value) % (1 << bits)
        if dtype.kind == "i" and value >= 1 << (bits - 1):
            value -= 1 << bits
        return jnp.asarray(np.asarray(value, dtype))
    with np.errstate(over="ignore", invalid="ignore"):
        return jnp.asarray(np.asarray(value, dtype))


def _qualified_name(op: OpOverload) -> str:
    """``"namespace::name.overload"``, the name a custom op is registered under."""
    return f"{op._schema.name}.{op._overloadname}"


class _LoweringTable(dict):
    """``op -> Lowering``, plus lowerings of custom ops registered by name.

    A custom op (``torch.library``) exists only once its library is imported, and importing,
    say, ``transformers`` here would cost seconds. Such lowerings wait in ``pending`` under their
    qualified name and are bound to the ``OpOverload`` on its first lookup. Rows are written
    only through :func:`install` and :func:`uninstall`.
    """

    def __init__(self):
        super().__init__()
        self.pending: dict[str, Lowering] = {}

    def _bind(self, op) -> None:
        if self.pending and isinstance(op, OpOverload) and not dict.__contains__(self, op):
            low = self.pending.pop(_qualified_name(op), None)
            if low is not None:
                dict.__setitem__(self, op, dataclasses.replace(low, op=op))

    def __contains__(self, op) -> bool:
        self._bind(op)
        return dict.__contains__(self, op)

    def __getitem__(self, op) -> Lowering:
        self._bind(op)
        return dict.__getitem__(self, op)

    def get(self, op, default=None):
        self._bind(op)
        return dict.get(self, op, default)


LOWERINGS: _LoweringTable = _LoweringTable()


def install(row: Lowering, *, replace: bool = False) -> None:
    """Put ``row`` in the op table: the one way a lowering gets there (:func:`lowers` for
    tpu-inductor's own, ``tpu_inductor.register_lowering`` for users').

    Raises:
        ValueError: if ``row.op`` already has a lowering and ``replace`` is false.
    """
    if not replace and (row.op in LOWERINGS or row.op in LOWERINGS.pending):
        raise ValueError(f"{row.op} is registered twice")
    if isinstance(row.op, str):
        LOWERINGS.pending[row.op] = row
    else:
        dict.__setitem__(LOWERINGS, row.op, row)


def uninstall(op) -> None:
    """Remove ``op``'s row from the op table (nothing when it has none)."""
    dict.pop(LOWERINGS, op, None)


def _expand(op) -> list:
    if isinstance(op, OpOverloadPacket):
        return [getattr(op, name) for name in op.overloads()]
    if isinstance(op, OpOverload | HigherOrderOperator):
        return [op]
    if isinstance(op, str) and re.fullmatch(r"\w+::\w+\.\w+", op):
        return [op]
    if callable(op) and getattr(op, "__module__", "").startswith("tpu_inductor."):
        return [op]  # an op of ours that a graph rewrite inserts (a torch function: runnable)
    raise TypeError(
        f"lowers expects ATen ops, higher-order ops or 'namespace::op.overload', got {op!r}"
    )


def lowers(
    *ops,
    promote: ELEMENTWISE_TYPE_PROMOTION_KIND | None = None,
    promote_args: Sequence[int] | None = None,
    random: bool | Callable[[Any], bool] = False,
    wide_args: Sequence[int] = (),
    wraps: int | None = None,
) -> Callable:
    """Decorator: register ``fn`` as the lowering of every overload in ``ops`` (tpu-inductor's
    own lowerings; users call ``tpu_inductor.register_lowering``).

    Args:
        ops: ``OpOverload`` s, packets (expanded to all their overloads), higher-order ops
            (``torch.ops.higher_order.*``), a custom op's qualified name
            ``"namespace::op.overload"`` (bound when the op is first looked up, so its library
            need not be imported here), or a function of tpu_inductor's that a graph rewrite
            puts in graphs (written in torch, so the graph still runs in torch:
            ``lowering/leading_dims.py``).
        promote: torch's elementwise promotion kind; tensor arguments are cast to the
            computation dtype before ``fn`` runs and the result to the result dtype after.
        promote_args: positions of the arguments that take part in promotion (default: every
            tensor or number argument). Python numbers at these positions reach ``fn`` as 0-d
            arrays of the computation dtype (:func:`scalar_array`), as torch converts them.
        random: the op draws random numbers (the graph then receives a key per call), or a
            predicate of the node saying so (a higher-order op that calls a subgraph).
        wide_args: promoted positions whose operand torch's kernel reads at the computation
            precision (a Python number or 0-d tensor meeting a bfloat16 tensor in ``mul`` or
            ``div`` is not rounded to bfloat16 first; everywhere else it is).
        wraps: for a higher-order op that wraps another op, that op's position among its
            arguments (see :class:`Lowering`).

    Raises:
        ValueError: if an overload already has a lowering.
    """

    def decorate(fn):
        for packet in ops:
            for op in _expand(packet):
                install(
                    Lowering(
                        op=op,
                        fn=fn,
                        promote=promote,
                        promote_args=tuple(promote_args) if promote_args else None,
                        random=random,
                        wide_args=tuple(wide_args),
                        wraps=wraps,
                    )
                )
        return fn

    return decorate


# --- torch's opmath: float16/bfloat16 compute in float32, and the result is cast back ---------
HALF = (jnp.float16, jnp.bfloat16)


def opmath_dtype(dtype):
    """The dtype torch computes ``dtype`` in: float32 for float16/bfloat16, else ``dtype``."""
    return jnp.float32 if dtype in HALF else dtype


def upcast(x):
    """``x`` in its opmath dtype (float16/bfloat16 -> float32; anything else unchanged)."""
    return x.astype(jnp.float32) if x.dtype in HALF else x


def accumulate_in(*dtypes):
    """``preferred_element_type`` of a matmul or convolution over ``dtypes``: float32 when one is
    float16/bfloat16 (accumulate like torch's opmath), else ``None`` (the inputs' own)."""
    return jnp.float32 if any(d in HALF for d in dtypes) else None


def matmul_precision(precision, *operands):
    """The ``precision`` to give a matmul or convolution of ``operands``: none when every operand
    is bfloat16, else ``precision`` (the user's float32 matmul precision, ``ctx.precision``).

    A bfloat16 product is exact in the float32 accumulator at any precision, so the setting changes
    no value on any backend; but XLA:TPU treats an operand asked for ``Precision.HIGHEST`` as a
    multi-pass float32 product:

    - it does not fuse that matmul into its consumer: bf16 attention scores are written out and
      read back by the softmax fusion (``attention._fused_softmax``);
    - Mosaic refuses a bf16 ragged dot (a MoE layer's) asked for it (``Bad lhs type``), so every
      bfloat16 MoE training step would fail to compile; float16 and float32 compile at
      HIGHEST.

    float16 keeps ``precision``: its 11-bit significands do not fit one bfloat16 pass.
    """
    if operands and all(jnp.dtype(o.dtype) == jnp.bfloat16 for o in operands):
        return None
    return precision


def jdt(dtype: torch.dtype | None, default=None):
    """JAX dtype of an optional torch dtype argument (``None`` -> ``default``)."""
    return default if dtype is None else to_jax_dtype(dtype)

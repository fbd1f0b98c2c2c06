"""The ATen -> JAX lowering table and the decorator that fills it.

A lowering is a pure function ``fn(ctx, *args, **kwargs)``: ``ctx`` is a
:class:`LoweringContext`, the rest are the ATen schema's arguments by their schema names, with
tensors as ``jax.Array`` and everything else as plain Python values. Type promotion is declared
at registration (``promote=``) with torch's own rules, so lowerings never rely on ``jnp``'s
implicit promotion.
"""

from __future__ import annotations

import dataclasses
import operator
import re
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import torch
from torch._ops import OpOverload, OpOverloadPacket
from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND, elementwise_dtypes

from tpu_inductor.dtypes import to_jax_dtype
from tpu_inductor.shapes import concrete_shape

P = ELEMENTWISE_TYPE_PROMOTION_KIND


@dataclasses.dataclass
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
    """

    node: Any
    precision: Any
    arg_metas: tuple
    make_key: Callable[[], jax.Array] | None = None
    bindings: dict | None = None
    platform: str | None = None

    @property
    def out(self):
        """The node's ``meta["val"]``: a FakeTensor, or a tuple of them."""
        return self.node.meta.get("val")

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


@dataclasses.dataclass(frozen=True)
class Lowering:
    """One registered lowering: the function and how its inputs are promoted."""

    op: OpOverload | str  # str: a custom op registered by name, not yet bound
    fn: Callable[..., Any]
    promote: ELEMENTWISE_TYPE_PROMOTION_KIND | None
    promote_args: tuple[int, ...] | None
    random: bool

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
        compute = to_jax_dtype(compute)
        args = list(args)
        for i in idx:
            if i < len(args) and isinstance(args[i], jax.Array | jax.core.Tracer):
                args[i] = args[i].astype(compute)
        out = self.fn(ctx, *args, **kwargs)
        return out.astype(to_jax_dtype(result))


def _is_promotable(meta) -> bool:
    return isinstance(meta, torch.Tensor | bool | int | float | complex | torch.SymInt)


def _qualified_name(op: OpOverload) -> str:
    """``"namespace::name.overload"``, the name a custom op is registered under."""
    return f"{op._schema.name}.{op._overloadname}"


class _LoweringTable(dict):
    """``OpOverload -> Lowering``, plus lowerings of custom ops registered by name.

    A custom op (``torch.library``) exists only once its library is imported, and importing,
    say, ``transformers`` here would cost seconds. Such lowerings wait in ``pending`` under their
    qualified name and are bound to the ``OpOverload`` on its first lookup.
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


def _expand(op) -> list[OpOverload | str]:
    if isinstance(op, OpOverloadPacket):
        return [getattr(op, name) for name in op.overloads()]
    if isinstance(op, OpOverload):
        return [op]
    if isinstance(op, str) and re.fullmatch(r"\w+::\w+\.\w+", op):
        return [op]
    raise TypeError(f"register_lowering expects ATen ops or 'namespace::op.overload', got {op!r}")


def register_lowering(
    *ops,
    promote: ELEMENTWISE_TYPE_PROMOTION_KIND | None = None,
    promote_args: Sequence[int] | None = None,
    random: bool = False,
) -> Callable:
    """Register ``fn`` as the lowering of every overload in ``ops``.

    Args:
        ops: ``OpOverload`` s, packets (expanded to all their overloads), or a custom op's
            qualified name ``"namespace::op.overload"`` (bound when the op is first looked up,
            so its library need not be imported here).
        promote: torch's elementwise promotion kind; tensor arguments are cast to the
            computation dtype before ``fn`` runs and the result to the result dtype after.
        promote_args: positions of the arguments that take part in promotion (default: every
            tensor or number argument).
        random: the op draws random numbers (the graph then receives a key per call).

    Raises:
        ValueError: if an overload already has a lowering.
    """

    def decorate(fn):
        for packet in ops:
            for op in _expand(packet):
                if op in LOWERINGS or op in LOWERINGS.pending:
                    raise ValueError(f"{op} is registered twice")
                low = Lowering(
                    op, fn, promote, tuple(promote_args) if promote_args else None, random
                )
                if isinstance(op, str):
                    LOWERINGS.pending[op] = low
                else:
                    LOWERINGS[op] = low
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


def jdt(dtype: torch.dtype | None, default=None):
    """JAX dtype of an optional torch dtype argument (``None`` -> ``default``)."""
    return default if dtype is None else to_jax_dtype(dtype)


def ensure_array(x, dtype=None) -> jax.Array:
    """A Python scalar or array as a JAX array (of ``dtype`` when given)."""
    return jnp.asarray(x, dtype=dtype)

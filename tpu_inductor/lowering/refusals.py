"""Refuse what eager refuses: the checks torch's CPU kernels make that its meta functions don't.

Dynamo and AOTAutograd trace with FakeTensors, whose meta functions compute shapes and dtypes
but skip many of the checks eager's CPU kernels make: ``mm`` of float32 by float64, an integer
tensor's in-place ``mul_`` by a float one (functionalized into ``mul`` + a casting ``copy_``
before any backend sees it), ``gelu`` of an integer tensor, ``x[idx] = v`` with ``v`` of another
dtype. The compiled program would then compute something eager never does.

So each node of the torch-level graph Dynamo hands the backend whose operands could meet such a
check (a ``FAMILIES`` row says when) is tried in eager on small CPU stand-ins of its operands:
the same dtypes, the real shapes when small (else every size 1), ones as values. If eager
raises, and raises no more once the operands' dtypes are made to agree (``_controls``), eager
refuses this program for its dtypes: :class:`~tpu_inductor.core.errors.EagerRefusalError` carries
eager's own message, the op and the user's line. A try whose dtype-agreeing controls fail too
says nothing about dtypes (a shape the stand-ins don't meet) and refuses nothing: what the
stand-ins' shapes or values cause can only hide a refusal. Results are cached per op, dtypes, shapes
and arguments. Ops never tried are ``NEVER_TRIED``, each with the reason.

Cost, at compile time only: one eager try per distinct op signature, cached, so a model's
repeated layers are checked once.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import operator
from collections.abc import Callable
from typing import Any

import torch
import torch.fx as fx

from tpu_inductor.core.dtypes import describe_tensor
from tpu_inductor.core.errors import EagerRefusalError
from tpu_inductor.core.sources import user_frame

log = logging.getLogger(__name__)

_SMALL = 1 << 14  # stand-ins take the real shapes up to this many elements in all
_INTEGRAL = (torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)


def _tensors(args) -> list[torch.Tensor]:
    return [a for a in torch.utils._pytree.tree_leaves(args) if isinstance(a, torch.Tensor)]


def _mixed_dtypes(node, args) -> bool:
    """Tensor operands of different dtypes: matmuls, convolutions, index writes
    (``index_put_``, ``scatter_``, ``masked_scatter_``, ``x[i] = v``), ``lerp``..."""
    return len({t.dtype for t in _tensors(args)}) > 1


def _integral_operand(node, args) -> bool:
    """An integer or bool operand, for ops eager implements for floating types only
    (``gelu``, ``softmax``, ``var``, ``frac``...) or not for bool (``abs``, ``floor``,
    ``relu``), and integer powers with a negative exponent."""
    return any(t.dtype in _INTEGRAL for t in _tensors(args))


def _in_place(node, args) -> bool:
    """An in-place op (``a.mul_(b)``, ``a *= b``) whose result dtype may not cast back to
    ``a``'s (``result type Float can't be cast to the desired output type Long``)."""
    name = _name(node.target)
    if not (name in _IN_PLACE_OPERATORS or name.endswith("_") and not name.endswith("__")):
        return False
    leaves = torch.utils._pytree.tree_leaves(args)
    self = leaves[0] if leaves else None
    if not isinstance(self, torch.Tensor):
        return False
    return any(
        isinstance(a, torch.Tensor)
        and a.dtype != self.dtype
        or isinstance(a, float | complex)
        and not (self.is_floating_point() or self.is_complex())
        for a in leaves[1:]
    )


_IN_PLACE_OPERATORS = {
    "iadd", "isub", "imul", "itruediv", "ifloordiv", "imod", "ipow", "iand", "ior", "ixor",
    "ilshift", "irshift", "imatmul",
}  # fmt: skip


# family -> when a node may meet one of its checks (tests/lowering/test_refusals.py counts
# refused programs per family).
FAMILIES: dict[str, Callable[[fx.Node, Any], bool]] = {
    "dtype agreement (matmul, convolution, index writes)": _mixed_dtypes,
    "dtype support (floating-only ops on integers/bool)": _integral_operand,
    "in-place castability": _in_place,
}

# Callables never tried on stand-ins (by module prefix), and why. Besides these: other
# libraries' ops and users' functions (only torch's and Python's operators are tried),
# higher-order ops, and the random ops below.
NEVER_TRIED: dict[str, str] = {
    "torch.autograd": "autograd calls (trace_autograd_ops) need the graph's real tensors",
    "torch._dynamo": "Dynamo's own bookkeeping",
    "torch._C._set_grad_enabled": "global state",
    "torch.distributed": "collectives need a process group",
    "torch.cuda": "device state",
}
# Random ops: a try would draw from torch's generator (its state is restored around every try
# anyway, so a missed name costs no repeatability).
_RANDOM_NAMES = {
    "dropout",
    "dropout_",
    "feature_dropout",
    "alpha_dropout",
    "rrelu",
    "bernoulli",
    "bernoulli_",
    "multinomial",
    "normal",
    "normal_",
    "uniform_",
    "random_",
    "exponential_",
    "geometric_",
    "cauchy_",
    "log_normal_",
    "rand_like",
    "randn_like",
    "randint_like",
    "poisson",
}
# Reads, side effects, and ``view(dtype)``, whose size rule depends on the dtype (stand-ins of
# size 1 would fail it where the real sizes pass).
_SKIPPED_METHODS = {
    "item", "tolist", "numpy", "backward", "record_stream", "data_ptr", "set_", "view",
}  # fmt: skip


def _name(target) -> str:
    if isinstance(target, str):
        return target
    return getattr(target, "__name__", "") or str(target)


def _module(target) -> str:
    if isinstance(target, torch._ops.OpOverload):
        return "torch.ops." + target.namespace
    if isinstance(target, torch._ops.OpOverloadPacket):
        return "torch.ops." + target._qualified_op_name.split("::")[0]
    if getattr(target, "__objclass__", None) in (torch.Tensor, torch._C.TensorBase):
        return "torch.Tensor"  # torch.Tensor.add_ called as a function
    return getattr(target, "__module__", None) or ""


def _triable(node: fx.Node) -> bool:
    target = node.target
    if node.op == "call_method":
        return target not in _SKIPPED_METHODS and target not in _RANDOM_NAMES
    if node.op != "call_function" or isinstance(target, torch._ops.HigherOrderOperator):
        return False
    module = _module(target)
    if module in ("_operator", "operator"):
        return True
    if (
        not module.startswith("torch")
        or module.startswith("torch.ops.")
        and (module != "torch.ops.aten")
    ):
        return False  # a user's function, a custom op of another library
    if any(module.startswith(p) or _qualified(target).startswith(p) for p in NEVER_TRIED):
        return False
    return _name(target) not in _RANDOM_NAMES


def _qualified(target) -> str:
    return f"{_module(target)}.{_name(target)}"


def _val(a):
    if isinstance(a, fx.Node):
        return a.meta.get("example_value", a.meta.get("val"))
    return a


def _concrete(v):
    """A SymInt/SymFloat/SymBool's hint, else ``v``; ``None`` where there is none."""
    if isinstance(v, torch.SymInt | torch.SymFloat | torch.SymBool):
        return v.node.hint
    return v


def _stand_in(t: torch.Tensor, small: bool, dtype: torch.dtype | None = None) -> torch.Tensor:
    shape = [_concrete(d) for d in t.shape] if small else [1] * t.dim()
    shape = [1 if d is None else d for d in shape]
    return torch.ones(shape, dtype=dtype or t.dtype)


def _shape_ok(t: torch.Tensor) -> bool:
    return all(_concrete(d) is not None for d in t.shape)


class _Uncheckable(Exception):
    pass


def _plain(a):
    """An argument as eager takes it: SymInts as their hints (raises _Uncheckable if none)."""
    if isinstance(a, torch.SymInt | torch.SymFloat | torch.SymBool):
        v = _concrete(a)
        if v is None:
            raise _Uncheckable
        return v
    return a


def _call(node: fx.Node, args, kwargs):
    if node.op == "call_method":
        self, *rest = args
        return getattr(self, node.target)(*rest, **kwargs)
    return node.target(*args, **kwargs)


def _try(node: fx.Node, args, kwargs) -> str | None:
    """Eager's error message for this call, or ``None`` if it runs."""
    state = torch.get_rng_state()
    try:
        with torch.no_grad():
            _call(node, args, kwargs)
    except Exception as e:  # whatever eager raises is its refusal (the controls judge it)
        return str(e).strip() or type(e).__name__
    finally:
        torch.set_rng_state(state)
    return None


def _build(args, kwargs, small: bool, dtype_of: Callable[[torch.Tensor], torch.dtype]):
    def make(a):
        if isinstance(a, torch.Tensor):
            return _stand_in(a, small, dtype_of(a))
        return _plain(a)

    return (
        torch.utils._pytree.tree_map(make, args),
        torch.utils._pytree.tree_map(make, kwargs),
    )


def _controls(tensors: list[torch.Tensor]) -> list[Callable[[torch.Tensor], torch.dtype]]:
    """Dtype maps under which the operands agree: floating operands made one floating dtype,
    integer ones int64 (the index dtype every kernel takes), both, then every operand the
    floating dtype."""
    floats = [t.dtype for t in tensors if t.is_floating_point() or t.is_complex()]
    common = functools.reduce(torch.promote_types, floats) if floats else torch.float32
    if common in (torch.float16, torch.bfloat16):
        common = torch.float32  # CPU kernels for half types are the patchiest; the point is dtype

    def floating(t):
        return common if t.is_floating_point() or t.is_complex() else t.dtype

    def index(t):
        return torch.int64 if t.dtype in _NARROW_INTS else t.dtype

    return [floating, index, lambda t: index(t) if t.dtype in _NARROW_INTS else floating(t),
            lambda t: common]  # fmt: skip


_NARROW_INTS = (torch.int8, torch.int16, torch.int32)


_CACHE: dict[tuple, str | None] = {}


def _key(node: fx.Node, args, kwargs, small: bool):
    def part(a):
        if isinstance(a, torch.Tensor):
            shape = tuple(_concrete(d) for d in a.shape) if small else a.dim()
            return ("T", a.dtype, shape)
        if isinstance(a, torch.SymInt | torch.SymFloat | torch.SymBool):
            return ("S", _concrete(a))
        if isinstance(a, list | tuple):
            return tuple(part(x) for x in a)
        if isinstance(a, dict):
            return tuple(sorted((k, part(v)) for k, v in a.items()))
        try:
            hash(a)
        except TypeError:
            return repr(a)
        return a

    autocast = tuple(
        (torch.is_autocast_enabled(d), torch.get_autocast_dtype(d)) for d in ("cpu", "cuda")
    )
    return (node.op, node.target, part(args), part(kwargs), autocast)


def eager_refusal(node: fx.Node) -> str | None:
    """Eager's error message if its CPU kernel refuses this node's operand dtypes, else
    ``None`` (see the module docstring for how it is found)."""
    if not _triable(node):
        return None
    args = fx.node.map_aggregate(node.args, _val)
    kwargs = fx.node.map_aggregate(node.kwargs, _val)
    tensors = _tensors((args, kwargs))
    if not tensors or not any(check(node, (args, kwargs)) for check in FAMILIES.values()):
        return None
    if any(t.is_quantized or t.layout != torch.strided or t.is_nested for t in tensors):
        return None
    out = _val(node)
    sizes = [t for t in _tensors(out) if _shape_ok(t)] + tensors
    small = (
        all(_shape_ok(t) for t in tensors)
        and sum(math.prod(_concrete(d) for d in t.shape) for t in sizes) <= _SMALL
    )
    try:
        key = _key(node, args, kwargs, small)
        hash(key)
    except (_Uncheckable, TypeError):
        return None
    if key in _CACHE:
        return _CACHE[key]
    try:
        message = _try(node, *_build(args, kwargs, small, lambda t: t.dtype))
        if message is not None:
            for control in _controls(tensors):
                if _try(node, *_build(args, kwargs, small, control)) is None:
                    break
            else:
                message = None  # not about dtypes: the stand-ins' shapes or values
    except _Uncheckable:
        message = None
    if message is not None:
        log.debug("eager refuses %s: %s", _describe(node), message)
    if len(_CACHE) > 100_000:  # many sizes under dynamic shapes: start over
        _CACHE.clear()
    _CACHE[key] = message
    return message


def check_graph(gm: fx.GraphModule) -> None:
    """Raise one :class:`EagerRefusalError` listing every node of a Dynamo graph that eager
    refuses for its operands' dtypes (with eager's message and the user's line)."""
    refused = []
    with contextlib.ExitStack() as outer:
        regions: dict[fx.Node, contextlib.ExitStack] = {}
        for node in gm.graph.nodes:
            if node.op != "call_function" and node.op != "call_method":
                continue
            name = _name(node.target)
            if name == "_enter_autocast":  # an autocast region: tries run under it too
                region = outer.enter_context(contextlib.ExitStack())
                region.enter_context(torch.autocast(*fx.node.map_aggregate(node.args, _val)))
                regions[node] = region
                continue
            if name == "_exit_autocast":
                region = regions.pop(node.args[0], None) if node.args else None
                if region is not None:
                    region.close()
                continue
            message = eager_refusal(node)
            if message is not None:
                refused.append((node, message))
    if not refused:
        return
    lines = [
        f"{_describe(n)}: {msg.splitlines()[0]}\n      at {user_frame(n)}" for n, msg in refused
    ]
    raise EagerRefusalError(
        f"eager PyTorch refuses {len(refused)} op(s) of this program, so the compiled one does "
        "too (torch's fake tensors skip these checks):\n  - "
        + "\n  - ".join(lines)
        + "\nWhat to do: make the operands' dtypes agree as eager requires (x.to(w.dtype), "
        "x.float()), or use the out-of-place op (a = a * b instead of a.mul_(b)).",
        refused=[(_describe(n), msg, user_frame(n)) for n, msg in refused],
    )


def _describe(node: fx.Node) -> str:
    def desc(a):
        v = _val(a)
        if isinstance(v, torch.Tensor):
            return describe_tensor(v.dtype, v.shape)
        return repr(v) if not isinstance(a, fx.Node) else a.name

    name = _name(node.target)
    if node.op == "call_method":
        name = f"Tensor.{name}"
    elif node.target in vars(operator).values():
        name = f"operator.{name}"
    return f"{name}({', '.join(desc(a) for a in node.args)})"

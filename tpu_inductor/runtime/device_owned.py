"""Device-owned state (opt-in): ``keep_on_device(model, optimizer)``.

By default every value a compiled graph changes or returns is copied back to the host, so the
host copy is always current (``residency.py`` only saves the way *in*). With
:func:`keep_on_device`, parameters, buffers, gradients, optimizer state and everything a
compiled graph that reads them returns are :class:`DeviceTensor` s: torch tensors whose current
value may live only on the device. Their host copy is refreshed when, and only when, something
reads it outside a compiled region.

Mechanism. A :class:`DeviceTensor` is a traceable wrapper subclass around a plain host tensor
(its *inner*). Dynamo and AOTAutograd flatten it (``__tensor_flatten__``), so compiled graphs
see, and the runtime receives, the inner tensor; ``residency.VALUES`` maps that to its device
array as for any tensor. What changes is the way back: when a graph updates an owned inner
tensor in place (``opt.step``, BatchNorm statistics) or returns a value, the runtime records
the new array as *pending* for that storage (:func:`mark_pending`) instead of copying it. Every
eager op on a DeviceTensor goes through ``__torch_dispatch__``, which first copies pending
values into the inner storage (:func:`sync`: counted as device->host, reason ``sync``), then
runs the op on the inner tensors. An eager in-place change bumps the inner tensor's version, so
the next compiled call sends it again. Ops that read only metadata (views, ``detach``,
``*_like`` factories) don't sync: that is what lets autograd accumulate a gradient, or
``zero_grad`` drop one, without moving it.

Why a subclass and not a flag on plain tensors: a plain tensor's reads (``print``, ``.item()``,
an eager op) are invisible to us, so a lazy host copy behind one would be a stale number. The
subclass sees every read. What it costs: a per-call overhead that grows with the number of
wrapped parameters (measured: ``python -m benchmarks.transfers``), and one recompile the first
time a graph sees DeviceTensors (Dynamo guards on the type).
"""

from __future__ import annotations

import collections
import copy
import functools
import weakref
from collections.abc import Callable

import jax
import numpy as np
import torch
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import _get_current_dispatch_mode

from tpu_inductor.core.boundary import _BITCAST, jax_to_host
from tpu_inductor.core.transfers import D2H, TOTAL
from tpu_inductor.runtime.residency import VALUES, StackSlice

OWNED = "_tpu_inductor_owned"

# Inner storage data pointer -> (weak reference to the inner tensor the array has the layout
# of, the array): values a compiled graph produced that the host copy does not have yet.
_PENDING: dict[int, tuple] = {}

# How many times keep_on_device ran in this process (the runtime checks ownership only then).
ACTIVE = [0]

aten = torch.ops.aten

# Ops that read only shapes, strides and dtypes: they run without syncing pending values.
_METADATA_ONLY = frozenset(
    {
        aten.detach.default,
        aten.alias.default,
        aten.empty_like.default,
        aten.zeros_like.default,
        aten.ones_like.default,
        aten.full_like.default,
        aten.new_empty.default,
        aten.new_zeros.default,
        aten.new_ones.default,
        aten.new_full.default,
        aten.new_empty_strided.default,
        aten.sym_size.int,
        aten.sym_stride.int,
        aten.sym_numel.default,
        aten.sym_storage_offset.default,
        aten.is_same_size.default,
    }
)


# Factories whose result takes the argument's place: state created with zeros_like(param) is
# device-owned like the parameter.
_LIKE = frozenset(
    {
        aten.empty_like.default,
        aten.zeros_like.default,
        aten.ones_like.default,
        aten.full_like.default,
    }
)


def _storage_key(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def pending_array_ids() -> set[int]:
    """Ids of the arrays that are the only current value of some owned storage."""
    return {id(arr) for _, arr in list(_PENDING.values())}


def mark_pending(inner: torch.Tensor, arr, owner: np.ndarray | None = None) -> None:
    """``arr`` (an array or a ``StackSlice``) is ``inner``'s current value; its host storage is
    filled when first read.

    ``owner``: the numpy array that holds ``inner``'s storage (a lazy output's), written
    directly; else ``inner`` itself is written, and the entry lives while ``inner`` does.
    """
    key = _storage_key(inner)
    obj = inner if owner is None else owner
    _PENDING[key] = (weakref.ref(obj, lambda r, key=key: _drop(key, r)), arr)


def _drop(key: int, ref) -> None:
    e = _PENDING.get(key)
    if e is not None and e[0] is ref:
        _PENDING.pop(key, None)


def pending_bytes() -> int:
    """Bytes of device values whose host copy has not been refreshed."""
    return sum(int(a.nbytes) for _, a in list(_PENDING.values()))


def sync(inner: torch.Tensor) -> None:
    """Copy a pending device value into ``inner``'s storage (a no-op when there is none).

    The copy is written through numpy, which leaves the version counter alone, so the device
    copy stays current after the refresh. Counted as device->host, reason ``sync``.
    """
    if not _PENDING or type(inner) is not torch.Tensor:
        return  # nothing pending, or a fake/functional tensor while tracing
    e = _PENDING.pop(_storage_key(inner), None)
    if e is None:
        return
    target, arr = e[0](), e[1]
    if target is None:
        return
    if isinstance(arr, StackSlice):
        arr = arr.array()
        if arr is None:  # as np.asarray does for a deleted array: say so, never copy garbage
            raise RuntimeError(
                f"tpu-inductor: the device value of a keep_on_device tensor of shape "
                f"{tuple(inner.shape)} was a layer of a stacked array that a compiled call "
                "consumed (donated) and did not replace (the call failed); its value is lost: "
                "load the model and optimizer state again (e.g. from a checkpoint)"
            )
    values = np.asarray(arr)
    if isinstance(target, np.ndarray):
        np.copyto(target, values.view(target.dtype))
    elif target.is_contiguous():
        np.copyto(_host_view(target), values, casting="no")
    else:  # a strided tensor: copy through torch (bumps the version), then re-record
        with torch.no_grad():
            target.copy_(jax_to_host(arr)[0])
        VALUES.record(target, arr)
    TOTAL.add(D2H, "sync", int(arr.nbytes))


def _host_view(t: torch.Tensor) -> np.ndarray:
    t = t.detach()
    if t.dtype in _BITCAST:
        as_int, np_dtype = _BITCAST[t.dtype]
        return t.view(as_int).numpy().view(np_dtype)
    return t.numpy()


# Eager ops on DeviceTensors run on the device through tpu_inductor.runtime.device_eager, which
# builds on this module (it needs DeviceTensor) and puts its ``run`` here when it loads (the
# runtime package loads it first); ``run`` returns HOST for an op that must run on the host.
RUN_ON_DEVICE: Callable | None = None
HOST = object()


def top_level_dispatch():
    """The dispatcher's state outside any ``__torch_dispatch__`` (which excludes every key
    above Python, functionalization and the tracer included), with autocast off: the op being
    traced was already dispatched past autocast."""
    return torch._C._ForceDispatchKeyGuard(*_top_level_keys())


@functools.cache
def _top_level_keys():
    keys = torch._C.DispatchKey
    autocast = torch._C.DispatchKeySet(keys.AutocastCPU)
    for name in dir(keys):
        if name.startswith("Autocast"):
            autocast = autocast | torch._C.DispatchKeySet(getattr(keys, name))
    include = torch._C.DispatchKeySet(keys.BackendSelect) | torch._C.DispatchKeySet(
        keys.ADInplaceOrView
    )
    return include, autocast


class DeviceTensor(torch.Tensor):
    """A tensor whose current value may be only on the device (see the module docstring).

    Behaves as its inner host tensor in eager code: every op first refreshes the host copy.
    """

    @staticmethod
    def __new__(cls, inner: torch.Tensor, requires_grad: bool | None = None):
        if requires_grad is None:
            requires_grad = inner.requires_grad
        return torch.Tensor._make_wrapper_subclass(
            cls,
            inner.shape,
            strides=inner.stride(),
            storage_offset=inner.storage_offset(),
            dtype=inner.dtype,
            layout=inner.layout,
            device=inner.device,
            requires_grad=requires_grad,
        )

    def __init__(self, inner: torch.Tensor, requires_grad: bool | None = None):
        if inner.requires_grad:
            inner = inner.detach()
        setattr(inner, OWNED, True)
        self._inner = inner

    __torch_function__ = torch._C._disabled_torch_function_impl

    def __tensor_flatten__(self):
        return ["_inner"], None

    @staticmethod
    def __tensor_unflatten__(inner_tensors, meta, outer_size, outer_stride):
        return DeviceTensor(inner_tensors["_inner"])

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        # A view reads no value: its inner tensor views the same storage, whose pending value
        # is synced (whole) when the view or its base is read.
        reads = func not in _METADATA_ONLY and not _makes_alias(func)
        if reads and RUN_ON_DEVICE is not None:
            out = RUN_ON_DEVICE(func, args, kwargs)
            if out is not HOST:
                return out

        def inner(t):
            if reads:
                sync(t._inner)
            return t._inner

        args_in, kwargs_in = pytree.tree_map_only(DeviceTensor, inner, (args, kwargs))
        if _makes_alias(func) and _plain_inner((args_in, kwargs_in)):
            # Below autograd a view or detach gets a version counter of its own; made as above
            # autograd, it shares its base's, so a later in-place change of either is seen
            # through both (residency.VALUES trusts a tensor's version).
            with top_level_dispatch():
                out = func(*args_in, **kwargs_in)
        else:
            out = func(*args_in, **kwargs_in)
        if func._schema.is_mutable:
            _bump_written(func, args, kwargs)
        return _rewrap(func, args, out)

    def host(self) -> torch.Tensor:
        """The inner host tensor, refreshed (shares storage with this tensor)."""
        sync(self._inner)
        return self._inner

    def __coerce_same_metadata_as_tangent__(self, expected_metadata, expected_type=None):
        # A tangent made from a lazy output (ones_like(loss)) where AOTAutograd traced a plain
        # tensor: hand it the inner tensor.
        if expected_type is None or expected_type is DeviceTensor:
            return self
        return self.host() if expected_type is torch.Tensor else None

    def numpy(self, *, force: bool = False) -> np.ndarray:
        return self.host().detach().numpy(force=force)

    def tolist(self):
        return self.host().tolist()

    def __repr__(self, *, tensor_contents=None) -> str:
        text = repr(self.host())
        return text if not self.requires_grad else text[:-1] + ", requires_grad=True)"

    def __reduce_ex__(self, protocol):
        # torch.save / pickle write a plain tensor: checkpoints load anywhere, also with
        # torch.load(weights_only=True).
        plain = self.host().detach().clone()
        if getattr(self, "_is_param", False):
            plain = torch.nn.Parameter(plain, requires_grad=self.requires_grad)
        else:
            plain.requires_grad_(self.requires_grad)
        return plain.__reduce_ex__(protocol)

    def __deepcopy__(self, memo):
        new = DeviceTensor(copy.deepcopy(self.host().detach(), memo), self.requires_grad)
        if getattr(self, "_is_param", False):
            new = torch.nn.Parameter(new, requires_grad=self.requires_grad)
        memo[id(self)] = new
        return new

    @property
    def data(self):
        return DeviceTensor(self._inner.detach(), requires_grad=False)

    @data.setter
    def data(self, value: torch.Tensor):
        value = value._inner if isinstance(value, DeviceTensor) else value
        if (
            value.shape != self.shape
            or value.dtype != self.dtype
            or value.stride() != self.stride()
        ):
            raise RuntimeError(
                f"keep_on_device: `p.data = x` needs x with p's shape, stride and dtype "
                f"({tuple(self.shape)}, {self.stride()}, {self.dtype}); got "
                f"({tuple(value.shape)}, {value.stride()}, {value.dtype}). Assign a new "
                "Parameter to the module instead, then call keep_on_device again."
            )
        sync(self._inner)
        new = value.detach()
        setattr(new, OWNED, True)
        self._inner = new


_ALIAS: dict = {}


def _makes_alias(func) -> bool:
    """Whether ``func`` returns a view of (or the same data as) an argument, not in place."""
    alias = _ALIAS.get(func)
    if alias is None:
        returns = func._schema.returns
        alias = bool(returns) and all(
            r.alias_info is not None and not r.alias_info.is_write for r in returns
        )
        _ALIAS[func] = alias
    return alias


def _plain_inner(args_in) -> bool:
    """Whether the op's tensors are real host tensors and no dispatch mode is active (then it
    can run as outside any ``__torch_dispatch__``)."""
    if _get_current_dispatch_mode() is not None:
        return False
    args, kwargs = args_in
    for a in (*args, *kwargs.values()):
        for t in a if isinstance(a, list | tuple) else (a,):
            if isinstance(t, torch.Tensor) and type(t) is not torch.Tensor:
                return False
    return True


def _bump_written(func, args, kwargs) -> None:
    """Below autograd (where ``__torch_dispatch__`` runs) an in-place op bumps the version of
    the DeviceTensor it changed, not of its inner tensor; bump that too, so the device copy of
    what it changed stops counting as current."""
    written = []
    for i, a in enumerate(func._schema.arguments):
        if a.alias_info is None or not a.alias_info.is_write:
            continue
        v = args[i] if i < len(args) else kwargs.get(a.name)
        for t in v if isinstance(v, list | tuple) else (v,):
            if isinstance(t, DeviceTensor):
                written.append(t._inner)
    if written:
        torch.autograd.graph.increment_version(written)


def _rewrap(func, args, out):
    """Outputs of an eager op on DeviceTensors: in-place results are the DeviceTensor argument
    and views are DeviceTensors (they share storage a compiled graph may update); fresh
    results are plain tensors."""
    returns = func._schema.returns
    if func in _LIKE and isinstance(args[0], DeviceTensor):
        return DeviceTensor(out)  # e.g. optimizer state made by zeros_like(param)
    if not returns or returns[0].alias_info is None:
        return out
    if returns[0].alias_info.is_write:  # in place: the op returns its first argument
        return args[0] if isinstance(args[0], DeviceTensor) else out
    return pytree.tree_map_only(
        torch.Tensor,
        lambda t: t if isinstance(t, DeviceTensor) else DeviceTensor(t, requires_grad=False),
        out,
    )


def unwrap(t):
    """The inner host tensor of a DeviceTensor (anything else unchanged)."""
    return t._inner if isinstance(t, DeviceTensor) else t


def is_owned(t) -> bool:
    """Whether a (runtime) tensor belongs to device-owned state."""
    return type(t) is DeviceTensor or getattr(t, OWNED, False)


def lazy_output(arr: jax.Array, dtype: torch.dtype) -> DeviceTensor:
    """A graph result as a DeviceTensor: nothing is copied until someone reads it."""
    if torch.is_inference_mode_enabled():
        # an inference tensor has no version counter, which the residency table keys on
        with torch.inference_mode(False):
            return lazy_output(arr, dtype)
    bits = _BITCAST.get(dtype)
    owner = np.empty(arr.shape, np.dtype(f"u{arr.dtype.itemsize}") if bits else arr.dtype)
    inner = torch.from_numpy(owner)
    if bits:
        inner = inner.view(dtype)
    # The numpy array lives as long as any tensor sharing the storage (views, p.grad).
    VALUES.record(inner, arr, owner)
    mark_pending(inner, arr, owner)
    return DeviceTensor(inner)


def _wrap_tensor(t: torch.Tensor) -> torch.Tensor:
    if isinstance(t, DeviceTensor):
        return t
    if isinstance(t, torch.nn.Parameter):
        return torch.nn.Parameter(DeviceTensor(t.detach()), requires_grad=t.requires_grad)
    return DeviceTensor(t.detach(), requires_grad=t.requires_grad)


def keep_on_device(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None):
    """Keep ``model``'s parameters, buffers and gradients, and ``optimizer``'s state, on the
    device across compiled calls; the host copies are refreshed only when read outside a
    compiled region.

    Parameters and buffers are replaced by :class:`DeviceTensor` s in place (the module and
    optimizer keep working, ``optimizer.param_groups`` and ``state`` are re-keyed), so call it
    before ``torch.compile``-ing, or expect one recompile. Returns ``model``.
    """
    ACTIVE[0] += 1
    replaced: dict[int, torch.Tensor] = {}
    for module in model.modules():
        for name, p in list(module._parameters.items()):
            if p is not None:
                if id(p) not in replaced:  # tied weights stay tied
                    replaced[id(p)] = _wrap_tensor(p)
                module._parameters[name] = replaced[id(p)]
        for name, b in list(module._buffers.items()):
            if b is not None:
                module._buffers[name] = _wrap_tensor(b)
    if optimizer is not None:
        for group in optimizer.param_groups:
            group["params"] = [replaced.get(id(p), p) for p in group["params"]]
        _own_state(optimizer, replaced)
        if not getattr(optimizer, OWNED, False):
            # load_state_dict replaces the state with plain tensors: own them again
            optimizer.register_load_state_dict_post_hook(lambda opt: _own_state(opt, {}))
            optimizer.register_state_dict_post_hook(_plain_state_dict)
            setattr(optimizer, OWNED, True)
    return model


class _OwnedState(dict):
    """One parameter's optimizer state: every tensor stored in it is device-owned. (The first
    compiled ``opt.step`` creates the state eagerly, in Dynamo's ``_init_group``; AdamW's 0-d
    ``step`` counters come from ``torch.tensor``, not from the parameter, so without this they
    would be host tensors written back, and blocked on, every step.)"""

    def __setitem__(self, key, value):
        if isinstance(value, torch.Tensor):
            value = _wrap_tensor(value)
        super().__setitem__(key, value)


def _plain_state_dict(optimizer, state_dict: dict) -> dict:
    # plain dicts, so torch.load(weights_only=True) accepts a saved optimizer state
    state_dict["state"] = {k: dict(v) for k, v in state_dict["state"].items()}
    return state_dict


def _own_state(optimizer: torch.optim.Optimizer, replaced: dict) -> None:
    state = collections.defaultdict(_OwnedState)
    for p, s in optimizer.state.items():
        owned = state[replaced.get(id(p), p)]
        for k, v in s.items():
            owned[k] = v
    optimizer.state = state

"""Eager ops on device-owned state, run on the device (``keep_on_device``).

A training loop runs eager code between its compiled calls: ``clip_grad_norm_``,
``zero_grad``, a grad scaler's unscale, an EMA update, ``torch.norm(p.grad)`` for a log line.
Under :func:`~tpu_inductor.keep_on_device` those ops see :class:`DeviceTensor` s whose current
value is on the device; syncing every one of them to the host to run the op there, and sending
the changed ones back at the next compiled call, moves each gradient both ways every step.
Instead, :func:`run` executes such an op where its inputs are: the op is traced once per
signature (``make_fx`` + functionalization + the backend's decompositions, plus
``foreach.decompositions()``), lowered through the same table compiled graphs use
(``tpu_inductor.lowering.lowerings``), jitted, and cached; then called with the device arrays.

- **When it runs on the device.** Every tensor argument is a DeviceTensor or a 0-d tensor (a
  Python-level scalar such as a grad scaler's ``inv_scale``), at least one DeviceTensor's value
  is current on the device (``residency.VALUES``), all such values are on one device, every
  tensor is non-empty and contiguous or a view of a contiguous base current on the device (the
  program takes the base's array and applies the view with ``as_strided``; such a view is read,
  never written), the op returns fresh tensors or changes its arguments in place (no views, no
  Python scalars: ``.item()`` still syncs), and the traced graph lowers without randomness.
  Anything else runs on the host as before (:func:`run` returns :data:`HOST`), after syncing
  what it reads.
- **What crosses.** A DeviceTensor held only on the host is imported once (``resident``) and
  stays; a 0-d host tensor is sent (``input``, its bytes); a 0-d host tensor changed in place
  (the scaler's ``found_inf``) is written back (``write-back``). Nothing else: results are lazy
  DeviceTensors (:func:`device_owned.lazy_output`), read only when the user reads them.
- **In place.** The changed DeviceTensor keeps its identity; its inner version is bumped (so
  autograd and the residency table see the change) and its new device value is recorded as
  current and pending, exactly as a compiled graph's in-place update is, so the next compiled
  call takes it and a host read syncs it. A DeviceTensor whose host storage owner is not known
  to outlive it (a view, a fresh alias) gets its new value written to the host at once instead.
- **Python floats** (``lerp_(p, 1 - decay)`` with a decay that changes every step, ``add_``'s
  ``alpha``) are arguments of the program, not constants, where the op allows it: the op is
  traced twice with different values, and each float that reaches the graph unchanged becomes
  an input. Where a float is transformed or steers the trace, or a lowering needs it as a Python
  number, the program is specialized to the value (one program per value).
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import math
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import torch
import torch.fx as fx
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import _get_current_dispatch_mode

from tpu_inductor.core import config
from tpu_inductor.core.boundary import nbytes, tensor_to_host, tensor_to_jax
from tpu_inductor.core.dtypes import to_jax_dtype
from tpu_inductor.core.transfers import D2H, H2D, TOTAL
from tpu_inductor.runtime import device_owned
from tpu_inductor.runtime.residency import VALUES

log = logging.getLogger(__name__)  # TORCH_LOGS="+tpu_inductor.runtime.device_eager"

HOST = device_owned.HOST  # run() says: run this op on the host (the sync path)

# Ops that read values on the host by definition (their result is a Python value).
_NEVER = frozenset(
    {
        torch.ops.aten._local_scalar_dense.default,
        torch.ops.aten.equal.default,
        torch.ops.aten.is_nonzero.default,
        torch.ops.aten.set_.source_Storage,
        torch.ops.aten.set_.source_Tensor,
        torch.ops.aten.resize_.default,
    }
)

MAX_PROGRAMS = 1024  # LRU bound on cached programs (and refusals)


@dataclasses.dataclass(kw_only=True)
class EagerStats:
    """Eager ops on device-owned state whose values were on the device: ``device`` ran there;
    ``host`` ran on the host after syncing what they read (``host_ops``: op -> count);
    ``programs`` built for them (``build_seconds`` in total). Ops that read a Python value
    (``.item()``) or make a view are not counted: they are reads."""

    device: int = 0
    host: int = 0
    host_ops: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    programs: int = 0
    build_seconds: float = 0.0

    def copy(self) -> EagerStats:
        """A snapshot."""
        return dataclasses.replace(self, host_ops=collections.Counter(self.host_ops))

    def reset(self) -> None:
        """Zero every counter."""
        self.device = self.host = self.programs = 0
        self.host_ops.clear()
        self.build_seconds = 0.0


STATS = EagerStats()


@dataclasses.dataclass(frozen=True)
class _OpInfo:
    written: tuple[int, ...]  # schema argument positions the op writes
    returns: str  # "fresh": new tensors; "self": its first argument; "none": nothing


_INFO: dict = {}


def _op_info(func) -> _OpInfo | None:
    """What the op's schema allows (``None``: never on the device)."""
    if func in _INFO:
        return _INFO[func]
    info = None
    schema = func._schema
    if func not in _NEVER and "out" not in func._overloadname:
        written = tuple(
            i for i, a in enumerate(schema.arguments) if a.alias_info and a.alias_info.is_write
        )
        rets = schema.returns
        tensors = all(
            isinstance(r.type, torch.TensorType)
            or (
                isinstance(r.type, torch.ListType)
                and isinstance(r.type.getElementType(), torch.TensorType)
            )
            for r in rets
        )
        if not rets and written:
            info = _OpInfo(written, "none")
        elif tensors and rets and all(r.alias_info is None for r in rets):
            info = _OpInfo(written, "fresh")
        elif (
            len(rets) == 1
            and rets[0].alias_info is not None
            and rets[0].alias_info.is_write
            and written[:1] == (0,)
            and schema.arguments[0].alias_info.before_set == rets[0].alias_info.before_set
        ):
            info = _OpInfo(written, "self")
    _INFO[func] = info
    return info


@dataclasses.dataclass(kw_only=True)
class _Program:
    """One op at one signature, lowered and compiled."""

    exe: object
    tensor_leaves: tuple[int, ...]  # leaf index feeding each tensor input, in order
    float_leaves: tuple[int, ...]  # leaf index of each Python float passed as an input
    output_plan: tuple  # lowered.output_plan
    output_dtypes: tuple  # torch dtype of each declared output
    mutations: tuple  # (leaf index of the input written, index of its new value in the results)
    out_spec: object  # the op's return structure (a tensor, a list or tuple of them)


_REFUSED = "refused"  # cache value: this signature runs on the host
_BAKED = "baked"  # cache value: programs of this signature are specialized to float values
_CACHE: collections.OrderedDict = collections.OrderedDict()
_LOCK = threading.RLock()


def clear() -> None:
    """Forget every cached program and the counters (``tpu_inductor.reset()``)."""
    with _LOCK:
        _CACHE.clear()
    STATS.reset()


def _cache_put(key, value) -> None:
    _CACHE[key] = value
    if len(_CACHE) > MAX_PROGRAMS:
        _CACHE.popitem(last=False)


def _single_device(arr):
    devices = arr.sharding.device_set
    return next(iter(devices)) if len(devices) == 1 else None


def run(func, args: tuple, kwargs: dict):
    """Run ``func(*args, **kwargs)`` (an eager op on DeviceTensors, seen in
    ``DeviceTensor.__torch_dispatch__``) on the device, returning what the op returns, or
    :data:`HOST` when it must run on the host (see the module docstring)."""
    if config.get("eager_ops") == "host":
        return HOST
    info = _op_info(func)
    if info is None or _get_current_dispatch_mode() is not None:
        return HOST  # reads a Python value, makes a view, or runs under a mode (tracing)
    leaves, spec = _flatten(args, kwargs)
    why, current, views, desc, device = _classify(leaves)
    if not current:
        return HOST  # nothing is on the device: the host has every value
    written = _written_ids(func, info, args, kwargs, leaves)
    if why is None and written and _aliased(leaves, written):
        why = "it writes a tensor that another argument views"
    if why is None and any(i in views for i in written):
        why = "it writes a view of a device value"
    if why is None:
        key = (func, spec, desc, device, torch.get_float32_matmul_precision())
        with jax.enable_x64(True):
            with _LOCK:
                program = _program(func, info, key, leaves, spec, written, device, views)
            if program is not None:
                return _call(program, info, args, leaves, current, device)
        why = "it has no lowering at this signature"
    STATS.host += 1
    STATS.host_ops[str(func)] += 1
    if log.isEnabledFor(logging.DEBUG):
        log.debug("eager %s runs on the host, syncing what it reads: %s", func, why)
    return HOST


def _classify(leaves: list) -> tuple[str | None, dict, dict, tuple, object]:
    """Why the op can't run on the device (``None``: it can), the device arrays of the
    DeviceTensors current there (leaf index -> array; for a view, its base's array), the views
    among them (leaf index -> :func:`_view_layout`), the signature, and the device."""
    device = None
    current, views = {}, {}
    desc = []
    first: dict[int, int] = {}  # id(tensor) -> first leaf index holding it
    why = None
    for i, v in enumerate(leaves):
        if isinstance(v, torch.Tensor):
            t = device_owned.unwrap(v)
            if type(t) is not torch.Tensor or t.device.type != "cpu" or t.is_complex():
                return "a tensor is not a plain CPU tensor", {}, {}, (), None
            layout = None
            if t is not v:
                if t.numel() == 0:
                    why = "a DeviceTensor is empty"
                    continue
                arr = VALUES.lookup(t) if t.is_contiguous() else None
                if arr is None:
                    base, layout = _view_layout(t)
                    arr = VALUES.lookup(base) if base is not None else None
                    if arr is None:
                        layout = None
                        if not t.is_contiguous():
                            why = "a DeviceTensor is a view whose base is not on the device"
                            continue
                    else:
                        views[i] = layout
                if arr is not None:
                    d = _single_device(arr)
                    if d is None or (device is not None and d != device):
                        why = "its values are on several devices"
                        continue
                    device = d
                    current[i] = arr
            elif v.dim() != 0:
                # the batch, an activation: an op that takes one is the host's (an eager
                # forward of a keep_on_device model stays there, as before)
                why = "a host tensor that is not a scalar takes part"
            desc.append(("t", tuple(t.shape), t.dtype, first.setdefault(id(v), i), layout))
        elif isinstance(v, float) and math.isfinite(v):
            desc.append(("f",))
        else:
            try:
                hash(v)
            except TypeError:
                why = f"an argument is unhashable ({type(v).__name__})"
                continue
            desc.append(("c", type(v), v))
    return why, current, views, tuple(desc), device


def _view_layout(t: torch.Tensor) -> tuple[torch.Tensor | None, tuple | None]:
    """The contiguous base a view ``t`` was made from, and where ``t`` lies in it: ``(base
    shape, size, stride, offset into the base)``; ``(None, None)`` when ``t`` is no such view.
    A program reads the view from the base's device array (``as_strided``), so making a view
    and reading it moves nothing."""
    base = t._base
    if (
        type(base) is not torch.Tensor
        or base.dtype != t.dtype
        or not base.is_contiguous()
        or base.untyped_storage().data_ptr() != t.untyped_storage().data_ptr()
    ):
        return None, None
    offset = t.storage_offset() - base.storage_offset()
    return base, (tuple(base.shape), tuple(t.shape), tuple(t.stride()), offset)


def _aliased(leaves: list, written: tuple[int, ...]) -> bool:
    """Whether a tensor the op writes shares storage with a different view among its
    arguments (the program would not see the write through the other view)."""
    views: dict[int, set] = {}
    for v in leaves:
        if isinstance(v, torch.Tensor):
            t = device_owned.unwrap(v)
            key = device_owned._storage_key(t)
            views.setdefault(key, set()).add((t.data_ptr(), t.shape, t.stride(), t.dtype))
    for i in written:
        v = leaves[i]
        t = device_owned.unwrap(v)
        if len(views[device_owned._storage_key(t)]) > 1:
            return True
    return False


def _flatten(args: tuple, kwargs: dict) -> tuple[list, tuple]:
    """The op's arguments as one flat list, and their layout (hashable): ATen arguments are
    values or lists of values, never deeper."""
    leaves, layout = [], []
    for a in args:
        if isinstance(a, list | tuple):
            leaves.extend(a)
            layout.append(len(a))
        else:
            leaves.append(a)
            layout.append(-1)
    kw = []
    for k, a in kwargs.items():
        if isinstance(a, list | tuple):
            leaves.extend(a)
            kw.append((k, len(a)))
        else:
            leaves.append(a)
            kw.append((k, -1))
    return leaves, (tuple(layout), tuple(kw))


def _unflatten(leaves: list, spec: tuple) -> tuple[list, dict]:
    layout, kw = spec
    it = iter(leaves)
    args = [next(it) if n < 0 else [next(it) for _ in range(n)] for n in layout]
    kwargs = {k: next(it) if n < 0 else [next(it) for _ in range(n)] for k, n in kw}
    return args, kwargs


def _written_ids(func, info: _OpInfo, args, kwargs, leaves) -> tuple[int, ...]:
    """Indices in ``leaves`` (:func:`_flatten`'s) of the tensors the op writes."""
    if not info.written:
        return ()
    ids = set()
    schema = func._schema
    for j in info.written:
        a = schema.arguments[j]
        v = args[j] if j < len(args) else kwargs.get(a.name)
        for t in v if isinstance(v, list | tuple) else (v,):
            if isinstance(t, torch.Tensor):
                ids.add(id(t))
    return tuple(i for i, v in enumerate(leaves) if id(v) in ids)


def _program(func, info, key, leaves, spec, written, device, views) -> _Program | None:
    """The cached program for this signature, built on first use (``None``: refused)."""
    entry = _CACHE.get(key)
    if entry is not None:
        _CACHE.move_to_end(key)
        if entry is _REFUSED:
            return None
        if entry is not _BAKED:
            return entry
        fkey = key + (tuple(v for v in leaves if isinstance(v, float)),)
        entry = _CACHE.get(fkey)
        if entry is None:
            entry = _build(func, info, leaves, spec, written, device, views, dynamic=False)
            _cache_put(fkey, entry or _REFUSED)
        return None if entry is _REFUSED else entry
    floats = any(d[0] == "f" for d in key[2])
    program = _build(func, info, leaves, spec, written, device, views, dynamic=floats)
    if program is None and floats:
        program = _build(func, info, leaves, spec, written, device, views, dynamic=False)
        if program is not None:  # the floats can't be inputs: one program per value
            _cache_put(key, _BAKED)
            _cache_put(key + (tuple(v for v in leaves if isinstance(v, float)),), program)
            return program
    _cache_put(key, program or _REFUSED)
    return program


def _build(func, info, leaves, spec, written, device, views, *, dynamic: bool) -> _Program | None:
    """Trace, lower and compile ``func`` at this signature (``None``: it can't run here)."""
    from tpu_inductor.core.devices import platform_of
    from tpu_inductor.lowering.lower import is_lowerable, lower_graph

    start = time.perf_counter()
    tensor_leaves, seen = [], set()
    for i, v in enumerate(leaves):
        if isinstance(v, torch.Tensor) and id(v) not in seen:
            seen.add(id(v))
            tensor_leaves.append(i)
    float_leaves = [i for i, v in enumerate(leaves) if isinstance(v, float) and math.isfinite(v)]
    try:
        gm, out_spec = _trace(func, info, leaves, spec, tensor_leaves, views, {})
        slots = []
        if dynamic:
            perturbed = {i: _perturb(leaves[i], k) for k, i in enumerate(float_leaves)}
            other, _ = _trace(func, info, leaves, spec, tensor_leaves, views, perturbed)
            slots = _float_slots(gm, other, leaves, perturbed)
            if slots is None:
                return None
        why = _refusal(gm, is_lowerable)
        if why is not None:
            log.debug("eager %s stays on the host: %s", func, why)
            return None
        _add_scalar_inputs(gm, slots, leaves)
        lowered = lower_graph(
            gm, precision=torch.get_float32_matmul_precision(), platform=platform_of(device)
        )
        if lowered.has_rng or lowered.scalar_outputs:
            return None
        slot_leaves = tuple(i for i, _ in slots) if slots else ()
        inputs = [_example(leaves[i], device, views.get(i)) for i in tensor_leaves]
        inputs += [leaves[i] for i in slot_leaves]
        jitted = jax.jit(lambda *xs: lowered.fn(None, *xs))
        # Compiling ahead surfaces a lowering that needs a float as a Python number (then the
        # op is specialized to the value); calls then take jit's fast path, whose cache the
        # compile filled.
        jitted.lower(*inputs).compile()
    except Exception as e:  # noqa: BLE001 - any failure to build means: run it on the host
        log.debug("eager %s stays on the host: %s: %s", func, type(e).__name__, e)
        return None
    # graph input k is tensor_leaves[k]; a write must be one the schema declares, and each
    # declared write must be in the graph
    mutations = tuple((tensor_leaves[m.input_index], m.value_index) for m in lowered.mutations)
    written_ids = {id(leaves[i]) for i in written}
    if {leaf for leaf, _ in mutations} != {
        i for i in tensor_leaves if id(leaves[i]) in written_ids
    }:
        log.debug("eager %s stays on the host: its graph writes %s", func, mutations)
        return None
    STATS.programs += 1
    STATS.build_seconds += time.perf_counter() - start
    return _Program(
        exe=jitted,
        tensor_leaves=tuple(tensor_leaves),
        float_leaves=slot_leaves,
        output_plan=lowered.output_plan,
        output_dtypes=tuple(getattr(m, "dtype", None) for m in lowered.output_metas),
        mutations=mutations,
        out_spec=out_spec,
    )


def _example(v, device, view) -> jax.ShapeDtypeStruct:
    t = device_owned.unwrap(v)
    shape = view[0] if view is not None else tuple(t.shape)  # a view's program takes its base
    sharding = jax.sharding.SingleDeviceSharding(device)
    return jax.ShapeDtypeStruct(shape, to_jax_dtype(t.dtype), sharding=sharding)


def _perturb(v: float, k: int) -> float:
    """A value near ``v``, different from it and from the other floats' (``k``: which)."""
    return v * (1 + (k + 1) * 2.0**-9) + (k + 1) * 2.0**-11


def _trace(
    func, info, leaves, spec, tensor_leaves, views: dict, floats: dict
) -> tuple[fx.GraphModule, object]:
    """The op as a functional ATen graph over its distinct tensors (a view's base in its
    place: ``views``), and its output structure (``floats``: leaf index -> value to trace with
    instead of the call's)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from tpu_inductor.capture import aot as capture

    holder = {}

    def f(*tensors):
        vals = list(leaves)
        by_id = {}
        for i, t in zip(tensor_leaves, tensors, strict=True):
            if i in views:
                _, size, stride, offset = views[i]
                t = t.as_strided(size, stride, offset)
            by_id[id(leaves[i])] = t
        for i, v in enumerate(vals):
            if isinstance(v, torch.Tensor):
                vals[i] = by_id[id(v)]
            elif i in floats:
                vals[i] = floats[i]
        a, kw = _unflatten(vals, spec)
        out = func(*a, **kw)
        flat, holder["spec"] = pytree.tree_flatten(out if info.returns == "fresh" else [])
        return flat

    inputs = [_input_like(leaves[i], views.get(i)) for i in tensor_leaves]
    table = capture.decomposition_table()
    functional = torch.func.functionalize(f, remove="mutations_and_views")
    with device_owned.top_level_dispatch():
        gm = make_fx(functional, decomposition_table=table, tracing_mode="fake")(*inputs)
    return gm, holder["spec"]


def _input_like(v, view) -> torch.Tensor:
    """What the traced program takes for argument ``v``: its host tensor, or for a view a
    contiguous tensor of its base's shape."""
    t = device_owned.unwrap(v)
    return t if view is None else t.new_empty(view[0])


def _refusal(gm: fx.GraphModule, is_lowerable) -> str | None:
    for n in gm.graph.nodes:
        if n.op == "call_function" and not is_lowerable(n):
            return f"{n.target} has no lowering"
        val = n.meta.get("val")
        for v in val if isinstance(val, list | tuple) else (val,):
            if isinstance(v, torch.Tensor) and v.device.type != "cpu":
                return f"{n.target} makes a {v.device.type} tensor"
    return None


def _float_slots(gm, other, leaves, perturbed: dict):
    """Where each Python float reaches the graph unchanged: ``[(leaf index, [(node, path)])]``,
    or ``None`` when a float is transformed or changes the graph's structure."""
    a, b = list(gm.graph.nodes), list(other.graph.nodes)
    if len(a) != len(b):
        return None
    index = {n: k for k, n in enumerate(a)}
    index_b = {n: k for k, n in enumerate(b)}
    by_value = {v: i for i, v in perturbed.items()}
    uses: dict[int, list] = {}
    for na, nb in zip(a, b, strict=True):
        if na.op != nb.op or na.target != nb.target:
            return None
        la, sa = pytree.tree_flatten((na.args, na.kwargs))
        lb, sb = pytree.tree_flatten((nb.args, nb.kwargs))
        if sa != sb or len(la) != len(lb):
            return None
        for p, (x, y) in enumerate(zip(la, lb, strict=True)):
            if isinstance(x, fx.Node) or isinstance(y, fx.Node):
                if not (isinstance(x, fx.Node) and isinstance(y, fx.Node)):
                    return None
                if index[x] != index_b[y]:
                    return None
            elif isinstance(x, float) and isinstance(y, float):
                if x == y or (math.isnan(x) and math.isnan(y)):
                    continue
                leaf = by_value.get(y)
                if leaf is None or leaves[leaf] != x:
                    return None  # a float computed from an argument: specialize
                uses.setdefault(leaf, []).append((na, p))
            elif type(x) is not type(y) or x != y:
                return None
    return sorted(uses.items())


def _add_scalar_inputs(gm: fx.GraphModule, slots, leaves) -> None:
    """Turn each float slot into a graph input (placed after the tensor inputs)."""
    if not slots:
        return
    graph = gm.graph
    last = [n for n in graph.nodes if n.op == "placeholder"][-1]
    for leaf, uses in slots:
        with graph.inserting_after(last):
            ph = graph.placeholder(f"scalar_{leaf}")
        ph.meta["val"] = leaves[leaf]  # promotion sees the Python float, as before
        last = ph
        for node, p in uses:
            flat, s = pytree.tree_flatten((node.args, node.kwargs))
            flat[p] = ph
            node.args, node.kwargs = pytree.tree_unflatten(flat, s)


def _call(program: _Program, info: _OpInfo, args, leaves, current, device):
    """Run a built program on this call's values and hand back what the op returns."""
    arrays = []
    for i in program.tensor_leaves:
        arr = current.get(i)
        if arr is None:
            arr = _send(leaves[i], device)
        arrays.append(arr)
    arrays += [leaves[i] for i in program.float_leaves]
    results = program.exe(*arrays)
    STATS.device += 1
    _apply_mutations(program, leaves, results)
    if info.returns == "none":
        return None
    if info.returns == "self":
        return args[0]
    values = []
    for kind, k in program.output_plan:
        if kind == "out":
            values.append(results[k])
        else:  # an input or an earlier output returned again: a buffer of its own
            values.append(jnp.array(arrays[k] if kind == "input" else values[k], copy=True))
    outs = [
        device_owned.lazy_output(a, dt) for a, dt in zip(values, program.output_dtypes, strict=True)
    ]
    return pytree.tree_unflatten(outs, program.out_spec)


def _send(v, device):
    """A tensor the device does not hold yet: a DeviceTensor is imported to stay (``resident``),
    a 0-d host tensor is sent for this call (``input``)."""
    if type(v) is device_owned.DeviceTensor:
        t = v._inner
        device_owned.sync(t)  # a view of pending storage: its host copy first
        arr = tensor_to_jax(t, device)
        VALUES.record(t, arr)
        TOTAL.add(H2D, "resident", nbytes(t))
        return arr
    TOTAL.add(H2D, "input", nbytes(v))
    return jax.device_put(tensor_to_host(v), device)


def _apply_mutations(program: _Program, leaves, results) -> None:
    """The new values of the tensors the op changed in place (see the module docstring)."""
    if not program.mutations:
        return
    owned = [
        leaves[i]._inner
        for i, _ in program.mutations
        if type(leaves[i]) is device_owned.DeviceTensor
    ]
    owners = {id(t): _lasting_owner(t) for t in owned}  # before the versions move
    # Below autograd torch bumps only the wrapper's version: bump the inner tensor's too, so
    # the residency table's old entry stops counting; the new value is recorded after it.
    if owned:
        torch.autograd.graph.increment_version(owned)
    for i, k in program.mutations:
        v, new = leaves[i], results[k]
        if type(v) is device_owned.DeviceTensor:
            t = v._inner
            owner = owners[id(t)]
            if owner is not None:
                VALUES.record(t, new, owner)
                device_owned.mark_pending(t, new, owner)
                continue
            device_owned._PENDING.pop(device_owned._storage_key(t), None)  # all overwritten
            _write_host(t, new)
            VALUES.record(t, new)
        else:
            _write_host(v, new)


def _lasting_owner(t: torch.Tensor):
    """The object whose life keeps ``t``'s storage (whole) current on the device: the owner
    the residency table knows for it, when it has ``t``'s layout; else ``None``."""
    owner = VALUES.owner(t)
    if owner is None:
        return None
    if t.storage_offset() != 0 or t.untyped_storage().nbytes() != t.numel() * t.element_size():
        return None
    if isinstance(owner, np.ndarray):
        ok = owner.shape == tuple(t.shape) and owner.itemsize == t.element_size()
        return owner if ok and owner.ctypes.data == t.data_ptr() else None
    if isinstance(owner, torch.Tensor):
        ok = owner.shape == t.shape and owner.dtype == t.dtype and owner.stride() == t.stride()
        return owner if ok and owner.data_ptr() == t.data_ptr() else None
    return None


def _write_host(t: torch.Tensor, new) -> None:
    """Write a new device value into host tensor ``t`` through numpy (no version bump)."""
    values = np.asarray(new)
    np.copyto(device_owned._host_view(t), values.reshape(tuple(t.shape)), casting="no")
    TOTAL.add(D2H, "write-back", int(values.nbytes))


# DeviceTensor's dispatch (device_owned, which this module builds on) runs eager ops here.
device_owned.RUN_ON_DEVICE = run

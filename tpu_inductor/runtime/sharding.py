"""SPMD over a device mesh: where each tensor lives with ``options={"mesh", "shardings"}``.

JAX is the distributed engine. This module only decides *placements* (a ``NamedSharding`` per
array); ``jax.jit`` partitions the program over the mesh (GSPMD/Shardy) and inserts every
collective. Where sharding enters the pipeline (docs/architecture.md, "Sharding"):

1. ``tpu_backend`` (the first call of each Dynamo graph, when real tensors and their source
   names are at hand) calls :func:`place_graph`: every parameter, buffer and optimizer state
   tensor the graph reads gets a placement from the plan, remembered by tensor identity, and a
   bad plan raises one :class:`~tpu_inductor.core.errors.ShardingError` listing every problem.
2. The runtime uploads a tensor with its placement (:meth:`Plan.put`); tensors with none (the
   batch, labels, tangents) get the plan's input sharding when their first dimension divides,
   else they are replicated. Arrays already on the device keep theirs.
3. The executable is traced with the inputs' shardings; the new value of an input it updates
   in place is constrained to that input's sharding, so parameters and optimizer state stay
   where the plan put them step after step. Saved activations stay wherever XLA put them.
4. Outputs handed back to torch are gathered by ``np.asarray`` (one copy of each element).

Multi-controller runs (``jax.distributed.initialize()``, one process per host, each running the
same program on the same global batch, over a mesh of all processes' devices): each process
uploads only the shards its own devices hold (:meth:`Plan.put`), and an output sharded over
other processes' devices is all-gathered so torch gets the whole value on every process
(``boundary.jax_to_host``). ``tests/runtime/test_multihost.py`` runs two processes on one machine.

Plans: ``"dp"`` (replicate state, shard the batch), ``"fsdp"`` (also shard every state
tensor's first divisible dimension over the data axis), ``"tp"`` (Megatron-style tensor
parallel over the ``"model"`` axis for Llama-family names, batch on ``"data"``), or a dict of
``fnmatch`` patterns over parameter names (``"model.layers.*.self_attn.q_proj.weight"``) to
``PartitionSpec``, with an optional ``"inputs"`` entry for the batch.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import math
import re
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np
import torch
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from tpu_inductor.core.errors import InvalidOptionError, ShardingError

PRESETS = ("dp", "fsdp", "tp")

# Megatron-style tensor parallelism for Llama-family names (transformers' Llama, Mistral,
# Qwen2/3, Gemma, ...): weights are [out_features, in_features].
_COLUMN = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")  # shard the outputs
_ROW = ("o_proj", "down_proj")  # shard the inputs; XLA all-reduces the partial sums
_TP_RULES = (
    *((f"*.{m}.weight", ("model", None)) for m in _COLUMN),
    *((f"*.{m}.bias", ("model",)) for m in _COLUMN),
    *((f"*.{m}.weight", (None, "model")) for m in _ROW),
    ("*embed_tokens.weight", (None, "model")),  # hidden dim: each device a slice of the vector
    ("lm_head.weight", ("model", None)),  # vocab: logits come out sharded and are gathered
)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Plan:
    """A validated mesh and sharding plan (``options["mesh"]``, ``options["shardings"]``)."""

    mesh: Mesh
    preset: str | None
    rules: tuple[tuple[str, PartitionSpec], ...]
    inputs: PartitionSpec

    @property
    def data_axis(self) -> str:
        names = self.mesh.axis_names
        return "data" if "data" in names else names[0]

    def replicated(self) -> NamedSharding:
        return NamedSharding(self.mesh, PartitionSpec())

    def input_sharding(self, shape: Sequence[int]) -> NamedSharding:
        """The batch's sharding for a tensor of ``shape`` (replicated where it doesn't divide)."""
        if _divides(self.mesh, self.inputs, shape):
            return NamedSharding(self.mesh, self.inputs)
        return self.replicated()

    def kv_spec(self, shape: Sequence[int]) -> PartitionSpec:
        """A KV cache's placement (``[batch, kv_heads, positions, head_dim]``): the batch over
        the data axis (dp, fsdp), the heads over ``model`` (tp), each where the axis divides
        it; the positions stay whole, so a decode step's attention needs no collective."""
        names = self.mesh.axis_names
        batch = self.data_axis if self.preset != "tp" or "data" in names else None
        heads = "model" if self.preset == "tp" else None
        spec = PartitionSpec(batch, heads, None, None)
        return PartitionSpec(
            *(
                a if _divides(self.mesh, PartitionSpec(a), (n,)) else None
                for a, n in zip(spec, shape, strict=False)
            )
        )

    def put(self, t: torch.Tensor, value) -> jax.Array:
        """``value`` (numpy or a single-device array of ``t``) placed on the mesh."""
        sharding = placement(t, self.mesh) or self.input_sharding(tuple(t.shape))
        # NOTE: a private copy. On CPU, device_put may alias host memory for every replica, and
        # torch writes tensors in place (the write-back of a step's new optimizer state) while
        # other devices still compute with them: 1 run in 2 of a dp/tp step on 8 CPU devices
        # diverged from eager at its second step. Uploads happen once per state tensor.
        host = np.array(value)
        if jax.process_count() > 1 and not sharding.is_fully_addressable:
            # Multi-controller (jax.distributed): every process holds the whole host value and
            # uploads only its own devices' shards. device_put would first check that the value
            # is the same on every process (an all-gather of all of it, at each upload).
            return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])
        return jax.device_put(host, sharding)

    def key(self) -> tuple:
        """What makes two plans compile differently (part of the executable cache key)."""
        mesh = (tuple(self.mesh.axis_names), self.mesh.devices.shape, self.mesh.devices.tobytes())
        return (mesh, self.preset, self.rules, self.inputs)


def parse_plan(mesh: Any, shardings: Any) -> Plan | None:
    """Check the ``mesh`` and ``shardings`` options (types and axis names, at compile time).

    Raises:
        InvalidOptionError: listing every problem.
    """
    if mesh is None and shardings is None:
        return None
    problems = []
    if not isinstance(mesh, Mesh):
        problems.append(
            f"option 'mesh' must be a jax.sharding.Mesh (e.g. jax.make_mesh((8,), ('data',))), "
            f"got {type(mesh).__name__}"
        )
    rules: list[tuple[str, PartitionSpec]] = []
    preset, inputs = None, None
    if shardings is None or isinstance(shardings, str):
        preset = shardings or "dp"
        if preset not in PRESETS:
            problems.append(
                f"option 'shardings' must be one of {PRESETS} or a dict, got {preset!r}"
            )
    elif isinstance(shardings, Mapping):
        for pattern, spec in shardings.items():
            if not isinstance(spec, PartitionSpec):
                problems.append(
                    f"shardings[{pattern!r}] must be a jax.sharding.PartitionSpec, got {spec!r}"
                )
            elif pattern == "inputs":
                inputs = spec
            elif not isinstance(pattern, str):
                problems.append(f"shardings keys must be name patterns (str), got {pattern!r}")
            else:
                rules.append((pattern, spec))
    else:
        problems.append(
            "option 'shardings' must be 'dp', 'fsdp', 'tp' or a dict of name pattern -> "
            f"PartitionSpec, got {type(shardings).__name__}"
        )
    if isinstance(mesh, Mesh):
        names = set(mesh.axis_names)
        if preset == "tp" and "model" not in names:
            problems.append(f"shardings='tp' needs a mesh axis named 'model'; the mesh has {names}")
        for pattern, spec in [*rules, ("inputs", inputs)]:
            unknown = sorted(set(_axes(spec)) - names) if spec is not None else []
            if unknown:
                problems.append(
                    f"shardings[{pattern!r}] = {spec} names mesh axes {unknown} the mesh lacks "
                    f"(its axes: {list(mesh.axis_names)})"
                )
    if problems:
        raise InvalidOptionError(
            "invalid sharding options:\n  - " + "\n  - ".join(problems) + "\nSee docs/scaling.md "
            "for the presets and the dict form."
        )
    if inputs is None:
        if preset == "tp":
            data = "data" if "data" in mesh.axis_names else None
            inputs = PartitionSpec(data) if data else PartitionSpec()
        else:
            inputs = PartitionSpec("data" if "data" in mesh.axis_names else mesh.axis_names[0])
    if preset == "tp":
        rules = [(p, PartitionSpec(*s)) for p, s in _TP_RULES]
    return Plan(mesh=_auto(mesh), preset=preset, rules=tuple(rules), inputs=inputs)


def _auto(mesh: Mesh) -> Mesh:
    """``mesh`` with every axis ``Auto``: XLA propagates shardings through the program.

    NOTE: ``jax.make_mesh`` makes ``Explicit`` axes (JAX 0.10), where shardings are part of
    array types and an op whose output sharding is ambiguous (a gather of replicated
    embeddings by batch-sharded ids) is an error asking for ``out_sharding=``. Lowered ATen
    has no place for such annotations, so placements here are hints XLA completes (GSPMD).
    """
    auto = (jax.sharding.AxisType.Auto,) * len(mesh.axis_names)
    if tuple(mesh.axis_types) == auto:
        return mesh
    return Mesh(mesh.devices, mesh.axis_names, axis_types=auto)


# --- placements, by tensor identity ---------------------------------------------------------

_PLACED: dict[int, tuple[weakref.ref, NamedSharding]] = {}


def placement(t: torch.Tensor, mesh: Mesh) -> NamedSharding | None:
    """The sharding :func:`place_graph` gave ``t`` on ``mesh`` (or its owner, :func:`follow`),
    or ``None``."""
    entry = _PLACED.get(id(t))
    if entry is not None and entry[0]() is t and entry[1].mesh == mesh:
        return entry[1]
    owner = _OWNERS.get(id(t))
    if owner is not None and owner[0]() is t:
        param = owner[1]()
        if param is not None and tuple(param.shape) == tuple(t.shape):
            return placement(param, mesh)
    return None


_OWNERS: dict[int, tuple] = {}  # id(state) -> (state, its parameter), both weakly


def follow(state: torch.Tensor, param: torch.Tensor) -> None:
    """Place optimizer ``state`` (a moment of ``param``'s shape) wherever ``param`` is placed:
    a moment sharded by the generic input rule instead (the batch axis only) held 4x its
    share of HBM on an fsdp x tp mesh of 4 x 4."""
    key = id(state)
    ref = weakref.ref(state, lambda _, key=key: _OWNERS.pop(key, None))
    _OWNERS[key] = (ref, weakref.ref(param))


def _remember(t: torch.Tensor, sharding: NamedSharding) -> None:
    key = id(t)
    _PLACED[key] = (weakref.ref(t, lambda _, key=key: _PLACED.pop(key, None)), sharding)


def clear() -> None:
    """Forget every placement (``tpu_inductor.reset()``)."""
    _PLACED.clear()
    _OWNERS.clear()


def place_graph(plan: Plan, gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> None:
    """Give every state tensor of Dynamo graph ``gm`` its placement (see the module docstring).

    State tensors are the graph's parameters and buffers (placeholders reached through a
    module's ``_parameters``/``_buffers``, and tensors Dynamo lifted into ``gm`` itself, such as a
    compiled optimizer's parameters and state). Optimizer state is placed like its parameter.

    Raises:
        ShardingError: listing every tensor a dict rule cannot shard (unknown axis, a dimension
            the axis size does not divide) and every pattern that matches no parameter.
    """
    for t in kv_caches(gm, example_inputs):
        if placement(t, plan.mesh) is None:
            _remember(t, NamedSharding(plan.mesh, plan.kv_spec(tuple(t.shape))))
    named = _state_tensors(gm, example_inputs)
    if not named:
        return
    problems: list[str] = []
    matched: set[str] = set()
    owners = _optimizer_state_owners(named)
    for name, t in named:
        if placement(t, plan.mesh) is not None:
            continue
        owner = owners.get(name)
        if owner is not None and placement(owner, plan.mesh) is not None:
            if tuple(owner.shape) == tuple(t.shape):
                _remember(t, placement(owner, plan.mesh))
                continue
        spec = _spec_for(plan, name, tuple(t.shape), matched, problems)
        _remember(t, NamedSharding(plan.mesh, spec))
    params = [n for n, _ in named if not _is_optimizer_name(n)]
    if params and plan.preset is None:
        for pattern, _ in plan.rules:
            if pattern not in matched:
                problems.append(
                    f"pattern {pattern!r} matches no parameter of this graph (its parameters: "
                    f"{_sample(params)})"
                )
    if problems:
        raise ShardingError(
            "the sharding plan does not fit this model:\n  - " + "\n  - ".join(problems) + "\n"
            "What to do: fix the patterns (fnmatch syntax, over names like "
            "'model.layers.0.self_attn.q_proj.weight'), or shard a dimension the mesh axis "
            "size divides."
        )


def _spec_for(plan: Plan, name: str, shape: tuple, matched: set, problems: list) -> PartitionSpec:
    mesh = plan.mesh
    for pattern, spec in plan.rules:
        if fnmatch.fnmatchcase(name, pattern):
            matched.add(pattern)
            if len(spec) > len(shape):
                problems.append(f"{name} {list(shape)}: {spec} has more entries than dimensions")
            elif not _divides(mesh, spec, shape):
                if plan.preset is None:
                    problems.append(
                        f"{name} {list(shape)}: {spec} splits a dimension its mesh axes "
                        f"({_axis_sizes(mesh, spec)}) do not divide"
                    )
                return PartitionSpec()  # a preset leaves what doesn't divide replicated
            return spec
    if plan.preset == "fsdp":
        size = mesh.shape[plan.data_axis]
        for d, n in enumerate(shape):
            if n % size == 0 and n >= size:
                return PartitionSpec(*([None] * d), plan.data_axis)
    return PartitionSpec()


def kv_caches(gm, example_inputs) -> list[torch.Tensor]:
    """The inputs of Dynamo graph ``gm`` that it updates in place along dimension 2 of four
    with ``index_copy_`` (a transformers ``StaticCache`` layer's keys or values, ``[batch,
    kv_heads, positions, head_dim]``)."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    by_node = dict(zip(placeholders, example_inputs, strict=False))
    out = []
    for n in gm.graph.nodes:
        if n.op != "call_method" or n.target != "index_copy_" or len(n.args) < 2:
            continue
        t = by_node.get(n.args[0])
        if isinstance(t, torch.Tensor) and t.dim() == 4 and n.args[1] in (2, -2):
            out.append(t)
    return out


def _state_tensors(gm, example_inputs) -> list[tuple[str, torch.Tensor]]:
    out = []
    for name, t in [*gm.named_parameters(), *gm.named_buffers()]:
        out.append((name, t))
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for node, t in zip(placeholders, example_inputs, strict=False):
        if not isinstance(t, torch.Tensor):
            continue
        source = getattr(node.meta.get("grapharg"), "source", None)
        text = getattr(source, "name", None)
        text = text() if callable(text) else text
        if text and ("_parameters[" in text or "_buffers[" in text):
            out.append((module_path(text), t))
    return out


_TOKEN = re.compile(r"\.(\w+)|\['([^']*)'\]|\[(\d+)\]")
_STRUCTURE = frozenset({"_modules", "_parameters", "_buffers"})


def module_path(source_name: str) -> str:
    """``L['self']._modules['model']._parameters['weight']`` -> ``model.weight`` (the name
    ``named_parameters()`` gives it, relative to the compiled module)."""
    tokens = ["".join(g) for g in _TOKEN.findall(source_name)]
    # The root (L['self'], L['args'][0], G['model'], ...) ends where the module tree begins.
    start = next((i for i, t in enumerate(tokens) if t in _STRUCTURE), len(tokens))
    return ".".join(t for t in tokens[start:] if t not in _STRUCTURE)


_PARAM_ATTR = re.compile(r"param_groups_\d+__params___(\d+)$")
_STATE_ATTR = re.compile(r"_state___(\d+)")


def _is_optimizer_name(name: str) -> bool:
    return bool(_PARAM_ATTR.search(name) or _STATE_ATTR.search(name))


def _optimizer_state_owners(named) -> dict[str, torch.Tensor]:
    """A compiled optimizer step's state tensors -> their parameter.

    Dynamo lifts the step's parameters (``..._param_groups_0__params___<k>``) and state
    (``..._state___<n>...``, ``n`` the position in ``optimizer.state``, which fills in parameter
    order on the first step) into the graph; state ``n`` belongs to the ``n``-th parameter.
    :func:`place_graph` checks the shapes agree before using it.
    """
    params = [t for n, t in named if _PARAM_ATTR.search(n)]
    owners = {}
    for n, _ in named:
        m = _STATE_ATTR.search(n)
        if m and int(m.group(1)) < len(params):
            owners[n] = params[int(m.group(1))]
    return owners


def _axes(spec: PartitionSpec) -> list[str]:
    out = []
    for entry in spec:
        if entry is None:
            continue
        out.extend(entry if isinstance(entry, tuple) else (entry,))
    return out


def _axis_sizes(mesh: Mesh, spec: PartitionSpec) -> str:
    return ", ".join(f"{a}={mesh.shape[a]}" for a in _axes(spec) if a in mesh.shape)


def _divides(mesh: Mesh, spec: PartitionSpec, shape: Sequence[int]) -> bool:
    if len(spec) > len(shape):
        return False
    for entry, n in zip(spec, shape, strict=False):
        if entry is None:
            continue
        names = entry if isinstance(entry, tuple) else (entry,)
        if any(a not in mesh.shape for a in names):
            return False
        if n % math.prod(mesh.shape[a] for a in names):
            return False
    return True


def _sample(names: list[str], n: int = 4) -> str:
    shown = ", ".join(names[:n])
    return shown + (f", ... ({len(names)} in all)" if len(names) > n else "")


def resident_bytes_per_device(arrays) -> dict[str, int]:
    """Device -> bytes of ``arrays`` held there (each shard counted where it lives)."""
    out: dict[str, int] = {}
    for arr in arrays:
        for shard in arr.addressable_shards:
            key = str(shard.device)
            out[key] = out.get(key, 0) + int(np.prod(shard.data.shape)) * arr.dtype.itemsize
    return out

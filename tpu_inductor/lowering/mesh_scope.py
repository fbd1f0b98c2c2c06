"""The device mesh a graph is traced for, for the lowerings that must place a kernel on it.

A Pallas kernel is a custom call XLA's SPMD partitioner cannot split: given sharded operands it
gathers them onto every device. A lowering that emits one (splash attention) wraps it in
``jax.shard_map`` over the mesh the graph is partitioned on, which it reads here; the runtime
sets it around each trace (``runtime/call.py``). ``None`` outside a sharded trace.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses

from jax.sharding import Mesh, PartitionSpec


@dataclasses.dataclass(frozen=True, kw_only=True)
class MeshScope:
    """A mesh and how the graph's batch is split on it (``batch``: the axis name or names of
    its inputs' first dimension, ``None`` when the batch is not split)."""

    mesh: Mesh
    batch: str | tuple[str, ...] | None


_CURRENT: contextvars.ContextVar[MeshScope | None] = contextvars.ContextVar(
    "tpu_inductor_mesh", default=None
)


def current() -> MeshScope | None:
    """The mesh of the trace in progress, or ``None``."""
    return _CURRENT.get()


@contextlib.contextmanager
def tracing_on(mesh: Mesh | None = None, inputs: PartitionSpec | None = None):
    """Within the block, :func:`current` is ``mesh`` with the batch axes of ``inputs``."""
    if mesh is None:
        yield
        return
    batch = inputs[0] if inputs is not None and len(inputs) else None
    token = _CURRENT.set(MeshScope(mesh=mesh, batch=batch))
    try:
        yield
    finally:
        _CURRENT.reset(token)


def axis_size(mesh: Mesh, axes) -> int:
    """How many devices the mesh axis or axes ``axes`` span (1 for ``None``)."""
    if axes is None:
        return 1
    size = 1
    for a in (axes,) if isinstance(axes, str) else axes:
        size *= mesh.shape[a]
    return size


__all__ = ["MeshScope", "axis_size", "current", "tracing_on"]

"""Stacked state on the device (``lowering/packing.py``: a run of layers' weights and state
crossing as one array per kind): the shardings of a stack and of its members, and the jitted
stack of arrays already on the device."""

from __future__ import annotations

import functools

import jax


def stacked_sharding(sharding):
    """The sharding of a stack of arrays placed as ``sharding`` (layers unsharded)."""
    if isinstance(sharding, jax.sharding.NamedSharding):
        spec = jax.sharding.PartitionSpec(None, *tuple(sharding.spec))
        return jax.sharding.NamedSharding(sharding.mesh, spec)
    return sharding


def member_sharding(sharding):
    """The sharding of one layer of a stack placed as ``sharding`` (:func:`stacked_sharding`'s
    inverse)."""
    if isinstance(sharding, jax.sharding.NamedSharding):
        spec = jax.sharding.PartitionSpec(*tuple(sharding.spec)[1:])
        return jax.sharding.NamedSharding(sharding.mesh, spec)
    return sharding


@functools.lru_cache(maxsize=64)
def _stacker(n: int, sharding) -> object:
    return jax.jit(lambda *xs: jax.numpy.stack(xs), out_shardings=sharding)


def stack_arrays(parts: list, device: jax.Device | None = None) -> jax.Array:
    """``parts`` (device arrays, or host arrays that cross now) stacked on the device: on
    ``device``, or under a sharding plan (``device=None``) each layer placed as ``parts[0]``.
    One device copy of the members (what the program's own ``jnp.stack`` did before)."""
    if device is not None:
        sharding = jax.sharding.SingleDeviceSharding(device)
    else:
        sharding = stacked_sharding(parts[0].sharding)
    return _stacker(len(parts), sharding)(*parts)


def clear_stackers() -> None:
    """Drop the jitted stack functions of stacked state (``tpu_inductor.reset``)."""
    _stacker.cache_clear()

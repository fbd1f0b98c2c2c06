"""Higher-order ops that wrap one op: ``with_effects`` and activation checkpointing's RNG
wrappers, as rows of the op table (``lowers(..., wraps=i)``: the wrapped op is argument ``i``).

The graph walk gives a wrapper's lowering the context of the op it wraps (:func:`wrapped_view`:
its target, arguments and output spec), so the wrapper's lowering only adds what the wrapper
does around that op's own row.

``with_effects(token, op, *args)`` wraps ops with side effects (e.g. linalg's error checks): the
token passes through.

Activation checkpointing (torch/_prims/rng_prims.py; AOTAutograd's
``partitioners.functionalize_rng_ops``) wraps each random op that the backward recomputes:
``run_and_save_rng_state(op, *args) -> (state, op(*args))`` in the forward, which saves the
state, and ``run_with_rng_state(state, op, *args) -> op(*args)`` in the backward, which must draw
the same numbers (the same dropout mask). Eager's state is the CPU generator's (uint8[5056]);
ours is where the op's keys come from: the call's base key and the draw counter at the op, as
uint32[3] bytes (uint8[12]). The forward runs the op exactly as without checkpointing (its draws
are ``fold_in(base, counter)``, counting on), so a checkpointed graph draws the numbers the plain
one draws under the same seed; the backward replays ``fold_in(base, start + i)`` from the saved
state and draws no seed of its own.
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import torch
import torch.fx as fx
from jax import lax
from torch.fx.node import map_arg

from tpu_inductor.lowering.lowerings.registry import LOWERINGS, Lowering, lowers

WITH_EFFECTS = getattr(torch.ops.higher_order, "with_effects", None)
RUN_AND_SAVE_RNG = getattr(torch.ops.higher_order, "run_and_save_rng_state", None)
RUN_WITH_RNG = getattr(torch.ops.higher_order, "run_with_rng_state", None)


def wrapped_view(node: fx.Node, row: Lowering) -> Any:
    """What the wrapped op's lowering sees of a wrapper node (``row.wraps`` set): its own
    target, arguments and output spec, without the effect token or the RNG state."""
    start = row.wraps
    op, args = node.args[start], node.args[start + 1 :]
    val = node.meta.get("val")
    if node.target is WITH_EFFECTS:  # (token, the op's result)
        val = val[1] if isinstance(val, tuple | list) else None
    else:  # the RNG wrappers carry no spec of their own: the op's, from fake tensors
        val = _fake_result(op, args, node.kwargs)
    return types.SimpleNamespace(
        target=op, args=args, kwargs=node.kwargs, name=node.name, meta={**node.meta, "val": val}
    )


def _fake_result(op, args, kwargs):
    metas = map_arg(args, lambda n: n.meta.get("val"))
    kw = map_arg(kwargs, lambda n: n.meta.get("val"))
    flat = [m for m in torch.utils._pytree.tree_leaves((metas, kw)) if isinstance(m, torch.Tensor)]
    mode = torch._guards.detect_fake_mode(flat)
    if mode is None:
        return None
    with mode:
        return op(*metas, **kw)


# with_effects(token, op, *args) -> (token, op(*args))
def _with_effects(ctx, token, op, *args, **kwargs):
    return token, LOWERINGS[op](ctx, args, kwargs)


# run_and_save_rng_state(op, *args) -> (state, op(*args)): saves where its draws start (an op
# that draws nothing, attention without dropout, saves no seed)
def _run_and_save_rng_state(ctx, op, *args, **kwargs):
    state = _rng_state(ctx.seed, ctx.draws[0]) if ctx.make_key is not None else _NO_RNG_STATE
    return state, LOWERINGS[op](ctx, args, kwargs)


# run_with_rng_state(state, op, *args) -> op(*args), drawing what the forward drew
def _run_with_rng_state(ctx, state, op, *args, **kwargs):
    return LOWERINGS[op](dataclasses.replace(ctx, make_key=_replay(state)), args, kwargs)


def _draws_when_its_op_does(node: fx.Node) -> bool:
    """``run_and_save_rng_state`` is random when the op it wraps draws (dropout > 0)."""
    low = LOWERINGS.get(node.args[0])
    return low is not None and (callable(low.random) or bool(low.random))


_NO_RNG_STATE = np.zeros(12, np.uint8)


def _rng_state(seed, start: int) -> jax.Array:
    """The RNG state ``run_and_save_rng_state`` returns: the call's seed (uint32[2]) and the
    number of the op's first draw, as uint8[12]."""
    words = jnp.concatenate([jnp.asarray(seed, jnp.uint32), jnp.full((1,), start, jnp.uint32)])
    return lax.bitcast_convert_type(words, jnp.uint8).reshape(-1)


def _replay(state) -> Callable[[], jax.Array]:
    """``ctx.make_key`` replaying the draws a :func:`_rng_state` state starts: the i-th is
    ``fold_in(base, start + i)``, as in the forward."""
    words = lax.bitcast_convert_type(state.reshape(-1, 4), jnp.uint32)
    base = jax.random.wrap_key_data(words[:2], impl="threefry2x32")
    draws = iter(range(1 << 30))
    return lambda: jax.random.fold_in(base, words[2] + next(draws))


if WITH_EFFECTS is not None:
    lowers(WITH_EFFECTS, wraps=1)(_with_effects)
if RUN_AND_SAVE_RNG is not None:
    lowers(RUN_AND_SAVE_RNG, wraps=0, random=_draws_when_its_op_does)(_run_and_save_rng_state)
if RUN_WITH_RNG is not None:
    lowers(RUN_WITH_RNG, wraps=1)(_run_with_rng_state)

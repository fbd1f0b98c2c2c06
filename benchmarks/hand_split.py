"""The hand-written training step split into programs as a split step is (``hand-2prog``,
``hand-3prog`` of ``python -m benchmarks.tpu_programs``): what a split costs a hand-written step,
the floor a split step of ours is measured against."""

from __future__ import annotations

import numpy as np


def split_step(M, spec, target, params, state, inputs, param_bytes: int, variant: str) -> dict:
    """The hand-written training step split where ours splits. ``3prog``: a forward returning
    the loss and ``jax.vjp``'s residuals (all of them: JAX does not rematerialize), a backward
    from them to the gradients, and AdamW (parameters and state donated). ``2prog``: the loss
    and gradients as one program (``value_and_grad``), AdamW as another: what splitting the
    optimizer off costs (gradients written and read back, the update fused with nothing)."""
    import collections

    import jax
    import jax.numpy as jnp

    from benchmarks import hand_llama
    from benchmarks.tpu_analysis import _state_in, analyze, compile_jitted

    def forward(p, *xs):
        with jax.default_matmul_precision("highest"):
            return jax.vjp(lambda q: M.loss_fn(spec, q, *xs), p)

    def backward(pullback):
        with jax.default_matmul_precision("highest"):
            return pullback(jnp.ones((), jnp.float32))[0]

    def update(p, grads, st):
        return hand_llama.adamw_update(hand_llama.AdamW(), p, grads, st)

    def grads(p, *xs):
        with jax.default_matmul_precision("highest"):
            return jax.value_and_grad(lambda q: M.loss_fn(spec, q, *xs))(p)

    optimizer = ("optimizer", jax.jit(update, donate_argnums=(0, 2)), (params, params, state))
    if variant == "2prog":
        steps = (("forward-backward", jax.jit(grads), (params, *inputs)), optimizer)
    else:
        _, pullback = jax.eval_shape(forward, params, *inputs)
        steps = (
            ("forward", jax.jit(forward), (params, *inputs)),
            ("backward", jax.jit(backward), (target.place(pullback),)),
            optimizer,
        )
    programs, cpu = [], 0.0
    # Parameters and the two moments live on the chip beside each program (as for ours).
    held = [(s.shape, s.dtype) for s in jax.tree.leaves(params)] * 3
    state_shapes = collections.Counter((tuple(sh), str(np.dtype(dt))) for sh, dt in held)
    state_bytes = 3 * param_bytes
    for name, jitted, args in steps:
        compiled, cpu_s, wall_s, spaces = compile_jitted(jitted, args)
        cpu += cpu_s
        program = {
            "name": name,
            "kind": name,
            **analyze(compiled, spaces),
            "compile_wall_s": wall_s,
        }
        given = [(s.shape, s.dtype) for s in jax.tree.leaves(args)]
        program["outside_state"] = max(0, state_bytes - _state_in(given, state_shapes))
        programs.append(program)
    return {"programs": programs, "param_bytes": param_bytes, "compile_cpu_s": cpu}

"""Run by tests/runtime/test_live_arrays.py in a process with 4 CPU devices: two small Llamas
trained under a dp and an fsdp mesh, deleted; prints what ``jax.live_arrays()`` still holds as
JSON."""

from __future__ import annotations

import gc
import json
import sys

import jax
import torch
from helpers import tiny_llama  # tests/helpers.py: this script runs from tests/

import tpu_inductor  # noqa: F401  (the backend)


def train(plan: str, compile_step: bool):
    model = tiny_llama()  # seed 0, vocab 128, hidden 32, 2 layers
    opts = {"mesh": jax.make_mesh((4,), ("data",)), "shardings": plan}
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    cmodel = torch.compile(model, backend="tpu", options=opts)
    step = torch.compile(opt.step, backend="tpu", options=opts) if compile_step else opt.step
    ids = torch.randint(0, 128, (4, 16))
    for _ in range(2):
        cmodel(input_ids=ids, labels=ids).loss.backward()
        step()
        opt.zero_grad()
    state_shapes = {tuple(t.shape) for s in opt.state.values() for t in s.values()}
    return (model, opt, cmodel, step), state_shapes


def main() -> None:
    compile_step = sys.argv[1] == "compiled-step"
    torch.set_num_threads(1)
    before = len(jax.live_arrays())
    held, shapes = [], set()
    for plan in ("dp", "fsdp"):
        objs, state_shapes = train(plan, compile_step)
        held.append(objs)
        shapes |= state_shapes
    while_held = len(jax.live_arrays()) - before
    del held, objs
    gc.collect()
    torch._dynamo.reset()
    gc.collect()
    live = jax.live_arrays()
    print(
        json.dumps(
            {
                "while_held": while_held,
                "after": len(live) - before,
                "shapes": sorted({tuple(a.shape) for a in live}),
                "state_shapes": sorted(shapes),
            }
        )
    )


if __name__ == "__main__":
    main()

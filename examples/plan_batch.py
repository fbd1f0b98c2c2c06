"""How large a batch fits: the largest global batch whose whole training step fits on a TPU
target, per activation-checkpointing choice, by bisection over deviceless compiles.

    pip install -e '.[tpu]'                       # libtpu: XLA's TPU compiler (~700 MB)
    JAX_PLATFORMS=cpu python examples/plan_batch.py
    JAX_PLATFORMS=cpu python examples/plan_batch.py --target v5p-8 --shardings fsdp --path split

The model is a transformers Llama built on the meta device (nothing is allocated); every probe
compiles the whole step with libtpu and runs nothing (``tpu_inductor.largest_batch``).
"""

from __future__ import annotations

import argparse

import torch
import transformers
from compile_for_tpu import llama_arguments, llama_config  # examples/, beside this script

import tpu_inductor


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", default="v5e")
    p.add_argument("--shardings", default=None, help="dp, fsdp or tp (with a multi-chip target)")
    p.add_argument("--path", default="one-program", choices=("one-program", "split"))
    llama_arguments(p)
    p.add_argument("--checkpointing", default="none,full,selective")
    args = p.parse_args()

    config = llama_config(args)
    tpu_inductor.largest_batch(
        lambda: transformers.LlamaForCausalLM(config),
        args.target,
        seq_len=args.seq,
        mesh_axes=("data",) if args.shardings else None,
        shardings=args.shardings,
        checkpointing=tuple(args.checkpointing.split(",")),
        dtype=torch.bfloat16,
        path=args.path,
    )


if __name__ == "__main__":
    main()

"""Check a training step on a TPU you don't have: compile it for a topology and read the report.

    pip install -e '.[tpu]'                       # libtpu: XLA's TPU compiler (~700 MB)
    JAX_PLATFORMS=cpu python examples/compile_for_tpu.py
    JAX_PLATFORMS=cpu python examples/compile_for_tpu.py --target v5e:2x2 --shardings fsdp

The model is a transformers Llama built on the meta device: no weight is ever allocated, so the
same script takes an 8B model's sizes on a laptop (``--hidden 4096 --layers 32 --heads 32
--kv-heads 8 --intermediate 14336 --vocab 128256``; untried here: its TPU compiles take much
longer than the default model's). Nothing runs: every graph is compiled by libtpu's TPU
compiler and described (``tpu_inductor.tpu_report()``); a program that does not fit in the
chip's HBM is reported with by how much.
"""

from __future__ import annotations

import argparse
import sys

import torch
import transformers

import tpu_inductor

# the README's sample report (tests/tpu/test_readme_sample.py checks it still matches)
README_ARGS = [
    "--hidden", "256", "--intermediate", "704", "--layers", "2", "--heads", "4",
    "--kv-heads", "2", "--vocab", "8192", "--batch", "8", "--seq", "256",
]  # fmt: skip


def llama_arguments(p: argparse.ArgumentParser, **defaults) -> None:
    """The Llama's shape flags (``--hidden --intermediate --layers --heads --kv-heads --vocab
    --seq``), with these defaults; examples/plan_batch.py takes the same flags."""
    d = dict(hidden=512, intermediate=1408, layers=4, heads=8, kv_heads=2, vocab=32000, seq=1024)
    d |= defaults
    for name, value in d.items():
        p.add_argument("--" + name.replace("_", "-"), type=int, default=value)


def llama_config(args: argparse.Namespace):
    """The ``LlamaConfig`` those flags describe."""
    return transformers.LlamaConfig(
        hidden_size=args.hidden,
        intermediate_size=args.intermediate,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        vocab_size=args.vocab,
        max_position_embeddings=args.seq,
    )


def main(argv: list[str] | None = None):
    """Compile the step for the target and print the report; returns it."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", default="v5e")
    p.add_argument("--shardings", default=None, help="dp, fsdp or tp (with a multi-chip target)")
    llama_arguments(p, hidden=1024, intermediate=2816, heads=16, kv_heads=4)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument(
        "--autocast",
        action="store_true",
        help="float32 weights, the forward under torch.autocast to bfloat16 (the model is built on "
        "the CPU: autocast does not apply to meta tensors)",
    )
    p.add_argument("--plot", default=None, help="write HBM per program to this PNG")
    p.add_argument(
        "--readme-sample", action="store_true", help="the README's sample (a smaller model)"
    )
    args = p.parse_args(argv)
    if args.readme_sample:
        args = p.parse_args([*README_ARGS, *(sys.argv[1:] if argv is None else argv)])

    config = llama_config(args)
    device = "cpu" if args.autocast else "meta"  # on meta nothing is allocated
    dtype = torch.float32 if args.autocast else getattr(torch, args.dtype)
    with torch.device(device):
        model = transformers.LlamaForCausalLM(config).to(dtype)
    ids = torch.zeros(args.batch, args.seq, dtype=torch.long, device=device)

    options = {"target": args.target}
    if args.shardings:
        target = tpu_inductor.tpu_target(args.target)
        axes = {"data": target.num_devices // 2, "model": 2} if args.shardings == "tp" else None
        options |= {"mesh": target.mesh(axes or ("data",)), "shardings": args.shardings}

    # the training step as on a TPU: compiled model, loss.backward(), compiled AdamW
    step_model = torch.compile(model, backend="tpu", options=options)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.autocast):
        loss = step_model(ids, labels=ids, use_cache=False).loss
    loss.backward()
    opt = torch.optim.AdamW(model.parameters())
    torch.compile(opt.step, backend="tpu", options=options)()

    report = tpu_inductor.tpu_report()
    if args.plot:
        report.plot(args.plot)
    return report


if __name__ == "__main__":
    main()

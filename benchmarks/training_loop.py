"""docs/training.md's training loop: time, bytes crossing and activation bytes per step.

``python -m benchmarks.training_loop``

The Llama of ``benchmarks/transfers.py`` (hidden 256, 4 layers, vocab 1024: 18.9 MB of float32
parameters), batch 2 x 64, AdamW with a tensor lr and a linear warmup schedule, clipping at 1.0,
the loss read every step. Variants:

- ``loop``: ``keep_on_device(model, opt)``, the loss compiled, clipping compiled with
  ``opt.step`` (one compiled ``update()``);
- ``loop-eager-clip``: the same with ``clip_grad_norm_`` run eagerly between the two;
- ``loop-no-keep``: ``loop`` without ``keep_on_device``;
- ``loop-accumulate-2``: two micro-batches of 2 x 64 per step (autograd adds the second
  gradient into the first eagerly);
- ``loop-checkpointing``: ``gradient_checkpointing_enable()`` (the backward recomputes each
  layer); ``saved`` is what the forward keeps on the device for the backward;
- ``loop-bf16``: the loss under ``torch.autocast("cpu", dtype=torch.bfloat16)``.

Prints a table and writes ``training_loop.json`` to ``--results`` (default the git-ignored
``benchmarks/results/local``). Bytes are exact (counted where an accelerator would copy); times
are this machine's, with its load average recorded.
"""

from __future__ import annotations

import argparse
import time

import torch

from benchmarks import paths
from benchmarks.suite import machine_info, write_record
from benchmarks.transfers import _delta, _llama, _param_bytes

VARIANTS = (
    "loop",
    "loop-eager-clip",
    "loop-no-keep",
    "loop-accumulate-2",
    "loop-checkpointing",
    "loop-bf16",
)


def loop(variant: str, steps: int = 5, warmup: int = 3) -> dict:
    """Steady-state time, bytes and saved activation bytes per optimizer step of ``variant``."""
    import transformers

    import tpu_inductor
    from tpu_inductor.core.transfers import TOTAL

    keep = variant != "loop-no-keep"
    accumulate = 2 if variant == "loop-accumulate-2" else 1
    bf16 = variant == "loop-bf16"
    model = _llama().train()
    model.config.use_cache = False
    if variant == "loop-checkpointing":
        model.gradient_checkpointing_enable()
    opt = torch.optim.AdamW(model.parameters(), lr=torch.tensor(1e-3))
    sched = transformers.get_linear_schedule_with_warmup(opt, 2, steps + warmup)
    if keep:
        tpu_inductor.keep_on_device(model, opt)

    def loss_fn(ids):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            return model(input_ids=ids, labels=ids).loss

    def clip():
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)

    def update():
        if variant != "loop-eager-clip":
            clip()
        opt.step()

    loss_fn = torch.compile(loss_fn, backend="tpu")
    update = torch.compile(update, backend="tpu")
    gen = torch.Generator().manual_seed(1)
    batches = torch.randint(3, 1024, (accumulate, 2, 64), generator=gen)

    def step():
        for ids in batches:
            loss = loss_fn(ids) / accumulate
            loss.backward()
        if variant == "loop-eager-clip":
            clip()
        update()
        sched.step()
        opt.zero_grad()
        return loss.item()

    for _ in range(warmup):
        step()
    before = TOTAL.copy()
    start = time.perf_counter()
    losses = [step() for _ in range(steps)]
    seconds = (time.perf_counter() - start) / steps
    d = _delta(before, TOTAL.copy())
    saved = sum(g.saved_bytes for g in tpu_inductor.report(False).graphs)
    return {
        "workload": variant,
        "param_bytes": _param_bytes(model),
        "h2d_per_step": d["host_to_device"] / steps,
        "d2h_per_step": d["device_to_host"] / steps,
        "by_reason_per_step": {k: v / steps for k, v in d["by_reason"].items()},
        "saved_activation_bytes": saved,
        "ms_per_step": seconds * 1e3,
        "last_loss": losses[-1],
    }


def _fmt(n: float) -> str:
    if n >= 1e5:
        return f"{n / 1e6:.1f} MB"
    return f"{n / 1e3:.2f} KB" if n >= 1e3 else f"{n:.0f} B"


def table(results: list[dict]) -> str:
    """The readable summary of a run."""
    lines = []
    for r in results:
        nonzero = {k: v for k, v in r["by_reason_per_step"].items() if v}
        lines.append(
            f"{r['workload']}: {r['ms_per_step']:.0f} ms/step; host->device "
            f"{_fmt(r['h2d_per_step'])}/step, device->host {_fmt(r['d2h_per_step'])}/step; "
            f"saved activations {_fmt(r['saved_activation_bytes'])}; "
            + ", ".join(f"{k} {_fmt(v)}" for k, v in nonzero.items())
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", choices=VARIANTS, action="append")
    parser.add_argument("--steps", type=int, default=5)
    paths.add_results_option(parser)
    args = parser.parse_args(argv)
    import tpu_inductor

    # transformers' attention wrapper (the kernels package) sets a context variable inside a
    # checkpointed layer; without this Dynamo graph-breaks there (docs/training.md).
    torch._dynamo.config.skip_fwd_side_effects_in_bwd_under_checkpoint = True
    machine = machine_info()
    results = []
    for name in args.only or VARIANTS:
        torch._dynamo.reset()
        tpu_inductor.reset()
        results.append(loop(name, args.steps))
    write_record(
        args.results / "training_loop.json", "benchmarks.training_loop", argv, machine, results
    )
    print(table(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

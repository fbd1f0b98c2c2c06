"""Compile time and bytes of a Llama training step, unrolled vs ``scan_layers``, by depth.

``python -m benchmarks.scan_layers [--mode step|train] [--hidden 64] [--layers 4 32]
[--target v5e] [--shardings fsdp]``

A transformers Llama (hidden ``H``, intermediate ``2H``, 4 heads, 2 KV heads, vocab 128), batch
2 x 8, AdamW, one eager step first so the optimizer state exists. ``--mode step``:
``compile_step``'s one program (forward, backward, update; the steady-state one); ``--mode
train``: ``torch.compile(model)`` forward + ``loss.backward()`` (two programs, summed). Per
depth and variant:

- ``compile_s``: jax trace + lower + XLA compile of that program on this machine's CPU
  (``Executables.builds[-1].seconds``); ``first_call_s``: the whole first call (Dynamo,
  AOTAutograd, lowering, compile, run);
- ``bytes_accessed``: XLA's ``cost_analysis()["bytes accessed"]`` of the compiled program;
  ``peak_bytes``: ``memory_analysis()``: arguments + outputs + temporaries (CPU reports no
  ``peak_memory_in_bytes``), the compiler's ``peak_memory_in_bytes`` where it has one;
- ``max_abs_diff``: of every parameter after the step (``train``: unchanged), scanned vs
  unrolled.

With ``--target`` the same programs are also compiled for that TPU topology through libtpu
(compile only), and its ``compile_s`` / peak / collective bytes are added as ``tpu_*``;
``--shardings`` (``dp``, ``fsdp``, ``tp``) compiles those under that plan over the target's
devices (a ``("data",)`` mesh; ``tp``: ``{"data": n/2, "model": 2}``).

Writes ``scan_layers.json`` to ``--results`` (default the git-ignored
``benchmarks/results/local``). Times are this machine's, with its load
average recorded.
"""

from __future__ import annotations

import argparse
import time

import torch

from benchmarks import paths
from benchmarks.suite import machine_info, write_record


def llama(layers: int, hidden: int = 64, **overrides):
    """A transformers Llama with SDPA attention, ``layers`` deep and ``hidden`` wide (random
    weights, seed 0); tests/test_scan_layers.py builds its models with it too."""
    import transformers

    config = transformers.LlamaConfig(
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=128,
        max_position_embeddings=64,
        **overrides,
    )
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM._from_config(config, attn_implementation="sdpa")


def _figures(exes) -> dict:
    """Compile seconds and XLA's bytes of a graph's (last) CPU executable."""
    exe = next(reversed(exes.entries.values()))
    mem = exe.memory_analysis()
    cost = exe.cost_analysis()
    cost = cost[0] if isinstance(cost, list | tuple) else cost
    summed = mem.argument_size_in_bytes + mem.output_size_in_bytes + mem.temp_size_in_bytes
    return {
        "compile_s": exes.builds[-1].seconds,
        "bytes_accessed": int(cost.get("bytes accessed", 0)),
        "peak_bytes": int(max(summed, getattr(mem, "peak_memory_in_bytes", 0) or 0)),
    }


def _tpu_figures(exes) -> dict:
    """The same figures of a graph compiled for a TPU target (``tpu_report``)."""
    import tpu_inductor

    program = [
        p for p in tpu_inductor.tpu_report(print_table=False).programs if p.graph == exes.name
    ]
    p = program[-1]
    return {
        "compile_s": p.compile_seconds,
        "bytes_accessed": int(p.bytes_accessed),
        "peak_bytes": int(p.peak_bytes),
        "comm_bytes": sum(c.op.bytes for c in p.comms),
    }


def measure(
    layers: int,
    hidden: int,
    scan: bool,
    mode: str,
    target: str | None = None,
    shardings: str | None = None,
) -> dict:
    """Compile (and, without ``target``, run) one step; the figures of its programs, summed
    (``mode="train"``: forward and backward; ``"step"``: compile_step's one program)."""
    import tpu_inductor
    from tpu_inductor.runtime import cache

    torch._dynamo.reset()
    model = llama(layers, hidden).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, eps=1e-3)
    ids = torch.randint(0, 128, (2, 8), generator=torch.Generator().manual_seed(1))
    model(input_ids=ids, labels=ids).loss.backward()  # the optimizer state, eagerly
    opt.step()
    opt.zero_grad()
    options = {"scan_layers": scan}
    if target is not None:
        options["target"] = target
        if shardings:
            t = tpu_inductor.tpu_target(target)
            n = t.num_devices
            axes = {"data": n // 2, "model": 2} if shardings == "tp" else ("data",)
            options |= {"mesh": t.mesh(axes), "shardings": shardings}
    before = set(map(id, cache.COMPILED))
    start = time.perf_counter()
    if mode == "step":

        def train_step(ids):
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            opt.step()
            opt.zero_grad()
            return loss.detach()

        tpu_inductor.compile_step(train_step, opt, options=options)(ids)
    else:
        compiled = torch.compile(model, backend="tpu", options=options)
        compiled(input_ids=ids, labels=ids).loss.backward()
    first = time.perf_counter() - start
    exes = {id(c.exes): c.exes for c in cache.COMPILED if id(c) not in before}.values()
    figures = [(_tpu_figures if target else _figures)(e) for e in exes]
    row = {"mode": mode, "layers": layers, "hidden": hidden, "scan": scan}
    prefix = "tpu_" if target else ""
    for key in ("compile_s", "bytes_accessed", "peak_bytes", "comm_bytes"):
        if key not in figures[0]:
            continue
        total = sum(f[key] for f in figures)
        row[prefix + key] = round(total, 2) if key == "compile_s" else total
    if target is None:
        row["first_call_s"] = round(first, 2)
        row["params"] = [p.detach().clone() for p in model.parameters()]
    return row


def main(argv: list[str] | None = None) -> int:
    """Print the table and write ``scan_layers.json`` to ``--results``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--layers", type=int, nargs="+", default=[4, 32])
    parser.add_argument("--mode", choices=("step", "train"), default="step")
    parser.add_argument("--target", default=None, help="also compile for a TPU topology")
    parser.add_argument(
        "--shardings", default=None, help="with --target: compile under this plan (fsdp, ...)"
    )
    paths.add_results_option(parser)
    args = parser.parse_args(argv)
    machine = machine_info()
    rows = []
    for layers in args.layers:
        pair = [measure(layers, args.hidden, scan, args.mode) for scan in (False, True)]
        diff = max(
            (a - b).abs().max().item()
            for a, b in zip(pair[0].pop("params"), pair[1].pop("params"), strict=True)
        )
        for r in pair:
            r["max_abs_diff"] = diff
            if args.target:
                r.update(
                    measure(layers, args.hidden, r["scan"], args.mode, args.target, args.shardings)
                )
        rows += pair
    head = ("mode", "layers", "scan", "compile_s", "first_call_s", "bytes_accessed", "peak_bytes")
    if args.target:
        head += ("tpu_compile_s", "tpu_bytes_accessed", "tpu_peak_bytes", "tpu_comm_bytes")
    print("  ".join(f"{h:>14}" for h in head))
    for r in rows:
        print("  ".join(f"{r.get(h, '')!s:>14}" for h in head))
    by = {(r["layers"], r["scan"]): r for r in rows}
    for layers in args.layers:
        print(
            f"{layers} layers: parameters after the step, scan vs unrolled, max |diff| "
            f"{by[(layers, False)]['max_abs_diff']:.1e}"
        )
    lo, hi = min(args.layers), max(args.layers)
    for prefix in ("", "tpu_") if args.target else ("",):
        for layers in args.layers:
            u, s = by[(layers, False)], by[(layers, True)]
            comm = ""
            if u.get(prefix + "comm_bytes"):
                comm = f", collectives {s[prefix + 'comm_bytes'] / u[prefix + 'comm_bytes']:.2f}x"
            print(
                f"{prefix or 'cpu_'}{layers} layers, scan / unrolled: bytes accessed "
                f"{s[prefix + 'bytes_accessed'] / u[prefix + 'bytes_accessed']:.2f}x, peak "
                f"{s[prefix + 'peak_bytes'] / u[prefix + 'peak_bytes']:.2f}x{comm}"
            )
        for scan in (False, True):
            key = prefix + "compile_s"
            ratio = by[(hi, scan)][key] / by[(lo, scan)][key]
            print(
                f"{prefix or 'cpu_'}compile, {'scan' if scan else 'unrolled'}: "
                f"{hi}-layer / {lo}-layer {ratio:.2f}x"
            )
    write_record(args.results / "scan_layers.json", "benchmarks.scan_layers", argv, machine, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

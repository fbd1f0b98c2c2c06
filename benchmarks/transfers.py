"""Bytes crossing host <-> device per step, next to time per step.

``python -m benchmarks.transfers``

On CPU every crossing is zero-copy, so time alone can't show them; the backend counts each one
where an accelerator would copy (``tpu_inductor.report().transfers``). Workloads:

- ``train``: a transformers Llama (hidden 256, 4 layers, vocab 1024: 18.9 MB of float32
  parameters), batch 2 x 64, compiled model + compiled AdamW ``opt.step``, steady state, the
  loss read every step; ``keep``: the same with ``tpu_inductor.keep_on_device(model, opt)``;
  ``keep-read10``: that, reading the loss every 10th step (nothing blocks in between);
  ``keep-clip``: ``keep`` with an eager ``torch.nn.utils.clip_grad_norm_(model.parameters(),
  1.0)`` between the backward and the compiled step, its eager ops run on the device
  (``device_eager.py``); ``keep-clip-host``: the same with them synced to the host and run
  there (``TPU_INDUCTOR_EAGER_OPS=host``, what every eager op on device-owned state did before);
- ``decode``: greedy ``generate()`` with a static KV cache (16 prompt + 16 new tokens, no EOS
  so every run generates them all), bytes per generated token against the cache's size, over a
  whole generate and per decode step (each way, by reason); ``decode-keep``: the same with
  ``keep_on_device(model)`` and ``tpu_inductor.transformers.inputs_in_forward(model)``, where
  per decode step only the token ids cross, each way;
- ``mlp``: one inference call of ``Linear(64, 256) -> GELU -> Linear(256, 64)`` at 1 x 64.

Prints one table and writes ``transfers.json`` to ``--results`` (default the git-ignored
``benchmarks/results/local``); ``--json-only`` skips the table. Each ratio is bytes per step
over the model's parameter bytes (or the cache's bytes).
"""

from __future__ import annotations

import argparse
import time

import torch

from benchmarks import paths
from benchmarks.suite import machine_info, write_record


def _llama(vocab=1024, hidden=256, layers=4):
    import transformers

    transformers.logging.set_verbosity_error()
    config = transformers.LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=4 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=128,
        pad_token_id=0,
    )
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config)


def _param_bytes(module) -> int:
    return sum(p.numel() * p.element_size() for p in module.parameters())


def _delta(before, after) -> dict:
    from tpu_inductor.core.transfers import D2H, H2D, REASONS

    d = after - before
    return {
        "host_to_device": d.bytes(H2D),
        "device_to_host": d.bytes(D2H),
        "by_reason": {
            f"{'h2d' if direction == H2D else 'd2h'}:{r}": d.bytes(direction, r)
            for direction in (H2D, D2H)
            for r in REASONS[direction]
        },
    }


def train(
    steps: int = 5,
    warmup: int = 3,
    keep_on_device: bool = False,
    read_every: int = 1,
    clip: float | None = None,
    eager_ops: str = "device",
) -> dict:
    """Steady-state bytes and time per training step (the loss read every ``read_every``
    steps: with keep_on_device nothing blocks in between, so steps can pipeline). ``clip``:
    an eager ``clip_grad_norm_`` to that norm each step, its ops run on the device or synced to
    the host (``eager_ops``)."""
    import tpu_inductor
    from tpu_inductor.core.transfers import TOTAL

    knobs = tpu_inductor.config.patch(eager_ops=eager_ops)
    knobs.__enter__()

    model = _llama().train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    if keep_on_device:
        tpu_inductor.keep_on_device(model, opt)
    cmodel = torch.compile(model, backend="tpu")
    cstep = torch.compile(opt.step, backend="tpu")
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 1024, (2, 64), generator=gen)

    def step(i):
        opt.zero_grad(set_to_none=True)
        loss = cmodel(input_ids=ids, labels=ids).loss
        loss.backward()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        cstep()
        return float(loss.detach()) if (i + 1) % read_every == 0 else None

    try:
        for i in range(warmup):
            step(i)
        before = TOTAL.copy()
        start = time.perf_counter()
        losses = [step(i) for i in range(steps)]
        seconds = (time.perf_counter() - start) / steps
    finally:
        knobs.__exit__(None, None, None)
    d = _delta(before, TOTAL.copy())
    params = _param_bytes(model)
    per = {k: v / steps for k, v in d["by_reason"].items()}
    return {
        "workload": "train"
        + ("-keep_on_device" if keep_on_device else "")
        + (f"-read_every_{read_every}" if read_every != 1 else "")
        + (f"-eager_clip_on_{eager_ops}" if clip is not None else ""),
        "param_bytes": params,
        "h2d_per_step": d["host_to_device"] / steps,
        "d2h_per_step": d["device_to_host"] / steps,
        "h2d_x_params": d["host_to_device"] / steps / params,
        "d2h_x_params": d["device_to_host"] / steps / params,
        "by_reason_per_step": per,
        "ms_per_step": seconds * 1e3,
        "last_loss": next(x for x in reversed(losses) if x is not None),
    }


def decode(prompt: int = 16, new: int = 16, keep_on_device: bool = False) -> dict:
    """Bytes per generated token of greedy static-cache decoding, against the cache's bytes:
    over a whole ``generate`` (prefill included) and per decode step (the difference between
    generating ``new`` and ``new // 2`` tokens)."""
    import tpu_inductor
    from tpu_inductor.core.transfers import TOTAL

    model = _llama().eval()
    if keep_on_device:
        tpu_inductor.keep_on_device(model)
    model.generation_config.pad_token_id = 0
    # No EOS, rather than min_new_tokens: that processor masks the scores with a vocab-sized
    # tensor it makes on the host each step, which would pull the logits back.
    model.generation_config.eos_token_id = None
    ids = torch.randint(3, 1024, (1, prompt), generator=torch.Generator().manual_seed(2))
    model.forward = torch.compile(model.forward, backend="tpu")
    if keep_on_device:  # the mask and position ids built in the graph: only the ids go in
        tpu_inductor.transformers.inputs_in_forward(model)

    def run(n):
        return model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=n,
            do_sample=False,
            cache_implementation="static",
        )

    half = new // 2
    run(new), run(half)  # compile prefill and decode for both cache lengths
    before = TOTAL.copy()
    start = time.perf_counter()
    tokens = run(new)
    seconds = time.perf_counter() - start
    d = _delta(before, TOTAL.copy())
    mid = TOTAL.copy()
    run(half)
    d_half = _delta(mid, TOTAL.copy())
    steps = new - half
    step_h2d = (d["host_to_device"] - d_half["host_to_device"]) / steps
    step_d2h = (d["device_to_host"] - d_half["device_to_host"]) / steps
    step_bytes = step_h2d + step_d2h
    cfg = model.config
    max_len = prompt + new
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    cache = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * max_len * head_dim * 4
    total = d["host_to_device"] + d["device_to_host"]
    return {
        "workload": "decode" + ("-keep_on_device" if keep_on_device else ""),
        "cache_bytes": cache,
        "bytes_per_token": total / new,
        "bytes_per_decode_step": step_bytes,
        "x_cache_per_decode_step": step_bytes / cache,
        "h2d_per_decode_step": step_h2d,
        "d2h_per_decode_step": step_d2h,
        "by_reason_per_decode_step": {
            k: (v - d_half["by_reason"][k]) / steps for k, v in d["by_reason"].items()
        },
        "tokens": tokens[0].tolist(),
        "h2d_per_token": d["host_to_device"] / new,
        "d2h_per_token": d["device_to_host"] / new,
        "x_cache_per_token": total / new / cache,
        "by_reason_per_generate": d["by_reason"],
        "ms_per_token": seconds * 1e3 / new,
    }


def mlp(calls: int = 20) -> dict:
    """Bytes per inference call of a small MLP: exactly its input in and its output out."""
    from tpu_inductor.core.transfers import TOTAL

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64)
    ).eval()
    x = torch.randn(1, 64)
    cm = torch.compile(model, backend="tpu")
    with torch.no_grad():
        cm(x)
        before = TOTAL.copy()
        for _ in range(calls):
            cm(x)
    d = _delta(before, TOTAL.copy())
    return {
        "workload": "mlp",
        "input_bytes": x.numel() * 4,
        "output_bytes": 64 * 4,
        "h2d_per_call": d["host_to_device"] / calls,
        "d2h_per_call": d["device_to_host"] / calls,
    }


def _fmt(n: float) -> str:
    return f"{n / 1e6:.3f} MB" if n >= 1e5 else f"{n / 1e3:.2f} KB"


def table(results: list[dict]) -> str:
    """The readable summary of a run."""
    lines = []
    for r in results:
        w = r["workload"]
        if w.startswith("train"):
            lines.append(
                f"{w}: {r['ms_per_step']:.1f} ms/step; host->device {_fmt(r['h2d_per_step'])}"
                f"/step ({r['h2d_x_params']:.3f}x params), device->host "
                f"{_fmt(r['d2h_per_step'])}/step ({r['d2h_x_params']:.3f}x params); params "
                f"{_fmt(r['param_bytes'])}"
            )
            nonzero = {k: v for k, v in r["by_reason_per_step"].items() if v}
            lines.append("    per step: " + ", ".join(f"{k} {_fmt(v)}" for k, v in nonzero.items()))
        elif w.startswith("decode"):
            lines.append(
                f"{w}: {r['ms_per_token']:.1f} ms/token; {_fmt(r['bytes_per_token'])}/token both"
                f" ways over a generate ({r['x_cache_per_token']:.3f}x the "
                f"{_fmt(r['cache_bytes'])} KV cache), {_fmt(r['bytes_per_decode_step'])} per decode"
                f" step ({r['x_cache_per_decode_step']:.3f}x)"
            )
            nonzero = {k: v for k, v in r["by_reason_per_decode_step"].items() if v}
            lines.append(
                "    per decode step: " + ", ".join(f"{k} {v:.0f} B" for k, v in nonzero.items())
            )
        else:
            lines.append(
                f"mlp 1x64 inference: host->device {r['h2d_per_call']:.0f} B/call (input "
                f"{r['input_bytes']} B), device->host {r['d2h_per_call']:.0f} B/call (output "
                f"{r['output_bytes']} B)"
            )
    return "\n".join(lines)


VARIANTS = (
    "train",
    "keep",
    "keep-read10",
    "keep-clip",
    "keep-clip-host",
    "decode",
    "decode-keep",
    "mlp",
)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", choices=VARIANTS, action="append")
    parser.add_argument("--steps", type=int, default=5)
    paths.add_results_option(parser)
    parser.add_argument("--json-only", action="store_true")
    args = parser.parse_args(argv)
    import tpu_inductor

    machine = machine_info()  # before the runs, so the load average is the starting one
    todo = args.only or list(VARIANTS)
    results = []
    for name in todo:
        torch._dynamo.reset()
        tpu_inductor.reset()
        if name == "train":
            results.append(train(args.steps))
        elif name == "keep":
            results.append(train(args.steps, keep_on_device=True))
        elif name == "keep-read10":
            results.append(train(max(args.steps, 10), keep_on_device=True, read_every=10))
        elif name in ("keep-clip", "keep-clip-host"):
            ops = "host" if name == "keep-clip-host" else "device"
            results.append(train(args.steps, keep_on_device=True, clip=1.0, eager_ops=ops))
        elif name == "decode":
            results.append(decode())
        elif name == "decode-keep":
            results.append(decode(keep_on_device=True))
        else:
            results.append(mlp())
    write_record(args.results / "transfers.json", "benchmarks.transfers", argv, machine, results)
    if not args.json_only:
        print(table(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

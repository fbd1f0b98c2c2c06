"""Decode ms/token on the CPU path: ours against torch eager and against hand-written JAX.

``python -m benchmarks.decode [--batches 1 8 64] [--context 2048] [--steps 16] [--repeats 5]
[--dtype float32|bfloat16] [--contenders eager tpu tpu-keep jax] [--results DIR]``

A transformers ``LlamaForCausalLM`` from a config, random weights (default hidden 512,
intermediate 1408, 4 layers, 8 heads / 2 KV heads, vocab 32000, SDPA attention), with a
transformers ``StaticCache`` of ``--context`` positions (``early_initialization(batch, kv_heads,
head_dim, dtype, "cpu")``), prefilled with a ``--prompt``-token prompt, then decoded one token at
a time: ``model(input_ids=ids[:, None], cache=cache, use_cache=True)`` (the cache's
``cumulative_length`` tensor gives the position: no ``cache_position``). Contenders, at each
batch, in one process, side by side:

- ``eager``: the model in torch eager on the CPU;
- ``tpu``: ``torch.compile(model, backend="tpu")`` (the same model object);
- ``tpu-keep``: the same on a copy of the model (same weights) after
  ``tpu_inductor.keep_on_device(copy)``;
- ``jax``: the decode step written by hand in JAX (``benchmarks.hand_decode``: one jitted step
  per token, the cache donated, greedy argmax inside, only the ids come back), parameters from
  the same torch weights.

A torch contender's step is the model call and a greedy ``argmax`` of the last logits in eager
torch (what a user's loop does around the compiled model); every contender ends a step with the
batch's next token ids in a host (numpy) array and feeds them to the next step. ms/token is
milliseconds per decode step, i.e. per token of each of the ``batch`` sequences.

Correctness, before timing: ``--check-steps`` steps fed eager's greedy tokens (so every
contender sees the same history); for each contender, whether its greedy tokens equal eager's at
every step (or differ only by a tie: eager's own logits of both tokens within the dtype's model
tolerance, ``tpu_inductor.core.dtypes.tolerance``, which bfloat16 rounding can flip), the largest
logit difference from eager and, after the check, the largest difference of the KV cache's
contents from eager's.

Timing: each contender compiles (its first prefill and first decode calls, reported as seconds),
warms up, then ``--repeats`` rounds, the contenders alternating within each round, each timing
``--steps`` consecutive decode steps; ms/token is the median over the rounds (the fastest round
is shown beside it). The attention always spans the whole static cache (masked), so the position
reached does not change the work. The machine (CPU count, torch threads, load average at the
start and at the end) is recorded with the results.

Results: ``<name>.json`` in ``--results`` (default ``benchmarks/results/local``, git-ignored).
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import time

import numpy as np
import torch

from benchmarks import paths
from benchmarks.hand_llama import LlamaSizes
from benchmarks.suite import machine_info, write_record
from tpu_inductor.core.dtypes import tolerance

CONTENDERS = ("eager", "tpu", "tpu-keep", "jax")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
# Largest logit difference from eager that still counts as agreeing, by dtype.
LOGIT_TOL = {"float32": 1e-3, "bfloat16": 0.25}


def build_model(sizes: LlamaSizes, dtype: torch.dtype, seed: int = 0):
    """A ``LlamaForCausalLM`` of ``sizes`` with random weights (seeded), SDPA attention, eval."""
    import transformers

    transformers.logging.set_verbosity_error()
    torch.manual_seed(seed)
    return transformers.LlamaForCausalLM(sizes.hf_config()).to(dtype).eval()


def static_cache(model, batch: int, context: int, dtype: torch.dtype):
    """A ``StaticCache`` of ``context`` positions for ``batch`` sequences, allocated now."""
    import transformers

    config = model.config
    cache = transformers.StaticCache(config=config, max_cache_len=context)
    head_dim = config.hidden_size // config.num_attention_heads
    cache.early_initialization(batch, config.num_key_value_heads, head_dim, dtype, "cpu")
    return cache


class TorchDecoder:
    """A torch contender: ``fn`` (the model, compiled or not) decoding into its own cache."""

    def __init__(self, fn, model, batch: int, context: int, dtype: torch.dtype):
        self.fn = fn
        self.cache = static_cache(model, batch, context, dtype)

    def _last_logits(self, ids: torch.Tensor) -> torch.Tensor:
        return self.fn(input_ids=ids, cache=self.cache, use_cache=True).logits[:, -1]

    def prefill(self, prompt: np.ndarray) -> np.ndarray:
        """Fill the cache with ``prompt`` ``[batch, prompt]``; the last logits (float32)."""
        with torch.no_grad():
            return _np32(self._last_logits(torch.from_numpy(prompt)))

    def logits(self, ids: np.ndarray) -> np.ndarray:
        """One decode step of ``ids`` ``[batch]``; its logits ``[batch, vocab]`` (float32)."""
        with torch.no_grad():
            return _np32(self._last_logits(torch.from_numpy(ids)[:, None]))

    def step(self, ids: np.ndarray) -> np.ndarray:
        """One decode step of ``ids``; the greedy next ids ``[batch]`` on the host."""
        with torch.no_grad():
            return self._last_logits(torch.from_numpy(ids)[:, None]).argmax(-1).numpy()

    def kv(self) -> list[tuple[np.ndarray, np.ndarray]]:
        """Every layer's keys and values (float32 numpy)."""
        return [(_np32(layer.keys), _np32(layer.values)) for layer in self.cache.layers]


class JaxDecoder:
    """The hand-written JAX contender (``benchmarks.hand_decode``)."""

    def __init__(self, sizes: LlamaSizes, params, batch: int, context: int):
        import jax.numpy as jnp

        from benchmarks import hand_decode

        self.params = params
        self.cache = hand_decode.empty_cache(sizes, batch, context, params["embed"].dtype)
        self._prefill = hand_decode.jitted_prefill(sizes)
        self._logits = hand_decode.jitted_decode_step(sizes, return_logits=True)
        self._step = hand_decode.jitted_decode_step(sizes)
        self.pos = None
        self.ids = None  # the last step's ids, still on the device
        self._jnp = jnp

    def prefill(self, prompt: np.ndarray) -> np.ndarray:
        logits, self.cache, self.pos = self._prefill(self.params, self.cache, prompt)
        return np.asarray(logits, np.float32)

    def logits(self, ids: np.ndarray) -> np.ndarray:
        logits, self.cache, self.pos = self._logits(self.params, self.cache, ids, self.pos)
        return np.asarray(logits, np.float32)

    def step(self, ids: np.ndarray) -> np.ndarray:
        # A JAX loop feeds the device ids back; reading them to the host is the per-token sync.
        fed = self.ids if self.ids is not None else ids
        self.ids, self.cache, self.pos = self._step(self.params, self.cache, fed, self.pos)
        return np.asarray(self.ids)

    def kv(self) -> list[tuple[np.ndarray, np.ndarray]]:
        return [(np.asarray(k, np.float32), np.asarray(v, np.float32)) for k, v in self.cache]


def _np32(t: torch.Tensor) -> np.ndarray:
    return t.detach().float().numpy()


def make_contenders(names, model, keep_model, params, sizes, batch, context, dtype) -> dict:
    """The decoders for one batch, each with a fresh cache (compiled ones compile afresh)."""
    out = {}
    for name in names:
        if name == "eager":
            out[name] = TorchDecoder(model, model, batch, context, dtype)
        elif name == "tpu":
            out[name] = TorchDecoder(
                torch.compile(model, backend="tpu"), model, batch, context, dtype
            )
        elif name == "tpu-keep":
            fn = torch.compile(keep_model, backend="tpu")
            out[name] = TorchDecoder(fn, keep_model, batch, context, dtype)
        else:
            out[name] = JaxDecoder(sizes, params, batch, context)
    return out


def compare(check: dict, logits: np.ndarray, ref: np.ndarray, atol: float, rtol: float) -> None:
    """Add one step's comparison with the reference logits to ``check``: whether every greedy
    token is the reference's, the largest logit difference, and whether the step's differing
    tokens are all ties (the reference's own logits for the two tokens within ``atol + rtol *
    |logit|``: the dtype's rounding can flip them, as bfloat16's does)."""
    ours, theirs = logits.argmax(-1), ref.argmax(-1)
    rows = np.flatnonzero(ours != theirs)
    top = ref[rows, theirs[rows]]
    gaps = top - ref[rows, ours[rows]]
    check["tokens_equal"].append(not len(rows))
    check["ties"] += int(len(rows) > 0 and bool((gaps <= atol + rtol * np.abs(top)).all()))
    check["max_logit_diff"] = max(check["max_logit_diff"], float(np.abs(logits - ref).max()))


def _timed(fn, *args):
    start = time.perf_counter()
    out = fn(*args)
    return out, time.perf_counter() - start


def run_batch(args, sizes, model, keep_model, params, batch: int) -> dict:
    """Check, compile, warm up and time every contender at ``batch`` (module docstring)."""
    dtype = DTYPES[args.dtype]
    torch._dynamo.reset()  # each batch compiles from scratch, static shapes, as a fresh process
    decoders = make_contenders(
        args.contenders, model, keep_model, params, sizes, batch, args.context, dtype
    )
    rng = np.random.default_rng(batch)
    prompt = rng.integers(0, sizes.vocab, (batch, args.prompt), dtype=np.int64)
    row = {"batch": batch, "contenders": {}}
    first = {}
    for name, dec in decoders.items():
        logits, seconds = _timed(dec.prefill, prompt if name != "jax" else prompt.astype(np.int32))
        first[name] = {"first_prefill_s": seconds, "logits": logits}

    # Check: every contender fed eager's greedy tokens; compare tokens and logits with eager.
    ref = first.get("eager", first[args.contenders[0]])["logits"]
    ties = tolerance(dtype, level="model")  # how close two logits are to count as a tie
    checks = {name: {"tokens_equal": [], "ties": 0, "max_logit_diff": 0.0} for name in first}
    for name, f in first.items():
        compare(checks[name], f["logits"], ref, *ties)
    ids = ref.argmax(-1)
    for i in range(args.check_steps):
        step_logits = {}
        for name, dec in decoders.items():
            feed = ids.astype(np.int32) if name == "jax" else ids.astype(np.int64)
            step_logits[name], seconds = _timed(dec.logits, feed)
            if i == 0:
                first[name]["first_decode_s"] = seconds
        ref = step_logits.get("eager", next(iter(step_logits.values())))
        for name, logits in step_logits.items():
            compare(checks[name], logits, ref, *ties)
        ids = ref.argmax(-1)
    ref_kv = decoders.get("eager", next(iter(decoders.values()))).kv()
    for name, dec in decoders.items():
        kv = dec.kv()
        checks[name]["cache_max_diff"] = max(
            float(np.abs(a - b).max())
            for pair, ref_pair in zip(kv, ref_kv, strict=True)
            for a, b in zip(pair, ref_pair, strict=True)
        )
        tol = LOGIT_TOL[args.dtype]
        c = checks[name]
        c["agrees"] = max(c["max_logit_diff"], c["cache_max_diff"]) <= tol and (
            c["ties"] == sum(not equal for equal in c["tokens_equal"])
        )

    # Timing: warm-up, then rounds with the contenders alternating; each feeds its own tokens.
    state = {}
    for name, dec in decoders.items():
        feed = ids.astype(np.int32) if name == "jax" else ids.astype(np.int64)
        for _ in range(args.warmup):
            feed = dec.step(feed)
        state[name] = feed
    samples: dict[str, list[float]] = {name: [] for name in decoders}
    for _ in range(args.repeats):
        for name, dec in decoders.items():
            feed = state[name]
            start = time.perf_counter()
            for _ in range(args.steps):
                feed = dec.step(feed)
            samples[name].append((time.perf_counter() - start) / args.steps * 1e3)
            state[name] = feed
    for name in decoders:
        row["contenders"][name] = {
            "ms_per_token": statistics.median(samples[name]),
            "samples_ms": samples[name],
            "first_prefill_s": first[name]["first_prefill_s"],
            "first_decode_s": first[name].get("first_decode_s"),
            "check": checks[name],
        }
    row["ratios"] = ratios(row["contenders"])
    return row


def ratios(contenders: dict) -> dict:
    """ours / eager and ours / hand-JAX (and the same for ``tpu-keep``), in ms/token."""
    out = {}
    for ours in ("tpu", "tpu-keep"):
        for other in ("eager", "jax"):
            if ours in contenders and other in contenders:
                a, b = contenders[ours]["ms_per_token"], contenders[other]["ms_per_token"]
                out[f"{ours}/{other}"] = a / b
    return out


def table(record: dict) -> str:
    """The results as a Markdown table (ms/token, ratios, compile seconds, agreement)."""
    m, res = record["machine"], record["results"]
    names = res["contenders"]
    label = {"eager": "eager", "tpu": "ours", "tpu-keep": "ours+keep", "jax": "hand-JAX"}
    cfg = res["config"]
    lines = [
        f"`{record['command']}`, {record['date']}: {cfg['dtype']}, hidden {cfg['hidden']}, "
        f"{cfg['layers']} layers, {cfg['heads']}/{cfg['kv_heads']} heads, vocab {cfg['vocab']}, "
        f"context {cfg['context']}, prompt {cfg['prompt']}; {m['cpus_usable']} CPUs, "
        f"{m['torch_threads']} torch threads, load average {m['load_avg'][0]:.2f} at the start"
        + (f", {res['load_end'][0]:.2f} at the end." if res.get("load_end") else "."),
        "",
        "| batch | "
        + " | ".join(f"{label[n]} ms/tok" for n in names)
        + " | "
        + " | ".join("/".join(label[n] for n in k.split("/")) for k in res["rows"][0]["ratios"])
        + " | ours compile s (prefill + decode) | agree with eager |",
        "|---:|" + "---:|" * (len(names) + len(res["rows"][0]["ratios"]) + 1) + "---|",
    ]
    for r in res["rows"]:
        c = r["contenders"]
        compile_s = "-"
        if "tpu" in c:
            compile_s = f"{c['tpu']['first_prefill_s']:.1f} + {c['tpu']['first_decode_s']:.1f}"
        agree = ", ".join(
            f"{label[n]} {'yes' if c[n]['check']['agrees'] else 'NO'}"
            f" ({c[n]['check']['max_logit_diff']:.1e}"
            + (f", ties at {c[n]['check']['ties']} steps" if c[n]["check"]["ties"] else "")
            + ")"
            for n in names
            if n != "eager"
        )
        lines.append(
            f"| {r['batch']} | "
            + " | ".join(
                f"{c[n]['ms_per_token']:.1f} ({min(c[n]['samples_ms']):.1f})" for n in names
            )
            + " | "
            + " | ".join(f"{v:.2f}x" for v in r["ratios"].values())
            + f" | {compile_s} | {agree} |"
        )
    lines += [
        "",
        f"ms/tok: median (fastest) over {cfg['repeats']} rounds of {cfg['steps']} decode "
        "steps (one token for each sequence of the batch); agree: the same greedy tokens as "
        f"eager after the prefill and each of {cfg['check_steps']} checked steps (or ties: "
        "eager's own logits of the two tokens within the dtype's model tolerance), logits and KV "
        f"cache within {LOGIT_TOL[cfg['dtype']]:g} (in brackets: the largest logit difference, "
        "and the steps with ties).",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict:
    """Run the benchmark (module docstring); returns the record written."""
    import json

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8, 64])
    p.add_argument("--context", type=int, default=2048, help="static cache positions")
    p.add_argument("--prompt", type=int, default=16, help="prompt tokens (prefill)")
    p.add_argument("--steps", type=int, default=16, help="decode steps per timed round")
    p.add_argument("--repeats", type=int, default=5, help="timed rounds (median)")
    p.add_argument("--warmup", type=int, default=2, help="untimed decode steps first")
    p.add_argument("--check-steps", type=int, default=4, help="decode steps compared to eager")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    p.add_argument("--contenders", nargs="+", choices=CONTENDERS, default=list(CONTENDERS))
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--intermediate", type=int, default=1408)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--torch-threads", type=int, help="torch intra-op threads (default torch's)")
    p.add_argument("--name", default="decode")
    paths.add_results_option(p)
    args = p.parse_args(argv)
    args.contenders = [n for n in CONTENDERS if n in args.contenders]  # a fixed order
    used = args.prompt + 1 + args.check_steps + args.warmup + args.repeats * args.steps
    if args.check_steps < 1:
        p.error("--check-steps must be at least 1 (the first decode call is timed there)")
    if used > args.context:
        p.error(f"prompt + decode steps ({used}) exceed --context {args.context}")
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)

    import tpu_inductor
    from benchmarks.hand_llama import params_from_torch

    sizes = LlamaSizes(
        args.hidden, args.intermediate, args.layers, args.heads, args.kv_heads, args.vocab
    )
    machine = machine_info()  # before the runs, so the load average is the starting one
    model = build_model(sizes, DTYPES[args.dtype])
    keep_model = None
    if "tpu-keep" in args.contenders:
        keep_model = tpu_inductor.keep_on_device(copy.deepcopy(model))
    params = params_from_torch(model) if "jax" in args.contenders else None
    rows = []
    for batch in args.batches:
        rows.append(run_batch(args, sizes, model, keep_model, params, batch))
        c = rows[-1]["contenders"]
        print(
            f"batch {batch}: "
            + ", ".join(f"{n} {c[n]['ms_per_token']:.2f} ms/tok" for n in args.contenders),
            flush=True,
        )
    config = {
        "dtype": args.dtype,
        "hidden": args.hidden,
        "intermediate": args.intermediate,
        "layers": args.layers,
        "heads": args.heads,
        "kv_heads": args.kv_heads,
        "vocab": args.vocab,
        "context": args.context,
        "prompt": args.prompt,
        "steps": args.steps,
        "repeats": args.repeats,
        "warmup": args.warmup,
        "check_steps": args.check_steps,
        "logit_tol": LOGIT_TOL[args.dtype],
    }
    # The start's load average is in ``machine``; other jobs on a shared machine can change it.
    load_end = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    results = {"config": config, "contenders": args.contenders, "rows": rows, "load_end": load_end}
    folder = args.results
    out = folder / f"{args.name}.json"
    write_record(out, "benchmarks.decode", argv, machine, results)
    record = json.loads(out.read_text())
    text = table(record)
    (folder / f"{args.name}.md").write_text(text)
    print(text)
    return record


if __name__ == "__main__":
    main()

"""Decode steps against the HBM minimum, and serving plans, for TPU chips we don't have.

``JAX_PLATFORMS=cpu python -m benchmarks.serving [--decode] [--rows ID ...] [--context N]
[--results DIR]``

``--decode``: the issue's Llama (hidden 1024, 4 layers, 8/2 heads, vocabulary 32,000, bf16), one
decode step over a ``StaticCache`` at batch 1, 8 and 64 and contexts 2,048 and 8,192, compiled
for v5e and v6e: its HBM traffic, the minimum (weights, the cache once, new K/V rows, logits),
their ratio and the tokens/s/chip ceilings (``tpu_report()``'s decode line).

Each row is a transformers Llama built on the ``meta`` device from its model card's config
(``benchmarks.plan_real_sizes``), in bfloat16, and ``tpu_inductor.serving_plan`` for a target
and the mesh plans named: per plan the largest concurrent batch whose decode step (weights +
KV cache at the full context + the program's peak) fits each chip, its HBM traffic against the
minimum, and decode and prefill tokens/s per chip. Deviceless: libtpu's compiler, nothing runs.
Results: ``serving.json`` (rows merged by id, each with its command and machine) in
``--results`` (default ``benchmarks/results/local``, git-ignored); ``python -m benchmarks.docs``
writes docs/planning.md's serving table from ``benchmarks/results/serving.json``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time

from benchmarks.paths import add_results_option
from benchmarks.plan_real_sizes import LLAMA_3_1_8B, LLAMA_3_1_70B
from benchmarks.suite import machine_info

# id -> (model config, target, meshes as (data, model) or None for every split)
ROWS = {
    "llama-3.1-8b-v6e-1": (LLAMA_3_1_8B, "v6e-1", None),
    "llama-3.1-8b-v5e-8": (LLAMA_3_1_8B, "v5e-8", [(1, 8)]),
    "llama-3.1-70b-v6e-8": (LLAMA_3_1_70B, "v6e-8", [(1, 8)]),
}


DECODE_LLAMA = dict(
    hidden_size=1024,
    intermediate_size=2816,
    num_hidden_layers=4,
    num_attention_heads=8,
    num_key_value_heads=2,
    vocab_size=32000,
)


def decode_rows(targets=("v5e", "v6e"), batches=(1, 8, 64), contexts=(2048, 8192)) -> list:
    """One decode step per (target, batch, context): the report's figures of its program."""
    import torch
    import transformers

    import tpu_inductor

    rows = []
    for target in targets:
        for context in contexts:
            for batch in batches:
                tpu_inductor.reset()
                torch._dynamo.reset()
                config = transformers.LlamaConfig(**DECODE_LLAMA)
                with torch.device("meta"):
                    model = transformers.LlamaForCausalLM(config).to(torch.bfloat16).eval()
                cache = transformers.StaticCache(config=config, max_cache_len=context)
                cache.early_initialization(batch, 2, 128, torch.bfloat16, "meta")
                ids = torch.zeros(batch, 1, dtype=torch.long, device="meta")
                compiled = torch.compile(model, backend="tpu", options={"target": target})
                start = time.perf_counter()
                with torch.no_grad():
                    compiled(input_ids=ids, past_key_values=cache, use_cache=True)
                (p,) = tpu_inductor.tpu_report(print_table=False).programs
                rows.append(
                    {
                        "target": target,
                        "batch": batch,
                        "context": context,
                        "hbm_traffic": p.hbm_traffic,
                        "minimum": p.minimum_traffic,
                        "x_minimum": p.hbm_traffic / p.minimum_traffic,
                        "rates": p.tokens_per_s_per_chip,
                        "compile_seconds": time.perf_counter() - start,
                    }
                )
                print(rows[-1], flush=True)
    return rows


def run_row(row_id: str, context: int) -> dict:
    """One row's serving plan, as a JSON-ready dict."""
    import torch
    import transformers

    import tpu_inductor

    config, target, meshes = ROWS[row_id]
    start = time.perf_counter()
    plan = tpu_inductor.serving_plan(
        lambda: transformers.LlamaForCausalLM(transformers.LlamaConfig(**config)),
        target,
        context=context,
        meshes=meshes,
        dtype=torch.bfloat16,
    )
    rows = []
    for r in plan.rows:
        row = dataclasses.asdict(r)
        row["plan"] = r.plan
        row["probes"] = [dataclasses.asdict(p) for p in r.probes]
        rows.append(row)
    return {
        "id": row_id,
        "target": target,
        "context": context,
        "prompt": plan.prompt,
        "table": str(plan),
        "plans": rows,
        "seconds": time.perf_counter() - start,
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", nargs="*", default=list(ROWS), choices=list(ROWS))
    parser.add_argument("--decode", action="store_true", help="the decode table first")
    parser.add_argument("--context", type=int, default=8192)
    add_results_option(parser)
    args = parser.parse_args(argv)
    args.results.mkdir(parents=True, exist_ok=True)
    path = args.results / "serving.json"
    old = json.loads(path.read_text()) if path.exists() else {"rows": {}}
    if args.decode:
        old["decode"] = {
            "rows": decode_rows(),
            "command": "python -m benchmarks.serving " + " ".join(sys.argv[1:]),
            "machine": machine_info(),
        }
        path.write_text(json.dumps(old, indent=1, default=str) + "\n")
    for row_id in args.rows:
        result = run_row(row_id, args.context)
        result["command"] = "python -m benchmarks.serving " + " ".join(sys.argv[1:])
        result["machine"] = machine_info()
        old["rows"][row_id] = result
        path.write_text(json.dumps(old, indent=1, default=str) + "\n")
        print(result["table"], flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

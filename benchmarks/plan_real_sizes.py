"""Training steps at the sizes people train, compiled for TPU slices we don't have.

``JAX_PLATFORMS=cpu python -m benchmarks.plan_real_sizes [--rows ID ...] [--layers N]
[--timeout 480] [--results DIR] [--docs] [--list]``

Each row is a transformers model built on the ``meta`` device from its public config (the
numbers below are written by hand from the model cards' ``config.json``; nothing is downloaded),
cast to bfloat16, with full activation checkpointing on its decoder layers, and ONE training
step (forward, ``backward()``, AdamW, ``zero_grad``) compiled by ``tpu_inductor.compile_step``
for a TPU target with ``scan_layers`` on (each run of identical layers lowered once as a
``lax.scan``), deviceless: libtpu's compiler, nothing runs. Per row: whether the step fits,
its peak HBM per device, the roofline step time (max of matmul FLOPs at peak, HBM bytes at
bandwidth, collectives at ICI bandwidth), two MFU ceilings (the report's, which counts the
recomputed forward's matmuls: a hardware-FLOPs ceiling; and the model-FLOPs one MaxText
publishes: ``6 x matmul parameters x tokens`` plus causal attention, over the same roofline
time), the tokens/s ceiling per chip, the predicted step (``Step.predicted_seconds``), and the
wall time of the compile on this machine. A row with a published measured run of the same
model, chip and per-device batch (``PUBLISHED``) is compared with it.

Rows run one at a time, each in a subprocess with a wall-clock limit (``--timeout``), so a row
that runs past it or is killed for memory is recorded as such (with ``--layers N``, the same row
at N layers, said in its name). Results: ``plan_real_sizes.json`` (rows merged by id, the
command and machine of each) and ``plan_real_sizes.md`` (the table) in ``--results`` (default
``benchmarks/results/local``, git-ignored; ``benchmarks/results`` holds the committed figures);
``--docs`` also writes docs/planning.md's generated tables.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import resource
import subprocess
import sys
import time
from typing import Any

RESULTS = pathlib.Path(__file__).parent / "results"  # the committed figures (--results)
LOCAL = RESULTS / "local"  # the default: git-ignored, so a run never rewrites tracked files

# config.json of each model card, by hand (https://huggingface.co/<repo>/blob/main/config.json)
LLAMA_3_1_8B = dict(  # meta-llama/Llama-3.1-8B
    hidden_size=4096,
    intermediate_size=14336,
    num_hidden_layers=32,
    num_attention_heads=32,
    num_key_value_heads=8,
    vocab_size=128256,
    max_position_embeddings=131072,
    rms_norm_eps=1e-5,
    tie_word_embeddings=False,
    rope_parameters={
        "rope_type": "llama3",
        "rope_theta": 500000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    },
)
LLAMA_3_1_70B = dict(  # meta-llama/Llama-3.1-70B
    LLAMA_3_1_8B,
    hidden_size=8192,
    intermediate_size=28672,
    num_hidden_layers=80,
    num_attention_heads=64,
)
QWEN3_30B_A3B = dict(  # Qwen/Qwen3-30B-A3B
    hidden_size=2048,
    intermediate_size=6144,
    moe_intermediate_size=768,
    num_hidden_layers=48,
    num_attention_heads=32,
    num_key_value_heads=4,
    head_dim=128,
    num_experts=128,
    num_experts_per_tok=8,
    norm_topk_prob=True,
    decoder_sparse_step=1,
    mlp_only_layers=[],
    vocab_size=151936,
    max_position_embeddings=40960,
    rms_norm_eps=1e-6,
    rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
    tie_word_embeddings=False,
)

LLAMA_2_70B = dict(  # meta-llama/Llama-2-70b-hf
    hidden_size=8192,
    intermediate_size=28672,
    num_hidden_layers=80,
    num_attention_heads=64,
    num_key_value_heads=8,
    vocab_size=32000,
    max_position_embeddings=4096,
    rms_norm_eps=1e-5,
    tie_word_embeddings=False,
    rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
)

# MaxText's published measurements (its "Optimized models tiering" page:
# https://maxtext.readthedocs.io/en/maxtext-v0.2.0/reference/models/tiering.html)
MAXTEXT = {
    "v6e llama3.1-8b": "45.46% MFU, 7,207 tokens/s/device (Llama 3.1 8B, v6e-256, BF16, SL 8192)",
    "v5p llama2-70b": "65.4% MFU, 692 tokens/s/device (Llama 2 70B, v5p 512 chips, BF16, SL 4096)",
}

# Published measured steps (tpu-recipes, AI-Hypercomputer/tpu-recipes@c8cfe2f6): one log line
PUBLISHED = {
    "v6e-8 llama3.1-8b": {
        "step_s": 3.443,
        "tokens_per_s_per_device": 7138.890,
        "source": "tpu-recipes training/trillium/Llama3.1-8B-MaxText/v6e-8/README.md "
        "(MaxText, 3 x 8192 per device, fsdp 8)",
        "differs": "MaxText offloads each layer's input and q/k/v/out projections to host "
        "memory and recomputes the rest; this plan keeps layer inputs in HBM and recomputes "
        "the whole layer (full checkpointing)",
    },
    "v5p llama2-70b": {
        "step_s": 4 * 4096 / 692,  # its tokens/s/device at 4 x 4096 per device
        "tokens_per_s_per_device": 692,
        "source": "MaxText tiering page (65.4% MFU, about 692 tokens/s/device; config "
        "llama2_70b_v5p_128 in benchmarks/maxtext_v5p_model_configs.py: 4 x 4096 per device, "
        "fsdp, no offload)",
        "differs": "MaxText saves every matmul output but the MLP's input projections "
        "(save_dot_except_mlpwi) on a larger slice; this plan recomputes the whole layer",
    },
}

# fsdp x tp for Llama names (weights [out, in]): tp's Megatron split over "model", the other
# dimension over "data" (what fsdp shards)
_FSDP_TP = {
    **{f"*.{m}.weight": ("model", "data") for m in ("q_proj", "k_proj", "v_proj")},
    **{f"*.{m}.weight": ("model", "data") for m in ("gate_proj", "up_proj")},
    **{f"*.{m}.weight": ("data", "model") for m in ("o_proj", "down_proj")},
    "*embed_tokens.weight": ("data", "model"),
    "lm_head.weight": ("model", "data"),
}


@dataclasses.dataclass(frozen=True)
class Row:
    """One planned step: a model's config, a target, a mesh and plan, the batch and sequence."""

    id: str
    model: str
    family: str  # "llama" or "qwen3_moe"
    config: dict
    target: str
    mesh: dict
    plan: str  # "fsdp" or "fsdp x tp"
    batch: int
    seq: int
    maxtext: str | None = None
    # a published measured run of the same model, chip, per-device batch and sequence:
    # {"step_s": ..., "tokens_per_s_per_device": ..., "source": ..., "differs": ...}
    measured: dict | None = None


ROWS = {
    r.id: r
    for r in (
        Row("llama8b-v5p8", "Llama-3.1-8B", "llama", LLAMA_3_1_8B, "v5p-8", {"data": 4},
            "fsdp", 4, 8192),
        Row("llama8b-v6e8", "Llama-3.1-8B", "llama", LLAMA_3_1_8B, "v6e-8", {"data": 8},
            "fsdp", 8, 8192, "v6e llama3.1-8b"),
        Row("llama70b-v5p32", "Llama-3.1-70B", "llama", LLAMA_3_1_70B, "v5p-32",
            {"data": 4, "model": 4}, "fsdp x tp", 4, 4096, "v5p llama2-70b"),
        Row("qwen3moe-v5p16", "Qwen3-30B-A3B", "qwen3_moe", QWEN3_30B_A3B, "v5p-16",
            {"data": 8}, "fsdp", 8, 4096),
        Row("llama8b-tpu7x8", "Llama-3.1-8B", "llama", LLAMA_3_1_8B, "tpu7x-8", {"data": 8},
            "fsdp", 8, 8192),
        Row("llama8b-v6e8-b3", "Llama-3.1-8B", "llama", LLAMA_3_1_8B, "v6e-8", {"data": 8},
            "fsdp", 24, 8192, measured=PUBLISHED["v6e-8 llama3.1-8b"]),
        Row("llama2-70b-v5p32-b4", "Llama-2-70B", "llama", LLAMA_2_70B, "v5p-32", {"data": 16},
            "fsdp", 64, 4096, measured=PUBLISHED["v5p llama2-70b"]),
    )
}  # fmt: skip


def build(row: Row, layers: int | None = None):
    """The row's transformers model class and config (``layers`` overrides the depth)."""
    import transformers

    cfg = dict(row.config, **({"num_hidden_layers": layers} if layers else {}))
    if row.family == "qwen3_moe":
        return transformers.Qwen3MoeForCausalLM, transformers.Qwen3MoeConfig(**cfg)
    return transformers.LlamaForCausalLM, transformers.LlamaConfig(**cfg)


def model_flops(config, batch: int, seq: int) -> float:
    """Model FLOPs of one training step, as MaxText counts them: ``6 x`` the matmul parameters
    a token passes through (embedding lookups excluded; for an MoE, the router and the
    ``num_experts_per_tok`` experts it picks) ``x tokens``, plus causal attention (QK^T and AV:
    ``4 x seq^2 x heads x head_dim`` per sequence and layer forward, x3 for training, halved
    for the causal mask)."""
    h, n_layers = config.hidden_size, config.num_hidden_layers
    heads, kv = config.num_attention_heads, config.num_key_value_heads
    head_dim = getattr(config, "head_dim", None) or h // heads
    attn = h * head_dim * (heads + 2 * kv) + heads * head_dim * h
    if getattr(config, "num_experts", None):
        mlp = config.num_experts_per_tok * 3 * h * config.moe_intermediate_size
        mlp += h * config.num_experts  # the router
    else:
        mlp = 3 * h * config.intermediate_size
    matmul_params = n_layers * (attn + mlp) + h * config.vocab_size  # + lm_head
    tokens = batch * seq
    attention = 3 * 4 * batch * seq * seq * heads * head_dim * n_layers / 2
    return 6 * matmul_params * tokens + attention


def plan_one(row: Row, layers: int | None) -> dict[str, Any]:
    """Compile the row's step once (in this process) and read its figures."""
    import torch

    import tpu_inductor
    from tpu_inductor.training.planning import _Search, causal_lm_loss, token_ids

    cls, config = build(row, layers)
    target = tpu_inductor.tpu_target(row.target)
    mesh = target.mesh(row.mesh)
    if row.plan == "fsdp":
        shardings: Any = "fsdp"
    else:
        from jax.sharding import PartitionSpec as P

        shardings = {k: P(*v) for k, v in _FSDP_TP.items()} | {"inputs": P("data")}
    options = {"target": row.target, "mesh": mesh, "shardings": shardings, "scan_layers": True}
    search = _Search(
        model_fn=lambda: cls(config),
        options=options,
        loss_fn=causal_lm_loss,
        inputs_fn=token_ids,
        optimizer=torch.optim.AdamW,
        dtype=torch.bfloat16,
        over="batch",
        batch=row.batch,
        seq_len=row.seq,
    )
    probe = search.probe("full", row.batch)
    report = tpu_inductor.tpu_report(print_table=False)
    steps = [s for s in report.steps if s.name.startswith("training")]
    if not steps:  # the TPU compiler refused the step's program
        errors = [p.error for p in report.programs if p.error]
        return {"failed": (errors[0] if errors else probe.error or "no step").splitlines()[0]}
    (step,) = steps
    step.model_flops = model_flops(config, row.batch, row.seq)
    step.tokens = row.batch * row.seq
    chip = target.chip
    devices, chips = target.num_devices, target.num_chips
    tokens = row.batch * row.seq
    mflops = model_flops(config, row.batch, row.seq)
    seconds = step.roofline_seconds
    per_device_peak = chip.bf16_flops  # per device: a TPU7x device is half a chip
    return {
        "fits": step.fits,
        "verdict": step.verdict().split(". What to do")[0],
        "step_peak_bytes": step.peak[0],
        "usable_bytes": step.usable_bytes,
        "roofline_s": seconds,
        "predicted_s": step.predicted_seconds,
        "compiler_s": sum(p.compiler_seconds for p in step.programs),
        "predicted_mfu": step.predicted_mfu,
        "predicted_tokens_per_s_per_chip": step.predicted_tokens_per_s_per_chip,
        "peak_parts": step.peak_parts(),
        "compute_s": sum(p.compute_seconds for p in step.programs),
        "memory_s": sum(p.memory_seconds for p in step.programs),
        "ici_s": step.comm_seconds,
        "bound": [p.bound for p in step.programs],
        "hw_mfu_ceiling": step.mfu_ceiling,
        "model_flops": mflops,
        "mfu_ceiling": mflops / devices / (seconds * per_device_peak) if seconds else None,
        "tokens": tokens,
        "tokens_per_s_per_chip": tokens / seconds / chips if seconds else None,
        "devices": devices,
        "chips": chips,
        "matmul_flops": {
            f"{d} {prec}": f for p in step.programs for (d, prec), f in p.matmul_flops.items()
        },
        "programs": [p.name for p in step.programs],
        "xla_compile_s": sum(p.compile_seconds or 0 for p in step.programs),
        "wall_s": probe.seconds,
        "max_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
        "error": probe.error,
    }


def _child(row_id: str, layers: int | None, out: str) -> None:
    import logging

    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("tpu_inductor.lowering.scan_layers").setLevel(logging.INFO)
    result = plan_one(ROWS[row_id], layers)
    pathlib.Path(out).write_text(json.dumps(result))


def run_row(row: Row, layers: int | None, timeout: float) -> dict[str, Any]:
    """Run one row in a subprocess under ``timeout`` seconds; a row that runs past it, or
    dies (killed for memory), is recorded with the reason."""
    out = LOCAL / f".{row.id}.tmp.json"
    LOCAL.mkdir(parents=True, exist_ok=True)
    out.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "benchmarks.plan_real_sizes", "--child", row.id, "--out", str(out)]
    if layers:
        cmd += ["--layers", str(layers)]
    start = time.perf_counter()
    load = os.getloadavg()
    try:
        proc = subprocess.run(cmd, timeout=timeout, capture_output=True, text=True)
        rc, tail = proc.returncode, (proc.stderr or "")[-2000:]
    except subprocess.TimeoutExpired as e:
        rc, tail = "timeout", str(e.stderr or "")[-2000:]
    wall = time.perf_counter() - start
    record: dict[str, Any] = {
        "id": row.id if not layers else f"{row.id}-{layers}layers",
        "row": {k: v for k, v in dataclasses.asdict(row).items() if k != "config"},
        "layers": layers or row.config["num_hidden_layers"],
        "full_depth": row.config["num_hidden_layers"],
        "load_avg_before": list(load),
        "process_wall_s": wall,
    }
    if rc == 0 and out.exists():
        record |= json.loads(out.read_text())
        out.unlink()
    elif rc == "timeout":
        record["failed"] = f"did not finish within {timeout:.0f} s on this machine"
    elif rc in (-9, 137):
        record["failed"] = "killed (out of this machine's memory)"
    else:
        record["failed"] = f"exit {rc}: {tail.strip().splitlines()[-1] if tail.strip() else ''}"
    return record


def table(records: list[dict]) -> str:
    """docs/planning.md's markdown table of the records."""
    head = (
        "| model | target (devices) | plan | layers | batch x seq | fits? | step peak / device "
        "| roofline step | compute / HBM / ICI s | MFU ceiling (model / hw) "
        "| tokens/s/chip ceiling | predicted step (MFU, tokens/s/chip) "
        "| compile here (load avg at start) | measured (published) |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    )
    lines = [head]
    for r in records:
        row = r["row"]
        depth = (
            r["layers"] if r["layers"] == r["full_depth"] else f"{r['layers']} of {r['full_depth']}"
        )
        first = (
            f"| {row['model']} | {row['target']} ({r.get('devices', '?')}) | {row['plan']} "
            f"| {depth} "
            f"| {row['batch']} x {row['seq']} "
        )
        mt = MAXTEXT.get(row.get("maxtext") or "", "-")
        measured = row.get("measured")
        if measured and r.get("predicted_s"):
            # compare per device-step: the published step runs the same per-device batch
            error = r["predicted_s"] / measured["step_s"] - 1
            mt = (
                f"{measured['step_s']:.3f} s, {measured['tokens_per_s_per_device']:,.0f} "
                f"tokens/s/device ({measured['source']}); predicted {error:+.0%}"
            )
        if "failed" in r:
            lines.append(first + f"| {r['failed']} |" + " - |" * 7 + f" {mt} |")
            continue
        predicted = "-"
        if r.get("predicted_s"):
            predicted = (
                f"{r['predicted_s']:.2f} s ({r['predicted_mfu']:.1%}, "
                f"{r['predicted_tokens_per_s_per_chip']:,.0f})"
            )
        gib = r["step_peak_bytes"] / 2**30
        load = f", load {r['load_avg_before'][0]:.1f}" if r.get("load_avg_before") else ""
        lines.append(
            first + f"| {'yes' if r['fits'] else 'NO'} "
            f"| {gib:.1f} GiB of {r['usable_bytes'] / 2**30:.2f} "
            f"| {r['roofline_s']:.2f} s "
            f"| {r['compute_s']:.2f} / {r['memory_s']:.2f} / {r['ici_s']:.2f} "
            f"| {r['mfu_ceiling']:.1%} / {r['hw_mfu_ceiling']:.1%} "
            f"| {r['tokens_per_s_per_chip']:,.0f} "
            f"| {predicted} "
            f"| {r['wall_s']:.0f} s (XLA {r['xla_compile_s']:.0f} s, "
            f"{r['max_rss_gib']:.1f} GiB RSS{load}) "
            f"| {mt} |"
        )
    return "\n".join(lines)


def published_table(records: list[dict]) -> str:
    """Predicted against published measured steps, per row that has one."""
    lines = [
        "| model | target | batch x seq per device | predicted step (model MFU) | roofline "
        "| measured step (tokens/s/device) | error | what differs | source |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in records:
        measured = r["row"].get("measured")
        if not measured or "failed" in r or not r.get("predicted_s"):
            continue
        per_device = r["row"]["batch"] // r["devices"]
        error = r["predicted_s"] / measured["step_s"] - 1
        lines.append(
            f"| {r['row']['model']} | {r['row']['target']} | {per_device} x {r['row']['seq']} "
            f"| {r['predicted_s']:.2f} s ({r['predicted_mfu']:.1%}) | {r['roofline_s']:.2f} s "
            f"| {measured['step_s']:.3f} s ({measured['tokens_per_s_per_device']:,.0f}) "
            f"| {error:+.0%} | {measured['differs']} | {measured['source']} |"
        )
    return "\n".join(lines)


DOCS = pathlib.Path(__file__).parent.parent / "docs" / "planning.md"


def write_docs(records: list[dict]) -> None:
    """Write docs/planning.md's two generated blocks (the table, the published comparison)."""
    text = DOCS.read_text()
    for name, body in (
        ("plan_real_sizes", table(records)),
        ("published", published_table(records)),
    ):
        start, end = f"<!-- {name}:start -->\n", f"<!-- {name}:end -->"
        head, rest = text.split(start, 1)
        text = head + start + body + "\n" + end + rest.split(end, 1)[1]
    DOCS.write_text(text)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", nargs="*", default=None, help=f"row ids (default all): {list(ROWS)}")
    p.add_argument("--layers", type=int, default=None, help="compile at this depth instead")
    p.add_argument("--timeout", type=float, default=480.0)
    p.add_argument("--list", action="store_true")
    p.add_argument(
        "--results",
        default=str(LOCAL),
        help="folder for plan_real_sizes.json and .md (default benchmarks/results/local, "
        "git-ignored; benchmarks/results holds the figures the docs show)",
    )
    p.add_argument(
        "--docs", action="store_true", help="also write docs/planning.md's generated tables"
    )
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--out", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        return _child(args.child, args.layers, args.out)
    if args.list:
        for r in ROWS.values():
            print(r.id, r.model, r.target, r.mesh, r.plan, f"{r.batch}x{r.seq}")
        return None
    from benchmarks.suite import machine_info

    folder = pathlib.Path(args.results)
    folder.mkdir(parents=True, exist_ok=True)
    out_json, out_md = folder / "plan_real_sizes.json", folder / "plan_real_sizes.md"
    old = json.loads(out_json.read_text()) if out_json.exists() else {"results": []}
    by_id = {r["id"]: r for r in old["results"]}
    machine = machine_info()
    for rid in args.rows or list(ROWS):
        record = run_row(ROWS[rid], args.layers, args.timeout)
        record["command"] = "JAX_PLATFORMS=cpu python -m benchmarks.plan_real_sizes " + " ".join(
            sys.argv[1:]
        )
        record["machine"] = machine
        by_id[record["id"]] = record
        print(json.dumps({k: v for k, v in record.items() if k != "machine"}, indent=1))
    order = {rid: i for i, rid in enumerate(ROWS)}
    records = sorted(by_id.values(), key=lambda r: (order.get(r["row"]["id"], 99), r["id"]))
    out_json.write_text(json.dumps({"results": records}, indent=2) + "\n")
    out_md.write_text(table(records) + "\n")
    if args.docs:
        write_docs(records)
    print(table(records))
    return None


if __name__ == "__main__":
    main()

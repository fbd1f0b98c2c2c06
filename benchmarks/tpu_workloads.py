"""The models of ``benchmarks.tpu_programs``: sizes, batches, the torch model with its training
loss and inference call, the hand-written JAX program of each workload, and the per-step figures
and ratios (ours / hand) that ``benchmarks.tpu_programs`` and ``benchmarks.tpu_levers`` report.

A workload is ``"[model-]kind-dtype"``: model ``llama`` (the default, no prefix), ``vit``,
``bert`` or ``resnet``; kind ``train`` (a training step: forward, backward, AdamW) or ``infer``
(an inference forward); dtype ``f32`` or ``bf16``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"

# Per model: sizes (full, small) and the batch (full, small): token ids [batch, seq] for the Llama
# and BERT, images [batch, 3, size, size] for the ViT and the ResNet (sizes["image"]).
SIZES = {
    "llama": (
        dict(hidden=512, intermediate=1408, layers=4, heads=8, kv_heads=2, vocab=8000),
        dict(hidden=64, intermediate=128, layers=2, heads=4, kv_heads=2, vocab=256),
    ),
    "vit": (
        dict(hidden=384, intermediate=1536, layers=4, heads=6, image=224, patch=16, labels=1000),
        dict(hidden=32, intermediate=64, layers=2, heads=4, image=16, patch=4, labels=10),
    ),
    "bert": (
        dict(hidden=512, intermediate=2048, layers=4, heads=8, vocab=8000, positions=512),
        dict(hidden=64, intermediate=128, layers=2, heads=4, vocab=256, positions=64),
    ),
    "resnet": (
        # ResNet-50's depth at half its width (stem 64), 64 px images
        dict(layers=(3, 4, 6, 3), channels=(32, 64, 128, 256), image=64, labels=1000),
        dict(layers=(1, 1, 1, 1), channels=(8, 16, 32, 64), image=32, labels=10),
    ),
}
BATCH = {
    "llama": ((4, 256), (2, 32)),
    "vit": ((8,), (2,)),
    "bert": ((4, 256), (2, 32)),
    "resnet": ((8,), (4,)),
}
MASKED = 0.15  # BERT: the fraction of positions with a label (the rest are -100)

WORKLOADS = (
    "train-f32",
    "train-bf16",
    "infer-f32",
    "infer-bf16",
    "vit-train-f32",
    "vit-train-bf16",
    "bert-train-f32",
    "bert-train-bf16",
    "bert-infer-f32",
    "bert-infer-bf16",
    "resnet-train-f32",
    "resnet-train-bf16",
    "resnet-infer-f32",
    "resnet-infer-bf16",
)
MODEL_NAMES = {"llama": "Llama", "vit": "ViT", "bert": "BERT masked-LM", "resnet": "ResNet"}
KIND_NAMES = {"train": "training step", "infer": "inference forward"}
DTYPE_NAMES = {"f32": "float32", "bf16": "bfloat16"}


def parse_workload(workload: str) -> tuple[str, str, str]:
    """``"[model-]kind-dtype"`` -> (model, kind, dtype); the model defaults to the Llama."""
    parts = workload.split("-")
    model = parts[0] if len(parts) == 3 else "llama"
    kind, dtype = parts[-2:]
    if model not in SIZES or kind not in ("train", "infer") or dtype not in ("f32", "bf16"):
        raise ValueError(f"unknown workload {workload!r}")
    return model, kind, dtype


def workload_name(workload: str) -> str:
    """``"bert-train-bf16"`` -> ``"BERT masked-LM training step, bfloat16"``."""
    model, kind, dtype = parse_workload(workload)
    return f"{MODEL_NAMES[model]} {KIND_NAMES[kind]}, {DTYPE_NAMES[dtype]}"


def spec(model: str, small: bool):
    """The hand-written module of ``model`` and its sizes."""
    from benchmarks import hand_bert, hand_llama, hand_resnet, hand_vit

    module, cls = {
        "llama": (hand_llama, hand_llama.LlamaSizes),
        "vit": (hand_vit, hand_vit.ViTSizes),
        "bert": (hand_bert, hand_bert.BertSizes),
        "resnet": (hand_resnet, hand_resnet.ResNetSizes),
    }[model]
    return module, cls(**SIZES[model][small])


def hand_program(workload: str, small: bool, struct: Callable) -> tuple[Any, tuple, str, Any]:
    """The hand-written program of ``workload``: (jitted function, its arguments as placed
    ``ShapeDtypeStruct``s from ``struct(shape, dtype)``, program name, parameter shapes)."""
    import jax
    import jax.numpy as jnp

    from benchmarks import hand_llama

    model, kind, dtype_name = parse_workload(workload)
    batch = BATCH[model][small]
    dtype = {"f32": jnp.float32, "bf16": jnp.bfloat16}[dtype_name]
    M, sizes = spec(model, small)
    if model in ("llama", "bert"):
        inputs = (struct(batch, jnp.int32),) + (
            (struct(batch, jnp.int32),) if model == "bert" else ()
        )
    else:
        image = (batch[0], 3, sizes.image, sizes.image)
        inputs = (struct(image, dtype), struct(batch, jnp.int32))
    like = M.params_like(sizes, dtype)
    place = lambda tree: jax.tree.map(lambda s: struct(s.shape, s.dtype), tree)  # noqa: E731
    params = place(like)
    extra = (place(M.stats_like(sizes, dtype)),) if model == "resnet" else ()
    if kind == "train":
        state = place(hand_llama.adamw_like(like))
        return M.jitted_train_step(sizes), (params, state, *extra, *inputs), "train_step", like
    return M.jitted_forward(sizes), (params, *extra, inputs[0]), "forward", like


def torch_workload(model_name: str, small: bool, dtype):
    """The torch model, its training loss and its inference call (each a function of the model,
    on a fixed batch)."""
    import torch

    sizes, batch = SIZES[model_name][small], BATCH[model_name][small]
    _, spec_ = spec(model_name, small)
    torch.manual_seed(0)
    if model_name in ("llama", "bert"):
        ids = torch.randint(0, sizes["vocab"], batch)
        if model_name == "llama":
            import transformers

            model = transformers.LlamaForCausalLM(spec_.hf_config()).to(dtype)
            return model, (lambda m: m(ids, labels=ids).loss), (lambda m: m(ids))
        import transformers

        model = transformers.BertForMaskedLM(spec_.hf_config()).to(dtype)
        labels = torch.where(torch.rand(batch) < MASKED, ids, -100)
        return model, (lambda m: m(ids, labels=labels).loss), (lambda m: m(ids))
    labels = torch.randint(0, sizes["labels"], batch)
    pixels = torch.randn(batch[0], 3, spec_.image, spec_.image, dtype=dtype)
    if model_name == "vit":
        import transformers

        model = transformers.ViTForImageClassification(spec_.hf_config()).to(dtype)
        return model, (lambda m: m(pixel_values=pixels, labels=labels).loss), (lambda m: m(pixels))
    model = spec_.timm_model().to(dtype)
    loss = lambda m: torch.nn.functional.cross_entropy(m(pixels), labels)  # noqa: E731
    return model, loss, (lambda m: m(pixels))


def describe(sizes: dict, batch: dict) -> str:
    """The models' sizes and batches, in words (docs/performance.md's table header)."""
    out = []
    if "llama" in sizes:
        s = sizes["llama"]
        out.append(
            f"transformers `LlamaForCausalLM` (hidden {s['hidden']}, intermediate "
            f"{s['intermediate']}, {s['layers']} layers, {s['heads']} heads / {s['kv_heads']} KV "
            f"heads, vocabulary {s['vocab']}, SDPA), batch {' x '.join(map(str, batch['llama']))} "
            "tokens, `labels=ids`"
        )
    if "vit" in sizes:
        s = sizes["vit"]
        out.append(
            f"`ViTForImageClassification` (hidden {s['hidden']}, {s['layers']} layers, "
            f"{s['heads']} heads, {s['image']} px, patch {s['patch']}, {s['labels']} classes), "
            f"batch {batch['vit'][0]}"
        )
    if "bert" in sizes:
        s = sizes["bert"]
        out.append(
            f"`BertForMaskedLM` (hidden {s['hidden']}, intermediate {s['intermediate']}, "
            f"{s['layers']} layers, {s['heads']} heads, vocabulary {s['vocab']}, SDPA, no "
            f"dropout), batch {' x '.join(map(str, batch['bert']))} tokens, "
            f"{MASKED:.0%} of them labelled"
        )
    if "resnet" in sizes:
        s = sizes["resnet"]
        out.append(
            f"timm bottleneck `ResNet` (blocks {tuple(s['layers'])}, widths "
            f"{tuple(s['channels'])}, BatchNorm in training mode, {s['image']} px, "
            f"{s['labels']} classes), batch {batch['resnet'][0]}"
        )
    return "; ".join(out) + "; AdamW"


# ----------------------------------------------------------------------------------------------
# Per-step figures and ratios


def totals(result: dict) -> dict:
    """Per-step figures: sums over the step's programs; the HBM peak is the largest program's
    peak plus the state living beside it."""
    programs = result["programs"]
    hbm = [p.get("hbm_bytes") for p in programs]
    return {
        "programs": len(programs),
        "bytes": sum(p["bytes"] for p in programs),
        # rows measured before 2026-12-07 lack it
        "hbm_bytes": None if None in hbm else sum(hbm),
        "flops": sum(p["flops"] for p in programs),
        "hbm_peak": max(p["hbm_peak"] + p["outside_state"] for p in programs),
        "compile_cpu_s": result["compile_cpu_s"],
        "compile_wall_s": sum(p["compile_wall_s"] for p in programs),
        "copies": sum(p["copies"] for p in programs),
        "copy_bytes": sum(p["copy_bytes"] for p in programs),
    }


RATIO_KEYS = ("bytes", "flops", "hbm_peak", "compile_cpu_s")


def derive(rows: dict) -> dict:
    """ours / hand for every workload and ours variant measured."""
    out: dict[str, dict] = {}
    for workload, by in rows.items():
        hand = by.get("hand")
        if not hand or "error" in hand:
            continue
        ht = totals(hand)
        for contender, res in by.items():
            if contender == "hand" or "error" in res:
                continue
            t = totals(res)
            out.setdefault(workload, {})[contender] = {
                k: (t[k] / ht[k] if ht[k] else float("nan")) for k in RATIO_KEYS
            }
            if t["hbm_bytes"] and ht["hbm_bytes"]:
                out[workload][contender]["hbm_bytes"] = t["hbm_bytes"] / ht["hbm_bytes"]
    return out

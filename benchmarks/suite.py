"""The measurements of ``python -m benchmarks.run``, one task at a time.

Each task (per-call overhead, one model run, one compile-time probe) is a plain function
returning a JSON-able dict. ``benchmarks.run`` starts every task in a subprocess of its own
(``python -m benchmarks.suite TASK_JSON OUT_PATH``) so that JAX's and torch's CPU thread pools
never share a process with another contender, and so each process's peak resident memory belongs
to one run; the smoke test calls the same functions in-process with tiny sizes.

Contenders:

- ``tpu``: ``torch.compile(model, backend="tpu")`` (this project);
- ``jax``: hand-written ``jax.jit`` of the same math, weights already ``jax.Array`` s on the
  device, the input crossing by DLPack each call (per-call overhead only);
- ``eager``: torch eager on the CPU;
- ``inductor``: ``torch.compile(model, backend="inductor")`` on the CPU;
- ``torchax``: ``torchax.compile`` (its ``jax_jit`` path), when torchax imports.
"""

from __future__ import annotations

import gc
import json
import math
import os
import resource
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

_PROCESS_START = time.perf_counter()

PERCALL_CONTENDERS = ("tpu", "jax", "eager", "inductor", "torchax")
MODEL_CONTENDERS = ("tpu", "eager", "inductor", "torchax")
MODELS = ("resnet", "bert", "gpt2", "llama")


def log(msg: str) -> None:
    """One progress line on stderr (the orchestrator passes it through)."""
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


# --- timing ---------------------------------------------------------------------------------------


def _batch_seconds(fn: Callable[[], Any], n: int) -> float:
    """Seconds per call of ``n`` back-to-back calls, garbage collector off (as in ``timeit``)."""
    gc_was_on = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        start = time.perf_counter()
        for _ in range(n):
            fn()
        return (time.perf_counter() - start) / n
    finally:
        if gc_was_on:
            gc.enable()


def time_per_call(
    fn: Callable[[], Any], *, target_s: float, repeats: int, warmup: int = 3
) -> dict[str, Any]:
    """Robust seconds per call of ``fn``: the median over ``repeats`` timed batches.

    Each batch runs ``fn`` ``n`` times back to back, with ``n`` calibrated so one batch lasts
    about ``target_s``; the garbage collector is off while a batch runs (as in ``timeit``).

    Args:
        fn: the call to time; it must finish its work before returning (synchronous).
        target_s: the wall time one batch should take.
        repeats: how many batches; the median of their per-call times is reported.
        warmup: untimed calls first.

    Returns:
        ``{"median_s", "min_s", "max_s", "n", "repeats", "samples_s"}``.
    """
    for _ in range(warmup):
        fn()
    start = time.perf_counter()
    fn()
    estimate = max(time.perf_counter() - start, 1e-7)
    n = max(1, min(1_000_000, math.ceil(target_s / estimate)))
    if n > 1:  # refine: one call is a noisy estimate of a fast function
        start = time.perf_counter()
        for _ in range(min(n, 50)):
            fn()
        estimate = max((time.perf_counter() - start) / min(n, 50), 1e-7)
        n = max(1, min(1_000_000, math.ceil(target_s / estimate)))
    samples = [_batch_seconds(fn, n) for _ in range(repeats)]
    return {
        "median_s": statistics.median(samples),
        "min_s": min(samples),
        "max_s": max(samples),
        "n": n,
        "repeats": repeats,
        "samples_s": samples,
    }


def peak_rss_mib() -> float:
    """This process's peak resident memory so far, in MiB (``ru_maxrss``)."""
    kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return kib / (1024 * 1024) if sys.platform == "darwin" else kib / 1024


def checksum(t) -> dict[str, float]:
    """A few numbers that identify a tensor's values, to compare contenders across processes."""
    t = t.detach().double()
    return {"sum": float(t.sum()), "abs_sum": float(t.abs().sum()), "shape": list(t.shape)}


# --- contenders -----------------------------------------------------------------------------------


def torchax_available() -> tuple[bool, str]:
    """Whether ``import torchax`` works here, and why not. Probe it in a throwaway process:
    its import renames PrivateUse1, which breaks Dynamo in the same process."""
    import subprocess

    proc = subprocess.run(
        [sys.executable, "-c", "import torchax"], capture_output=True, text=True, timeout=300
    )
    if proc.returncode == 0:
        return True, ""
    lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
    return False, lines[-1] if lines else f"exit code {proc.returncode}"


def compile_for(contender: str, fn, options: dict | None = None):
    """``fn`` wrapped the way ``contender`` runs it (torch-level contenders only)."""
    import torch

    if contender == "eager":
        return fn
    if contender == "tpu":
        return torch.compile(fn, backend="tpu", options=options)
    if contender == "inductor":
        return torch.compile(fn, backend="inductor")
    if contender == "torchax":
        import torchax

        torchax.enable_globally()
        return torchax.compile(fn)
    raise ValueError(f"unknown contender {contender!r}")


def _torchax_io(contender: str):
    """(to_device, to_cpu) for a contender's inputs and outputs; identity except for torchax."""
    if contender != "torchax":
        return (lambda t: t), (lambda t: t)
    return (lambda t: t.to("jax")), (lambda t: t.to("cpu"))


# --- per-call overhead ----------------------------------------------------------------------------


def _mlp(d: int):
    from torch import nn

    return nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))


def _hand_jax_mlp(model, io: str = "dlpack"):
    """The MLP written by hand as one ``jax.jit``, weights resident on the device.

    ``io="dlpack"`` (the benchmark's hand-JAX contender): the input crosses by DLPack each call
    and the output comes back by DLPack. ``io="numpy"``: zero-copy numpy views both ways, the
    cheapest crossing measured on CPU (``python -m benchmarks.boundary``), which is what the
    backend itself does: against it, the ratio is the backend's whole overhead. GELU is written
    with ``erf`` exactly as the backend lowers ``aten.gelu`` (``jax.nn.gelu`` uses ``erfc``,
    slower on XLA:CPU), so the ratio measures overhead, not a different formula.
    """
    import jax
    import jax.numpy as jnp
    import numpy as np
    import torch
    from jax.scipy.special import erf

    device = jax.devices()[0]  # the best device, as the backend picks it
    hi = jax.lax.Precision.HIGHEST  # what torch's default "highest" float32 precision maps to
    params = [
        jax.device_put(jnp.asarray(p.detach().numpy()), device)
        for p in (model[0].weight, model[0].bias, model[2].weight, model[2].bias)
    ]
    half, rsqrt2 = np.float32(0.5), np.float32(1 / np.sqrt(2))

    @jax.jit
    def f(params, x):
        w1, b1, w2, b2 = params
        h = jnp.matmul(x, w1.T, precision=hi) + b1
        h = h * half * (1.0 + erf(h * rsqrt2))
        return jnp.matmul(h, w2.T, precision=hi) + b2

    if io == "numpy":
        return lambda x: torch.from_numpy(np.asarray(f(params, x.numpy())))
    if device.platform == "cpu":
        return lambda x: torch.from_dlpack(f(params, jax.dlpack.from_dlpack(x)))
    # torch is a CPU build: outputs come back to the host through numpy, as the backend does.
    return lambda x: torch.from_numpy(
        np.asarray(f(params, jax.device_put(jax.dlpack.from_dlpack(x), device)))
    )


def _interleaved(fns: dict[str, Callable[[], Any]], *, target_s: float, rounds: int) -> dict:
    """Seconds per call of each function, timed in turns: round after round, each function
    runs one batch of ``n`` calls (``n`` sized so the first function's batch lasts about
    ``target_s``). Load that drifts over seconds then hits every function alike, so the
    per-round ratios are steadier than ratios of times measured one after the other.

    Returns ``{name: [seconds per call, one per round]}``.
    """
    first = next(iter(fns.values()))
    for fn in fns.values():
        for _ in range(3):
            fn()
    start = time.perf_counter()
    for _ in range(20):
        first()
    n = max(1, math.ceil(target_s / max((time.perf_counter() - start) / 20, 1e-7)))
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            times[name].append(_batch_seconds(fn, n))
    return times


def run_percall(
    contender: str,
    sizes: list[tuple[int, int]],
    *,
    target_s: float = 0.2,
    repeats: int = 5,
) -> list[dict[str, Any]]:
    """Per-call time of the MLP ``Linear(d,4d) -> GELU -> Linear(4d,d)`` for one contender.

    Args:
        contender: one of :data:`PERCALL_CONTENDERS`.
        sizes: ``(batch, d)`` pairs.
        target_s, repeats: see :func:`time_per_call`.

    Returns:
        One dict per size: ``size``, ``us`` (median), ``us_min``, ``n``, ``first_call_s``,
        ``check`` (a checksum of the output) and ``ref`` (the eager output's checksum).
    """
    import torch

    results = []
    for batch, d in sizes:
        torch._dynamo.reset()
        torch.manual_seed(0)
        model = _mlp(d).eval()
        x = torch.randn(batch, d)
        with torch.no_grad():
            ref = model(x)
            start = time.perf_counter()
            if contender == "jax":
                hand = _hand_jax_mlp(model)
                call = lambda hand=hand, x=x: hand(x)  # noqa: E731
            else:
                to_dev, to_cpu = _torchax_io(contender)
                run = compile_for(contender, model)
                xd = to_dev(x)
                call = lambda run=run, xd=xd, to_cpu=to_cpu: to_cpu(run(xd))  # noqa: E731
            out = call()
            first = time.perf_counter() - start
            timing = time_per_call(call, target_s=target_s, repeats=repeats)
            paired = _paired_with_hand_jax(model, x, call, target_s) if contender == "tpu" else None
        row = {
            "size": f"{batch}x{d}",
            "us": timing["median_s"] * 1e6,
            "us_min": timing["min_s"] * 1e6,
            "us_samples": [s * 1e6 for s in timing["samples_s"]],
            "n": timing["n"],
            "first_call_s": first,
            "check": checksum(out),
            "ref": checksum(ref),
            "max_abs_err": float((out - ref).abs().max()),
        }
        if paired is not None:
            row["paired"] = paired
        results.append(row)
        log(f"percall {contender:>8} {row['size']:>9}: {row['us']:10.1f} us/call")
    return results


def _paired_with_hand_jax(model, x, ours: Callable[[], Any], target_s: float) -> dict[str, Any]:
    """Ours against both hand-written JAX versions in this one process, interleaved (both sides
    of the ratio in the same process state: all three run on JAX's thread pool)."""
    hands = {io: _hand_jax_mlp(model, io) for io in ("dlpack", "numpy")}
    times = _interleaved(
        {
            "tpu": ours,
            "dlpack": lambda: hands["dlpack"](x),
            "numpy": lambda: hands["numpy"](x),
        },
        target_s=target_s / 3,
        rounds=15,
    )
    reference = ours()
    out: dict[str, Any] = {
        "rounds": len(times["tpu"]),
        **{f"{io}_max_abs_err": float((hands[io](x) - reference).abs().max()) for io in hands},
    }
    for name, ts in times.items():
        out[f"{name}_us"] = statistics.median(ts) * 1e6
    for io in ("dlpack", "numpy"):
        ratios = [a / b for a, b in zip(times["tpu"], times[io], strict=True)]
        out[f"tpu/{io}"] = statistics.median(ratios)
    return out


# --- models ---------------------------------------------------------------------------------------


def model_config(name: str, quick: bool) -> dict[str, Any]:
    """The shape of each benchmark model (quick runs keep the widths and cut the depth)."""
    if name == "resnet":  # ResNet-18: basic blocks, widths 64..512
        return {"depths": [1, 1, 1, 1] if quick else [2, 2, 2, 2], "batch": 2, "image": 128}
    if name == "bert":  # BERT-base dims
        return {"layers": 2 if quick else 12, "batch": 2, "seq": 128, "hidden": 768}
    if name == "gpt2":  # GPT-2 small dims
        return {"layers": 2 if quick else 12, "batch": 2, "seq": 128, "hidden": 768}
    if name == "llama":  # a small Llama: SwiGLU, RoPE, RMSNorm
        return {"layers": 2 if quick else 8, "batch": 2, "seq": 128, "hidden": 512}
    raise ValueError(f"unknown model {name!r}; known: {', '.join(MODELS)}")


def build_model(name: str, quick: bool, train: bool):
    """``(module, inputs, info)``: ``module(**inputs)`` returns the main output, or the loss when
    ``train``; ``info`` has the parameter count and, for decoders, the analytic training FLOPs.

    Every dropout probability is 0, so contenders compute the same function and their losses and
    outputs can be compared across processes.
    """
    import torch
    import transformers
    from torch import nn

    transformers.logging.set_verbosity_error()
    cfg = model_config(name, quick)
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1)
    info: dict[str, Any] = {"config": cfg}
    if name == "resnet":
        config = transformers.ResNetConfig(
            embedding_size=64,
            hidden_sizes=[64, 128, 256, 512],
            depths=cfg["depths"],
            layer_type="basic",
            num_labels=10,
        )
        body = transformers.ResNetForImageClassification(config)
        size = cfg["image"]
        inputs = {"pixel_values": torch.randn(cfg["batch"], 3, size, size, generator=gen)}
        if train:
            inputs["labels"] = torch.randint(0, 10, (cfg["batch"],), generator=gen)
        head = "logits"
    else:
        if name == "bert":
            config = transformers.BertConfig(
                hidden_size=768,
                num_hidden_layers=cfg["layers"],
                num_attention_heads=12,
                intermediate_size=3072,
                hidden_dropout_prob=0.0,
                attention_probs_dropout_prob=0.0,
            )
            body = transformers.BertModel(config, add_pooling_layer=False)
        elif name == "gpt2":
            config = transformers.GPT2Config(
                n_embd=768,
                n_layer=cfg["layers"],
                n_head=12,
                resid_pdrop=0.0,
                embd_pdrop=0.0,
                attn_pdrop=0.0,
            )
            body = transformers.GPT2Model(config)
        else:
            config = transformers.LlamaConfig(
                vocab_size=32000,
                hidden_size=512,
                intermediate_size=1408,
                num_hidden_layers=cfg["layers"],
                num_attention_heads=8,
                # 8: multi-head attention; fewer (e.g. 4) is grouped-query attention, which
                # the backend runs too. Changing it changes the benchmark: rerun before comparing.
                num_key_value_heads=8,
                max_position_embeddings=512,
            )
            body = transformers.LlamaModel(config)
        ids = torch.randint(3, config.vocab_size, (cfg["batch"], cfg["seq"]), generator=gen)
        inputs = {"input_ids": ids}
        head = "last_hidden_state"
        tokens = cfg["batch"] * cfg["seq"]
        embed = sum(m.weight.numel() for m in body.modules() if isinstance(m, nn.Embedding))
        dense = sum(p.numel() for p in body.parameters()) - embed
        # 6 N T for the dense weights (2 forward + 4 backward per multiply-add) plus the
        # attention scores and values, 12 L d s per token (PaLM, appendix B).
        info["train_flops"] = 6 * dense * tokens + 12 * cfg["layers"] * cfg["hidden"] * (
            cfg["seq"] * tokens
        )
        info["tokens"] = tokens

    class Wrapped(nn.Module):
        """The model returning one tensor: its main output, or a loss when training."""

        def __init__(self, body):
            super().__init__()
            self.body = body

        def forward(self, **kw):
            out = self.body(**kw)
            if not train:
                return getattr(out, head)
            if getattr(out, "loss", None) is not None:
                return out.loss
            # Base models have no head: a stand-in loss over every output element.
            return getattr(out, head).float().pow(2).mean()

    module = Wrapped(body).train(train)
    info["params"] = sum(p.numel() for p in module.parameters())
    return module, inputs, info


def run_model(
    contender: str,
    name: str,
    mode: str,
    *,
    quick: bool,
    target_s: float = 0.5,
    repeats: int = 3,
) -> dict[str, Any]:
    """Time one model's inference (``mode="infer"``) or training step (``mode="train"``).

    A training step is ``zero_grad``, the forward returning the loss, ``backward`` and an AdamW
    step; compiled contenders compile both the model and ``opt.step`` with their backend.

    Returns:
        ``ms`` (median step time), ``first_call_s`` (first step, compile included),
        ``peak_rss_mib`` (this process's peak), ``rss_setup_mib`` (after imports and model
        build), ``check`` (output or first-step loss checksum) and the model's ``info``.
    """
    import torch

    if contender == "torchax" and mode == "train":
        raise ValueError("torchax is measured for inference only")
    module, inputs, info = build_model(name, quick, train=(mode == "train"))
    rss_setup = peak_rss_mib()
    to_dev, to_cpu = _torchax_io(contender)
    compiled = compile_for(contender, module)
    inputs_dev = {k: to_dev(v) for k, v in inputs.items()}
    if mode == "infer":

        def step():
            with torch.no_grad():
                return to_cpu(compiled(**inputs_dev))

    else:
        opt = torch.optim.AdamW(module.parameters(), lr=1e-4)
        opt_step = compile_for(contender, opt.step) if contender != "eager" else opt.step

        def step():
            opt.zero_grad(set_to_none=True)
            loss = compiled(**inputs_dev)
            loss.backward()
            opt_step()
            return loss.detach()

    start = time.perf_counter()
    first = step()
    first_s = time.perf_counter() - start
    log(f"model {name}/{mode} {contender}: first call {first_s:.1f}s")
    timing = time_per_call(step, target_s=target_s, repeats=repeats, warmup=1)
    result = {
        "ms": timing["median_s"] * 1e3,
        "ms_min": timing["min_s"] * 1e3,
        "ms_samples": [s * 1e3 for s in timing["samples_s"]],
        "n": timing["n"],
        "first_call_s": first_s,
        "check": checksum(first),
        "rss_setup_mib": rss_setup,
        "peak_rss_mib": peak_rss_mib(),
        "info": info,
    }
    if contender == "tpu":
        import tpu_inductor.runtime.cache

        result["fallback_ops"] = list(tpu_inductor.runtime.cache.FALLBACK_OPS)
    log(f"model {name}/{mode} {contender}: {result['ms']:.1f} ms/step")
    return result


# --- compile time ---------------------------------------------------------------------------------


def run_compile(item: str, cache_dir: str, *, quick: bool) -> dict[str, Any]:
    """Time to the first result of ``torch.compile(backend="tpu")`` with a persistent cache.

    Args:
        item: ``"mlp"`` (the 32x512 MLP, inference), ``"<model>/infer"`` or ``"<model>/train"``
            (forward + backward of the loss; the optimizer is left out).
        cache_dir: the JAX persistent compilation cache folder (empty for a cold start).

    Returns:
        ``first_result_s`` (from ``torch.compile`` to the first result: Dynamo tracing,
        AOTAutograd, lowering and XLA compile or cache load), ``import_s`` (importing torch's
        Dynamo, tpu-inductor and JAX, and starting JAX, timed apart before that) and
        ``since_start_s`` (from interpreter start to the first result, everything included).
    """
    import_start = time.perf_counter()
    import jax
    import torch
    import torch._dynamo

    import tpu_inductor  # noqa: F401

    jax.devices()
    import_s = time.perf_counter() - import_start
    options = {"cache_dir": cache_dir}
    if item == "mlp":
        torch.manual_seed(0)
        module = _mlp(512).eval()
        inputs = {"input": torch.randn(32, 512)}
        train = False
    else:
        name, mode = item.split("/")
        train = mode == "train"
        module, inputs, _ = build_model(name, quick, train=train)
    start = time.perf_counter()
    compiled = torch.compile(module, backend="tpu", options=options)
    if train:
        out = compiled(**inputs)
        out.backward()
    else:
        with torch.no_grad():
            out = compiled(**inputs)
    end = time.perf_counter()
    return {
        "first_result_s": end - start,
        "import_s": import_s,
        "since_start_s": end - _PROCESS_START,
        "check": checksum(out),
    }


# --- machine --------------------------------------------------------------------------------------


def write_record(path, module: str, argv: list[str] | None, machine: dict, results: list) -> None:
    """Write a benchmark's results file: the command that made it, the date, the machine (taken
    before the runs, so its load average is the starting one) and the results."""
    import datetime
    import pathlib

    record = {
        "command": " ".join([f"python -m {module}", *(sys.argv[1:] if argv is None else argv)]),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": machine,
        "results": results,
    }
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=2) + "\n")


def machine_info() -> dict[str, Any]:
    """CPU count, platform, JAX device and library versions of this machine."""
    import platform

    import jax
    import numpy
    import torch

    try:
        import transformers

        tf_version = transformers.__version__
    except ImportError:
        tf_version = None
    device = jax.devices()[0]
    try:
        affinity = len(os.sched_getaffinity(0))
    except AttributeError:
        affinity = os.cpu_count()
    return {
        "cpu_count": os.cpu_count(),
        "cpus_usable": affinity,
        "cpu": platform.processor() or platform.machine(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "load_avg": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "jax_backend": jax.default_backend(),
        "jax_device": f"{device.platform} ({device.device_kind})",
        "jax_device_kind": device.device_kind,
        "jax_device_count": jax.device_count(),
        "torch_threads": torch.get_num_threads(),
        "versions": {
            "torch": torch.__version__,
            "jax": jax.__version__,
            "jaxlib": getattr(__import__("jaxlib"), "__version__", None),
            "numpy": numpy.__version__,
            "transformers": tf_version,
        },
    }


# --- subprocess entry -----------------------------------------------------------------------------


def run_task(task: dict[str, Any]) -> Any:
    """Run one task description (as built by ``benchmarks.run``) and return its result."""
    kind = task["kind"]
    if kind == "percall":
        sizes = [tuple(s) for s in task["sizes"]]
        return run_percall(
            task["contender"], sizes, target_s=task["target_s"], repeats=task["repeats"]
        )
    if kind == "model":
        return run_model(
            task["contender"],
            task["model"],
            task["mode"],
            quick=task["quick"],
            target_s=task["target_s"],
            repeats=task["repeats"],
        )
    if kind == "compile":
        return run_compile(task["item"], task["cache_dir"], quick=task["quick"])
    if kind == "machine":
        return machine_info()
    raise ValueError(f"unknown task kind {kind!r}")


def limit_threads(n: int, pin: bool = True) -> None:
    """Keep this process's compute (torch's and XLA's thread pools alike) to ``n`` threads.

    Must run before torch and JAX start their pools: torch reads ``OMP_NUM_THREADS``; XLA sizes
    its CPU pool from the affinity mask, so ``pin`` restricts that to ``n`` CPUs. Inductor is
    not pinned: its C++ compile workers inherit the mask, and its kernels follow
    ``OMP_NUM_THREADS``.
    """
    if pin and hasattr(os, "sched_setaffinity"):
        cpus = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, cpus[:n])
    os.environ["OMP_NUM_THREADS"] = str(n)


def main(argv: list[str] | None = None) -> int:
    """``python -m benchmarks.suite TASK_JSON OUT_PATH``: run one task, write its JSON result."""
    argv = sys.argv[1:] if argv is None else argv
    task, out_path = json.loads(argv[0]), argv[1]
    if os.environ.get("BENCH_THREADS"):
        limit_threads(int(os.environ["BENCH_THREADS"]), pin=task.get("contender") != "inductor")
    result = run_task(task)
    with open(out_path, "w") as f:
        json.dump(result, f)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

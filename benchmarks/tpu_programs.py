"""Our TPU programs against hand-written JAX: ``python -m benchmarks.tpu_programs``.

Compiles, for a TPU topology and without a TPU (libtpu's compile-only topologies, the method of
``research/tpu-programs.md``), the programs of a Llama-style model
(``transformers.LlamaForCausalLM``, SDPA attention) two ways, and reads XLA's analysis of each:

- **hand**: the same model written directly in JAX (``benchmarks/hand_llama.py``): the training
  step (forward, backward, AdamW) as ONE jitted program with parameters and optimizer state
  donated, and the inference forward (logits and the KV cache HF returns);
- **ours**: what ``torch.compile(..., backend="tpu")`` compiles for the same step: every graph
  AOTAutograd hands the backend, lowered with ``platform="tpu"`` and compiled for the topology
  with the inputs the backend donates. Variants: ``3prog`` (the model and ``opt.step`` compiled
  separately: forward, backward and AdamW programs) and ``1prog`` (the whole step compiled by the
  user as one function: one program, README "One program per training step").

Figures per program and per step (summed over its programs): XLA's "bytes accessed" and FLOPs
(``cost_analysis``), the HBM peak (``memory_analysis``: arguments + outputs - aliased + temporaries,
plus, for a step split into programs, the state that lives on the device beside a program
without being its argument), the TPU compile's CPU seconds, and the optimized HLO's top-level
copies. Ratios are ours / hand from one run. Each contender runs in a process of its own.

``--small`` uses tiny sizes (tests, CI); ``--target cpu`` compiles for the local CPU instead of a
TPU topology (no libtpu needed; the figures are XLA:CPU's). TPU targets need libtpu: run this
with the interpreter that has it (here ``/work/tpuenv/bin/python``) and ``JAX_PLATFORMS=cpu``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"

# Per model: sizes (full, small) and the batch (full, small): token ids [batch, seq] for the Llama,
# images [batch, 3, size, size] for the ViT (sizes["image"]).
SIZES = {
    "llama": (
        dict(hidden=512, intermediate=1408, layers=4, heads=8, kv_heads=2, vocab=8000),
        dict(hidden=64, intermediate=128, layers=2, heads=4, kv_heads=2, vocab=256),
    ),
    "vit": (
        dict(hidden=384, intermediate=1536, layers=4, heads=6, image=224, patch=16, labels=1000),
        dict(hidden=32, intermediate=64, layers=2, heads=4, image=16, patch=4, labels=10),
    ),
}
BATCH = {"llama": ((4, 256), (2, 32)), "vit": ((8,), (2,))}

WORKLOADS = (
    "train-f32",
    "train-bf16",
    "infer-f32",
    "infer-bf16",
    "vit-train-f32",
    "vit-train-bf16",
)


def parse_workload(workload: str) -> tuple[str, str, str]:
    """``"[model-]kind-dtype"`` -> (model, kind, dtype); the model defaults to the Llama."""
    parts = workload.split("-")
    model = parts[0] if len(parts) == 3 else "llama"
    kind, dtype = parts[-2:]
    if model not in SIZES or kind not in ("train", "infer") or dtype not in ("f32", "bf16"):
        raise ValueError(f"unknown workload {workload!r}")
    return model, kind, dtype


CONTENDERS = ("hand", "ours-3prog", "ours-1prog")


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------------------------
# Targets and program analysis


@dataclasses.dataclass
class Target:
    """Where programs compile: a libtpu topology (deviceless) or the local CPU."""

    name: str
    platform: str
    device: Any

    @classmethod
    def make(cls, name: str) -> Target:
        import jax

        if name == "cpu":
            return cls(name, "cpu", jax.devices("cpu")[0])
        from jax.experimental import topologies

        topology = topologies.get_topology_desc(name, "tpu")
        return cls(name, "tpu", topology.devices[0])

    def struct(self, shape, dtype):
        import jax
        from jax.sharding import SingleDeviceSharding

        return jax.ShapeDtypeStruct(tuple(shape), dtype, sharding=SingleDeviceSharding(self.device))

    def place(self, tree):
        """A pytree of ShapeDtypeStructs, each placed on the target's device."""
        import jax

        return jax.tree.map(lambda s: self.struct(s.shape, s.dtype), tree)


_SHAPE = re.compile(r"^(pred|[a-z]+\d+)\[([\d,]*)\]")
_BITS = {"pred": 8}
_INSTR = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+) = (.+?) ([a-z][\w\-]*)\((.*)$")


def _shape_bytes(text: str) -> int:
    """Bytes of an HLO array shape (``f32[4,256]{1,0}``); 0 for tuples and tokens."""
    m = _SHAPE.match(text)
    if not m:
        return 0
    kind, dims = m.groups()
    bits = _BITS.get(kind) or int(re.sub(r"\D", "", kind) or 8)
    n = 1
    for d in filter(None, dims.split(",")):
        n *= int(d)
    return n * bits // 8


def hlo_summary(text: str) -> dict[str, Any]:
    """Counts of the optimized HLO's top-level (ENTRY) instructions by opcode, and the bytes
    written by its top-level copies (layout changes XLA could not fold into a fusion)."""
    entry, depth, ops = False, 0, {}
    copy_bytes = 0
    for line in text.splitlines():
        if line.startswith("ENTRY "):
            entry = True
            continue
        if not entry:
            continue
        if line.startswith("}"):
            break
        m = _INSTR.match(line)
        if not m:
            continue
        _, shape, opcode, _ = m.groups()
        ops[opcode] = ops.get(opcode, 0) + 1
        if opcode == "copy":
            copy_bytes += _shape_bytes(shape)
    del depth
    return {"ops": dict(sorted(ops.items())), "copy_bytes": copy_bytes}


SAVE_HLO: Path | None = None  # --save-hlo: write each program's optimized HLO there


def analyze(compiled, compile_cpu_s: float, compile_wall_s: float, trace_s: float) -> dict:
    """XLA's figures for one compiled program."""
    text = compiled.as_text()
    if SAVE_HLO is not None:
        SAVE_HLO.mkdir(parents=True, exist_ok=True)
        (SAVE_HLO / f"program{len(list(SAVE_HLO.iterdir()))}.hlo.txt").write_text(text)
    cost = compiled.cost_analysis()
    if isinstance(cost, list):  # older jaxlibs: one dict per partition
        cost = cost[0]
    mem = compiled.memory_analysis()
    args, outs = mem.argument_size_in_bytes, mem.output_size_in_bytes
    alias, temp = mem.alias_size_in_bytes, mem.temp_size_in_bytes
    summary = hlo_summary(text)
    return {
        "bytes": float(cost.get("bytes accessed", 0.0)),
        "flops": float(cost.get("flops", 0.0)),
        "hbm_peak": int(args + outs - alias + temp),
        "arguments": int(args),
        "outputs": int(outs),
        "aliased": int(alias),
        "temp": int(temp),
        "compile_cpu_s": compile_cpu_s,
        "compile_wall_s": compile_wall_s,
        "trace_s": trace_s,
        "copies": summary["ops"].get("copy", 0),
        "copy_bytes": summary["copy_bytes"],
        "fusions": summary["ops"].get("fusion", 0),
        "hlo_ops": summary["ops"],
    }


def compile_jitted(jitted, args, options: dict | None = None):
    """``jitted.trace(*args).lower().compile()``, timed: (compiled, cpu_s, wall_s, trace_s)."""
    t0 = time.perf_counter()
    lowered = jitted.trace(*args).lower()
    trace_s = time.perf_counter() - t0
    c0, w0 = time.process_time(), time.perf_counter()
    compiled = lowered.compile(compiler_options=options) if options else lowered.compile()
    return compiled, time.process_time() - c0, time.perf_counter() - w0, trace_s


# ----------------------------------------------------------------------------------------------
# hand: the hand-written JAX programs


def run_hand(workload: str, small: bool, target: Target) -> dict:
    import jax
    import jax.numpy as jnp

    from benchmarks import hand_llama, hand_vit

    model, kind, dtype_name = parse_workload(workload)
    sizes, batch = SIZES[model][small], BATCH[model][small]
    dtype = {"f32": jnp.float32, "bf16": jnp.bfloat16}[dtype_name]
    if model == "llama":
        M, spec = hand_llama, hand_llama.LlamaSizes(**sizes)
        inputs = (target.struct(batch, jnp.int32),)
    else:
        M, spec = hand_vit, hand_vit.ViTSizes(**sizes)
        image = (batch[0], spec.channels, spec.image, spec.image)
        inputs = (target.struct(image, dtype), target.struct(batch, jnp.int32))
    like = M.params_like(spec, dtype)
    params = target.place(like)
    if kind == "train":
        state = target.place(hand_llama.adamw_like(like))
        jitted, args, name = M.jitted_train_step(spec), (params, state, *inputs), "train_step"
    else:
        jitted, args, name = M.jitted_forward(spec), (params, *inputs[:1]), "forward"
    compiled, cpu_s, wall_s, trace_s = compile_jitted(jitted, args)
    program = {"name": name, "kind": kind, **analyze(compiled, cpu_s, wall_s, trace_s)}
    program["outside_state"] = 0
    param_bytes = sum(s.size * s.dtype.itemsize for s in jax.tree.leaves(like))
    return {"programs": [program], "param_bytes": int(param_bytes)}


# ----------------------------------------------------------------------------------------------
# ours: every graph the backend compiles, captured and compiled for the target


@dataclasses.dataclass
class Captured:
    """One functional ATen graph AOTAutograd handed the backend, and what the backend knew."""

    gm: Any
    kind: str
    static_positions: tuple[int, ...]
    saved_positions: tuple[int, ...]


@contextlib.contextmanager
def capturing():
    """Record every graph ``backend="tpu"`` would lower, and run it in torch instead.

    Until the compile-only TPU target exists in the backend itself, this replaces
    ``tpu_inductor.backend.compile_graph``: the graphs are exactly those the backend lowers
    (same AOTAutograd configuration), and they run as torch ATen graphs on the CPU, so the
    training step proceeds (AOTAutograd compiles the backward at the first backward call)
    without compiling anything for the CPU.
    """
    from functorch.compile import make_boxed_func

    from tpu_inductor import backend, capture

    graphs: list[Captured] = []
    original = backend.compile_graph

    def recording(gm, opts, device, *, kind="inference", static_positions=()):
        n_out = len(next(n for n in reversed(gm.graph.nodes) if n.op == "output").args[0])
        saved = capture.saved_output_positions(n_out) if kind == "forward" else ()
        graphs.append(Captured(gm, kind, tuple(static_positions), tuple(saved)))
        return make_boxed_func(gm)

    backend.compile_graph = recording
    try:
        yield graphs
    finally:
        backend.compile_graph = original


def compile_captured(c: Captured, target: Target, precision: str) -> tuple[dict, Any]:
    """Lower one captured graph for the target and compile it with the inputs the backend
    donates off CPU (the inputs the graph overwrites)."""
    import jax
    import jax.numpy as jnp
    import torch
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    from tpu_inductor.devices import compiler_options
    from tpu_inductor.dtypes import to_jax_dtype
    from tpu_inductor.lower import lower_graph

    with unset_fake_temporarily():
        lowered = lower_graph(c.gm, precision=precision, platform=target.platform)
        args, static = [], []
        for i, meta in enumerate(lowered.input_metas):
            if i in lowered.tensor_inputs:
                args.append(target.struct(meta.shape, to_jax_dtype(meta.dtype)))
            else:
                args.append(int(meta) if isinstance(meta, int | torch.SymInt) else meta)
                static.append(i + 1)
        seed = target.struct((2,), jnp.uint32) if lowered.has_rng else None
        donate = tuple(m.input_index + 1 for m in lowered.mutations)
        jitted = jax.jit(lowered.fn, static_argnums=tuple(static), donate_argnums=donate)
        with jax.enable_x64(True):
            compiled, cpu_s, wall_s, trace_s = compile_jitted(
                jitted, [seed, *args], compiler_options(target.platform, c.kind)
            )
    return analyze(compiled, cpu_s, wall_s, trace_s), lowered


def _nbytes(meta) -> int:
    import torch

    if not isinstance(meta, torch.Tensor):
        return 0
    return meta.numel() * meta.element_size()


def _state_bytes_in_args(c: Captured, lowered, forward: tuple | None) -> int:
    """Bytes of a program's arguments that are model/optimizer state (parameters, buffers, the
    inputs it updates in place, parameters the forward saved as they are for the backward)."""
    metas = lowered.input_metas
    state = set(c.static_positions) | {m.input_index for m in lowered.mutations}
    if c.kind == "backward" and forward is not None:
        fw_captured, fw_lowered = forward
        for j, pos in enumerate(fw_captured.saved_positions):
            plan = fw_lowered.output_plan[pos]
            if plan[0] == "input" and plan[1] in fw_captured.static_positions and j < len(metas):
                state.add(j)
    return sum(_nbytes(metas[i]) for i in state if i < len(metas))


def _torch_workload(model_name: str, small: bool, dtype):
    """The transformers model, its batch, and the training loss / inference call on it."""
    import torch
    import transformers

    from benchmarks import hand_llama, hand_vit

    sizes, batch = SIZES[model_name][small], BATCH[model_name][small]
    torch.manual_seed(0)
    if model_name == "llama":
        config = hand_llama.LlamaSizes(**sizes).hf_config()
        model = transformers.LlamaForCausalLM(config).to(dtype)
        ids = torch.randint(0, sizes["vocab"], batch)
        return model, (lambda m: m(ids, labels=ids).loss), (lambda m: m(ids))
    spec = hand_vit.ViTSizes(**sizes)
    model = transformers.ViTForImageClassification(spec.hf_config()).to(dtype)
    pixels = torch.randn(batch[0], spec.channels, spec.image, spec.image, dtype=dtype)
    labels = torch.randint(0, spec.labels, batch)
    return model, (lambda m: m(pixel_values=pixels, labels=labels).loss), (lambda m: m(pixels))


def run_ours(workload: str, variant: str, small: bool, target: Target, options: dict) -> dict:
    import torch

    model_name, kind, dtype_name = parse_workload(workload)
    dtype = {"f32": torch.float32, "bf16": torch.bfloat16}[dtype_name]
    model, loss_of, infer = _torch_workload(model_name, small, dtype)
    param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    compile_kw = {"backend": "tpu", "options": {"device": "cpu", **options} or None}
    t0 = time.perf_counter()
    steps: list[int] = []  # how many graphs were captured when each step began
    with capturing() as graphs:
        if kind == "infer":
            model.eval()
            compiled = torch.compile(model, **compile_kw)
            with torch.no_grad():
                infer(compiled)
            state_bytes = param_bytes
        else:
            model.train()
            opt = torch.optim.AdamW(model.parameters())
            step = _train_step(variant, model, opt, compile_kw, loss_of)
            for _ in range(2):  # the second step runs with the optimizer state in place
                steps.append(len(graphs))
                step()
            state_bytes = param_bytes + sum(
                t.numel() * t.element_size()
                for s in opt.state.values()
                for t in s.values()
                if isinstance(t, torch.Tensor)
            )
    frontend_s = time.perf_counter() - t0
    # Each Dynamo graph compiles once; a graph compiled again (a recompile) replaces its first.
    programs, by_kind_forward = [], None
    precision = options.get("matmul_precision") or torch.get_float32_matmul_precision()
    for c in _latest_graphs(graphs, steps):
        log(f"  compiling {c.kind} graph ({len(c.gm.graph.nodes)} nodes) for {target.name}")
        figures, lowered = compile_captured(c, target, precision)
        in_args = _state_bytes_in_args(c, lowered, by_kind_forward)
        if c.kind == "forward":
            by_kind_forward = (c, lowered)
        programs.append(
            {
                "name": c.kind,
                "kind": c.kind,
                "nodes": len(c.gm.graph.nodes),
                **figures,
                "outside_state": max(0, state_bytes - in_args),
            }
        )
    return {"programs": programs, "param_bytes": int(param_bytes), "frontend_s": frontend_s}


def _latest_graphs(graphs: list[Captured], steps: list[int]) -> list[Captured]:
    """The graphs the last training step runs: for each kind of graph, those compiled during
    the latest step that compiled any of that kind (the first step of a one-program step
    compiles a graph that also creates the optimizer state; the second one, the steady state)."""
    step_of = [sum(1 for s in steps if s <= i) for i in range(len(graphs))]
    last = {}
    for c, s in zip(graphs, step_of, strict=True):
        last[c.kind] = max(last.get(c.kind, 0), s)
    return [c for c, s in zip(graphs, step_of, strict=True) if s == last[c.kind]]


def _train_step(variant: str, model, opt, compile_kw: dict, loss_of):
    """The user's training step: ``3prog`` compiles the model and ``opt.step`` (forward,
    backward and AdamW programs), ``1prog`` the whole step (``tpu_inductor.compile_step``)."""
    import torch

    if variant == "3prog":
        cmodel = torch.compile(model, **compile_kw)
        cstep = torch.compile(opt.step, **compile_kw)

        def step():
            loss = loss_of(cmodel)
            loss.backward()
            cstep()
            opt.zero_grad()
            return loss.detach()

        return step
    if variant == "1prog":
        import tpu_inductor

        def train_step():
            loss = loss_of(model)
            loss.backward()
            opt.step()
            opt.zero_grad()
            return loss.detach()

        return tpu_inductor.compile_step(
            train_step, opt, options=compile_kw["options"], fullgraph=True
        )
    raise ValueError(f"unknown variant {variant!r}")


# ----------------------------------------------------------------------------------------------
# Totals, ratios, the run


def totals(result: dict) -> dict:
    """Per-step figures: sums over the step's programs; the HBM peak is the largest program's
    peak plus the state living beside it."""
    programs = result["programs"]
    return {
        "programs": len(programs),
        "bytes": sum(p["bytes"] for p in programs),
        "flops": sum(p["flops"] for p in programs),
        "hbm_peak": max(p["hbm_peak"] + p["outside_state"] for p in programs),
        "compile_cpu_s": sum(p["compile_cpu_s"] for p in programs),
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
    return out


def apply_levers(levers: dict[str, Any]) -> None:
    """Set ``tpu_inductor.<module>.<NAME> = value`` for each ``"module.NAME": value``."""
    import importlib

    for key, value in levers.items():
        module, name = key.rsplit(".", 1)
        mod = importlib.import_module(f"tpu_inductor.{module}")
        if not hasattr(mod, name):
            raise ValueError(f"--levers: tpu_inductor.{module} has no {name}")
        setattr(mod, name, value)


def run_one(args: argparse.Namespace) -> dict:
    """One (workload, contender) in this process."""
    import jax

    jax.config.update("jax_platforms", "cpu") if args.target != "cpu" else None
    target = Target.make(args.target)
    options = json.loads(args.options) if args.options else {}
    apply_levers(json.loads(args.levers) if args.levers else {})
    if args.save_hlo:
        global SAVE_HLO
        SAVE_HLO = Path(args.save_hlo) / f"{args.workload}-{args.contender}"
    if args.contender == "hand":
        return run_hand(args.workload, args.small, target)
    variant = args.contender.removeprefix("ours-")
    if parse_workload(args.workload)[1] == "infer" and variant != "3prog":
        return {"skipped": "inference is one program already"}
    return run_ours(args.workload, variant, args.small, target, options)


def _subprocess(args: argparse.Namespace, workload: str, contender: str) -> dict:
    cmd = [
        sys.executable,
        "-m",
        "benchmarks.tpu_programs",
        "--one",
        "--workload",
        workload,
        "--contender",
        contender,
        "--target",
        args.target,
    ]
    if args.small:
        cmd.append("--small")
    if args.options:
        cmd += ["--options", args.options]
    if args.levers:
        cmd += ["--levers", args.levers]
    if args.save_hlo:
        cmd += ["--save-hlo", args.save_hlo]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [env.get("PYTHONPATH", "")]).rstrip(
        os.pathsep
    )
    if args.target != "cpu":
        env["JAX_PLATFORMS"] = "cpu"
        # libtpu takes a machine-wide lock file by default; compile-only processes (ours, other
        # sessions') never touch a chip, so several may load it at once.
        env.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    proc = subprocess.run(
        cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=args.timeout_s
    )
    sys.stderr.write(
        "".join(line + "\n" for line in proc.stderr.splitlines() if line.startswith("  "))
    )
    if proc.returncode != 0:
        return {"error": proc.stderr[-4000:]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def conditions(argv: list[str]) -> dict:
    """What the numbers depend on: the command, the machine, its load, the versions."""
    import platform

    import jax
    import torch

    try:
        load = os.getloadavg()
    except OSError:
        load = None
    versions = {"torch": torch.__version__, "jax": jax.__version__}
    try:
        from importlib.metadata import version

        versions["libtpu"] = version("libtpu")
    except Exception:
        pass
    return {
        "command": "python -m benchmarks.tpu_programs " + " ".join(argv),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "cpu_count": os.cpu_count(),
        "machine": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "load_before": load,
        "versions": versions,
    }


def _same_hand(earlier: dict | None, workload: str, small: bool) -> bool:
    """Whether ``earlier`` has the hand-written row of ``workload`` at the same sizes."""
    if not earlier or "hand" not in earlier["rows"].get(workload, {}):
        return False
    model = parse_workload(workload)[0]
    sizes = earlier["sizes"].get(model, earlier["sizes"])  # older files: the Llama's alone
    return sizes == SIZES[model][small] and earlier.get("small") == small


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--small", action="store_true", help="tiny sizes (tests, CI)")
    p.add_argument("--target", default="v5e:2x2", help="a libtpu topology, or 'cpu'")
    p.add_argument("--only", default=",".join(WORKLOADS), help="workloads, comma-separated")
    p.add_argument("--contenders", default=",".join(CONTENDERS))
    p.add_argument("--options", default="", help="backend options for ours, as JSON")
    p.add_argument(
        "--levers",
        default="",
        help='internal switches for ours, as JSON {"module.NAME": value} under tpu_inductor '
        '(e.g. {"capture.PARTITIONER": "default"}), to measure a lever before/after',
    )
    p.add_argument(
        "--hand-from",
        default="",
        help="take the hand-written rows from this earlier results file (same sizes and "
        "target) instead of compiling them again",
    )
    p.add_argument("--out-dir", default=str(RESULTS))
    p.add_argument("--save-hlo", default="", help="write each program's optimized HLO here")
    p.add_argument("--name", default=None, help="results file name (default tpu-programs)")
    p.add_argument("--timeout-s", type=float, default=3600.0)
    p.add_argument("--in-process", action="store_true", help="no subprocesses (tests)")
    p.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--workload", help=argparse.SUPPRESS)
    p.add_argument("--contender", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.one:
        print(json.dumps(run_one(args)))
        return 0
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    name = args.name or ("tpu-programs-small" if args.small else "tpu-programs")
    data: dict[str, Any] = {
        "conditions": conditions(argv),
        "target": args.target,
        "small": args.small,
        "sizes": {m: SIZES[m][args.small] for m in SIZES},
        "batch": {m: BATCH[m][args.small] for m in BATCH},
        "options": json.loads(args.options) if args.options else {},
        "levers": json.loads(args.levers) if args.levers else {},
        "rows": {},
    }
    earlier = json.loads(Path(args.hand_from).read_text()) if args.hand_from else None
    if earlier is not None and earlier["target"] != data["target"]:
        raise SystemExit(f"--hand-from {args.hand_from}: another target")
    for workload in [w for w in args.only.split(",") if w]:
        for contender in [c for c in args.contenders.split(",") if c]:
            log(f"{workload} / {contender} ...")
            t0 = time.perf_counter()
            if contender == "hand" and _same_hand(earlier, workload, args.small):
                res = dict(earlier["rows"][workload]["hand"], reused_from=args.hand_from)
                data["rows"].setdefault(workload, {})[contender] = res
                continue
            if args.in_process:
                one = argparse.Namespace(**{**vars(args), "workload": workload})
                one.contender = contender
                res = run_one(one)
            else:
                res = _subprocess(args, workload, contender)
            if "skipped" in res:
                continue
            res["wall_s"] = time.perf_counter() - t0
            data["rows"].setdefault(workload, {})[contender] = res
            if "error" in res:
                log(f"  failed: {res['error'][-600:]}")
            data["derived"] = derive(data["rows"])
            (out_dir / f"{name}.json").write_text(json.dumps(data, indent=1) + "\n")
    try:
        data["conditions"]["load_after"] = os.getloadavg()
    except OSError:
        pass
    data["derived"] = derive(data["rows"])
    (out_dir / f"{name}.json").write_text(json.dumps(data, indent=1) + "\n")
    print(table(data))
    plot(data, out_dir / f"{name}.png")
    return 0


def _mb(x: float) -> str:
    return f"{x / 1e6:,.1f}"


def table(data: dict) -> str:
    """A Markdown table: per workload and contender, the step's figures and ours/hand."""
    lines = [
        "| workload | program(s) | bytes accessed (MB) | GFLOP | HBM peak (MB) | "
        "TPU compile CPU s | top-level copies | ours/hand: bytes, FLOPs, HBM, compile |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for workload, by in data["rows"].items():
        for contender, res in by.items():
            if "error" in res:
                lines.append(f"| {workload} | {contender}: failed | | | | | | |")
                continue
            t = totals(res)
            r = data.get("derived", {}).get(workload, {}).get(contender)
            ratios = ", ".join(f"{r[k]:.2f}x" for k in RATIO_KEYS) if r else "(reference)"
            lines.append(
                f"| {workload} | {contender} ({t['programs']}) | {_mb(t['bytes'])} | "
                f"{t['flops'] / 1e9:.2f} | {_mb(t['hbm_peak'])} | {t['compile_cpu_s']:.1f} | "
                f"{t['copies']} | {ratios} |"
            )
    return "\n".join(lines)


def plot(data: dict, path: Path) -> None:
    """Bars of ours / hand per workload and figure; nothing without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    derived = data.get("derived", {})
    groups = [(w, c) for w, by in derived.items() for c in by]
    if not groups:
        return
    labels = {"bytes": "bytes accessed", "flops": "FLOPs", "hbm_peak": "HBM peak",
              "compile_cpu_s": "compile CPU s"}  # fmt: skip
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(groups)), 4))
    width = 0.8 / len(RATIO_KEYS)
    for k, key in enumerate(RATIO_KEYS):
        xs = [i + (k - (len(RATIO_KEYS) - 1) / 2) * width for i in range(len(groups))]
        ax.bar(xs, [derived[w][c][key] for w, c in groups], width, label=labels[key])
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.axhline(1.1, color="grey", linewidth=0.8, linestyle="--")
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels([f"{w}\n{c}" for w, c in groups], fontsize=8)
    ax.set_ylabel("ours / hand-written JAX")
    where = "v5e (deviceless)" if data["target"] != "cpu" else "XLA:CPU"
    size = "small" if data["small"] else "Llama 512x4, batch 4x256"
    ax.set_title(f"TPU programs vs hand-written JAX: {data['target']} {where}, {size}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())

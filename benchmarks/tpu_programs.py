"""Our TPU programs against hand-written JAX: ``python -m benchmarks.tpu_programs``.

Compiles for a TPU topology, without a TPU (libtpu's compiler on compile-only topology devices;
nothing runs), the programs of a training step and an inference forward of
``transformers.LlamaForCausalLM`` (SDPA attention), ``BertForMaskedLM`` and timm's bottleneck
``ResNet`` (BatchNorm) and of a ``ViTForImageClassification`` training step (the models, sizes
and batches: ``benchmarks/tpu_workloads.py``), two ways, and reads XLA's own analysis of each:

- **hand**: the same model written directly in JAX (``benchmarks/hand_llama.py``,
  ``hand_vit.py``, ``hand_bert.py``, ``hand_resnet.py``): the training step (forward, backward,
  AdamW; BatchNorm's running statistics) as ONE jitted program with parameters, optimizer state
  (and running statistics) donated; the Llama's inference forward returns the logits and the KV
  cache HF returns;
- **ours**: what ``torch.compile(..., backend="tpu", options={"target": ...})`` compiles for the
  user's code (``tpu_inductor.tpu.programs`` records each program). ``3prog``: the model and
  ``opt.step`` compiled separately (forward, backward and AdamW programs); ``1prog``: the whole
  step compiled as one function with ``tpu_inductor.compile_step`` (one program);
- **hand-2prog** / **hand-3prog** (not run by default): the hand-written step split as a split
  step is (loss and gradients, then AdamW; or forward, backward, AdamW): what a split costs.

Per program and per step (summed over its programs): XLA's "bytes accessed" and FLOPs
(``cost_analysis``); the HBM peak (XLA's buffer assignment's HBM bytes, i.e. arguments +
outputs - aliased + temporaries, plus code: ``tpu_inductor.tpu.programs.compile_measured``;
plus, for a step split into programs, the parameters and optimizer state
that stay on the chip beside a program without being its arguments); the compile's CPU seconds
(hand: tracing, lowering and the TPU compile; ours: everything from the user's call: Dynamo,
AOTAutograd, our lowering and the TPU compile); the optimized HLO's top-level copies. Ratios are
ours / hand from one run; each contender compiles in a process of its own (a crash of the TPU
compiler is recorded as the row's ``"crashed"`` signal, not the end of the run).

``--small`` uses tiny sizes (tests, CI). libtpu must be installed (``pip install -e '.[tpu]'``;
here the interpreter ``/work/tpuenv/bin/python```).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import paths, tpu_analysis
from benchmarks.tpu_analysis import _state_in, analyze, compile_jitted, hlo_summary
from benchmarks.tpu_workloads import (
    BATCH,
    RATIO_KEYS,
    ROOT,
    SIZES,
    WORKLOADS,
    derive,
    describe,
    hand_program,
    parse_workload,
    torch_workload,
    totals,
    workload_name,
)

CONTENDERS = ("hand", "ours-3prog", "ours-1prog")
# Also measurable: "hand-3prog", the hand-written step split into three programs as ours is
# (jax.vjp's residuals handed over), and "hand-2prog", its loss and gradients as one program and
# AdamW as another (_hand_split): what a split costs a hand-written step.


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------------------------
# Targets and program analysis


@dataclasses.dataclass
class Target:
    """A libtpu topology's first chip, for the hand-written programs (compile only)."""

    name: str
    device: Any

    @classmethod
    def make(cls, name: str) -> Target:
        from tpu_inductor.tpu.targets import tpu_target

        return cls(name, tpu_target(name).devices[0])

    def struct(self, shape, dtype):
        import jax
        from jax.sharding import SingleDeviceSharding

        return jax.ShapeDtypeStruct(tuple(shape), dtype, sharding=SingleDeviceSharding(self.device))

    def place(self, tree):
        """A pytree of ShapeDtypeStructs, each placed on the target's device."""
        import jax

        return jax.tree.map(lambda s: self.struct(s.shape, s.dtype), tree)


# ----------------------------------------------------------------------------------------------
# hand: the hand-written JAX programs


def run_hand(workload: str, small: bool, target: Target, variant: str = "1prog") -> dict:
    import jax

    jitted, args, name, like = hand_program(workload, small, target.struct)
    param_bytes = sum(s.size * s.dtype.itemsize for s in jax.tree.leaves(like))
    if variant != "1prog":  # the split hand step: Llama and ViT training only (no BN stats)
        from benchmarks.hand_split import split_step
        from benchmarks.tpu_workloads import spec

        M, sizes = spec(parse_workload(workload)[0], small)
        params, state, *inputs = args
        return split_step(M, sizes, target, params, state, tuple(inputs), int(param_bytes), variant)
    compiled, cpu_s, wall_s, spaces = compile_jitted(jitted, args)
    kind = parse_workload(workload)[1]
    program = {"name": name, "kind": kind, **analyze(compiled, spaces), "compile_wall_s": wall_s}
    program["outside_state"] = 0
    # Tracing, lowering and the TPU compile: what a JAX user waits for.
    return {"programs": [program], "param_bytes": int(param_bytes), "compile_cpu_s": cpu_s}


# ----------------------------------------------------------------------------------------------
# ours: the programs torch.compile(..., backend="tpu", options={"target": ...}) compiles


def run_ours(workload: str, variant: str, small: bool, target: str, options: dict) -> dict:
    """Compile the workload's step with ``options={"target": target}`` (compile only: nothing
    runs) and read each program the backend recorded (``tpu_inductor.tpu.programs.PROGRAMS``)."""
    import collections

    import torch

    import tpu_inductor
    from tpu_inductor.core.dtypes import to_jax_dtype
    from tpu_inductor.tpu import programs as recorded

    model_name, kind, dtype_name = parse_workload(workload)
    dtype = {"f32": torch.float32, "bf16": torch.bfloat16}[dtype_name]
    model, loss_of, infer = torch_workload(model_name, small, dtype)
    param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    compile_kw = {"backend": "tpu", "options": {"target": target, **options}}
    torch._dynamo.reset()
    tpu_inductor.reset()
    marks: list[int] = []  # how many programs were recorded when each call began
    cpu: list[float] = []  # each call's CPU seconds: Dynamo, AOTAutograd, lowering, TPU compile

    def timed(fn) -> None:
        marks.append(len(recorded.PROGRAMS))
        c0 = time.process_time()
        fn()
        cpu.append(time.process_time() - c0)

    # BatchNorm's running statistics: state a program reads (and a training step updates)
    buffers = [b for b in model.buffers() if b.is_floating_point()]
    t0 = time.perf_counter()
    if kind == "infer":
        model.eval()
        compiled = torch.compile(model, **compile_kw)
        with torch.no_grad():
            timed(lambda: infer(compiled))
        state = list(model.parameters()) + buffers
    else:
        model.train()
        opt = torch.optim.AdamW(model.parameters())
        step = _train_step(variant, model, opt, compile_kw, loss_of)
        for _ in range(2):  # the second step runs with the optimizer state in place
            timed(step)
        state = (
            list(model.parameters())
            + buffers
            + [t for st in opt.state.values() for t in st.values() if isinstance(t, torch.Tensor)]
        )
    frontend_s = time.perf_counter() - t0
    chosen, calls = _step_programs(list(recorded.PROGRAMS), marks)
    failed = [p for p in chosen if not p.compiled]
    if failed:
        raise RuntimeError("; ".join(f"{p.name}: {p.error}" for p in failed))
    state_shapes = collections.Counter(
        (tuple(t.shape), str(np.dtype(to_jax_dtype(t.dtype)))) for t in state
    )
    state_bytes = sum(t.numel() * t.element_size() for t in state)
    programs = []
    for p in chosen:
        m = p.memory
        summary = hlo_summary(p.hlo_text)
        programs.append(
            {
                "name": p.name,
                "kind": p.role,
                "bytes": p.bytes_accessed,
                "hbm_bytes": p.hbm_traffic,
                "flops": p.flops,
                "hbm_peak": int(p.peak_bytes),
                "arguments": m["argument"],
                "outputs": m["output"],
                "aliased": m["alias"],
                "temp": m["temp"],
                "vmem": m.get("vmem", 0),
                "compile_wall_s": p.compile_seconds,
                "copies": summary["ops"].get("copy", 0),
                "copy_bytes": summary["copy_bytes"],
                "fusions": summary["ops"].get("fusion", 0),
                "outside_state": max(0, state_bytes - _state_in(p.inputs, state_shapes)),
            }
        )
        if tpu_analysis.SAVE_HLO is not None:
            tpu_analysis.SAVE_HLO.mkdir(parents=True, exist_ok=True)
            (tpu_analysis.SAVE_HLO / f"{p.name}.hlo.txt").write_text(p.hlo_text)
    return {
        "programs": programs,
        "param_bytes": int(param_bytes),
        "frontend_s": frontend_s,
        # Everything from the user's call to the compiled programs: Dynamo, AOTAutograd, our
        # lowering and the TPU compile of the calls that compiled the step's programs.
        "compile_cpu_s": sum(cpu[i] for i in sorted(calls)),
    }


def _step_programs(programs: list, marks: list[int]) -> tuple[list, set[int]]:
    """The programs the last call runs, and the calls that compiled them: per role (forward,
    backward, optimizer, inference), those compiled by the latest call that compiled that role
    (a one-program step whose optimizer makes its state lazily, SGD with dampening, compiles a
    state-creating program first and the steady one at its second call; a split step compiles
    all three programs in its first)."""
    call_of = [sum(1 for m in marks if m <= i) - 1 for i in range(len(programs))]
    last: dict[str, int] = {}
    for p, c in zip(programs, call_of, strict=True):
        last[p.role] = max(last.get(p.role, 0), c)
    chosen = [p for p, c in zip(programs, call_of, strict=True) if c == last[p.role]]
    return chosen, {last[p.role] for p in chosen}


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


def apply_levers(levers: dict[str, Any]) -> None:
    """Patch ``tpu_inductor.config`` with ``{knob: value}`` for the rest of this process (a
    benchmark's process measures one setting)."""
    import tpu_inductor

    tpu_inductor.config.patch(levers).__enter__()


def set_layers(layers: int, small: bool) -> None:
    """Give the transformers (not the ResNet, whose blocks are per stage) ``layers`` layers."""
    for model in ("llama", "vit", "bert"):
        sizes = list(SIZES[model])
        sizes[small] = {**sizes[small], "layers": layers}
        SIZES[model] = tuple(sizes)


def run_one(args: argparse.Namespace) -> dict:
    """One (workload, contender) in this process."""
    options = json.loads(args.options) if args.options else {}
    apply_levers(json.loads(args.levers) if args.levers else {})
    if args.save_hlo:
        tpu_analysis.SAVE_HLO = Path(args.save_hlo) / f"{args.workload}-{args.contender}"
    if args.contender.startswith("hand"):
        variant = args.contender.removeprefix("hand").removeprefix("-") or "1prog"
        if variant != "1prog" and parse_workload(args.workload)[1] == "infer":
            return {"skipped": "inference is one program already"}
        return run_hand(args.workload, args.small, Target.make(args.target), variant)
    variant = args.contender.removeprefix("ours-")
    if parse_workload(args.workload)[1] == "infer" and variant != "3prog":
        return {"skipped": "inference is one program already"}
    return run_ours(args.workload, variant, args.small, args.target, options)


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
    if args.layers:
        cmd += ["--layers", str(args.layers)]
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
    env.setdefault("JAX_PLATFORMS", "cpu")  # a compile-only run needs no TPU
    proc = subprocess.run(
        cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=args.timeout_s
    )
    sys.stderr.write(
        "".join(line + "\n" for line in proc.stderr.splitlines() if line.startswith("  "))
    )
    if proc.returncode < 0:  # killed by a signal: libtpu's SIGSEGV on ResNet's backward
        sig = signal.Signals(-proc.returncode).name
        return {"error": proc.stderr[-4000:], "crashed": sig}
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


def _merge_earlier(data: dict, path: Path, now: list[str]) -> None:
    """``--merge``: copy into ``data`` the rows of ``path`` (an earlier run) whose workloads this
    run does not measure, where the target, the mode and the model's sizes are the same; each
    workload kept records the earlier run's conditions in ``data["earlier"]``."""
    if not path.exists():
        return
    old = json.loads(path.read_text())
    if old["target"] != data["target"] or old.get("small") != data["small"]:
        raise SystemExit(f"--merge {path}: another target or mode")
    for workload, by in old["rows"].items():
        model = parse_workload(workload)[0]
        if workload in now or old["sizes"].get(model) != data["sizes"][model]:
            continue
        if list(old["batch"].get(model, ())) != list(data["batch"][model]):
            continue
        data["rows"][workload] = by
        kept = old.get("earlier", {}).get(workload, old["conditions"])
        data.setdefault("earlier", {})[workload] = kept


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--small", action="store_true", help="tiny sizes (tests, CI)")
    p.add_argument("--target", default="v5e:2x2", help="a TPU topology (libtpu compiles it)")
    p.add_argument(
        "--layers",
        type=int,
        default=0,
        help="the Llama's, ViT's and BERT's layer count instead of the workload's (reading a "
        "lever in one layer's HLO compiles in a fraction of the time; ratios then differ)",
    )
    p.add_argument("--only", default=",".join(WORKLOADS), help="workloads, comma-separated")
    p.add_argument("--contenders", default=",".join(CONTENDERS))
    p.add_argument("--options", default="", help="backend options for ours, as JSON")
    p.add_argument(
        "--levers",
        default="",
        help='knobs for ours, as JSON {"name": value} (tpu_inductor.list_options(); e.g. '
        '{"partitioner": "default"}), to measure a lever before/after',
    )
    p.add_argument(
        "--hand-from",
        default="",
        help="take the hand-written rows from this earlier results file (same sizes and "
        "target) instead of compiling them again",
    )
    paths.add_results_option(p, "--out-dir", dest="out_dir")
    p.add_argument(
        "--merge",
        action="store_true",
        help="keep the rows of workloads not run now from the results file this run writes "
        "(same target and sizes), each with the conditions of the run that measured it",
    )
    p.add_argument("--save-hlo", default="", help="write each program's optimized HLO here")
    p.add_argument("--name", default=None, help="results file name (default tpu-programs)")
    p.add_argument("--timeout-s", type=float, default=3600.0)
    p.add_argument("--in-process", action="store_true", help="no subprocesses (tests)")
    p.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--workload", help=argparse.SUPPRESS)
    p.add_argument("--contender", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    sizes = dict(SIZES)
    try:
        if args.layers:
            set_layers(args.layers, args.small)
        return _main(args, argv)
    finally:
        SIZES.update(sizes)  # --layers in-process (tests) leaves the sizes as they were


def _main(args: argparse.Namespace, argv: list[str]) -> int:
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
    if args.merge:
        _merge_earlier(data, out_dir / f"{name}.json", args.only.split(","))
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


def _failed(res: dict) -> str:
    return f"crashed ({res['crashed']})" if "crashed" in res else "failed"


def _mb(x: float) -> str:
    return f"{x / 1e6:,.1f}"


def _hbm_mb(t: dict) -> str:
    return "-" if t["hbm_bytes"] is None else _mb(t["hbm_bytes"])


def _hbm_ratio(r: dict | None) -> str:
    return f"{r['hbm_bytes']:.2f}x" if r and "hbm_bytes" in r else "-"


def table(data: dict) -> str:
    """A Markdown table: per workload and contender, the step's figures and ours/hand."""
    lines = [
        "| workload | program(s) | bytes accessed (MB) | HBM traffic (MB) | GFLOP | "
        "HBM peak (MB) | TPU compile CPU s | top-level copies | "
        "ours/hand: bytes, FLOPs, HBM, compile | ours/hand: HBM traffic |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for workload, by in data["rows"].items():
        for contender, res in by.items():
            if "error" in res:
                lines.append(f"| {workload} | {contender}: {_failed(res)} | | | | | | | | |")
                continue
            t = totals(res)
            r = data.get("derived", {}).get(workload, {}).get(contender)
            ratios = ", ".join(f"{r[k]:.2f}x" for k in RATIO_KEYS) if r else "(reference)"
            lines.append(
                f"| {workload} | {contender} ({t['programs']}) | {_mb(t['bytes'])} | "
                f"{_hbm_mb(t)} | {t['flops'] / 1e9:.2f} | {_mb(t['hbm_peak'])} | "
                f"{t['compile_cpu_s']:.1f} | {t['copies']} | {ratios} | {_hbm_ratio(r)} |"
            )
    return "\n".join(lines)


README_START = (
    "<!-- tpu-programs:start -->"  # the block of tpu-programs.json; tpu-programs-small.json
)
README_END = "<!-- tpu-programs:end -->"  # has its own (tpu-programs-small:start ...)
CONTENDER_NAMES = {
    "hand": "hand-written JAX (1 jitted program)",
    "ours-3prog": "ours, model + `opt.step` compiled apart",
    "ours-1prog": "ours, `tpu_inductor.compile_step`",
}


def _load(values) -> str:
    return "n/a" if not values else f"{values[0]:.1f}"


def readme_block(
    data: dict,
    levers: dict | None,
    rel_json: str,
    rel_png: str | None,
    markers: tuple[str, str] = (README_START, README_END),
) -> str:
    """docs/performance.md's TPU-programs block, from a results file (and the levers file)."""
    start, end = markers
    c = data["conditions"]
    v = c["versions"]
    lines = [
        start,
        f"<!-- Written by python -m benchmarks.docs from {rel_json}; do not edit by hand. -->",
        "",
        f"Target {data['target']} (one chip), compile only (libtpu {v.get('libtpu', '?')}, "
        f"jax {v['jax']}, torch {v['torch']}); {c['cpu_count']} CPUs ({c['processor']}, "
        f"{c['machine']}), load avg {_load(c.get('load_before'))} at start and "
        f"{_load(c.get('load_after'))} at the end (shared with other jobs); {c['date']}.",
        "",
        f"Command: `{c['command']}`.",
        "",
        f"Models: {describe(_measured(data['sizes'], data['rows']), data['batch'])}. "
        "float32 matmuls and convolutions at HIGHEST on both sides. "
        "Bytes and FLOPs are XLA's `cost_analysis` of each program, summed over a step's "
        "programs; HBM traffic is what those programs' top-level ops read from and write to "
        "HBM (`tpu_inductor.tpu.hlo.hbm_bytes`: bytes accessed without the values XLA keeps "
        "in on-chip memory, and each prefetch into it counted once; rows measured before "
        "2026-12-07 lack it); HBM peak is the HBM of XLA's buffer assignment (arguments + "
        "outputs - donated + temporaries) + code, on-chip VMEM not counted (rows measured before "
        "2026-12-06 took `memory_analysis`, which counts VMEM for some programs); for a split "
        "step, the largest program's plus the state it leaves on the chip; "
        "compile is CPU seconds (hand: tracing, lowering and TPU compile; ours: the whole call, "
        "Dynamo, AOTAutograd, lowering and TPU compile). Ratios are ours / hand-written. "
        "`--hand-from` reuses hand-written rows of an earlier run of the same sizes and target.",
        "",
        *_earlier_lines(data),
        "| workload | contender | programs | bytes accessed | HBM traffic | GFLOP | HBM peak "
        "| compile CPU s | top-level copies | bytes | HBM traffic | FLOPs | HBM | compile |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for workload, by in data["rows"].items():
        for contender, res in by.items():
            name = workload_name(workload)
            who = CONTENDER_NAMES.get(contender, contender)
            if "-infer-" in f"-{workload}" and contender != "hand":
                who = "ours, `torch.compile(model)`"
            if "error" in res:
                lines.append(f"| {name} | {who} | {_failed(res)} | | | | | | | | | | | |")
                continue
            t = totals(res)
            r = data.get("derived", {}).get(workload, {}).get(contender)
            ratios = [f"{r[k]:.2f}x" for k in RATIO_KEYS] if r else ["-"] * 4
            ratios.insert(1, _hbm_ratio(r))
            hbm = "-" if t["hbm_bytes"] is None else f"{_hbm_mb(t)} MB"
            lines.append(
                f"| {name} | {who} | {t['programs']} | {_mb(t['bytes'])} MB | {hbm} | "
                f"{t['flops'] / 1e9:.1f} | {_mb(t['hbm_peak'])} MB | {t['compile_cpu_s']:.0f} | "
                f"{t['copies']} | " + " | ".join(ratios) + " |"
            )
    if levers and levers.get("steps"):
        from benchmarks import tpu_levers

        first = levers["steps"][0]["conditions"]
        lines += [
            "",
            "Each lever, cumulative, on the Llama training step (ours / hand-written: bytes "
            "accessed, FLOPs, HBM peak, compile CPU s). `python -m benchmarks.tpu_levers` "
            "compiles the backend as it was at each lever's commit of branch issue22 "
            f"({levers['target']}, {first['date']}, load avg {_load(first.get('load_before'))} "
            "at start; compile ratios on a loaded machine are +-20%):",
            "",
            tpu_levers.table(levers["steps"]),
        ]
    if rel_png:
        lines += ["", f"![ours / hand-written JAX per figure]({rel_png})"]
    lines += ["", end]
    return "\n".join(lines)


def _measured(sizes: dict, rows: dict) -> dict:
    """The sizes of the models that have rows."""
    models = {parse_workload(w)[0] for w in rows}
    return {m: s for m, s in sizes.items() if m in models}


def _earlier_lines(data: dict) -> list[str]:
    """Which rows an earlier run measured (``--merge``), with its command, date and load."""
    runs: dict[str, list[str]] = {}
    conds = {}
    for workload, c in data.get("earlier", {}).items():
        runs.setdefault(c["date"], []).append(workload)
        conds[c["date"]] = c
    lines = []
    for date, workloads in runs.items():
        c = conds[date]
        lines.append(
            f"Rows {', '.join(workloads)}: from an earlier run ({date}, load avg "
            f"{_load(c.get('load_before'))} at start, `{c['command']}`)."
        )
    return lines + [""] if lines else []


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
    where = "compile only"
    size = "small" if data["small"] else "Llama 512x4, batch 4x256"
    ax.set_title(f"TPU programs vs hand-written JAX: {data['target']} {where}, {size}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())

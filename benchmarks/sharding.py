"""Step time and resident bytes per device of a sharded training step, against device count.

``python -m benchmarks.sharding``

A transformers Llama (hidden 256, 4 layers, vocab 1024: 18.9 MB of float32 parameters; AdamW
adds twice that) trains at batch 8 x 64: compiled forward and backward, compiled AdamW
``opt.step``, the loss read every step, with ``options={"mesh", "shardings"}`` for each plan:

- ``dp`` and ``fsdp`` over ``jax.make_mesh((n,), ("data",))``;
- ``tp`` over ``jax.make_mesh((n // 2, 2), ("data", "model"))`` (from 2 devices).

JAX creates its host (CPU) devices once, from ``XLA_FLAGS=--xla_force_host_platform_device_count``
read at its start, so each device count (1, 2, 4, 8) runs in a subprocess of its own
(``python -m benchmarks.sharding --worker N``). Per plan it reports the median seconds of
``--steps`` steps after ``--warmup`` (the first compiles), the first step's seconds, and the
resident bytes per device (``tpu_inductor.report().resident_bytes_per_device``: parameters,
optimizer state and other values kept on the devices; the max over devices); the losses are
checked against torch eager's. On a CPU host all "devices" share the same cores, so step time
shows what partitioning costs there, not a speedup; the memory split is what carries over.

Prints one table and writes ``sharding.json`` ({command, date, machine, results}) and, where
matplotlib is installed, ``sharding.png`` to ``--results`` (default the git-ignored
``benchmarks/results/local``).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import json
import os
import pathlib
import re
import statistics
import subprocess
import sys
import tempfile
import time

from benchmarks import paths

ROOT = pathlib.Path(__file__).resolve().parent.parent
PLANS = ("dp", "fsdp", "tp")
MODEL = {"vocab": 1024, "hidden": 256, "layers": 4, "batch": 8, "seq": 64}
TINY = {"vocab": 128, "hidden": 32, "layers": 1, "batch": 4, "seq": 16}


def _mesh(plan: str, n: int):
    import jax

    if plan == "tp":
        return jax.make_mesh((n // 2, 2), ("data", "model"))
    return jax.make_mesh((n,), ("data",))


def _batches(model: dict, count: int) -> list:
    import torch

    gen = torch.Generator().manual_seed(1)
    shape = (model["batch"], model["seq"])
    return [torch.randint(3, model["vocab"], shape, generator=gen) for _ in range(count)]


def _train(net, ids_per_step: list, step_fn, opt) -> tuple[list[float], list[float]]:
    """Losses and seconds per step of forward + backward + optimizer step (loss read)."""
    losses, seconds = [], []
    for ids in ids_per_step:
        start = time.perf_counter()
        loss = net(input_ids=ids, labels=ids).loss
        loss.backward()
        step_fn()
        opt.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
        seconds.append(time.perf_counter() - start)
    return losses, seconds


def measure(n: int, plans: list[str], model: dict, steps: int, warmup: int) -> list[dict]:
    """Every plan of ``plans`` at ``n`` devices (this process must have ``n`` JAX devices)."""
    import jax
    import torch

    import tpu_inductor
    from benchmarks.transfers import _llama, _param_bytes

    assert jax.device_count() >= n, f"{jax.device_count()} JAX devices, {n} asked for"
    batches = _batches(model, warmup + steps)
    dims = {k: model[k] for k in ("vocab", "hidden", "layers")}
    eager = _llama(**dims).train()
    eager_opt = torch.optim.AdamW(eager.parameters(), lr=1e-3)
    eager_losses, eager_s = _train(eager, batches, eager_opt.step, eager_opt)
    del eager, eager_opt
    out = []
    for plan in plans:
        row = {"devices": n, "plan": plan}
        if plan == "tp" and (n < 2 or n % 2):
            out.append({**row, "skipped": "tp needs a 'model' axis: mesh (n // 2, 2), n >= 2"})
            continue
        torch._dynamo.reset()
        tpu_inductor.reset()
        mesh = _mesh(plan, n)
        net = _llama(**dims).train()
        opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
        opts = {"mesh": mesh, "shardings": plan}
        cnet = torch.compile(net, backend="tpu", options=opts)
        cstep = torch.compile(opt.step, backend="tpu", options=opts)
        try:
            losses, seconds = _train(cnet, batches, cstep, opt)
        except Exception as e:  # one plan failing must not lose the others' numbers
            out.append({**row, "error": f"{type(e).__name__}: {e}"[:2000]})
            continue
        per_device = tpu_inductor.report(print_table=False).resident_bytes_per_device
        timed = seconds[warmup:]
        out.append(
            {
                **row,
                "mesh": dict(mesh.shape),
                "ms_per_step": statistics.median(timed) * 1e3,
                "ms_per_step_min": min(timed) * 1e3,
                "first_step_s": seconds[0],
                "eager_ms_per_step": statistics.median(eager_s[warmup:]) * 1e3,
                "resident_bytes_max_device": max(per_device.values(), default=0),
                "resident_bytes_total": sum(per_device.values()),
                "resident_bytes_per_device": per_device,
                "param_bytes": _param_bytes(net),
                "losses": losses,
                "max_abs_loss_err": max(
                    abs(a - b) for a, b in zip(losses, eager_losses, strict=True)
                ),
            }
        )
    return out


def _worker(args) -> int:
    """One device count, in this process (``--worker N``): results JSON to ``--worker-out``."""
    import jax

    jax.config.update("jax_platforms", "cpu")
    model = TINY if args.tiny else MODEL
    plans = args.plans.split(",")
    record = {"rows": measure(args.worker, plans, model, args.steps, args.warmup)}
    pathlib.Path(args.worker_out).write_text(json.dumps(record) + "\n")
    return 0


def run_device_count(n: int, args, timeout_s: float) -> dict:
    """``--worker n`` in a subprocess with ``n`` host devices; its results, or an error row."""
    with tempfile.TemporaryDirectory() as tmp:
        out = pathlib.Path(tmp) / "rows.json"
        env = {**os.environ, "JAX_PLATFORMS": "cpu"}
        flags = re.sub(r"--xla_force_host_platform_device_count=\S*", "", env.get("XLA_FLAGS", ""))
        env["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={n}".strip()
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
        cmd = [
            sys.executable, "-m", "benchmarks.sharding", "--worker", str(n),
            "--worker-out", str(out), "--plans", args.plans, "--steps", str(args.steps),
            "--warmup", str(args.warmup), *(["--tiny"] if args.tiny else []),
        ]  # fmt: skip
        try:
            proc = subprocess.run(
                cmd, env=env, cwd=ROOT, timeout=timeout_s, capture_output=True, text=True
            )
        except subprocess.TimeoutExpired:
            return {"rows": [{"devices": n, "error": f"timed out after {timeout_s:.0f} s"}]}
        if proc.returncode != 0 or not out.exists():
            tail = proc.stderr[-2000:]
            return {"rows": [{"devices": n, "error": f"rc {proc.returncode}: {tail}"}]}
        return json.loads(out.read_text())


def _mb(b: float) -> str:
    return f"{b / 1e6:.2f}"


def table(rows: list[dict]) -> str:
    """The readable summary of a run (one line per device count and plan)."""
    lines = [
        "| devices | plan | mesh | ms/step | first step s | MB/device (max) | MB all devices "
        "| max abs loss err vs eager |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        head = f"| {r['devices']} | {r.get('plan', '-')} |"
        if "skipped" in r or "error" in r:
            why = r.get("skipped") or r["error"].strip().splitlines()[-1][:80]
            lines.append(f"{head} {why} | | | | | |")
            continue
        mesh = " x ".join(f"{k}={v}" for k, v in r["mesh"].items())
        lines.append(
            f"{head} {mesh} | {r['ms_per_step']:.1f} | {r['first_step_s']:.1f} | "
            f"{_mb(r['resident_bytes_max_device'])} | {_mb(r['resident_bytes_total'])} | "
            f"{r['max_abs_loss_err']:.1e} |"
        )
    ok = [r for r in rows if "ms_per_step" in r]
    if ok:
        lines.append(
            f"\nparameters {_mb(ok[0]['param_bytes'])} MB float32; torch eager on the host "
            f"{ok[0]['eager_ms_per_step']:.1f} ms/step (1-device run)"
        )
    return "\n".join(lines)


def plot(record: dict, path: pathlib.Path) -> bool:
    """Step time and per-device MB against device count, one line per plan (``False``, and
    nothing written, without matplotlib: ``pip install -e '.[bench]'``)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    rows = [r for r in record["results"] if "ms_per_step" in r]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for plan in PLANS:
        mine = sorted((r for r in rows if r["plan"] == plan), key=lambda r: r["devices"])
        if not mine:
            continue
        xs = [r["devices"] for r in mine]
        axes[0].plot(xs, [r["ms_per_step"] for r in mine], "o-", label=plan)
        axes[1].plot(xs, [r["resident_bytes_max_device"] / 1e6 for r in mine], "o-", label=plan)
    devices = sorted({r["devices"] for r in rows})
    for ax, ylabel, title in (
        (axes[0], "ms per step (median)", "Training step time (fwd + bwd + AdamW)"),
        (axes[1], "MB resident on the busiest device", "Resident bytes per device"),
    ):
        ax.set_xscale("log", base=2)
        ax.set_xticks(devices, [str(d) for d in devices])
        ax.set_xlabel("host devices")
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    m = record.get("machine") or {}
    load = " ".join(f"{x:.2f}" for x in m.get("load_avg") or [])
    fig.suptitle(
        f"{record['command']} | {m.get('cpu_count')} CPUs, load average {load} at the start | "
        f"{record['date']}",
        fontsize=8,
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def main(argv=None) -> int:
    """The CLI (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--devices", default="1,2,4,8", help="device counts, comma-separated")
    parser.add_argument("--plans", default=",".join(PLANS), help="dp,fsdp,tp")
    parser.add_argument("--steps", type=int, default=5, help="timed steps (the median is kept)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    parser.add_argument("--tiny", action="store_true", help="a tiny Llama (smoke test)")
    parser.add_argument("--timeout-s", type=float, default=900, help="per device count")
    parser.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="device counts run at once (smoke tests: the timings then share the cores)",
    )
    paths.add_results_option(parser, "--out-dir", dest="out_dir")
    parser.add_argument("--name", default="sharding", help="output file stem")
    parser.add_argument("--no-plot", action="store_true")
    parser.add_argument("--json-only", action="store_true")
    parser.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--worker-out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker is not None:
        return _worker(args)
    from benchmarks.suite import machine_info

    machine = machine_info()  # before the runs, so the load average is the starting one
    counts = [int(d) for d in args.devices.split(",")]

    def one(n: int) -> list[dict]:
        print(f"[bench] {n} device(s) ...", file=sys.stderr, flush=True)
        return run_device_count(n, args, args.timeout_s)["rows"]

    with concurrent.futures.ThreadPoolExecutor(max(args.jobs, 1)) as pool:
        rows = [r for got in pool.map(one, counts) for r in got]
    record = {
        "command": " ".join(
            ["python -m benchmarks.sharding", *(sys.argv[1:] if argv is None else argv)]
        ),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": machine,
        "model": TINY if args.tiny else MODEL,
        "steps": args.steps,
        "warmup": args.warmup,
        "results": rows,
    }
    out_dir = pathlib.Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if not args.no_plot and plot(record, out_dir / f"{args.name}.png"):
        record["plot"] = f"{args.name}.png"
    (out_dir / f"{args.name}.json").write_text(json.dumps(record, indent=2) + "\n")
    if not args.json_only:
        print(table(rows))
    return 0 if all("error" not in r for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())

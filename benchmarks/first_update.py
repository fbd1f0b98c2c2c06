"""The first calls of a compiled ``update()`` (clipping + a scheduled AdamW ``opt.step()``).

``python -m benchmarks.first_update [--runs 2]``

docs/training.md's ``update()`` on ``tests/helpers.tiny_llama()`` after one backward: per call, the
seconds it took and the programs it compiled (``tpu_inductor.report().graphs``). Each run is a
fresh process (Dynamo's caches are per process). Prints one line per run with the load average;
docs/architecture.md ("Graph breaks and joined optimizer steps") quotes it.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time


def _one() -> None:
    import torch
    import transformers

    import tpu_inductor
    from tests.helpers import tiny_llama

    model = tiny_llama()
    opt = torch.optim.AdamW(model.parameters(), lr=torch.tensor(3e-4))
    sched = transformers.get_linear_schedule_with_warmup(opt, 2, 10)

    @torch.compile(backend="tpu")
    def update():
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()

    calls = []
    g = torch.Generator().manual_seed(0)
    for _ in range(3):
        ids = torch.randint(0, 128, (2, 16), generator=g)
        model(input_ids=ids, labels=ids).loss.backward()
        before = len(tpu_inductor.report(False).graphs)
        t = time.perf_counter()
        update()
        seconds = time.perf_counter() - t
        calls.append(f"{seconds:.2f} s / {len(tpu_inductor.report(False).graphs) - before}")
        sched.step()
        opt.zero_grad()
    load = f"load {os.getloadavg()[0]:.1f}"
    print("calls (seconds / programs compiled):", ", ".join(calls), load)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=2)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        return _one()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    for _ in range(args.runs):
        out = subprocess.run(
            [sys.executable, "-m", "benchmarks.first_update", "--child"],
            cwd=root, env=env, capture_output=True, text=True, check=True,
        )  # fmt: skip
        print(out.stdout.strip().splitlines()[-1])
    return None


if __name__ == "__main__":
    main()

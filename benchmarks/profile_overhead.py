"""Where the per-call time of a tiny compiled graph goes: ``python -m benchmarks.profile_overhead``.

Compiles the benchmark MLP (``Linear(d,4d) -> GELU -> Linear(4d,d)``, default 1x64, inference)
with ``backend="tpu"`` and prints (1) the per-call time peeled layer by layer, unprofiled:
Dynamo + AOTAutograd wrappers, our runtime, the XLA executable, against hand-written JAX; (2)
cProfile's top functions by own and cumulative time, in µs per call. With ``--pyinstrument``
(``pip install pyinstrument``) it also prints pyinstrument's call tree.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import math
import pstats
import time

import torch

from benchmarks.suite import _mlp


def _warm_compiled_mlp(batch: int, d: int):
    """The benchmark MLP compiled with backend="tpu", called 200 times; and its input."""
    torch.manual_seed(0)
    compiled = torch.compile(_mlp(d).eval(), backend="tpu")
    x = torch.randn(batch, d)
    with torch.no_grad():
        for _ in range(200):
            compiled(x)
    return compiled, x


def profile(batch: int = 1, d: int = 64, calls: int = 20000, top: int = 25) -> str:
    """Profile ``calls`` calls of the compiled MLP; returns the report text.

    Args:
        batch, d: the input is ``batch x d``.
        calls: how many calls to profile (the report divides by it).
        top: rows per table.
    """
    compiled, x = _warm_compiled_mlp(batch, d)
    with torch.no_grad():
        start = time.perf_counter()
        for _ in range(calls):
            compiled(x)
        plain_us = (time.perf_counter() - start) / calls * 1e6
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(calls):
            compiled(x)
        prof.disable()
    stats = pstats.Stats(prof)
    rows = []
    for (file, line, func), (_cc, nc, tt, ct, _callers) in stats.stats.items():
        where = f"{_short(file)}:{line}({func})" if line else func
        rows.append((where, nc / calls, tt / calls * 1e6, ct / calls * 1e6))
    out = io.StringIO()
    print(
        f"backend='tpu', MLP {batch}x{d}, inference: {plain_us:.1f} us/call unprofiled; "
        f"{calls} calls profiled (cProfile inflates each Python call, so compare rows, "
        "not totals)",
        file=out,
    )
    for title, key in (("own time", 2), ("cumulative time", 3)):
        print(f"\nTop {top} by {title}, per call:", file=out)
        print(f"{'calls':>6} {'own us':>8} {'cum us':>8}  function", file=out)
        for where, nc, tt, ct in sorted(rows, key=lambda r: -r[key])[:top]:
            print(f"{nc:6.1f} {tt:8.2f} {ct:8.2f}  {where}", file=out)
    return out.getvalue()


def layers(
    batch: int = 1, d: int = 64, target_s: float = 0.05, repeats: int = 3, rounds: int = 10
) -> str:
    """Per-call time peeled layer by layer, unprofiled; returns the text.

    1. ``compiled(x)``: the whole call as a user makes it;
    2. ``CompiledGraph.__call__(args)``: our runtime alone (no Dynamo guards, no AOTAutograd
       wrappers), with the flat argument list AOTAutograd passes;
    3. the XLA executable on already-converted inputs, outputs read back with ``np.asarray``;
    4. the same executable without reading the outputs back (``block_until_ready``);
    5. hand-written ``jax.jit`` with DLPack in and out (the benchmark's hand-JAX contender).

    The differences between rows are the cost of each layer.
    """
    import jax
    import numpy as np

    from benchmarks.suite import _hand_jax_mlp, time_per_call
    from tpu_inductor.runtime import CompiledGraph

    torch._dynamo.reset()
    torch.manual_seed(0)
    model = _mlp(d).eval()
    x = torch.randn(batch, d)
    compiled = torch.compile(model, backend="tpu")
    captured: list = []
    original = CompiledGraph.__call__

    def spy(self, args):
        captured.append((self, list(args)))
        return original(self, args)

    with torch.no_grad():
        CompiledGraph.__call__ = spy  # only in this process, to capture one call's arguments
        try:
            compiled(x)
        finally:
            CompiledGraph.__call__ = original
        graph, args = captured[-1]
        (exe,) = graph.exes.entries.values()
        with jax.enable_x64(True):
            arrays = [graph.resident.get(i, a) for i, a in enumerate(args)]
        hand = _hand_jax_mlp(model)
        rows = [
            ("compiled(x)  [Dynamo + AOTAutograd + ours + XLA]", lambda: compiled(x)),
            ("CompiledGraph.__call__(args)  [ours + XLA]", lambda: graph(list(args))),
            (
                "executable(*arrays) + np.asarray(outputs)  [XLA]",
                lambda: [np.asarray(o) for o in exe(None, *arrays)],
            ),
            (
                "executable(*arrays).block_until_ready()",
                lambda: jax.block_until_ready(exe(None, *arrays)),
            ),
            ("hand-JAX: jit, DLPack in and out", lambda: hand(x)),
        ]
        # Rows take turns, round after round, and each keeps its quietest round: on a loaded
        # machine the load drifts over seconds, and timing rows one after the other would
        # turn that drift into fake layer costs.
        times = [math.inf] * len(rows)
        for _ in range(rounds):
            for i, (_, fn) in enumerate(rows):
                t = time_per_call(fn, target_s=target_s, repeats=repeats)["median_s"] * 1e6
                times[i] = min(times[i], t)
    out = [
        f"Layers of one call, MLP {batch}x{d}, inference, µs/call (rows interleaved; the "
        f"lowest of {rounds} rounds of a median of {repeats}):"
    ]
    for i, ((label, _), us) in enumerate(zip(rows, times, strict=True)):
        delta = f"(+{times[i] - times[i + 1]:6.1f} over the next row)" if i < 2 else ""
        out.append(f"  {us:8.1f}  {label} {delta}")
    return "\n".join(out)


def _short(path: str) -> str:
    for marker in ("site-packages/", "/work/main/", "lib/python3"):
        if marker in path:
            return path.split(marker, 1)[1]
    return path


def pyinstrument_tree(batch: int = 1, d: int = 64, calls: int = 20000) -> str:
    """pyinstrument's call tree of ``calls`` calls (requires pyinstrument)."""
    from pyinstrument import Profiler

    compiled, x = _warm_compiled_mlp(batch, d)
    with torch.no_grad():
        prof = Profiler(interval=0.0001)
        prof.start()
        for _ in range(calls):
            compiled(x)
        prof.stop()
    return prof.output_text(unicode=False, color=False, show_all=False)


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--d", type=int, default=64)
    p.add_argument("--calls", type=int, default=20000)
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--pyinstrument", action="store_true")
    args = p.parse_args(argv)
    print(layers(args.batch, args.d))
    print()
    torch._dynamo.reset()
    print(profile(args.batch, args.d, args.calls, args.top))
    if args.pyinstrument:
        torch._dynamo.reset()
        print(pyinstrument_tree(args.batch, args.d, args.calls))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""``tpu_inductor.report()``: what the backend compiled, why, and how long it took."""

from __future__ import annotations

import dataclasses

from tpu_inductor.core import transfers
from tpu_inductor.core.stages import STAGES
from tpu_inductor.core.transfers import Transfers
from tpu_inductor.runtime import cache, device_eager, residency


@dataclasses.dataclass(kw_only=True)
class GraphReport:
    """One lowered graph.

    Attributes:
        name: ``graphN-kind`` (kind: forward, backward, inference, or an eager-fallback island).
        nodes: number of ATen ops in the graph.
        ops: op name -> count.
        lower_seconds: time to translate the graph to JAX.
        executables: live XLA executables (one per concrete input signature).
        builds: ``(reason, seconds)`` for every executable built, oldest first.
        hits / misses / evictions: executable cache look-ups for this graph.
        transfers: this graph's host <-> device crossings (see ``tpu_inductor.core.transfers``).
        saved_bytes: for a training forward, the bytes of the activations its last call kept
            on the device for the backward (values it computed; inputs saved as they are,
            such as parameters, are not counted). Activation checkpointing lowers it.
        stages: seconds by stage (``core.stages.STAGES``): ``dynamo`` and ``aot`` (Dynamo's
            tracing and AOTAutograd, counted on the first program of each Dynamo graph),
            ``lower`` (our lowering and JAX's trace of it), ``xla`` (XLA's compiles) and
            ``load`` (programs read from ``cache_dir`` on a warm start).
    """

    name: str
    nodes: int
    ops: dict[str, int]
    lower_seconds: float
    executables: int
    builds: list[tuple[str, float]]
    hits: int
    misses: int
    evictions: int
    transfers: Transfers = dataclasses.field(default_factory=Transfers)
    saved_bytes: int = 0
    stages: dict[str, float] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(kw_only=True)
class Report:
    """Everything :func:`report` knows; ``str(report)`` is a readable table."""

    graphs: list[GraphReport]
    fallback_ops: list[str]
    graphs_handed_over: int
    graph_cache_hits: int
    traces: int
    transfers: Transfers = dataclasses.field(default_factory=Transfers)
    device_values: int = 0
    device_value_bytes: int = 0
    resident_bytes_per_device: dict[str, int] = dataclasses.field(default_factory=dict)
    eager_ops: device_eager.EagerStats = dataclasses.field(default_factory=device_eager.EagerStats)

    def stage_seconds(self) -> dict[str, float]:
        """Every graph's seconds by stage, summed (``GraphReport.stages``)."""
        return {k: sum(g.stages.get(k, 0.0) for g in self.graphs) for k in STAGES}

    def __str__(self) -> str:
        lines = [
            f"tpu-inductor: {len(self.graphs)} graph(s) lowered "
            f"({self.graphs_handed_over} handed over by AOTAutograd, "
            f"{self.graph_cache_hits} reused from the graph cache), {self.traces} trace(s)",
            f"{'graph':<24} {'ops':>5} {'execs':>6} {'hits':>7} {'misses':>7} {'dynamo s':>9}"
            f" {'aot s':>6} {'lower s':>8} {'xla s':>6} {'load s':>7} {'H2D MB':>8} {'D2H MB':>8}"
            f" {'saved MB':>9}",
        ]
        for g in self.graphs:
            st = g.stages
            lines.append(
                f"{g.name:<24} {g.nodes:>5} {g.executables:>6} {g.hits:>7} {g.misses:>7} "
                f"{st.get('dynamo', 0):>9.2f} {st.get('aot', 0):>6.2f} {st.get('lower', 0):>8.2f} "
                f"{st.get('xla', 0):>6.2f} {st.get('load', 0):>7.2f} "
                f"{g.transfers.host_to_device_bytes / 1e6:>8.3f} "
                f"{g.transfers.device_to_host_bytes / 1e6:>8.3f} "
                f"{g.saved_bytes / 1e6:>9.3f}"
            )
            for i, (reason, seconds) in enumerate(g.builds):
                lines.append(f"    executable {i}: {seconds:.2f}s  {reason}")
        lines.append(f"transfers: {self.transfers}")
        lines.append(
            f"device copies of host tensors kept: {self.device_values} "
            f"({self.device_value_bytes / 1e6:.2f} MB)"
        )
        if len(self.resident_bytes_per_device) > 1:
            split = ", ".join(
                f"{d} {b / 1e6:.2f}" for d, b in self.resident_bytes_per_device.items()
            )
            lines.append(f"resident MB per device: {split}")
        e = self.eager_ops
        if e.device or e.host:
            lines.append(
                f"eager ops on keep_on_device state: {e.device} on the device ({e.programs} "
                f"programs, {e.build_seconds:.2f}s to build), {e.host} synced to the host"
                + (f": {dict(e.host_ops.most_common(5))}" if e.host_ops else "")
            )
        if self.fallback_ops:
            lines.append(f"ops that fell back to eager ({len(self.fallback_ops)}):")
            lines += [f"  - {op}" for op in self.fallback_ops]
        return "\n".join(lines)


def report(print_table: bool = True) -> Report:
    """Summarize every graph compiled in this process.

    Args:
        print_table: also print the readable table (``str`` of the result).

    Returns:
        A :class:`Report`: graphs with their ops, lowering and compile times, executables per
        graph and why each was built (which input shape changed), cache hits and misses, and
        the ops that fell back to eager, every host <-> device crossing (``transfers``:
        bytes and counts each way, by reason, in total and per graph), and where eager ops on
        ``keep_on_device`` state ran (``eager_ops``).

    Example:
        >>> tpu_inductor.report()  # after running a compiled model
    """
    seen = {}
    for compiled in list(cache.COMPILED):
        exes = compiled.exes
        seen[id(exes)] = exes
    graphs = []
    for exes in sorted(seen.values(), key=lambda e: _order(e.name)):
        low = exes.lowered
        graphs.append(
            GraphReport(
                name=exes.name,
                nodes=sum(low.ops.values()),
                ops=dict(low.ops),
                lower_seconds=exes.lower_seconds,
                executables=len(exes.entries),
                builds=[(b.reason, b.seconds) for b in exes.builds],
                hits=exes.stats.hits,
                misses=exes.stats.misses,
                evictions=exes.stats.evictions,
                transfers=exes.transfers.totals.copy(),
                saved_bytes=exes.stats.saved_bytes,
                stages=_stages(exes),
            )
        )
    result = Report(
        graphs=graphs,
        fallback_ops=list(cache.FALLBACK_OPS),
        graphs_handed_over=cache.STATS.graphs,
        graph_cache_hits=cache.STATS.hits,
        traces=cache.STATS.traces,
        transfers=transfers.TOTAL.copy(),
        device_values=len(residency.VALUES),
        device_value_bytes=residency.VALUES.device_bytes(),
        resident_bytes_per_device=residency.VALUES.bytes_per_device(),
        eager_ops=device_eager.STATS.copy(),
    )
    if print_table:
        print(result)
    return result


def _stages(exes) -> dict[str, float]:
    frame = exes.stats.frame if exes.stats.frame_owner else None
    trace = sum(b.seconds - b.xla_seconds for b in exes.builds)
    return {
        "dynamo": frame.dynamo if frame else 0.0,
        "aot": frame.aot if frame else 0.0,
        "lower": exes.lower_seconds + trace,
        "xla": sum(b.xla_seconds for b in exes.builds),
        "load": frame.load if frame else 0.0,
    }


def _order(name: str) -> int:
    digits = name.removeprefix("graph").split("-")[0]
    return int(digits) if digits.isdigit() else 0

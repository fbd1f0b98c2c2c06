"""``tpu_inductor.report()``: what the backend compiled, why, and how long it took."""

from __future__ import annotations

import dataclasses

from tpu_inductor import cache


@dataclasses.dataclass
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


@dataclasses.dataclass
class Report:
    """Everything :func:`report` knows; ``str(report)`` is a readable table."""

    graphs: list[GraphReport]
    fallback_ops: list[str]
    graphs_handed_over: int
    graph_cache_hits: int
    traces: int

    def __str__(self) -> str:
        lines = [
            f"tpu-inductor: {len(self.graphs)} graph(s) lowered "
            f"({self.graphs_handed_over} handed over by AOTAutograd, "
            f"{self.graph_cache_hits} reused from the graph cache), {self.traces} trace(s)",
            f"{'graph':<24} {'ops':>5} {'lower s':>8} {'execs':>6} {'hits':>7} {'misses':>7}"
            f" {'compile s':>10}",
        ]
        for g in self.graphs:
            compile_s = sum(s for _, s in g.builds)
            lines.append(
                f"{g.name:<24} {g.nodes:>5} {g.lower_seconds:>8.3f} {g.executables:>6} "
                f"{g.hits:>7} {g.misses:>7} {compile_s:>10.2f}"
            )
            for i, (reason, seconds) in enumerate(g.builds):
                lines.append(f"    executable {i}: {seconds:.2f}s  {reason}")
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
        the ops that fell back to eager.

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
                hits=exes.hits,
                misses=exes.misses,
                evictions=exes.evictions,
            )
        )
    result = Report(
        graphs=graphs,
        fallback_ops=list(cache.FALLBACK_OPS),
        graphs_handed_over=cache.STATS.graphs,
        graph_cache_hits=cache.STATS.hits,
        traces=cache.STATS.traces,
    )
    if print_table:
        print(result)
    return result


def _order(name: str) -> int:
    digits = name.removeprefix("graph").split("-")[0]
    return int(digits) if digits.isdigit() else 0

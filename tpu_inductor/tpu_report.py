"""``tpu_inductor.tpu_report()``: what compiling for a TPU target found, for a person to read.

Per program (forward, backward, optimizer, inference, prefill, decode): compiled, or why not
with the user's source line; HBM per chip (arguments, outputs, temporaries, donated/aliased,
code) and the peak against the chip's HBM ("DOES NOT FIT ... over by"); FLOPs, bytes accessed,
transcendentals; a time estimate from the chip's datasheet roofline and XLA's own estimate where
it gives one; which side of the roofline it is on; the ops that dominate (XLA's cycle
estimates), each named by its torch module, ATen op and source line. A training step
(forward + backward + optimizer) also gets an MFU ceiling. Every figure is per chip.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata

from tpu_inductor import hlo, programs
from tpu_inductor.errors import TargetCompileError
from tpu_inductor.programs import Program

_TRAINING = ("forward", "backward", "optimizer")
TOP_OPS = 5


def _mb(n: float) -> str:
    return f"{n / 1e6:,.1f} MB" if n < 1e9 else f"{n / 2**30:,.2f} GiB"


def _ms(s: float | None) -> str:
    return "-" if s is None else f"{s * 1e3:,.3f}"


@dataclasses.dataclass
class Step:
    """Programs that run together once per step (the latest executable of each graph).

    Attributes:
        name: ``"training step"`` or ``"inference"``; ``programs``: its programs.
    """

    name: str
    programs: list[Program]

    @property
    def flops(self) -> float:
        """XLA's FLOPs of the step, per chip."""
        return sum(p.flops for p in self.programs)

    @property
    def bytes_accessed(self) -> float:
        """XLA's bytes accessed of the step, per chip."""
        return sum(p.bytes_accessed for p in self.programs)

    @property
    def roofline_seconds(self) -> float:
        """The sum of its programs' roofline times (each is a lower bound)."""
        return sum(p.roofline_seconds for p in self.programs)

    @property
    def mfu_ceiling(self) -> float | None:
        """The model FLOP utilization the step could reach at best: its matmul FLOPs per chip
        over (roofline time x the chip's bf16 peak). A real step is slower than its roofline."""
        seconds = self.roofline_seconds
        if not seconds or not self.programs:
            return None
        p0 = self.programs[0]
        per_chip = sum(p.total_matmul_flops / p.chips for p in self.programs)
        return per_chip / (seconds * p0.target.chip.bf16_flops)


@dataclasses.dataclass
class TargetReport:
    """Every program compiled for a TPU target in this process (see the module docstring).

    ``str(report)`` is the readable report; :meth:`raise_for_errors` raises one
    :class:`~tpu_inductor.errors.TargetCompileError` listing what failed or does not fit;
    :meth:`plot` draws HBM per program against the chip's.
    """

    programs: list[Program]

    @property
    def failed(self) -> list[Program]:
        """Programs the TPU compiler refused (including those too big for HBM)."""
        return [p for p in self.programs if not p.compiled]

    @property
    def too_big(self) -> list[Program]:
        """Compiled programs whose HBM peak per chip exceeds the chip's HBM."""
        return [p for p in self.programs if p.compiled and not p.fits]

    @property
    def steps(self) -> list[Step]:
        """The training step (forward + backward + optimizer) and the inference programs,
        each graph's latest executable, per target."""
        latest: dict[str, Program] = {}
        for p in self.programs:
            latest[p.graph + p.target.topology] = p
        out = []
        compiled = [p for p in latest.values() if p.compiled]
        training = [p for p in compiled if p.role in _TRAINING]
        if any(p.role == "backward" for p in training):
            out.append(Step("training step", training))
        inference = [p for p in compiled if p.role not in _TRAINING]
        if inference:
            out.append(Step("inference", inference))
        return out

    def raise_for_errors(self) -> None:
        """Raise :class:`~tpu_inductor.errors.TargetCompileError` if any program failed to
        compile or does not fit in the chip's HBM; the message lists every one."""
        lines = [f"{p.name} ({p.role}): {p.error}" for p in self.failed]
        lines += [f"{p.name} ({p.role}): {_does_not_fit(p)}" for p in self.too_big]
        if lines:
            raise TargetCompileError(
                f"{len(lines)} program(s) would not run on the target:\n  - "
                + "\n  - ".join(line.replace("\n", "\n    ") for line in lines)
            )

    def __str__(self) -> str:
        if not self.programs:
            return (
                "tpu-inductor TPU report: nothing compiled for a target yet (compile with "
                "options={'target': 'v5e:2x2'} and call the model)"
            )
        lines = []
        for topology in dict.fromkeys(p.target.topology for p in self.programs):
            progs = [p for p in self.programs if p.target.topology == topology]
            lines += _target_section(progs)
        for step in self.steps:
            lines.append(_step_line(step))
        return "\n".join(lines)

    def plot(self, path: str) -> str:
        """Draw each program's HBM per chip (arguments, outputs, temporaries, code) against
        the chip's HBM and save it to ``path`` (PNG). Needs matplotlib. Returns ``path``."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        progs = [p for p in self.programs if p.memory]
        fig, ax = plt.subplots(figsize=(max(6, 1.1 * len(progs) + 2), 4.5))
        names = [f"{p.name}\n{p.role}" for p in progs]
        bottom = [0.0] * len(progs)
        parts = (
            ("arguments", lambda p: p.memory["argument"]),
            ("outputs (not aliased)", lambda p: p.memory["output"] - p.memory["alias"]),
            ("temporaries", lambda p: p.memory["temp"]),
            ("code", lambda p: p.memory["code"]),
        )
        for label, get in parts:
            values = [get(p) / 2**30 for p in progs]
            ax.bar(names, values, bottom=bottom, label=label)
            bottom = [b + v for b, v in zip(bottom, values, strict=True)]
        for chip in {p.target.chip for p in progs}:
            ax.axhline(chip.hbm_bytes / 2**30, color="red", linestyle="--")
            label = f" {chip.generation} HBM per chip"
            ax.text(0, chip.hbm_bytes / 2**30, label, color="red", va="bottom")
        ax.set_ylabel("GiB per chip")
        ax.set_title("HBM per program against the chip's (XLA memory_analysis)")
        ax.legend(fontsize=8)
        plt.xticks(fontsize=7)
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        return path


def _does_not_fit(p: Program) -> str:
    over = p.peak_bytes - p.hbm_bytes
    return (
        f"DOES NOT FIT: needs {_mb(p.peak_bytes)} of HBM per chip, a {p.target.chip.device_kind} "
        f"chip has {_mb(p.hbm_bytes)}; {_mb(over)} over"
    )


def _target_section(progs: list[Program]) -> list[str]:
    t = progs[0].target
    c = t.chip
    lines = [
        f"tpu-inductor TPU report: {t.topology} ({t.num_chips} x {c.device_kind}; per chip "
        f"{_mb(c.hbm_bytes)} HBM at {c.hbm_bytes_per_s / 1e9:,.0f} GB/s, "
        f"{c.bf16_flops / 1e12:,.0f} TFLOP/s bf16)",
        f"  compiled by libtpu {_libtpu_version()} without a TPU: nothing ran. Figures are XLA's"
        " (memory_analysis, cost_analysis), per chip; roofline from the datasheet:",
        f"  {c.source}",
        f"  {'program':<22} {'role':<10} {'chips':>5} {'HBM peak':>11} {'of HBM':>7} "
        f"{'args':>10} {'outputs':>10} {'temp':>10} {'donated':>10} {'GFLOP':>8} "
        f"{'GB moved':>9} {'roofline ms':>11} {'XLA ms':>7} {'bound':>7} {'compile s':>9}",
    ]
    for p in progs:
        if not p.compiled:
            lines.append(f"  {p.name:<22} {p.role:<10} {p.chips:>5} FAILED, see below")
            continue
        m = p.memory
        lines.append(
            f"  {p.name:<22} {p.role:<10} {p.chips:>5} {_mb(p.peak_bytes):>11} "
            f"{p.peak_bytes / p.hbm_bytes:>6.1%} {_mb(m['argument']):>10} "
            f"{_mb(m['output']):>10} {_mb(m['temp']):>10} {_mb(m['alias']):>10} "
            f"{p.flops / 1e9:>8.2f} {p.bytes_accessed / 1e9:>9.3f} "
            f"{_ms(p.roofline_seconds):>11} {_ms(p.xla_seconds):>7} {p.bound:>7} "
            f"{p.compile_seconds:>9.1f}"
        )
    for p in progs:
        if not p.compiled:
            lines.append(
                f"  {p.name} ({p.role}) did not compile: {p.error}".replace("\n", "\n    ")
            )
        elif not p.fits:
            lines.append(f"  {p.name} ({p.role}): {_does_not_fit(p)}")
    shown = [p for p in progs if p.ops]
    if shown:
        lines.append(
            f"  where the time goes: the top {TOP_OPS} ops of each program by the TPU compiler's "
            "cycle estimate (share of the program's), with the torch code they come from"
        )
    for p in shown:
        total = sum(op.cycles for op in p.ops) or 1
        lines.append(f"  {p.name} ({p.role}), transcendentals {p.transcendentals:,.0f}:")
        for op in p.ops[:TOP_OPS]:
            module, aten = hlo.split_scope(op.scope)
            where = f"{module or '-'} {aten}".strip()
            lines.append(
                f"    {op.cycles / total:>6.1%}  {op.opcode:<12.12} {_mb(op.bytes):>9}  {where}"
                f"  at {op.source or '(no source line)'}"
            )
    return lines


def _step_line(step: Step) -> str:
    mfu = step.mfu_ceiling if step.name.startswith("training") else None
    ceiling = f", MFU ceiling {mfu:.1%} of bf16 peak" if mfu is not None else ""
    roles = " + ".join(f"{p.role}" for p in step.programs)
    return (
        f"{step.name} ({roles}): {step.flops / 1e9:,.2f} GFLOP, "
        f"{step.bytes_accessed / 1e9:,.3f} GB accessed per chip, roofline "
        f"{step.roofline_seconds * 1e3:,.3f} ms{ceiling}"
    )


def _libtpu_version() -> str:
    try:
        return importlib.metadata.version("libtpu")
    except importlib.metadata.PackageNotFoundError:
        return "?"


def tpu_report(print_table: bool = True) -> TargetReport:
    """The report on every program compiled for a TPU target in this process.

    Args:
        print_table: also print it (``str`` of the result).

    Returns:
        A :class:`TargetReport`: ``programs`` (each a :class:`~tpu_inductor.programs.Program`
        with XLA's memory and cost figures and its top ops), ``failed``, ``too_big``, ``steps``
        (training step and inference totals, MFU ceiling), ``raise_for_errors()``, ``plot()``.

    Example:
        >>> cm = torch.compile(model, backend="tpu", options={"target": "v5e"})
        >>> cm(x).sum().backward()            # compiles forward and backward; runs nothing
        >>> tpu_inductor.tpu_report().raise_for_errors()
    """
    result = TargetReport(list(programs.PROGRAMS))
    if print_table:
        print(result)
    return result

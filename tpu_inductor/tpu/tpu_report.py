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

from tpu_inductor.core.errors import TargetCompileError
from tpu_inductor.tpu import hlo, programs
from tpu_inductor.tpu.programs import TRAINING_STEP, Program

_TRAINING = ("forward", "backward", "optimizer", "forward+backward", TRAINING_STEP)
TOP_OPS = 5
UNITS = (
    "sizes in MiB / GiB (2^20 / 2^30 bytes); rates as the datasheet gives them (GB/s = 10^9 "
    "bytes/s, TFLOP/s = 10^12 FLOP/s)"
)
ADVICE = (
    "shard it over more chips (options mesh=tpu_target(...).mesh(...), shardings='fsdp'), "
    "activation checkpointing, a smaller batch or sequence, or bfloat16 parameters and "
    "optimizer state"
)
# ATen ops whose name says where torch would run them, not what the TPU program runs
_TPU_NAMES = {
    "aten::_scaled_dot_product_flash_attention_for_cpu": "attention",
    "aten::_scaled_dot_product_flash_attention_for_cpu_backward": "attention backward",
    "aten::_scaled_dot_product_efficient_attention": "attention",
    "aten::_scaled_dot_product_efficient_attention_backward": "attention backward",
    "aten::_scaled_dot_product_flash_attention": "attention",
    "aten::_scaled_dot_product_flash_attention_backward": "attention backward",
}


def size(n: float) -> str:
    """Bytes as the report writes them: MiB below a GiB, else GiB (binary units only)."""
    return f"{n / 2**20:,.1f} MiB" if abs(n) < 2**30 else f"{n / 2**30:,.2f} GiB"


def _ms(s: float | None) -> str:
    return "-" if s is None else f"{s * 1e3:,.3f}"


def tpu_op_name(aten: str, opcode: str) -> str:
    """What the TPU program runs for ``aten``: SDPA's CPU-named kernels are attention, as a
    splash (Pallas) kernel where the op is a TPU custom call, else XLA's fused matmuls and
    softmax."""
    name = _TPU_NAMES.get(aten)
    if name is None:
        return aten
    how = "splash kernel" if "tpu_custom_call" in opcode else "XLA dot+softmax fusion"
    return f"{name} ({how})"


@dataclasses.dataclass(kw_only=True)
class Step:
    """Programs that run together once per step (the latest executable of each graph), and
    what stays in HBM between them.

    Attributes:
        name: ``"training step"`` or ``"inference"``; ``programs``: its programs, in order.
        model_flops: the step's model FLOPs, all devices together, as MaxText counts them
            (``6 x`` matmul parameters ``x`` tokens plus attention), for
            :attr:`predicted_mfu`; ``None``: its matmul FLOPs (recomputation included).
        tokens: tokens per step, for :attr:`predicted_tokens_per_s_per_chip`.
    """

    name: str
    programs: list[Program]
    model_flops: float | None = None
    tokens: int | None = None

    @property
    def flops(self) -> float:
        """XLA's FLOPs of the step, per device."""
        return sum(p.flops for p in self.programs)

    @property
    def bytes_accessed(self) -> float:
        """XLA's bytes accessed of the step, per device."""
        return sum(p.bytes_accessed for p in self.programs)

    @property
    def hbm_traffic(self) -> float:
        """What the step's programs read from and write to HBM, per device."""
        return sum(p.hbm_traffic for p in self.programs)

    @property
    def roofline_seconds(self) -> float:
        """The sum of its programs' roofline times (each is a lower bound)."""
        return sum(p.roofline_seconds for p in self.programs)

    @property
    def predicted_seconds(self) -> float:
        """The step's predicted time: its programs' :attr:`Program.predicted_seconds` (their
        ops one after another at the compiler's estimates or their HBM bytes, whichever is
        slower, a loop body once per trip, never below the roofline), one after another. It
        does not see the host's input pipeline, the data-center network (DCN) between slices,
        nor host offload."""
        return sum(p.predicted_seconds for p in self.programs)

    @property
    def predicted_mfu(self) -> float | None:
        """Model FLOP utilization at :attr:`predicted_seconds`, as MaxText defines it: model
        FLOPs per device over (step time x the device's bf16 peak)."""
        seconds = self.predicted_seconds
        if not seconds or not self.programs:
            return None
        p0 = self.programs[0]
        flops = self.model_flops
        if flops is None:
            flops = sum(p.total_matmul_flops for p in self.programs)
        return flops / p0.chips / (seconds * p0.target.chip.bf16_flops)

    @property
    def predicted_tokens_per_s_per_chip(self) -> float | None:
        """:attr:`tokens` per :attr:`predicted_seconds` per chip (``None`` without tokens)."""
        seconds = self.predicted_seconds
        if not seconds or not self.tokens or not self.programs:
            return None
        p0 = self.programs[0]
        return self.tokens / seconds / (p0.chips / p0.target.chip.devices_per_chip)

    @property
    def comm_seconds(self) -> float:
        """The step's collectives at ICI (DCN) bandwidth, per device."""
        return sum(p.comm_seconds for p in self.programs)

    @property
    def resident(self) -> dict[int, programs.Value]:
        """The tensors that stay in HBM for the whole step, by identity: parameters and what
        the step updates in place (optimizer state, a KV cache, buffers). Saved activations
        (the forward's outputs, the backward's arguments) and gradients (the backward's
        outputs, the optimizer's arguments) live only between the programs that make and
        take them, and are counted there."""
        kept: dict[int, programs.Value] = {}
        for p in self.programs:
            for v in p.values:
                if v.kind in ("parameter", "state"):
                    old = kept.get(v.key)
                    if old is None or v.bytes > old.bytes:
                        kept[v.key] = v
        return kept

    def resident_bytes(self, kind: str | None = None) -> int:
        """Bytes per device of :attr:`resident` (of one ``kind``: ``parameter``, ``state``)."""
        return sum(v.bytes for v in self.resident.values() if kind in (None, v.kind))

    def held_beside(self, p: Program) -> int:
        """Resident bytes per device that are not ``p``'s arguments (in HBM while it runs)."""
        args = {v.key for v in p.values}
        return sum(v.bytes for k, v in self.resident.items() if k not in args)

    @property
    def peak(self) -> tuple[int, Program | None]:
        """``(bytes, program)``: the step's peak HBM per device, the largest over its programs
        of the program's peak (:attr:`Program.peak_bytes`, its HBM and code) plus the
        resident values that are not its arguments, and the program where it is reached."""
        best, where = 0, None
        for p in self.programs:
            need = p.peak_bytes + self.held_beside(p)
            if need > best:
                best, where = need, p
        return best, where

    @property
    def usable_bytes(self) -> int:
        """HBM a program may use on one device (libtpu's figure, never above the capacity)."""
        return self.programs[0].hbm_bytes if self.programs else 0

    def peak_parts(self) -> list[tuple[str, int]]:
        """The step peak per device split into parts that add up to it: the resident
        parameters and state (optimizer moments, buffers, a KV cache) and the peak program's
        other arguments, its outputs that do not reuse an argument's buffer, its temporaries
        (saved activations, gradients and transients as XLA's buffer assignment places them),
        its code, and resident values beside it that are not its arguments."""
        peak, where = self.peak
        if where is None or not where.memory:
            return [("total", peak)]
        m = where.memory
        args = {v.key: v for v in where.values}
        params = sum(v.bytes for v in args.values() if v.kind == "parameter")
        state = sum(v.bytes for v in args.values() if v.kind == "state")
        parts = [
            ("parameters", params),
            (_state_label(self).replace(" updated in place", ""), state),
            ("other arguments", m["argument"] - params - state),
            ("outputs not aliased", m["output"] - m["alias"]),
            ("temporaries", m["temp"]),
            ("code", m["code"]),
            ("resident beside it", self.held_beside(where)),
        ]
        rest = peak - sum(n for _, n in parts)
        if rest:
            parts.append(("XLA's peak above its parts", rest))
        return [(k, n) for k, n in parts if n]

    @property
    def fits(self) -> bool:
        """Whether the step's peak fits in one device's usable HBM."""
        return self.peak[0] <= self.usable_bytes

    def verdict(self) -> str:
        """``fits (38.7% of 15.75 GiB usable)`` or ``DOES NOT FIT: 1.20 GiB over ...`` with
        what to do."""
        peak, where = self.peak
        usable = self.usable_bytes
        if peak <= usable:
            return f"fits ({peak / usable:.1%} of the {size(usable)} usable)"
        return (
            f"DOES NOT FIT: {size(peak - usable)} over the {size(usable)} usable, during "
            f"{where.name if where else '?'}. What to do: {ADVICE}"
        )

    @property
    def mfu_ceiling(self) -> float | None:
        """The model FLOP utilization the step could reach at best: its matmul FLOPs per device
        over (roofline time x the device's bf16 peak). A real step is slower than its
        roofline."""
        seconds = self.roofline_seconds
        if not seconds or not self.programs:
            return None
        p0 = self.programs[0]
        per_device = sum(p.total_matmul_flops / p.chips for p in self.programs)
        return per_device / (seconds * p0.target.chip.bf16_flops)


@dataclasses.dataclass
class TargetReport:
    """Every program compiled for a TPU target in this process (see the module docstring).

    ``str(report)`` is the readable report; :meth:`raise_for_errors` raises one
    :class:`~tpu_inductor.core.errors.TargetCompileError` listing what failed or does not fit;
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
        """The training step and the inference programs, per target: each graph's latest
        executable; for ``compile_step``, its latest ``training step`` program."""
        out = []
        for topology in dict.fromkeys(p.target.topology for p in self.programs):
            latest: dict[str, Program] = {}
            for p in self.programs:
                if p.target.topology == topology:
                    latest[p.graph] = p
            compiled = [p for p in latest.values() if p.compiled]
            whole = [p for p in compiled if p.role == TRAINING_STEP]
            if whole:
                training = [whole[-1]] + [p for p in compiled if p.role == "optimizer"]
            else:
                training = [p for p in compiled if p.role in _TRAINING]
            if any(p.role in ("backward", "forward+backward", TRAINING_STEP) for p in training):
                out.append(Step(name="training step", programs=training))
            inference = [p for p in compiled if p.role not in _TRAINING]
            if inference:
                out.append(Step(name="inference", programs=inference))
        return out

    def raise_for_errors(self) -> None:
        """Raise :class:`~tpu_inductor.core.errors.TargetCompileError` if any program failed to
        compile or does not fit in a device's usable HBM, or a step does not (its resident
        values beside its largest program); the message lists every one."""
        lines = [f"{p.name} ({p.role}): {p.error}" for p in self.failed]
        lines += [f"{p.name} ({p.role}): {_does_not_fit(p)}" for p in self.too_big]
        if not lines:
            lines = [
                f"{step.name} on {step.programs[0].target.topology}: step peak "
                f"{size(step.peak[0])} per device: {step.verdict()}"
                for step in self.steps
                if not step.fits
            ]
        if lines:
            raise TargetCompileError(
                f"{len(lines)} problem(s) for the target:\n  - "
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
            lines += _step_lines(step)
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
            ax.axhline(chip.usable_hbm_bytes / 2**30, color="red", linestyle="--")
            label = f" {chip.generation} HBM usable per device"
            ax.text(0, chip.usable_hbm_bytes / 2**30, label, color="red", va="bottom")
        ax.set_ylabel("GiB per device")
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
        f"does not fit: needs {size(p.peak_bytes)} of HBM per device, a "
        f"{p.target.chip.device_kind} device has {size(p.hbm_bytes)} usable; {size(over)} over."
        f"\nWhat to do: {ADVICE}."
    )


def _target_section(progs: list[Program]) -> list[str]:
    t = progs[0].target
    c = t.chip
    per = "chip" if c.devices_per_chip == 1 else f"device ({c.devices_per_chip} per chip)"
    devices = f", {t.num_devices} devices" if c.devices_per_chip > 1 else ""
    lines = [
        f"tpu-inductor TPU report: {t.topology} ({t.num_chips} x {c.device_kind}{devices}; per "
        f"{per}: {size(c.usable_hbm_bytes)} HBM usable by a program (libtpu's figure) of "
        f"{size(c.hbm_bytes)} ({c.hbm_source}), "
        f"{c.hbm_bytes_per_s / 1e9:,.0f} GB/s, {c.bf16_flops / 1e12:,.0f} TFLOP/s bf16, ICI "
        f"{c.ici_bytes_per_s / 1e9:,.0f} GB/s)",
        f"  compiled by libtpu {_libtpu_version()} without a TPU: nothing ran. Figures are XLA's"
        " (buffer assignment, cost_analysis), per device; roofline from the datasheet:",
        f"  {c.source}",
        f"  {UNITS}",
        f"  {'program':<26} {'role':<13} {'dev':>3} {'HBM peak':>10} {'usable':>6} "
        f"{'args':>10} {'outputs':>10} {'temp':>10} {'donated':>10} {'GFLOP':>8} "
        f"{'GiB moved':>9} {'GiB HBM':>8} {'comm MiB':>8} {'roofline ms':>11} {'predicted ms':>12} "
        f"{'bound':>7} {'compile s':>9}",
    ]
    for p in progs:
        if not p.compiled:
            lines.append(f"  {p.name:<26} {p.role:<13} {p.chips:>3} FAILED, see below")
            continue
        m = p.memory
        comm = sum(x.op.bytes for x in p.comms)
        lines.append(
            f"  {p.name:<26} {p.role:<13} {p.chips:>3} {size(p.peak_bytes):>10} "
            f"{p.peak_bytes / p.hbm_bytes:>6.1%} {size(m['argument']):>10} "
            f"{size(m['output']):>10} {size(m['temp']):>10} {size(m['alias']):>10} "
            f"{p.flops / 1e9:>8.2f} {p.bytes_moved / 2**30:>9.3f} {p.hbm_traffic / 2**30:>8.3f} "
            f"{(f'{comm / 2**20:,.1f}' if p.comms else '-'):>8} "
            f"{_ms(p.roofline_seconds):>11} {_ms(p.predicted_seconds):>12} {p.bound:>7} "
            f"{p.compile_seconds:>9.1f}"
        )
    ok = [p for p in progs if p.compiled]
    exact = all(p.memory.get("hbm") for p in ok)
    notes = [
        "HBM peak: arguments + outputs not aliased + temporaries + code, "
        + (
            "as XLA's buffer assignment places them in HBM (on-chip VMEM not counted)"
            if exact
            else "or XLA's peak_memory_in_bytes where larger (it counts on-chip VMEM too)"
        )
        + "; usable: of the HBM a program may use",
        "GiB moved: every operand and result of the program's ops per call, a loop body once "
        "per trip; GiB HBM: the part of it in HBM (less the values XLA keeps on chip, "
        "tpu.hlo.hbm_bytes); GFLOP: XLA's cost analysis (a loop body once)",
        "roofline: max(matmul FLOPs at peak, HBM bytes at HBM bandwidth, collectives at ICI "
        "bandwidth) (they overlap at best); bound: which of the three sets it; predicted: the "
        "ops one after another, each at the slower of the TPU compiler's cycle estimate and its "
        "HBM bytes, plus Pallas kernels' matmuls at peak, never below the roofline",
    ]
    if any(not p.comms for p in ok):
        notes.append("comm MiB '-': no collectives (one device, or nothing to exchange)")
    lines += [f"  ({n})" for n in notes]
    for p in progs:
        if not p.compiled:
            lines.append(
                f"  {p.name} ({p.role}) did not compile: {p.error}".replace("\n", "\n    ")
            )
        elif not p.fits:
            lines.append(f"  {p.name} ({p.role}): {_does_not_fit(p)}".replace("\n", "\n    "))
    lines += _comm_lines(progs)
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
            where = f"{module or '-'} {tpu_op_name(aten, op.opcode)}".strip()
            lines.append(
                f"    {op.cycles / total:>6.1%}  {op.opcode:<12.12} {size(op.bytes):>10}  {where}"
                f"  at {op.source or '(no source line)'}"
            )
    return lines


def _comm_lines(progs: list[Program]) -> list[str]:
    """Per program, its collectives grouped by kind, mesh axes and link."""
    with_comms = [p for p in progs if p.comms]
    if not with_comms:
        return []
    c = progs[0].target.chip
    dcn = f"{c.dcn_bytes_per_s / 1e9:,.2f} GB/s" if c.dcn_bytes_per_s else "no cited figure"
    lines = [
        "  communication: the collectives of each optimized program, timed as rings over the "
        f"device's bidirectional ICI bandwidth ({c.ici_bytes_per_s / 1e9:,.0f} GB/s; DCN "
        f"between slices: {dcn}): all-gather / reduce-scatter / all-to-all move bytes x "
        "(n-1)/n, all-reduce twice that, a permute its bytes"
    ]
    for p in with_comms:
        groups: dict[tuple, list] = {}
        for x in p.comms:
            groups.setdefault((x.op.kind, x.axes, x.link, x.op.group_size), []).append(x)
        parts = [
            f"{kind} x{len(xs)} over {axes} (n={n}, {link}) {size(sum(x.op.bytes for x in xs))} "
            f"{sum(x.seconds for x in xs) * 1e3:,.3f} ms"
            for (kind, axes, link, n), xs in sorted(groups.items())
        ]
        lines.append(f"  {p.name} ({p.role}): " + "; ".join(parts))
    return lines


def _step_lines(step: Step) -> list[str]:
    mfu = step.mfu_ceiling if step.name.startswith("training") else None
    ceiling = f", MFU ceiling {mfu:.1%} of bf16 peak" if mfu is not None else ""
    roles = " + ".join(f"{p.role}" for p in step.programs)
    peak, where = step.peak
    largest = max(step.programs, key=lambda p: p.peak_bytes)
    own = where.peak_bytes if where else 0
    beside = step.held_beside(where) if where else 0
    kept = [
        f"{label} {size(step.resident_bytes(kind))}"
        for kind, label in (
            ("parameter", "parameters"),
            ("state", _state_label(step)),
        )
        if step.resident_bytes(kind)
    ]
    parts = " + ".join(f"{label} {size(n)}" for label, n in step.peak_parts())
    predicted = f"predicted {step.predicted_seconds * 1e3:,.3f} ms"
    if step.predicted_mfu is not None and step.name.startswith("training"):
        predicted += f" (MFU {step.predicted_mfu:.1%}"
        per_chip = step.predicted_tokens_per_s_per_chip
        predicted += f", {per_chip:,.0f} tokens/s/chip)" if per_chip else ")"
    return [
        f"{step.name} ({roles}) on {step.programs[0].target.topology}, per device:",
        f"  resident through the step: {', '.join(kept) or 'nothing'} (state: optimizer "
        "moments, KV cache, buffers; saved activations and gradients live between the "
        "programs that make and take them, or in a program's temporaries)",
        f"  step peak {size(peak)} during {where.name if where else '-'} (its peak "
        f"{size(own)} + {size(beside)} "
        f"resident that are not its arguments; the largest program alone: "
        f"{size(largest.peak_bytes)}): {step.verdict()}",
        f"  step peak = {parts}",
        *_temporaries(where),
        f"  {step.flops / 1e9:,.2f} GFLOP, {step.bytes_accessed / 2**30:,.3f} GiB accessed "
        f"({step.hbm_traffic / 2**30:,.3f} GiB HBM traffic), "
        f"collectives {step.comm_seconds * 1e3:,.3f} ms, roofline "
        f"{step.roofline_seconds * 1e3:,.3f} ms{ceiling}; {predicted}",
        *_token_lines(step),
    ]


def _state_label(step: Step) -> str:
    if any(p.tokens for p in step.programs):
        return "KV cache and buffers updated in place"
    return "optimizer state and buffers updated in place"


def _token_lines(step: Step) -> list[str]:
    """Per decode program: its HBM traffic as a multiple of the minimum and its tokens/s/chip
    ceilings; per prefill program: its compute ceiling."""
    lines = []
    for p in step.programs:
        rates = p.tokens_per_s_per_chip
        if not rates:
            continue
        head = f"  {p.name} ({p.role}, {p.tokens:,} tokens per call): "
        if p.role.startswith("decode"):
            lines.append(
                head
                + f"HBM traffic {size(p.hbm_traffic)} = {p.hbm_traffic / p.minimum_traffic:.2f}x "
                f"the minimum {size(p.minimum_traffic)} (arguments read once, an embedding table "
                "by its rows; outputs not written in place written once); tokens/s/chip: "
                f"{rates['limit']:,.0f} at the HBM limit, {rates['roofline']:,.0f} at its "
                f"roofline ({p.bound}-bound), {rates['predicted']:,.0f} predicted"
            )
        else:
            lines.append(
                head + f"tokens/s/chip: {rates.get('compute', 0):,.0f} at the compute ceiling "
                f"(matmuls at the bf16 peak), {rates['roofline']:,.0f} at its roofline "
                f"({p.bound}-bound), {rates['predicted']:,.0f} predicted"
            )
    return lines


def _temporaries(p: Program | None) -> list[str]:
    """The peak program's largest HBM temporaries, each by the module and line that makes it."""
    # a temporary below 1 MiB or 1% of the program's peak says nothing about where it goes
    floor = max(2**20, p.peak_bytes // 100) if p is not None else 0
    shown = [t for t in (p.temporaries if p is not None else ()) if t[0] >= floor]
    if not shown:
        return []
    named = []
    for size_, scope, source in shown:
        module, aten = hlo.split_scope(scope)
        where = f"{module or '-'} {tpu_op_name(aten, '')}".strip() if scope else "(unnamed)"
        named.append(f"{size(size_)} {where}" + (f" at {source}" if source else ""))
    return [f"  its largest temporaries: {'; '.join(named)}"]


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
        A :class:`TargetReport`: ``programs`` (each a :class:`~tpu_inductor.tpu.programs.Program`
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

"""Programs compiled for a TPU target, and what the TPU compiler says of each.

``compile_only.TargetGraph`` calls :func:`record` once per program it compiles; each
:class:`Program` keeps XLA's own figures (``memory_analysis()``: HBM per chip by kind;
``cost_analysis()``: FLOPs, bytes accessed, transcendentals and, where it has one, its time
estimate) and the top-level ops of the optimized HLO (``hlo.py``), each named by the torch
module path and source line it was lowered from. ``tpu_report.py`` turns them into the report a
person reads.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import os
import pathlib
import re
import tempfile
import threading
import weakref

import jax
import numpy as np

from tpu_inductor.core.devices import compile_lowered
from tpu_inductor.core.errors import TargetCompileError
from tpu_inductor.core.graph_kind import GraphKind
from tpu_inductor.tpu import hlo
from tpu_inductor.tpu.targets import Target

_lock = threading.Lock()
PROGRAMS: list[Program] = []  # in compile order; tpu_inductor.reset() clears it

# An op is the optimizer's when its stack trace passes through torch/optim's functional updates
# or through the traceable steps that call them (state initialization included).
_OPTIMIZER_FILES = (
    "/torch/optim/",
    str(pathlib.Path(__file__).parents[1] / "dynamo" / "optimizers.py"),
)
TRAINING_STEP = "training step"


def role_of(gm, kind: GraphKind, island: bool = False) -> str:
    """What a graph does in a step, as far as its code tells: ``forward``, ``backward``,
    ``training step`` (a graph that differentiates inside itself, ``loss.backward()`` traced
    into it, and updates parameters: ``compile_step``'s one program), ``forward+backward``
    (differentiates, no optimizer), ``optimizer`` (most of its ops from ``torch/optim``) or
    ``inference`` (see :func:`cache_role` for decode and prefill); an island's role ends in
    ``-island``, as its kind's label does."""
    if kind is not GraphKind.INFERENCE:
        return kind.label(island)
    suffix = "-island" if island else ""
    calls = [n for n in gm.graph.nodes if n.op == "call_function"]
    traces = [n.meta.get("stack_trace") or "" for n in calls]
    from_optim = sum(any(f in t for f in _OPTIMIZER_FILES) for t in traces)
    if any(n.meta.get("autograd_backward") for n in calls):  # AOTAutograd's backward nodes
        return (TRAINING_STEP if from_optim else "forward+backward") + suffix
    if traces and from_optim > len(traces) // 2:
        return "optimizer" + suffix
    return kind.label(island)


def cache_role(role: str, lowered, out_info) -> str:
    """``decode`` / ``prefill`` for an inference graph that writes one / several rows into an
    input in place (a static KV cache: ``index_copy_`` or a slice assignment), else ``role``."""
    if not role.startswith("inference"):
        return role
    rows = [shape[dim] for shape, dim in _rows_written(lowered, out_info)]
    if not rows:
        return role
    return role.replace("inference", "decode" if max(rows) == 1 else "prefill")


def cache_tokens(lowered, out_info) -> int:
    """Token positions a KV-cache graph writes per call: batch x rows of the first in-place row
    update (a batch-first cache, ``[batch, heads, positions, head_dim]``); 0 for none."""
    for shape, dim in _rows_written(lowered, out_info):
        return int(shape[0] * shape[dim]) if len(shape) > 1 else int(shape[dim])
    return 0


def _rows_written(lowered, out_info) -> list[tuple[tuple, int]]:
    """``(shape of the rows written, dim)`` per in-place row update of ``lowered``."""
    outs = list(out_info)
    found = []
    for m in lowered.mutations:
        delta = m.delta
        if delta is None:
            continue
        source = outs[delta[-1]] if delta[-1] < len(outs) else None
        dim = delta[1]
        if source is not None and len(source.shape) > dim % max(len(source.shape), 1):
            found.append((tuple(source.shape), dim % len(source.shape)))
    return found


@dataclasses.dataclass(kw_only=True)
class Program:
    """One XLA program compiled for a target (one executable of one graph).

    Attributes:
        name: ``graph3-backward#0`` (``graph``, the graph's name, then the executable's number).
        kind / role: AOTAutograd's kind and what it does in a step (:func:`role_of`).
        target: the topology; ``chips``: how many of its chips the program spans.
        inputs: ``(shape, dtype)`` per tensor argument (with ``scan_layers``, one stack per
            kind of per-layer state: ``lowering/packing.py``); ``donated_bytes``: the
            arguments it may overwrite.
        error: why it did not compile (``None`` when it did), with the user's source line.
        compile_seconds: wall time of tracing, lowering and the TPU compile.
        memory: ``memory_analysis()`` per chip: ``argument``, ``output``, ``temp``, ``alias``,
            ``code`` bytes (empty when the compile failed).
        flops, bytes_accessed, transcendentals: ``cost_analysis()`` of the program (per chip).
        hbm_traffic: what its ops read from and write to HBM per call (:func:`hlo.hbm_bytes`:
            a loop body once per trip, without the values XLA keeps on chip, a prefetch once).
        bytes_moved: every operand and result of its ops per call (:func:`hlo.bytes_moved`),
            of which ``hbm_traffic`` is the HBM part; XLA's ``bytes_accessed`` counts a loop
            body once.
        cycles: the TPU compiler's cycle estimate of a call (:func:`hlo.estimated_cycles`).
        op_seconds: its ops one after another, each at the slower of the compiler's estimate
            and its HBM bytes at bandwidth (:func:`hlo.op_seconds`).
        kernel_flops: the part of ``matmul_flops`` inside Pallas kernels.
        xla_seconds: XLA's own time estimate, ``None`` where it gives none (a negative value).
        ops: the top-level ops of the optimized HLO, with estimates and sources (``hlo.Op``).
        matmul_flops: ``(operand dtype, precision) -> FLOPs`` of its matmuls (from the jaxpr).
        out_info: the outputs' shapes and dtypes; ``hlo_text``: the optimized HLO module.
        comms: the collectives of the optimized HLO (:class:`Comm`: kind, bytes, mesh axes,
            link and time).
        values: per tensor input, a :class:`Value` (which tensor, what it is, bytes per
            device), for the step's memory (``tpu_report.Step``).
        temporaries: its largest HBM temporaries, ``(bytes, scope, source)`` each (the
            module path and ATen op of the instruction that makes it, the user's line), from
            XLA's buffer assignment (:func:`largest_temporaries`).
        tokens: token positions a decode or prefill program writes into its KV cache per call,
            all devices together (:func:`cache_tokens`); 0 for other programs.
    """

    name: str
    graph: str
    kind: str
    role: str
    target: Target
    chips: int
    inputs: list
    donated_bytes: int
    error: str | None
    compile_seconds: float
    memory: dict = dataclasses.field(default_factory=dict)
    flops: float = 0.0
    bytes_accessed: float = 0.0
    hbm_traffic: float = 0.0
    bytes_moved: float = 0.0
    cycles: float = 0.0
    op_seconds: float = 0.0
    kernel_flops: dict = dataclasses.field(default_factory=dict)
    transcendentals: float = 0.0
    xla_seconds: float | None = None
    ops: list = dataclasses.field(default_factory=list)
    matmul_flops: dict = dataclasses.field(default_factory=dict)
    out_info: tuple = ()
    hlo_text: str = dataclasses.field(default="", repr=False)
    raw_error: str | None = dataclasses.field(default=None, repr=False)
    comms: list = dataclasses.field(default_factory=list)
    values: list = dataclasses.field(default_factory=list, repr=False)
    temporaries: list = dataclasses.field(default_factory=list)
    tokens: int = 0

    @property
    def compiled(self) -> bool:
        """Whether the TPU compiler accepted the program."""
        return self.error is None

    @property
    def peak_bytes(self) -> int:
        """HBM the program needs per device while it runs: the bytes its buffer assignment
        places in HBM (arguments, outputs that do not reuse a donated argument's buffer,
        temporaries, constants) plus its code.

        Where XLA wrote no buffer assignment (a compile served from a cache), the sum of
        ``memory_analysis()``'s parts, or its ``peak_memory_in_bytes`` where larger; libtpu's
        figures count the on-chip VMEM with the HBM (see :func:`compile_measured`).
        """
        return peak_of(self.memory) if self.memory else 0

    @property
    def hbm_bytes(self) -> int:
        """The HBM a program may use on one device: libtpu's usable figure (the datasheet's
        capacity less what libtpu keeps for itself; ``targets.Chip.usable_hbm_bytes``)."""
        return self.target.chip.usable_hbm_bytes

    @property
    def fits(self) -> bool:
        """Whether :attr:`peak_bytes` fits in one device's usable HBM (and it compiled)."""
        return self.compiled and self.peak_bytes <= self.hbm_bytes

    @property
    def compute_seconds(self) -> float:
        """The program's matmul FLOPs at the MXU's peak for their operand dtype and precision
        (float32 at HIGHEST is 6 bf16 passes). Elementwise FLOPs are left to the memory side:
        they run on the vector unit at the speed of the bytes they read."""
        chip = self.target.chip
        # the jaxpr is the global (unpartitioned) program: its FLOPs split over the devices
        total = sum(f / chip.peak_flops(d, p) for (d, p), f in self.matmul_flops.items())
        return total / max(self.chips, 1)

    @property
    def total_matmul_flops(self) -> float:
        """FLOPs of the program's matmuls and convolutions (all dtypes)."""
        return sum(self.matmul_flops.values())

    @property
    def memory_seconds(self) -> float:
        """The program's HBM traffic per call (:attr:`hbm_traffic`) at the chip's HBM
        bandwidth."""
        return self.hbm_traffic / self.target.chip.hbm_bytes_per_s

    @property
    def compiler_seconds(self) -> float:
        """The TPU compiler's own time for a call: its cycle estimate of every op, a loop body
        once per trip, at the rate its estimates convert to seconds (:func:`cycle_rate`).
        Ops it does not estimate (a Pallas kernel's custom call) count 0."""
        return self.cycles / cycle_rate(self.target.chip.generation) if self.cycles else 0.0

    @property
    def kernel_seconds(self) -> float:
        """The matmuls inside Pallas kernels (splash attention) at the MXU's peak, which the
        compiler gives no estimate for."""
        chip = self.target.chip
        total = sum(f / chip.peak_flops(d, p) for (d, p), f in self.kernel_flops.items())
        return total / max(self.chips, 1)

    @property
    def predicted_seconds(self) -> float:
        """The time a call is predicted to take: its ops one after another, each at the slower
        of the compiler's estimate and its HBM bytes at bandwidth (:attr:`op_seconds`), plus
        the Pallas kernels' matmuls (:attr:`kernel_seconds`); never below the roofline
        (:attr:`roofline_seconds`, a lower bound)."""
        return max(self.op_seconds + self.kernel_seconds, self.roofline_seconds)

    @property
    def comm_seconds(self) -> float:
        """The program's collectives at the chip's ICI bandwidth (DCN between slices), one
        after another (:class:`Comm`)."""
        return sum(c.seconds for c in self.comms)

    @property
    def roofline_seconds(self) -> float:
        """A lower bound on the program's time: the largest of :attr:`compute_seconds`,
        :attr:`memory_seconds` and :attr:`comm_seconds`. Overlap model: XLA's TPU scheduler
        runs collectives asynchronously beside compute and HBM traffic, so at best they hide
        each other completely and the slowest of the three sets the time."""
        return max(self.compute_seconds, self.memory_seconds, self.comm_seconds)

    @property
    def minimum_traffic(self) -> float:
        """The least HBM traffic a call can have, per device: each argument read once (a
        table read only by row lookups: its rows) and each output written once, less the
        outputs written in place over a donated argument (for a decode step: the weights, the
        KV cache, the new K/V rows and the logits). 0 before it compiled."""
        if not self.memory:
            return 0.0
        read = sum(v.bytes if v.read is None else v.read for v in self.values)
        return float(read + self.memory["output"] - self.memory["alias"])

    @property
    def tokens_per_s_per_chip(self) -> dict[str, float]:
        """Tokens per second per chip of a decode or prefill program (:attr:`tokens` per
        call): ``limit`` at the HBM bandwidth for :attr:`minimum_traffic` (decode), ``compute``
        at the MXU's peak for its matmuls, ``roofline`` at :attr:`roofline_seconds` (a ceiling)
        and ``predicted`` at :attr:`predicted_seconds`; empty for other programs."""
        if not self.tokens or not self.memory:
            return {}
        chip = self.target.chip
        chips = max(self.chips, 1) / chip.devices_per_chip
        seconds = {
            "limit": self.minimum_traffic / chip.hbm_bytes_per_s,
            "compute": self.compute_seconds,
            "roofline": self.roofline_seconds,
            "predicted": self.predicted_seconds,
        }
        return {k: self.tokens / s / chips for k, s in seconds.items() if s > 0}

    @property
    def bound(self) -> str:
        """``"compute"``, ``"memory"`` or ``"ICI"`` (``"DCN"`` when the collectives between
        slices dominate): which side of the roofline the program is on."""
        sides = {"compute": self.compute_seconds, "memory": self.memory_seconds}
        if self.comms:
            dcn = sum(c.seconds for c in self.comms if c.link == "DCN")
            sides["DCN" if dcn > self.comm_seconds / 2 else "ICI"] = self.comm_seconds
        return max(sides, key=sides.get)


@dataclasses.dataclass(kw_only=True)
class Comm:
    """One collective of a program, placed on the mesh and timed.

    Attributes:
        op: the collective as the optimized HLO has it (``hlo.Collective``: kind, bytes).
        axes: the mesh axes its group spans (``"data"``, ``"data,model"``), ``"?"`` when the
            group matches no set of axes.
        link: ``"ICI"``, or ``"DCN"`` when its group spans slices.
        seconds: ring model: :meth:`hlo.Collective.ring_bytes` over the link's bidirectional
            bandwidth per device (all of a chip's ICI links at once: a lower bound).
    """

    op: hlo.Collective
    axes: str
    link: str
    seconds: float


@dataclasses.dataclass(frozen=True)
class Value:
    """A tensor input of a program: ``key`` identifies the torch tensor across the programs of
    a step; ``kind``: ``parameter``, ``state`` (updated in place: optimizer state, a KV cache,
    buffers) or ``other``; ``bytes``: its bytes on one device (its shard); ``read``: the bytes
    a call must read of it at least (``None``: all; an embedding table: the rows it takes)."""

    key: int
    kind: str
    bytes: int
    read: int | None = None


_KEYS: dict[int, tuple[weakref.ref, int]] = {}  # id(tensor) -> (the tensor, weakly; its key)
_NEXT_KEY = itertools.count()


def tensor_key(t) -> int:
    """A number naming tensor ``t`` for the life of the process (a :attr:`Value.key`).

    Not ``id(t)``: CPython gives a dead object's id to the next one, and a step's programs see
    tensors at different times, so a tensor made later (an optimizer moment) could pass for a
    freed one (a saved activation) and be left out of the step's peak.
    """
    i = id(t)
    entry = _KEYS.get(i)
    if entry is not None and entry[0]() is t:
        return entry[1]
    key = next(_NEXT_KEY)

    def forget(ref, i=i):
        if _KEYS.get(i, (None,))[0] is ref:
            del _KEYS[i]

    _KEYS[i] = (weakref.ref(t, forget), key)
    return key


def place_collectives(ops: list, target: Target, mesh) -> list[Comm]:
    """Name each collective's mesh axes and link, and time it (:class:`Comm`)."""
    chip = target.chip
    flat = list(mesh.devices.flat) if mesh is not None else list(target.devices[:1])
    shape = mesh.devices.shape if mesh is not None else (1,)
    names = mesh.axis_names if mesh is not None else ("-",)
    comms = []
    for op in ops:
        if op.kind == hlo.DCN_TRANSFER:
            seconds = op.ring_bytes() / (chip.dcn_bytes_per_s or chip.ici_bytes_per_s)
            comms.append(Comm(op=op, axes="slices", link="DCN", seconds=seconds))
            continue
        group = [i for i in op.group if i < len(flat)]
        axes = "?"
        if group:
            coords = np.array(np.unravel_index(group, shape))
            varying = [names[d] for d in range(len(shape)) if len(set(coords[d])) > 1]
            axes = ",".join(varying) or "-"
        slices = {getattr(flat[i], "slice_index", 0) or 0 for i in group}
        link = "DCN" if len(slices) > 1 else "ICI"
        bandwidth = chip.dcn_bytes_per_s if link == "DCN" else chip.ici_bytes_per_s
        seconds = op.ring_bytes() / (bandwidth or chip.ici_bytes_per_s)
        comms.append(Comm(op=op, axes=axes, link=link, seconds=seconds))
    return comms


def record(
    *,
    name: str,
    graph: str,
    kind: str,
    role: str,
    target: Target,
    chips: int,
    inputs: list,
    out_info,
    compiled,
    error: Exception | None,
    jaxpr,
    seconds: float,
    donated: list,
    mesh=None,
    values: list | None = None,
    spaces: dict | None = None,
) -> Program:
    """Describe one compiled (or refused) program and add it to :data:`PROGRAMS` (``spaces``:
    its bytes per memory space, from :func:`compile_measured`)."""
    program = Program(
        name=name,
        graph=graph,
        kind=kind,
        role=role,
        target=target,
        chips=chips,
        inputs=[(tuple(s.shape), str(s.dtype)) for s in inputs],
        donated_bytes=sum(_nbytes(s) for s in donated),
        error=None if error is None else explain_error(error, jaxpr, target),
        raw_error=None if error is None else str(error),
        compile_seconds=seconds,
        out_info=tuple(jax.tree_util.tree_leaves(out_info, is_leaf=lambda x: x is None)),
        matmul_flops=hlo.matmul_flops(jaxpr),
        kernel_flops=hlo.matmul_flops(jaxpr, kernels_only=True),
        values=list(values or ()),
    )
    if compiled is not None:
        _describe(program, compiled, spaces)
        ops = hlo.collectives(program.hlo_text, target.num_devices)
        program.comms = place_collectives(ops, target, mesh)
    with _lock:
        PROGRAMS.append(program)
    return program


def _nbytes(spec) -> int:
    return int(np.prod(spec.shape, dtype=np.int64)) * np.dtype(spec.dtype).itemsize


_MEMORY_SPACE = re.compile(r"Memory Space: (\S+) \(color=\d+\)\nTotal bytes: (\d+)")


def compile_measured(lowered, options: dict | None = None):
    """``lowered.compile()`` for a TPU target, and the bytes its buffer assignment places in
    each memory space: ``(compiled, {"default": HBM bytes, "vmem": ..., ...})``, the dict empty
    where XLA wrote no buffer assignment (a compile served from a cache).

    Why not ``memory_analysis()`` alone: its ``peak_memory_in_bytes`` and, for some programs,
    its ``temp_size_in_bytes`` count the chip's on-chip VMEM as if it were HBM, and for others
    its temp is 0 while HBM temporaries exist (measured: ``python -m benchmarks.tpu_programs``).
    The buffer assignment (XLA's memory-usage report, written to a temporary folder and read
    here, or read from the user's own ``--xla_dump_to`` folder, left as it is) says which bytes
    are HBM.
    """
    # The user's own XLA_FLAGS=--xla_dump_to=DIR keeps its dumps: read this compile's there.
    users = re.search(r"--xla_dump_to=(\S+)", os.environ.get("XLA_FLAGS", ""))
    if users:
        folder = pathlib.Path(users.group(1))
        before = set(folder.glob("*memory-usage-report.txt"))
        compiled = compile_lowered(lowered, options or {})
        return compiled, _spaces(set(folder.glob("*memory-usage-report.txt")) - before)
    with tempfile.TemporaryDirectory(prefix="tpu_inductor_buffers_") as folder:
        compiled = compile_lowered(lowered, {**(options or {}), "xla_dump_to": folder})
        return compiled, _spaces(pathlib.Path(folder).glob("*memory-usage-report.txt"))


def _spaces(reports) -> dict:
    """Bytes per memory space of the largest module among XLA's memory-usage ``reports``, and
    under ``"temporaries"`` its largest HBM temporaries (:func:`largest_temporaries`)."""
    spaces: dict = {}
    chosen = None
    for report in reports:
        found = {k: int(v) for k, v in _MEMORY_SPACE.findall(report.read_text())}
        if found.get("default", 0) > spaces.get("default", 0):
            spaces, chosen = found, report
    if chosen is not None:
        name = chosen.name.replace("-memory-usage-report.txt", "-buffer-assignment.txt")
        assignment = chosen.with_name(name)
        if assignment.exists():
            spaces["temporaries"] = largest_temporaries(assignment.read_text())
    return spaces


_ALLOCATION = re.compile(r"^allocation \d+: size (\d+)(.*)$")
_VALUE = re.compile(r"^ value: <\d+ ([\w.\-]+)(?:\{[^}]*\})? @\d+> \(size=(\d+),")
TEMPORARIES = 5  # how many of a program's largest temporaries the report names


def largest_temporaries(text: str, n: int = TEMPORARIES) -> list[tuple[str, int]]:
    """``(instruction, bytes)`` of the ``n`` largest values XLA's buffer assignment places in
    HBM temporaries (allocations of memory space 0 marked ``preallocated-temp``): the
    activations, gradients and transients a program holds while it runs, by the instruction
    that makes each."""
    sizes: dict[str, int] = {}
    temp = False
    for line in text.splitlines():
        head = _ALLOCATION.match(line)
        if head:
            flags = head.group(2)
            temp = "preallocated-temp" in flags and "color " not in flags
            continue
        value = _VALUE.match(line) if temp else None
        if value:
            name, size = value.group(1), int(value.group(2))
            sizes[name] = max(size, sizes.get(name, 0))
    return sorted(sizes.items(), key=lambda kv: -kv[1])[:n]


def memory_of(compiled, spaces: dict | None = None) -> dict:
    """A compiled program's memory per device: ``memory_analysis()``'s ``argument``,
    ``output``, ``temp``, ``alias``, ``code`` and ``peak``, and with ``spaces`` (from
    :func:`compile_measured`) the buffer assignment's ``hbm`` and ``vmem``, ``temp`` then
    being what the arguments and outputs leave of the HBM (XLA's own kept as ``xla_temp``).
    Empty when XLA gives no analysis."""
    mem = compiled.memory_analysis()
    if mem is None:
        return {}
    m = {
        "argument": mem.argument_size_in_bytes,
        "output": mem.output_size_in_bytes,
        "temp": mem.temp_size_in_bytes,
        "alias": mem.alias_size_in_bytes,
        "code": mem.generated_code_size_in_bytes,
        "peak": getattr(mem, "peak_memory_in_bytes", 0) or 0,
    }
    hbm = (spaces or {}).get("default", 0)
    if hbm:  # VMEM is on-chip memory beside the HBM, not in it (compile_measured)
        m["hbm"], m["vmem"], m["xla_temp"] = hbm, spaces.get("vmem", 0), m["temp"]
        m["temp"] = max(0, hbm - m["argument"] - (m["output"] - m["alias"]))
    return m


def peak_of(m: dict) -> int:
    """HBM peak per device of a :func:`memory_of` dict (see :attr:`Program.peak_bytes`)."""
    if m.get("hbm"):
        return m["hbm"] + m["code"]
    summed = m["argument"] + m["output"] - m["alias"] + m["temp"] + m["code"]
    return max(summed, m.get("peak", 0))


def _describe(program: Program, compiled, spaces: dict | None = None) -> None:
    program.memory = memory_of(compiled, spaces)
    cost = compiled.cost_analysis() or {}
    if isinstance(cost, list):  # older jax: one dict per computation
        cost = cost[0] if cost else {}
    program.flops = float(cost.get("flops", 0.0))
    program.bytes_accessed = float(cost.get("bytes accessed", 0.0))
    program.transcendentals = float(cost.get("transcendentals", 0.0))
    estimate = cost.get("optimal_seconds")
    # XLA returns a negative time when it has no estimate: that is no time at all
    program.xla_seconds = float(estimate) if estimate is not None and estimate > 0 else None
    program.hlo_text = compiled.as_text()
    program.ops = hlo.top_ops(program.hlo_text)
    named = hlo.provenance_of(program.hlo_text)
    program.temporaries = [
        (size, *named.get(name, ("", None))) for name, size in (spaces or {}).get("temporaries", ())
    ]
    program.hbm_traffic = float(hlo.hbm_bytes(program.hlo_text))
    program.bytes_moved = float(hlo.bytes_moved(program.hlo_text))
    program.cycles = float(hlo.estimated_cycles(program.hlo_text))
    chip = program.target.chip
    rate = cycle_rate(chip.generation)
    program.op_seconds = hlo.op_seconds(program.hlo_text, rate, chip.hbm_bytes_per_s)


_CALIBRATION = 8192  # a bf16 [n, n] @ [n, n] matmul: compute bound on every generation


@functools.cache
def cycle_rate(generation: str) -> float:
    """Cycles per second of the TPU compiler's ``estimated_cycles`` for ``generation``: what
    it estimates for a bf16 ``8192^3`` matmul over the time it gives that program itself
    (``cost_analysis()["optimal_seconds"]``). Compiled once per process (a few seconds);
    where the compiler gives no time, the matmul at the datasheet's bf16 peak."""
    from tpu_inductor.tpu.targets import tpu_target

    target = tpu_target(generation)
    n = _CALIBRATION
    spec = jax.ShapeDtypeStruct(
        (n, n), np.dtype("bfloat16") if hasattr(np, "bfloat16") else jax.numpy.bfloat16,
        sharding=jax.sharding.SingleDeviceSharding(target.devices[0]),
    )  # fmt: skip
    compiled = compile_lowered(jax.jit(lambda a, b: a @ b).trace(spec, spec).lower(), {})
    cycles = hlo.estimated_cycles(compiled.as_text())
    cost = compiled.cost_analysis() or {}
    if isinstance(cost, list):
        cost = cost[0] if cost else {}
    seconds = cost.get("optimal_seconds") or -1
    if seconds <= 0:
        seconds = 2 * n**3 / target.chip.bf16_flops
    return cycles / seconds


def explain_error(error: Exception, jaxpr, target: Target) -> str:
    """The TPU compiler's refusal in a user's words: what, where in their code, what to do."""
    return hlo.explain(error, jaxpr, target)


def clear() -> None:
    """Forget every recorded program (``tpu_inductor.reset()``)."""
    with _lock:
        PROGRAMS.clear()


__all__ = [
    "PROGRAMS",
    "Comm",
    "Program",
    "Value",
    "TargetCompileError",
    "clear",
    "record",
    "role_of",
]

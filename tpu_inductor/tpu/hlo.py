"""Reading what the TPU compiler made: the optimized HLO's top-level ops, the jaxpr's matmul
FLOPs, and compile errors in the user's words.

Every lowered op carries its FX node's module path and ATen op as a named scope and its user
source line as a stack frame (``sources.provenance``), so each instruction of the optimized HLO
names the torch code it came from: ``op_name="jit(graph1_backward)/backward/model.layers.0.mlp.
down_proj/mm/dot_general" stack_frame_id=17``, the frame table mapping 17 to a file and line.
The TPU compiler also writes its own cycle estimate into each instruction's backend config
(``"estimated_cycles"``); the report ranks ops by it.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import re

import numpy as np

_BYTES = {
    "pred": 1, "s4": 1, "u4": 1, "s8": 1, "u8": 1, "f8e4m3fn": 1, "f8e5m2": 1,
    "s16": 2, "u16": 2, "f16": 2, "bf16": 2,
    "s32": 4, "u32": 4, "f32": 4,
    "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16,
}  # fmt: skip
_ARRAY = re.compile(r"\b([a-z]+\d*(?:e\d+m\d+\w*)?)\[([\d,]*)\](\{[^}]*\})?")  # and layout
_INSTR = re.compile(r"^\s*(?:ROOT )?%([\w.\-]+) = (.*)$")
_SKIP = {
    "parameter", "constant", "bitcast", "get-tuple-element", "tuple", "copy-done",
    "after-all", "partition-id", "replica-id",
}  # fmt: skip
_TABLES = ("FileNames", "FunctionNames", "FileLocations", "StackFrames")


@dataclasses.dataclass(kw_only=True)
class Op:
    """One top-level instruction of an optimized HLO module.

    Attributes:
        name: its HLO name (``fusion.12``); ``opcode``: ``fusion``, ``copy``, ``custom-call``...
        cycles: the TPU compiler's estimate of its cycles (0 where it gives none).
        bytes: bytes of its operands and results (what it may move through HBM).
        scope: the torch module path and ATen op it was lowered from
            (``backward/model.layers.0.mlp.down_proj/mm``), ``""`` when unknown.
        source: ``"modeling_llama.py:245 (forward)"``, the user's line, or ``None``.
    """

    name: str
    opcode: str
    cycles: int
    bytes: int
    scope: str
    source: str | None


def parse_tables(text: str) -> dict[int, str]:
    """``stack_frame_id -> "file:line (function)"`` from the module's frame tables."""
    tables: dict[str, list[str]] = {name: [] for name in _TABLES}
    current = None
    for line in text.splitlines():
        stripped = line.strip()
        if stripped in _TABLES:
            current = stripped
            continue
        if current is None:
            continue
        if not stripped or stripped.startswith("%") or stripped.startswith("ENTRY"):
            if stripped:
                break
            continue
        tables[current].append(stripped)
    files = {int(k): v.strip('"') for k, v in (r.split(" ", 1) for r in tables["FileNames"])}
    funcs = {int(k): v.strip('"') for k, v in (r.split(" ", 1) for r in tables["FunctionNames"])}
    locations = {}
    for row in tables["FileLocations"]:
        key, rest = row.split(" ", 1)
        f = dict(re.findall(r"(\w+)=(\d+)", rest))
        short = files.get(int(f.get("file_name_id", 0)), "?").rsplit("/", 1)[-1]
        func = funcs.get(int(f.get("function_name_id", 0)), "?")
        locations[int(key)] = f"{short}:{f.get('line', '?')} ({func})"
    frames = {}
    for row in tables["StackFrames"]:
        key, rest = row.split(" ", 1)
        loc = re.search(r"file_location_id=(\d+)", rest)
        if loc:
            frames[int(key)] = locations.get(int(loc.group(1)))
    return frames


def _array_bytes(shape_text: str) -> int:
    return sum(n for n, _ in _arrays(shape_text))


def _arrays(shape_text: str) -> list[tuple[int, bool]]:
    """``(bytes, in HBM)`` of each array of a shape (a tuple's in order): an array whose layout
    names a memory space other than 0 (``S(1)``: the TPU's on-chip memory) is not in HBM."""
    out = []
    for dtype, dims, layout in _ARRAY.findall(shape_text):
        size = _BYTES.get(dtype)
        if size is not None:
            n = size * int(np.prod([int(d) for d in dims.split(",") if d] or [1]))
            out.append((n, re.search(r"S\([1-9]", layout or "") is None))
    return out


def _entry_lines(text: str) -> list[str]:
    start = text.find("\nENTRY ")
    if start < 0:
        return []
    end = text.find("\n}", start)
    return text[start:end].splitlines()[2:]


def _split_shape(rest: str) -> tuple[str, str]:
    """``"f32[2]{0} fusion(%a), ..."`` -> (the result shape, the rest from the opcode on)."""
    if rest.startswith("("):
        depth = 0
        for i, ch in enumerate(rest):
            depth += ch == "("
            depth -= ch == ")"
            if depth == 0:
                return rest[: i + 1], rest[i + 1 :].lstrip()
    shape, _, tail = rest.partition(" ")
    return shape, tail


def _entry_ops(text: str):
    """``(name, shape, opcode, operand shapes, rest of the line)`` of each top-level op of the
    entry computation (parameters, bitcasts, tuples and the like skipped)."""
    yield from _ops(_entry_lines(text))


def _instructions(lines):
    """``(name, shape, opcode, rest from the opcode on, line)`` of each instruction line."""
    for line in lines:
        m = _INSTR.match(line)
        if m is None:
            continue
        name, rest = m.groups()
        shape, tail = _split_shape(rest)
        yield name, shape, tail.split("(", 1)[0].strip(), tail, line


def _ops(lines):
    """:func:`_entry_ops` of one computation's instruction lines."""
    shapes: dict[str, str] = {}
    for name, shape, opcode, tail, _ in _instructions(lines):
        shapes[name] = shape
        if opcode not in _SKIP:
            operands = re.findall(r"%([\w.\-]+)", tail.split("),", 1)[0])
            yield name, shape, opcode, [shapes.get(o, "") for o in operands], tail


# Ops whose operands and results are a loop's or call's state, passed by reference: their
# bytes are moved by the ops of the computations they run, counted there.
_CONTROL = {"while", "call", "conditional", "async-start", "async-done", "async-update"}
_CONTROL_REF = re.compile(r"\b(?:body|condition)=%([\w.\-]+)")
_CALL_REF = re.compile(r" call\(.*\bto_apply=%([\w.\-]+)")


def control_computations(text: str) -> dict[str, list[str]]:
    """The computations of a module that run as a sequence of ops (the entry, loop bodies and
    conditions, conditional branches, called computations), not a fusion's or a reduction's
    inside: ``{name: instruction lines}``."""
    from tpu_inductor.tpu.hlo_loops import split_computations

    comps, entry = split_computations(text)
    if entry is None:
        return {}
    names = {entry}
    for lines in comps.values():
        for line in lines:
            names.update(_CONTROL_REF.findall(line))
            names.update(_CALL_REF.findall(line))
            if " conditional(" in line:
                branches = re.search(r"branch_computations=\{([^}]*)\}", line)
                if branches:
                    names.update(b.strip().lstrip("%") for b in branches.group(1).split(","))
    return {n: comps[n] for n in names if n in comps}


def per_run(text: str, of_line) -> float:
    """``sum(of_line(...))`` over the ops of a module's control computations, each as many
    times as it runs per call (a loop body once per trip: ``hlo_loops.computation_counts``).
    ``of_line(shape, opcode, operand shapes, rest, computations)`` gives one op's figure."""
    from tpu_inductor.tpu.hlo_loops import computation_counts, split_computations

    counts = computation_counts(text)
    comps, _ = split_computations(text)
    total = 0.0
    for name, lines in control_computations(text).items():
        times = counts.get(name, 1)
        for _, shape, opcode, operands, tail in _ops(lines):
            total += times * of_line(shape, opcode, operands, tail, comps)
    return total


_PARAM = re.compile(r"parameter\((\d+)\)")


def _slices(fused: list[str], comps: dict) -> tuple[dict[int, int], int | None]:
    """What a fusion reads of each parameter it only slices (or gathers rows of: an embedding
    lookup reads its rows, not the table), and what it writes when it
    updates parameters in place: ``({parameter index: bytes read}, bytes written or None)``.
    A parameter read whole (any other use) is left out: it costs its size. Bitcasts of a
    parameter are the parameter, a fusion inside is looked into, and a tuple result adds its
    parts."""
    alias: dict[str, int] = {}  # value name -> the parameter it is (a bitcast of)
    shapes: dict[str, str] = {}
    updates: dict[str, int] = {}  # an in-place update's name -> bytes it writes
    reads: dict[int, int] = {}
    whole: set[int] = set()
    root = None
    for name, shape, opcode, tail, line in _instructions(fused):
        if opcode == "parameter":
            alias[name] = int(_PARAM.search(tail).group(1))
            continue
        shapes[name] = shape
        args = tail.partition("(")[2].split("),", 1)[0].rstrip(")")
        names = re.findall(r"%([\w.\-]+)", args)
        if line.lstrip().startswith("ROOT"):
            root = (name, opcode, names)
        if opcode == "bitcast" and names and names[0] in alias:
            alias[name] = alias[names[0]]
            continue
        inner = None
        if opcode == "fusion":
            called = re.search(r"calls=%([\w.\-]+)", tail)
            inner = _slices(comps.get(called.group(1), []), comps)[0] if called else {}
        for k, arg in enumerate(names):
            i = alias.get(arg)
            if i is None:
                continue
            if opcode in ("dynamic-slice", "gather") and k == 0:  # the rows it takes
                reads[i] = reads.get(i, 0) + _array_bytes(shape)
            elif opcode == "dynamic-update-slice" and k == 0:
                reads.setdefault(i, 0)  # updated in place: only the update is written
                updates[name] = _array_bytes(shapes.get(names[1], "")) if len(names) > 1 else 0
            elif inner is not None and k in inner:
                reads[i] = reads.get(i, 0) + inner[k]
            else:
                whole.add(i)
    written = None
    if root is not None:
        name, opcode, names = root
        parts = names if opcode == "tuple" else [name]
        if any(p in updates for p in parts):
            written = sum(updates.get(p, _array_bytes(shapes.get(p, ""))) for p in parts)
    return {i: n for i, n in reads.items() if i not in whole}, written


def op_seconds(text: str, cycles_per_s: float, hbm_bytes_per_s: float) -> float:
    """A call's time as its ops run one after another, each at the slower of the compiler's
    cycle estimate and its HBM bytes at bandwidth (a loop body once per trip; an op the
    compiler does not estimate, as a Pallas kernel, by its bytes only)."""

    def seconds(shape, opcode, operands, tail, comps):
        m = re.search(r'"estimated_cycles":"(\d+)"', tail)
        cycles = int(m.group(1)) / cycles_per_s if m else 0.0
        moved = _op_bytes(shape, opcode, operands, tail, comps, hbm_only=True)
        return max(cycles, moved / hbm_bytes_per_s)

    return per_run(text, seconds)


def estimated_cycles(text: str) -> float:
    """The TPU compiler's cycle estimate of a whole call: each op's ``estimated_cycles`` times
    the runs of its computation (ops the compiler does not estimate, as a Pallas kernel's
    custom call, count 0)."""

    def cycles(shape, opcode, operands, tail, comps):
        m = re.search(r'"estimated_cycles":"(\d+)"', tail)
        return int(m.group(1)) if m else 0

    return per_run(text, cycles)


def top_ops(text: str) -> list[Op]:
    """The top-level ops of an optimized HLO module's entry computation, most cycles first."""
    frames = parse_tables(text)
    ops = []
    for name, shape, opcode, operands, tail in _entry_ops(text):
        moved = _array_bytes(shape) + sum(_array_bytes(o) for o in operands)
        cycles = re.search(r'"estimated_cycles":"(\d+)"', tail)
        op_name = re.search(r'op_name="([^"]*)"', tail)
        frame = re.search(r"stack_frame_id=(\d+)", tail)
        target = re.search(r'custom_call_target="([^"]+)"', tail)
        ops.append(
            Op(
                name=name,
                opcode=f"{opcode}:{target.group(1)}" if target else opcode,
                cycles=int(cycles.group(1)) if cycles else 0,
                bytes=moved,
                scope=_scope(op_name.group(1)) if op_name else "",
                source=frames.get(int(frame.group(1))) if frame else None,
            )
        )
    ops.sort(key=lambda o: (o.cycles, o.bytes), reverse=True)
    return ops


def provenance_of(text: str) -> dict[str, tuple[str, str | None]]:
    """``instruction name -> (scope, source)`` for every instruction of an optimized HLO module
    that carries an ``op_name`` (any computation, fusions' insides included)."""
    frames = parse_tables(text)
    out = {}
    for line in text.splitlines():
        m = _INSTR.match(line)
        if m is None or "op_name=" not in line:
            continue
        op_name = re.search(r'op_name="([^"]*)"', line)
        frame = re.search(r"stack_frame_id=(\d+)", line)
        source = frames.get(int(frame.group(1))) if frame else None
        out[m.group(1)] = (_scope(op_name.group(1)) if op_name else "", source)
    return out


def _hbm(shape_text: str) -> int:
    return sum(n for n, in_hbm in _arrays(shape_text) if in_hbm)


def _op_bytes(shape, opcode, operands, tail, comps, hbm_only: bool) -> int:
    """Bytes one op reads and writes (only those in HBM with ``hbm_only``). A slice of an
    operand reads the slice, not the operand; an update in place writes the update (a loop
    reading and writing one layer of a ``[layers, ...]`` stack per trip moves one layer)."""
    if opcode in _CONTROL or opcode == "slice-done":
        return 0
    arrays = _arrays(shape)

    def size(x: str) -> int:
        return sum(n for n, in_hbm in _arrays(x) if in_hbm or not hbm_only)

    if opcode == "dynamic-slice":
        return 2 * size(shape)
    if opcode == "gather" and operands:  # the rows it takes, its indices, its result
        return 2 * size(shape) + sum(size(o) for o in operands[1:])
    if opcode == "dynamic-update-slice" and len(operands) > 1:
        return 2 * size(operands[1])
    if opcode == "fusion":
        called = re.search(r"calls=%([\w.\-]+)", tail)
        reads, written = _slices(comps.get(called.group(1), []), comps) if called else ({}, None)
        total = size(shape) if written is None else written
        for i, o in enumerate(operands):
            total += size(o) if i not in reads else min(reads[i], size(o))
        return total

    if opcode == "copy-start" and len(arrays) >= 2:  # (destination, source, context)
        dest, dest_hbm = arrays[0]
        return (dest if dest_hbm or not hbm_only else 0) + size(operands[0] if operands else "")
    if opcode == "slice-start" and len(arrays) >= 2:  # ((source), slice, context)
        (_, source_hbm), (piece, piece_hbm) = arrays[0], arrays[1]
        return piece * 2 if not hbm_only else piece * (source_hbm + piece_hbm)
    return size(shape) + sum(size(o) for o in operands)


def hbm_bytes(text: str) -> int:
    """The bytes an optimized HLO module's ops read from and write to HBM per call, a loop
    body's once per trip (:func:`per_run`).

    XLA's ``cost_analysis`` "bytes accessed" counts every operand and result of every op,
    wherever it lives: on a TPU, memory-space assignment keeps values that fit in the on-chip
    memory (layouts marked ``S(1)``) and prefetches inputs into it (``copy-start`` / sliced
    ``slice-start``), and each of those is counted again where it is read. This counts only
    HBM: an op's operands and results in memory space 0, a prefetch's HBM side once; a loop's
    or call's own operands (its state, passed by reference) not at all. Where nothing fits on
    chip the two agree; for an MLP whose hidden activation stays on chip this counts its inputs
    and output once (``tests/tpu/test_hlo_hbm.py`` checks both).
    """
    return int(per_run(text, functools.partial(_op_bytes, hbm_only=True)))


def bytes_moved(text: str) -> int:
    """Every operand and result of a module's ops per call, wherever it lives (HBM or on
    chip), a loop body's once per trip: :func:`hbm_bytes` is the HBM part of it."""
    return int(per_run(text, functools.partial(_op_bytes, hbm_only=False)))


def _scope(op_name: str) -> str:
    """``jit(graph1_backward)/backward/model.norm/aten::mul/mul`` ->
    ``backward/model.norm/aten::mul`` (the jit name and JAX's own inner scopes dropped)."""
    parts = op_name.split("/")
    if parts and parts[0].startswith("jit("):
        parts = parts[1:]
    for i, part in enumerate(parts):
        if "::" in part:  # the ATen op (sources.scope_name); what follows is JAX's
            return "/".join(parts[: i + 1])
    return "/".join(parts[:-1]) if len(parts) > 1 else "/".join(parts)


def split_scope(scope: str) -> tuple[str, str]:
    """``backward/model.norm/aten::mul`` -> (``backward/model.norm``, ``aten::mul``)."""
    parts = scope.split("/")
    for i, part in enumerate(parts):
        if "::" in part:
            return "/".join(parts[:i]), part
    return "", scope


# --- collectives ---------------------------------------------------------------------------------

DCN_TRANSFER = "dcn-send"
COLLECTIVES = ("all-gather", "reduce-scatter", "all-reduce", "all-to-all", "collective-permute")
_COLLECTIVE = re.compile(
    r"^\s*(?:ROOT )?%([\w.\-]+) = (.*?) (" + "|".join(COLLECTIVES) + r")(-start)?\((.*)$"
)
_GROUPS_LIST = re.compile(r"replica_groups=\{((?:\{[\d,\s]*\},?\s*)*)\}")
_GROUPS_IOTA = re.compile(r"replica_groups=\[([\d,]+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?")
_GROUPS_MESH = re.compile(r"replica_groups=mesh\[([^\]]*)\]\s*\{([^}]*)\}")
# between slices, XLA splits a collective into its in-slice part and transfers over the
# data-center network, which the TPU compiler writes as host sends to the megascale runtime
_DCN_SEND = re.compile(
    r"^\s*(?:ROOT )?%([\w.\-]+) = \((\w+\[[\d,]*\])\S*, .*? send\(.*xla_megascale_runtime(.*)$"
)
_PAIRS = re.compile(r"source_target_pairs=\{((?:\{\d+,\d+\},?)*)\}")


@dataclasses.dataclass(kw_only=True)
class Collective:
    """One collective of an optimized HLO module (any computation: XLA puts some inside
    fusions).

    Attributes:
        name: its HLO name; ``kind``: ``all-gather``, ``reduce-scatter``, ``all-reduce``,
            ``all-to-all``, ``collective-permute``, or ``dcn-send`` (the part of a collective
            across slices that XLA sends over the data-center network).
        bytes: the bytes it hands each device: the gathered result (all-gather), the reduced
            input (reduce-scatter: the result times the group), the reduced value
            (all-reduce), the exchanged buffer (all-to-all, collective-permute).
        group: the device ids (logical: positions in the mesh) of its first replica group.
        scope / source: the torch module path and ATen op, and the user's line.
    """

    name: str
    kind: str
    bytes: int
    group: tuple[int, ...]
    scope: str
    source: str | None

    @property
    def group_size(self) -> int:
        """How many devices take part together."""
        return max(len(self.group), 1)

    def ring_bytes(self) -> float:
        """Bytes each device sends over its links in a ring (bidirectional) algorithm:
        ``bytes * (n-1)/n`` for all-gather, reduce-scatter and all-to-all, twice that for
        all-reduce (a reduce-scatter then an all-gather), ``bytes`` for a permute."""
        n = self.group_size
        if self.kind in ("collective-permute", DCN_TRANSFER):
            return float(self.bytes)
        share = self.bytes * (n - 1) / n
        return 2 * share if self.kind == "all-reduce" else share


def collectives(text: str, num_devices: int) -> list[Collective]:
    """Every collective in an optimized HLO module, with its bytes and first replica group,
    listed once per run: one in a loop body (``scan_layers``' layer loop) as many times as the
    loop runs (``hlo_loops.computation_counts``)."""
    from tpu_inductor.tpu.hlo_loops import computation_counts, split_computations

    frames = parse_tables(text)
    counts = computation_counts(text)
    comps, _ = split_computations(text)
    lines = [(counts.get(c, 1), line) for c, body in comps.items() for line in body]
    if not comps:  # a fragment, not a module
        lines = [(1, line) for line in text.splitlines()]
    found = []
    for times, line in lines:
        m = _COLLECTIVE.match(line)
        if m is None:
            dcn = _DCN_SEND.match(line)
            if dcn is not None:  # the data-center-network leg of a collective across slices
                send = Collective(
                    name=dcn.group(1),
                    kind=DCN_TRANSFER,
                    bytes=_array_bytes(dcn.group(2)),
                    group=(),
                    scope="",
                    source=None,
                )
                found += [send] * times
            continue
        name, shape, kind, _start, rest = m.groups()
        size = _collective_bytes(shape, kind, bool(_start))
        group = _first_group(rest, num_devices)
        if kind == "reduce-scatter":
            size *= max(len(group), 1)
        op_name = re.search(r'op_name="([^"]*)"', rest)
        frame = re.search(r"stack_frame_id=(\d+)", rest)
        found += [
            Collective(
                name=name,
                kind=kind,
                bytes=size,
                group=group,
                scope=_scope(op_name.group(1)) if op_name else "",
                source=frames.get(int(frame.group(1))) if frame else None,
            )
        ] * times
    return found


def _collective_bytes(shape: str, kind: str, start: bool) -> int:
    """The bytes of a collective's result: every array of a combined op's tuple; of an async
    all-gather's or permute's ``(operands, results, ...)`` tuple, the results."""
    if start and kind in ("all-gather", "collective-permute") and shape.startswith("("):
        parts = _top_level(shape[1:-1])
        if len(parts) >= 2:
            return _array_bytes(parts[1])
    return _array_bytes(shape)


def _top_level(text: str) -> list[str]:
    parts, depth, last = [], 0, 0
    for i, ch in enumerate(text):
        depth += ch in "([{"
        depth -= ch in ")]}"
        if ch == "," and depth == 0:
            parts.append(text[last:i])
            last = i + 1
    return parts + [text[last:]]


def _first_group(rest: str, num_devices: int) -> tuple[int, ...]:
    """The first replica group, in any of the optimized HLO's three spellings: explicit lists
    ``{{0,1},{2,3}}``, iota ``[2,2]<=[4]`` / ``[2,2]<=[2,2]T(1,0)``, or mesh axes
    ``mesh['axis_0'=2,'axis_1'=2] {'axis_1'}``; a permute's source/target pairs."""
    m = _GROUPS_MESH.search(rest)
    if m:
        axes = re.findall(r"'([^']+)'=(\d+)", m.group(1))
        names = [a for a, _ in axes]
        sizes = [int(n) for _, n in axes]
        chosen = [names.index(a) for a in re.findall(r"'([^']+)'", m.group(2)) if a in names]
        ids = np.arange(int(np.prod(sizes))).reshape(sizes)
        index = tuple(slice(None) if i in chosen else 0 for i in range(len(sizes)))
        return tuple(int(i) for i in ids[index].ravel())
    m = _GROUPS_IOTA.search(rest)
    if m:
        shape = [int(d) for d in m.group(1).split(",")]
        dims = [int(d) for d in m.group(2).split(",")]
        ids = np.arange(int(np.prod(dims))).reshape(dims)
        if m.group(3):
            ids = ids.transpose([int(d) for d in m.group(3).split(",")])
        return tuple(int(i) for i in ids.reshape(shape)[0])
    m = _GROUPS_LIST.search(rest)
    if m and m.group(1).strip():
        first = re.search(r"\{([\d,\s]*)\}", m.group(1))
        ids = [int(i) for i in first.group(1).replace(" ", "").split(",") if i]
        return tuple(ids) or tuple(range(num_devices))
    m = _PAIRS.search(rest)
    if m:
        pairs = re.findall(r"\{(\d+),(\d+)\}", m.group(1))
        return (int(pairs[0][0]), int(pairs[0][1])) if pairs else ()
    return tuple(range(num_devices))  # no groups given: every device


# --- matmul FLOPs by operand dtype and precision, from the jaxpr ----------------------------------


def matmul_flops(jaxpr, kernels_only: bool = False) -> dict[tuple[str, str], float]:
    """FLOPs of every ``dot_general``, ragged dot (an MoE's grouped GEMM) and convolution in
    ``jaxpr`` (sub-jaxprs included; with ``kernels_only``, those inside Pallas kernels only),
    keyed by (operand dtype, precision): what the MXU does, at a rate that depends on both."""
    totals: dict[tuple[str, str], float] = collections.defaultdict(float)
    for eqn, times, in_kernel in _eqns_counted(jaxpr):
        if kernels_only and not in_kernel:
            continue
        name = eqn.primitive.name
        if name not in ("dot_general", "ragged_dot_general", "conv_general_dilated"):
            continue
        lhs, rhs = (v.aval for v in eqn.invars[:2])
        out = eqn.outvars[0].aval
        if name == "dot_general":
            (contract, _), _ = eqn.params["dimension_numbers"]
            k = int(np.prod([lhs.shape[d] for d in contract] or [1]))
            flops = 2.0 * float(np.prod(out.shape)) * k
        elif name == "ragged_dot_general":
            dims = eqn.params["ragged_dot_dimension_numbers"]
            (contract, _), _ = dims.dot_dimension_numbers
            k = int(np.prod([lhs.shape[d] for d in contract] or [1]))
            flops = 2.0 * float(np.prod(out.shape)) * k
            if dims.lhs_ragged_dimensions[0] in contract:
                # ragged K (a weight gradient): the output has a group dimension, and each
                # group contracts only its own rows of K
                flops /= eqn.invars[2].aval.shape[0]
        else:
            spec = eqn.params["dimension_numbers"].rhs_spec  # (out feature, in feature, ...)
            flops = 2.0 * float(np.prod(out.shape)) * float(np.prod(rhs.shape)) / rhs.shape[spec[0]]
        totals[(_short_dtype(lhs.dtype), _precision(eqn.params.get("precision")))] += flops * times
    return dict(totals)


def _eqns_counted(jaxpr, times: int = 1, in_kernel: bool = False):
    """``(eqn, times)`` for every equation, sub-jaxprs included, with how often it runs per
    call: a ``scan`` body (``scan_layers``' repeated blocks) runs ``length`` times, so its
    matmuls count that many times (a loop without a static count counts once); a Pallas
    kernel's body once per point of its grid.

    NOTE: a kernel that skips blocks at run time (splash attention under a causal mask skips
    about half) is counted as if it ran them all."""
    from jax.extend.core import jaxprs_in_params

    closed = getattr(jaxpr, "jaxpr", jaxpr)
    for eqn in closed.eqns:
        yield eqn, times, in_kernel
        inner, kernel = times, in_kernel
        if eqn.primitive.name == "scan":
            inner = times * int(eqn.params["length"])
        elif eqn.primitive.name == "pallas_call":
            grid = getattr(eqn.params.get("grid_mapping"), "grid", ())
            inner = times * int(np.prod([g for g in grid if isinstance(g, int)] or [1]))
            kernel = True
        for sub in jaxprs_in_params(eqn.params):
            yield from _eqns_counted(sub, inner, kernel)


def _eqns(jaxpr):
    return (eqn for eqn, _, _ in _eqns_counted(jaxpr))


def _short_dtype(dtype) -> str:
    name = np.dtype(dtype).name
    return {"float32": "f32", "bfloat16": "bf16", "float16": "f16", "int8": "s8"}.get(name, name)


def _precision(precision) -> str:
    if isinstance(precision, tuple | list):
        precision = precision[0] if precision else None
    text = str(precision).lower() if precision is not None else "default"
    for level in ("highest", "high"):
        if level in text:
            return level
    return "default"


# --- errors ------------------------------------------------------------------------------------

_SIZE = r"([\d.]+[KMGT]?)"
_OOM = (  # the two ways libtpu says a program does not fit (libtpu 0.0.42)
    re.compile(rf"Used {_SIZE} of {_SIZE} hbm"),  # an allocation failed: used, capacity
    re.compile(rf"memory required for ([\w ]+?) \({_SIZE}\) exceeds available HBM \({_SIZE}\)"),
)
_NO_RULE = re.compile(r"translation rule for primitive '(\w+)' not found for platform (\w+)")


def _bytes(size: str) -> float:
    scale = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}.get(size[-1], 1)
    return float(size.rstrip("KMGT")) * scale


def _gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB"


def explain(error: Exception, jaxpr, target) -> str:
    """The TPU lowering's or compiler's refusal, said as what, where and what to do."""
    text = str(error)
    kind = target.chip.device_kind
    used = _OOM[0].search(text)
    required = _OOM[1].search(text)
    if used or required:
        need, capacity = used.groups() if used else required.groups()[1:]
        what = f" ({required.group(1)})" if required else ""
        over = _bytes(need) - _bytes(capacity)
        return (
            f"does not fit: the program needs {_gib(_bytes(need))}{what} of HBM per chip, a "
            f"{kind} chip has {_gib(_bytes(capacity))} usable; {_gib(over)} over."
            f"{_largest_allocations(text)}\nWhat to do: shard it over more chips (options "
            "mesh=tpu_target(...).mesh(...), shardings='fsdp'), a smaller batch or sequence, "
            "bfloat16 parameters, or activation checkpointing."
        )
    rule = _NO_RULE.search(text)
    if rule:
        primitive = rule.group(1)
        where = sorted({_where(e) for e in _eqns(jaxpr) if e.primitive.name == primitive})
        at = "".join(f"\n  at {w}" for w in where) or "\n  (no source line known)"
        return (
            f"the TPU compiler has no lowering for JAX's {primitive!r}:{at}\nWhat to do: "
            "compute it outside the compiled region (torch.compiler.disable), or compile for "
            "the CPU; on a TPU this op can't run."
        )
    first = text.strip().splitlines()[0] if text.strip() else type(error).__name__
    return f"{type(error).__name__}: {first}"


def _largest_allocations(text: str) -> str:
    """The largest allocations XLA lists with an out-of-memory error, named by our scopes."""
    rows = []
    for m in re.finditer(
        r"Size: ([\d.]+[KMGT]?)\s*\n\s*Operator: op_name=\"([^\"]*)\"(?:[^\n]*\n\s*Shape: (\S+))?",
        text,
    ):
        size, op_name, shape = m.groups()
        rows.append(f"\n  - {size}B {shape or ''} from {_scope(op_name) or op_name}")
        if len(rows) == 3:
            break
    return "\nLargest allocations:" + "".join(rows) if rows else ""


def _where(eqn) -> str:
    from jax._src import source_info_util

    scope = str(eqn.source_info.name_stack)
    frame = source_info_util.user_frame(eqn.source_info.traceback)
    line = f'File "{frame.file_name}", line {frame.start_line}' if frame else "unknown line"
    return f"{scope or eqn.primitive.name}: {line}"

"""What XLA says of one compiled TPU program, for ``benchmarks.tpu_programs`` and the split hand
steps of ``benchmarks.hand_split``: bytes, FLOPs, memory and the optimized HLO's top-level ops."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import numpy as np

_SHAPE = re.compile(r"^(pred|[a-z]+\d+)\[([\d,]*)\]")
_BITS = {"pred": 8}
_INSTR = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+) = (.+?) ([a-z][\w\-]*)\((.*)$")


def _shape_bytes(text: str) -> int:
    """Bytes of an HLO array shape (``f32[4,256]{1,0}``); 0 for tuples and tokens."""
    m = _SHAPE.match(text)
    if not m:
        return 0
    kind, dims = m.groups()
    bits = _BITS.get(kind) or int(re.sub(r"\D", "", kind) or 8)
    n = 1
    for d in filter(None, dims.split(",")):
        n *= int(d)
    return n * bits // 8


def hlo_summary(text: str) -> dict[str, Any]:
    """Counts of the optimized HLO's top-level (ENTRY) instructions by opcode, and the bytes
    written by its top-level copies (layout changes XLA could not fold into a fusion)."""
    entry, depth, ops = False, 0, {}
    copy_bytes = 0
    for line in text.splitlines():
        if line.startswith("ENTRY "):
            entry = True
            continue
        if not entry:
            continue
        if line.startswith("}"):
            break
        m = _INSTR.match(line)
        if not m:
            continue
        _, shape, opcode, _ = m.groups()
        ops[opcode] = ops.get(opcode, 0) + 1
        if opcode == "copy":
            copy_bytes += _shape_bytes(shape)
    del depth
    return {"ops": dict(sorted(ops.items())), "copy_bytes": copy_bytes}


SAVE_HLO: Path | None = None  # --save-hlo: write each program's optimized HLO there


def analyze(compiled, spaces: dict | None = None) -> dict:
    """XLA's figures for one compiled program (the hand-written ones; ours come from
    ``tpu_inductor.tpu.programs``, which reads the same analyses). ``spaces``: its bytes per
    memory space (``compile_jitted``): the HBM peak is then the buffer assignment's HBM plus
    code, as ``Program.peak_bytes`` counts it."""
    from tpu_inductor.tpu.hlo import hbm_bytes
    from tpu_inductor.tpu.programs import memory_of, peak_of

    text = compiled.as_text()
    if SAVE_HLO is not None:
        SAVE_HLO.mkdir(parents=True, exist_ok=True)
        (SAVE_HLO / f"program{len(list(SAVE_HLO.iterdir()))}.hlo.txt").write_text(text)
    cost = compiled.cost_analysis()
    if isinstance(cost, list):  # older jaxlibs: one dict per partition
        cost = cost[0]
    m = memory_of(compiled, spaces)
    summary = hlo_summary(text)
    return {
        "bytes": float(cost.get("bytes accessed", 0.0)),
        "hbm_bytes": hbm_bytes(text),
        "flops": float(cost.get("flops", 0.0)),
        "hbm_peak": int(peak_of(m)),  # as Program.peak_bytes counts it
        "arguments": int(m["argument"]),
        "outputs": int(m["output"]),
        "aliased": int(m["alias"]),
        "temp": int(m["temp"]),
        "vmem": int(m.get("vmem", 0)),
        "copies": summary["ops"].get("copy", 0),
        "copy_bytes": summary["copy_bytes"],
        "fusions": summary["ops"].get("fusion", 0),
    }


def compile_jitted(jitted, args) -> tuple[Any, float, float, dict]:
    """``jitted.trace(*args).lower().compile()``: (compiled, CPU seconds, wall seconds, bytes
    per memory space from its buffer assignment)."""
    from tpu_inductor.tpu.programs import compile_measured

    c0, w0 = time.process_time(), time.perf_counter()
    compiled, spaces = compile_measured(jitted.trace(*args).lower())
    return compiled, time.process_time() - c0, time.perf_counter() - w0, spaces


def _state_in(inputs: list, state_shapes) -> int:
    """Bytes of a program's arguments that are parameters or optimizer state, matched by shape
    and dtype (for these models no activation has a parameter's shape)."""
    left = dict(state_shapes)
    total = 0
    for shape, dtype in inputs:
        key = (tuple(shape), str(dtype))
        if left.get(key, 0) > 0:
            left[key] -= 1
            total += int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
    return total

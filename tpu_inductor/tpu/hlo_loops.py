"""How many times each computation of an optimized HLO module runs per call.

``scan_layers`` lowers a model's repeated blocks as one ``lax.scan``: in the optimized HLO a
``while`` whose body holds one layer. An instruction in that body (a collective, an op) runs
once per layer, but appears once in the text. :func:`computation_counts` gives every
computation's runs per call: 1 for the entry, a ``while`` body's caller's count times the loop's
trip count, and a called computation (fusions, reductions, branches) its caller's count.

The trip count: XLA writes ``known_trip_count`` into a while's ``backend_config`` on some
backends; the TPU compiler does not for ``scan_layers``' loops, so the bound
is read from the loop's condition: the largest integer constant it compares a value against
with ``direction=LT`` (``i < 32``). A loop whose bound can't be read counts once.
"""

from __future__ import annotations

import re

_HEADER = re.compile(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$")
_SINGLE = re.compile(r"\b(condition|body|calls|to_apply)=%([\w.\-]+)")
_MULTI = re.compile(r"\b(?:branch_computations|called_computations)=\{([^}]*)\}")
_KNOWN = re.compile(r'"known_trip_count":\{"n":"(\d+)"\}')
_CONSTANT = re.compile(r"^\s*%([\w.\-]+) = [su]\d+\[\]\S* constant\((\d+)\)")
_LESS = re.compile(r"compare\(([^)]*)\), direction=LT")


def split_computations(text: str) -> tuple[dict[str, list[str]], str | None]:
    """``({name: instruction lines}, entry name)`` of an HLO module's text."""
    comps: dict[str, list[str]] = {}
    entry, current = None, None
    for line in text.splitlines():
        if current is None:
            m = _HEADER.match(line)
            if m and not line.startswith(" "):
                current = m.group(1)
                comps[current] = []
                if line.startswith("ENTRY"):
                    entry = current
            continue
        if line.startswith("}"):
            current = None
            continue
        comps[current].append(line)
    return comps, entry


def _trip_count(while_line: str, condition: list[str]) -> int:
    known = _KNOWN.search(while_line)
    if known:
        return int(known.group(1))
    constants = {}
    for line in condition:
        c = _CONSTANT.match(line)
        if c:
            constants[c.group(1)] = int(c.group(2))
    bounds = [
        constants[name]
        for line in condition
        for m in _LESS.finditer(line)
        for name in (x.strip().lstrip("%") for x in m.group(1).split(","))
        if name in constants
    ]
    return max(bounds) if bounds and max(bounds) > 0 else 1


def computation_counts(text: str) -> dict[str, int]:
    """Runs per call of each computation reachable from the entry (see the module docstring);
    computations not reached (or a module without an entry) are left out."""
    comps, entry = split_computations(text)
    if entry is None:
        return {}
    counts = {entry: 1}
    stack = [entry]
    while stack:
        name = stack.pop()
        times = counts[name]
        for line in comps.get(name, ()):
            refs = dict((k, v) for k, v in _SINGLE.findall(line))
            children = [(v, 1) for k, v in refs.items() if k in ("calls", "to_apply")]
            if " while(" in line and "body" in refs:
                trip = _trip_count(line, comps.get(refs.get("condition", ""), []))
                children += [(refs["body"], trip), (refs.get("condition", ""), trip + 1)]
            for group in _MULTI.findall(line):
                children += [(c.strip().lstrip("%"), 1) for c in group.split(",") if c.strip()]
            for child, factor in children:
                if child in comps and counts.get(child, 0) < times * factor:
                    counts[child] = times * factor
                    stack.append(child)
    return counts


__all__ = ["computation_counts", "split_computations"]

"""The Core ATen opset and how tpu-inductor accounts for each of its overloads.

Shared by ``test_core_aten.py`` and ``scripts/gen_ops_doc.py``.
"""

from __future__ import annotations

import functools

import torch
from torch._ops import OpOverload

from tpu_inductor.capture.aot import decomposition_table
from tpu_inductor.lowering.lowerings import LOWERINGS
from tpu_inductor.lowering.lowerings.unsupported import UNSUPPORTED

aten = torch.ops.aten


@functools.cache
def core_aten_overloads() -> tuple[OpOverload, ...]:
    """Every ATen overload tagged ``torch.Tag.core``, sorted by name."""
    found = {}
    for schema in torch._C._jit_get_all_schemas():
        if not schema.name.startswith("aten::"):
            continue
        packet = getattr(aten, schema.name.removeprefix("aten::"), None)
        op = getattr(packet, schema.overload_name or "default", None) if packet else None
        if isinstance(op, OpOverload) and torch.Tag.core in op.tags:
            found[str(op)] = op
    return tuple(found[name] for name in sorted(found))


def coverage(op: OpOverload, _seen: frozenset = frozenset()) -> str | None:
    """How ``op`` is accounted for (``"lowered"``, ``"decomposed"``, ...), or ``None``."""
    if op in LOWERINGS:
        return "lowered"
    if op in decomposition_table():
        return "decomposed"
    if torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "CompositeImplicitAutograd"):
        return "decomposed by tracing (CompositeImplicitAutograd)"
    if op in UNSUPPORTED:
        return "unsupported: " + UNSUPPORTED[op].split(". What to do", 1)[0]
    if op._schema.is_mutable and op._overloadname.startswith("out"):
        packet = getattr(aten, op._schema.name.removeprefix("aten::"))
        for name in packet.overloads():
            other = getattr(packet, name)
            if other is not op and not other._schema.is_mutable and other not in _seen:
                if coverage(other, _seen | {op}) is not None:
                    return f"functionalized to {other}"
    return None

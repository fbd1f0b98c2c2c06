"""Decompositions of torch's multi-tensor ops (``_foreach_*``) and of the grad scaler's
``_amp_foreach_non_finite_check_and_unscale_`` into per-tensor ops that have lowerings.

torch ships no decomposition for these (Inductor lowers them itself), so without these a graph
holding one could only fall back. Each ``_foreach_<name>`` overload becomes ``<name>`` applied
to each element: ``Tensor[]`` and ``Scalar[]`` arguments are taken element by element, a single
``Tensor`` or ``Scalar`` is shared by every element, and torch picks the per-element overload
from the arguments' types, as it does for a direct call.
"""

from __future__ import annotations

import functools

import torch

aten = torch.ops.aten

# _foreach_<name> whose per-element op is not aten.<name>.
_RENAMED = {"norm": "linalg_vector_norm", "zero": "zeros_like"}

# Per-element ops with no overload for a number in the element's second place: the op that
# means the same for one (``_foreach_maximum(xs, 1.0)``: ASGD's eta update).
_WITH_NUMBER = {"maximum": aten.clamp_min, "minimum": aten.clamp_max}

# Per-element ops taking as a keyword what the foreach op takes positionally.
_AS_KEYWORD = {"addcmul": {3: "value"}, "addcdiv": {3: "value"}}

# Overloads not decomposed: their per-element value comes from a tensor torch reads on the host
# (``scalars: Tensor``) or they have no single aten counterpart.
_SKIP = {"powsum", "addcmul.Tensor", "addcdiv.Tensor"}


def _is_list(arg) -> bool:
    t = arg.type
    return isinstance(t, torch.ListType) or (
        isinstance(t, torch.OptionalType) and isinstance(t.getElementType(), torch.ListType)
    )


def _decomposition(op: torch._ops.OpOverload):
    name = op._schema.name.split("::")[1].removeprefix("_foreach_")
    if name in _SKIP or f"{name}.{op._overloadname}" in _SKIP:
        return None
    base = getattr(aten, _RENAMED.get(name, name), None)
    if base is None:
        return None
    schema = op._schema
    lists = [i for i, a in enumerate(schema.arguments) if _is_list(a)]
    names = [a.name for a in schema.arguments]
    kwarg_only = {a.name for a in schema.arguments if a.kwarg_only}
    as_keyword = _AS_KEYWORD.get(name, {})

    def decompose(*args, **kwargs):
        values = list(args) + [kwargs[n] for n in names[len(args) :] if n in kwargs]
        given = names[: len(values)]
        n = len(values[lists[0]])
        out = []
        for i in range(n):
            pos, kw = [], {}
            for j, (arg_name, v) in enumerate(zip(given, values, strict=True)):
                v = v[i] if j in lists else v
                if j in as_keyword:
                    kw[as_keyword[j]] = v
                elif arg_name in kwarg_only:
                    kw[arg_name] = v
                else:
                    pos.append(v)
            op_i = base
            if name in _WITH_NUMBER and len(pos) > 1 and not isinstance(pos[1], torch.Tensor):
                op_i = _WITH_NUMBER[name]
            out.append(op_i(*pos, **kw))
        return out

    return decompose


def _amp_unscale(self, found_inf, inv_scale):
    # aten::_amp_foreach_non_finite_check_and_unscale(Tensor[] self, Tensor found_inf,
    #     Tensor inv_scale) -> (Tensor[] self_out, Tensor found_inf_out)
    # torch's kernel: each value times inv_scale (in the value's opmath dtype), and found_inf set
    # to 1 if any value is not finite (never reset to 0).
    out, bad = [], []
    for g in self:
        half = g.dtype in (torch.float16, torch.bfloat16)
        out.append((g.float() * inv_scale).to(g.dtype) if half else g * inv_scale)
        bad.append(torch.logical_not(torch.isfinite(g)).any())
    if not bad:
        return out, found_inf
    any_bad = torch.stack(bad).any()
    return out, torch.where(any_bad, torch.ones_like(found_inf), found_inf)


@functools.cache
def decompositions() -> dict:
    """``OpOverload -> decomposition`` for every functional ``_foreach_*`` overload whose
    per-element op exists, and the grad scaler's unscale-and-check."""
    table = {}
    for schema in torch._C._jit_get_all_schemas():
        name = schema.name
        if not name.startswith("aten::_foreach_") or schema.overload_name.endswith("out"):
            continue
        if schema.is_mutable:  # functionalization hands us the functional variant
            continue
        packet = getattr(aten, name.split("::")[1])
        op = getattr(packet, schema.overload_name or "default")
        fn = _decomposition(op)
        if fn is not None:
            table[op] = fn
    table[aten._amp_foreach_non_finite_check_and_unscale.default] = _amp_unscale
    return table

"""Foreach ops (``aten._foreach_*``): one op over a list of tensors, as ``clip_grad_norm_``
(``_foreach_norm``, ``_foreach_mul_``), ``zero_grad(set_to_none=False)`` and the foreach
optimizers call them. Each is lowered as its per-tensor op applied to every element, through
that op's own lowering, so dtypes, promotion and every ``NOTE:`` are the per-tensor op's.
XLA fuses the elements inside one program, which is what torch's multi-tensor kernels buy.

The per-element op is ``aten.<name>`` (``_foreach_mul`` -> ``mul``), with the overload whose
schema takes the element's arguments (a tensor where a list held tensors, a number where it
held numbers); the exceptions are the table below. Functionalization has already turned the
in-place variants (``_foreach_mul_``) into these and ``copy_``.
"""

from __future__ import annotations

import types

import torch

from tpu_inductor.lowerings.registry import LOWERINGS, LoweringContext, register_lowering
from tpu_inductor.lowerings.unsupported import REFUSED

aten = torch.ops.aten

# foreach name -> per-element op (packet), where it is not aten.<name>
_ELEMENT_OP = {
    "norm": aten.linalg_vector_norm,  # _foreach_norm.Scalar(self, ord, dtype)
    "zero": aten.zeros_like,
}
# Ops with no single per-element ATen op, or results that are not one tensor per element.
_SKIP = {"mm", "powsum", "max"}


def _is_list(schema_type) -> bool:
    return isinstance(schema_type, torch.ListType)


def _element_args(schema, args, kwargs, i):
    """The ``i``-th element's arguments: ``(names, positional, keywords)``. List arguments give
    their ``i``-th item, the rest pass as they are; ``Tensor scalars`` (one value per element,
    addcdiv/addcmul ``.Tensor``) becomes ``value=scalars[i]``."""
    names, out, kw = [], [], {}
    for arg, value in zip(schema.arguments, args, strict=False):
        if arg.name == "scalars":
            kw["value"] = value[i]
        elif schema.name == "aten::_foreach_norm" and arg.name == "dtype":
            kw["dtype"] = value  # keyword-only in linalg_vector_norm
        else:
            names.append(arg.name)
            out.append(value[i] if _is_list(arg.type) else value)
    for k, v in kwargs.items():
        arg = next((a for a in schema.arguments if a.name == k), None)
        kw[k] = v[i] if arg is not None and _is_list(arg.type) else v
    return names, out, kw


def _kind(value) -> str:
    if isinstance(value, torch.Tensor):
        return "tensor"
    if isinstance(value, bool | int | float | complex | torch.SymInt | torch.SymFloat):
        return "number"
    return "other"


_PREFERRED = {"Tensor": 0, "Scalar": 1, "default": 2}  # tried first, in this order


def _pick_overload(packet, names, metas, kw_metas):
    """``(op, n)``: the overload of ``packet`` whose schema takes these per-element arguments,
    with the first ``n`` positionally and the rest by their names (``value`` of addcmul is
    keyword-only there); ``(None, 0)`` when none does."""
    candidates = sorted(packet.overloads(), key=lambda n: _PREFERRED.get(n, 3))
    # A second pass lets a number stand for a tensor (``_foreach_maximum.Scalar``: maximum has
    # no Scalar overload; the per-tensor lowerings take Python numbers as weak scalars).
    for loose, name in [(False, n) for n in candidates] + [(True, n) for n in candidates]:
        if "out" in name:
            continue
        op = getattr(packet, name)
        arguments = op._schema.arguments
        positional = [a for a in arguments if not a.kwarg_only]
        keyword_only = {a.name for a in arguments if a.kwarg_only}
        n = min(len(metas), len(positional))
        if any(names[j] not in keyword_only for j in range(n, len(metas))):
            continue
        pairs = zip(positional[:n], metas[:n], strict=True)
        if not all(_accepts(a.type, m, loose) for a, m in pairs):
            continue
        if not all(k in {a.name for a in arguments} for k in kw_metas):
            continue
        if all(a.has_default_value() for a in positional[n:]):
            return op, n
    return None, 0


def _accepts(schema_type, meta, loose: bool = False) -> bool:
    kind = _kind(meta)
    text = str(schema_type)
    if kind == "tensor":
        return text.startswith("Tensor")
    if kind == "number":
        return loose or not text.startswith("Tensor")
    return not text.startswith("Tensor") or meta is None


def _lower_foreach(name: str):
    def lower(ctx, *args, **kwargs):
        schema = ctx.node.target._schema
        n = next(
            len(v)
            for a, v in zip(schema.arguments, args, strict=False)
            if str(a.type).startswith("List[Tensor]")
        )
        packet = _ELEMENT_OP.get(name) or getattr(aten, name)
        results = []
        for i in range(n):
            names, el_args, el_kwargs = _element_args(schema, args, kwargs, i)
            _, el_metas, el_kw_metas = _element_args(schema, ctx.arg_metas, _kw_metas(ctx), i)
            op, k = _pick_overload(packet, names, el_metas, el_kw_metas)
            if op is None or op not in LOWERINGS:  # refused up front (_no_element_op)
                raise ValueError(f"no per-element op for {ctx.node.target} element {i}")
            el_kwargs.update(zip(names[k:], el_args[k:], strict=True))
            el_kw_metas.update(zip(names[k:], el_metas[k:], strict=True))
            view = types.SimpleNamespace(
                target=op,
                args=tuple(el_metas[:k]),
                kwargs=el_kw_metas,
                name=f"{getattr(ctx.node, 'name', name)}[{i}]",
                meta={"val": ctx.out[i]},
            )
            el_ctx = LoweringContext(
                view,
                ctx.precision,
                tuple(el_metas[:k]),
                make_key=ctx.make_key,
                bindings=ctx.bindings,
                platform=ctx.platform,
            )
            results.append(LOWERINGS[op](el_ctx, el_args[:k], el_kwargs))
        return results

    return lower


def _no_element_op(node) -> str | None:
    """Why a foreach node can't be lowered element by element (``unsupported.REFUSED``)."""

    def meta(a):
        if isinstance(a, list | tuple):
            return [meta(x) for x in a]
        return a.meta.get("val") if hasattr(a, "meta") else a

    schema = node.target._schema
    name = schema.name.removeprefix("aten::_foreach_")
    packet = _ELEMENT_OP.get(name) or getattr(aten, name)
    metas = [meta(a) for a in node.args]
    kw = {k: meta(v) for k, v in node.kwargs.items()}
    n = next((len(v) for a, v in zip(schema.arguments, metas, strict=False) if _is_list(a.type)), 0)
    for i in range(n):
        names, el_metas, el_kw = _element_args(schema, metas, kw, i)
        op, _ = _pick_overload(packet, names, el_metas, el_kw)
        if op is None or op not in LOWERINGS:
            return f"no overload of aten.{name} takes element {i}'s arguments"
    return None


def _kw_metas(ctx) -> dict:
    kwargs = getattr(ctx.node, "kwargs", None) or {}
    return {k: (v.meta.get("val") if hasattr(v, "meta") else v) for k, v in kwargs.items()}


def register_all() -> None:
    """Register every foreach op whose per-element op has a lowering (called by the package
    once all families are registered)."""
    names = sorted(
        {
            s.name.removeprefix("aten::_foreach_")
            for s in torch._C._jit_get_all_schemas()
            if s.name.startswith("aten::_foreach_") and not s.name.endswith("_")
        }
    )
    for name in names:
        if name in _SKIP:
            continue
        element = _ELEMENT_OP.get(name) or getattr(aten, name, None)
        if element is None or not any(
            getattr(element, o) in LOWERINGS for o in element.overloads()
        ):
            continue
        packet = getattr(aten, f"_foreach_{name}")
        ops = [getattr(packet, o) for o in packet.overloads() if "out" not in o]
        register_lowering(*ops)(_lower_foreach(name))
        for op in ops:
            REFUSED[op] = _no_element_op

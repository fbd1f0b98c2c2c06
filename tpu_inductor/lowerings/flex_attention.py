"""FlexAttention: the ``flex_attention`` and ``flex_attention_backward`` higher-order ops.

``torch.nn.attention.flex_attention.flex_attention(q, k, v, score_mod=, block_mask=)`` reaches
the AOTAutograd graph as ``torch.ops.higher_order.flex_attention`` (forward) and
``torch.ops.higher_order.flex_attention_backward`` (backward), with the user's ``score_mod`` and
the block mask's ``mask_mod`` as ATen subgraphs (``get_attr`` GraphModules over 0-d
``score, b, h, q_idx, kv_idx`` plus captured buffers). Both subgraphs are lowered with
:func:`tpu_inductor.lower.lower_graph` and vectorized over the index grids with ``jax.vmap``,
so any score/mask function built from lowerable ATen ops works.

The computation is dense (the full ``[B, H, M, N]`` score matrix), as torch's own CPU
reference (``torch._higher_order_ops.flex_attention.math_attention``): scores in float32
(float64 for float64 inputs), softmax that gives 0 for fully masked rows, ``logsumexp`` in the
units torch's op returns (log2 unless ``kernel_options["BACKEND"] == "FLASH"``; the public
function multiplies by ln 2). The backward is ``jax.vjp`` of the same dense forward, so the
gradients of ``q``, ``k``, ``v`` and of captured floating-point ``score_mod`` buffers (a
learnable bias) are exact; the ``joint_graph`` torch traces for its kernels is not used.

The block mask is honoured as its block-sparse tensors say, like torch's kernels: a position is
visible when its block is a full block, or a partial block and ``mask_mod`` allows it. For a
BlockMask made by ``create_block_mask`` this is exactly ``mask_mod``.

NOTE: on TPU the fast path is a block-sparse Pallas kernel (splash attention,
``jax.experimental.pallas.ops.tpu.splash_attention``) driven by ``kv_num_blocks`` /
``kv_indices`` / ``full_kv_*``; it would plug in at :func:`_attention` (forward) and
:func:`_flex_backward` (backward) when the platform is ``"tpu"``. It is not built: this
lowering is dense everywhere.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
import torch
import torch.fx as fx
from torch._higher_order_ops.flex_attention import flex_attention, flex_attention_backward

from tpu_inductor.dtypes import to_jax_dtype
from tpu_inductor.errors import UnsupportedOpError
from tpu_inductor.lowerings.registry import LOWERINGS, Lowering

_LN2 = math.log(2.0)


def _register_hop(hop) -> Callable:
    """Register a higher-order op's lowering (``register_lowering`` takes ATen ops only)."""

    def decorate(fn):
        if hop in LOWERINGS:
            raise ValueError(f"{hop} is registered twice")
        LOWERINGS[hop] = Lowering(hop, fn, None, None, False)
        return fn

    return decorate


def _precision_name(precision) -> str:
    from tpu_inductor.lower import PRECISIONS

    return next((k for k, v in PRECISIONS.items() if v == precision), "highest")


def _tuple_output_copy(sub: fx.GraphModule) -> fx.GraphModule:
    """A copy of ``sub`` whose output is a 1-tuple (what ``lower_graph`` expects)."""
    graph = fx.Graph()
    value = graph.graph_copy(sub.graph, {})
    graph.output((value,) if not isinstance(value, tuple | list) else tuple(value))
    return fx.GraphModule(sub, graph)


def _lower_mod(sub, what: str, precision) -> tuple[Callable, list]:
    """Lower a score_mod / mask_mod subgraph. Returns ``(fn, placeholder_metas)`` with ``fn``
    taking the subgraph's inputs (0-d arrays and buffers) and returning its one output."""
    from tpu_inductor.lower import lower_graph

    if not isinstance(sub, fx.GraphModule):
        raise UnsupportedOpError(
            f"flex_attention: the {what} reached the backend as {type(sub).__name__}, not an "
            "ATen subgraph (a GraphModule); compile the call with torch.compile so Dynamo "
            "traces it."
        )
    gm = _tuple_output_copy(sub)
    try:
        lowered = lower_graph(gm, precision=_precision_name(precision))
    except UnsupportedOpError as e:
        raise UnsupportedOpError(
            f"flex_attention: the {what} uses ops without a TPU lowering, so the attention "
            f"cannot be lowered:\n{e}",
            missing=getattr(e, "missing", None),
        ) from e
    if lowered.has_rng:
        raise UnsupportedOpError(f"flex_attention: a random op in the {what} is not supported")
    metas = [n.meta.get("val") for n in gm.graph.nodes if n.op == "placeholder"]

    kind, pos = lowered.output_plan[0]

    def fn(*inputs):
        if kind == "input":  # the identity score_mod returns its score as it is
            return inputs[pos]
        return lowered.fn(None, *inputs)[pos]

    return fn, metas


def _index_dtype(metas, i):
    m = metas[i] if i < len(metas) else None
    return to_jax_dtype(m.dtype) if isinstance(m, torch.Tensor) else jnp.int32


def _over_grid(fn: Callable, lead: int, n_bufs: int) -> Callable:
    """``fn(*lead_values, b, h, m, n, *bufs)`` on 0-d values, vectorized to
    ``fn(*lead_arrays[B, H, M, N], b[B], h[H], m[M], n[N], *bufs)`` (as torch's
    ``_vmap_for_bhqkv``): innermost over kv_idx, outermost over b."""
    bufs = (None,) * n_bufs
    for dim in (3, 2, 1, 0):
        idx = [None, None, None, None]
        idx[dim] = 0
        fn = jax.vmap(fn, in_axes=(0,) * lead + tuple(idx) + bufs)
    return fn


def _grids(metas, first: int, shape):
    """``arange`` over each of ``b, h, q_idx, kv_idx`` in the subgraph's index dtype."""
    return [jnp.arange(size, dtype=_index_dtype(metas, first + i)) for i, size in enumerate(shape)]


def _block_visibility(block_mask: tuple, M: int, N: int):
    """``(partial, full)`` booleans ``[b, h, M, N]`` (b, h possibly 1) from the block-sparse
    tensors, or ``None`` where the mask has none."""
    q_bs, kv_bs = block_mask[-3], block_mask[-2]

    def dense(num, indices):
        if num is None or indices is None:
            return None
        n_kv_blocks = -(-N // kv_bs)
        slots = jnp.arange(indices.shape[-1])
        valid = slots < num[..., None]  # [b, h, QB, slots]
        hit = jax.nn.one_hot(indices, n_kv_blocks, dtype=jnp.bool_) & valid[..., None]
        blocks = jnp.any(hit, axis=-2)  # [b, h, QB, KVB]
        rows = jnp.minimum(jnp.arange(M) // q_bs, blocks.shape[-2] - 1)
        cols = jnp.arange(N) // kv_bs
        out = blocks[..., rows, :][..., cols]
        if blocks.shape[-2] * q_bs < M:  # rows past the mask's blocks see nothing
            out = out & (jnp.arange(M) < blocks.shape[-2] * q_bs)[:, None]
        return out

    return dense(block_mask[2], block_mask[3]), dense(block_mask[4], block_mask[5])


def _mask(block_mask: tuple, mask_bufs: tuple, shape, precision):
    """The dense visibility ``[B, H, M, N]`` (broadcastable) of a block mask tuple."""
    M, N = shape[2], shape[3]
    mask_fn, metas = _lower_mod(block_mask[-1], "mask_mod", precision)
    grids = _grids(metas, 0, shape)
    allowed = _over_grid(mask_fn, 0, len(mask_bufs))(*grids, *mask_bufs).astype(jnp.bool_)
    partial, full = _block_visibility(block_mask, M, N)
    if partial is not None:
        allowed = allowed & partial
    if full is not None:
        allowed = allowed | full
    return allowed


def _attention(q, k, v, score_fn, score_metas, mask, scale, score_bufs, lse_scale):
    """Dense flex attention: ``(out, lse * lse_scale, max * lse_scale)`` with lse/max in the
    working precision."""
    wp = jnp.float64 if q.dtype == jnp.float64 else jnp.float32
    B, Hq, M, _ = q.shape
    Hkv, N = k.shape[1], k.shape[2]
    if Hq != Hkv:  # GQA: every group of Hq // Hkv query heads shares one kv head
        k = jnp.repeat(k, Hq // Hkv, axis=1)
        v = jnp.repeat(v, Hq // Hkv, axis=1)
    k = jnp.broadcast_to(k, (B, *k.shape[1:]))
    v = jnp.broadcast_to(v, (B, *v.shape[1:]))
    scores = jnp.einsum(
        "bhmd,bhnd->bhmn",
        q.astype(wp),
        k.astype(wp),
        precision=jax.lax.Precision.HIGHEST,
        preferred_element_type=wp,
    )
    scores = (scores * scale).astype(wp)
    if score_fn is not None:
        score_dtype = _index_dtype(score_metas, 0)
        grids = _grids(score_metas, 1, (B, Hq, M, N))
        scores = _over_grid(score_fn, 1, len(score_bufs))(
            scores.astype(score_dtype), *grids, *score_bufs
        ).astype(wp)
    scores = jnp.where(mask, scores, -jnp.inf)
    row_max = jnp.max(scores, axis=-1, keepdims=True)
    shift = jax.lax.stop_gradient(jnp.where(jnp.isfinite(row_max), row_max, 0.0))
    p = jnp.exp(scores - shift)
    total = jnp.sum(p, axis=-1, keepdims=True)
    empty = total == 0  # a fully masked row: output 0, lse -inf (torch's _safe_softmax)
    probs = p / jnp.where(empty, 1.0, total)
    lse = jnp.where(empty, -jnp.inf, jnp.log(jnp.where(empty, 1.0, total)) + shift)[..., 0]
    out = jnp.einsum(
        "bhmn,bhnd->bhmd",
        probs.astype(q.dtype),
        v.astype(q.dtype),
        precision=jax.lax.Precision.HIGHEST,
        preferred_element_type=wp,
    ).astype(q.dtype)
    return out, lse * lse_scale, row_max[..., 0] * lse_scale


def _lse_scale(kernel_options) -> float:
    # torch's kernels keep lse (and max) in log2 units except the FLASH backend; the op's
    # result is in those units and flex_attention() multiplies by ln 2.
    backend = (kernel_options or {}).get("BACKEND", "AUTO")
    return 1.0 if backend == "FLASH" else 1.0 / _LN2


def _check_block_mask(block_mask) -> None:
    if not isinstance(block_mask, tuple) or len(block_mask) < 7:
        raise UnsupportedOpError(
            f"flex_attention: unexpected block_mask layout ({type(block_mask).__name__} of "
            f"{len(block_mask) if isinstance(block_mask, tuple) else '?'}); this lowering "
            "knows torch 2.13's BlockMask.as_tuple()"
        )


def _prepare(ctx, q, k, block_mask, score_mod, mask_bufs):
    _check_block_mask(block_mask)
    shape = (q.shape[0], q.shape[1], q.shape[2], k.shape[2])
    mask = _mask(block_mask, tuple(mask_bufs), shape, ctx.precision)
    score_fn, score_metas = (None, [])
    if score_mod is not None:
        score_fn, score_metas = _lower_mod(score_mod, "score_mod", ctx.precision)
    return mask, score_fn, score_metas


# flex_attention(Tensor query, Tensor key, Tensor value, Callable score_mod, tuple block_mask,
#     float scale, dict kernel_options, tuple score_mod_other_buffers=(),
#     tuple mask_mod_other_buffers=()) -> (Tensor out, Tensor logsumexp, Tensor max_scores)
@_register_hop(flex_attention)
def _flex_attention(
    ctx,
    query,
    key,
    value,
    score_mod,
    block_mask,
    scale,
    kernel_options,
    score_mod_other_buffers=(),
    mask_mod_other_buffers=(),
):
    mask, score_fn, score_metas = _prepare(
        ctx, query, key, block_mask, score_mod, mask_mod_other_buffers
    )
    out, lse, mx = _attention(
        query,
        key,
        value,
        score_fn,
        score_metas,
        mask,
        scale,
        tuple(score_mod_other_buffers),
        _lse_scale(kernel_options),
    )
    return out, lse.astype(ctx.out_dtype(1)), mx.astype(ctx.out_dtype(2))


def _is_float(x) -> bool:
    return isinstance(x, jax.Array | jax.core.Tracer) and jnp.issubdtype(x.dtype, jnp.inexact)


# flex_attention_backward(Tensor query, Tensor key, Tensor value, Tensor out, Tensor logsumexp,
#     Tensor? grad_out, Tensor? grad_logsumexp, Callable fw_graph, GraphModule joint_graph,
#     tuple block_mask, float scale, dict kernel_options, tuple score_mod_other_buffers=(),
#     tuple mask_mod_other_buffers=()) -> (Tensor dq, Tensor dk, Tensor dv, tuple buffer_grads)
@_register_hop(flex_attention_backward)
def _flex_backward(
    ctx,
    query,
    key,
    value,
    out,
    logsumexp,
    grad_out,
    grad_logsumexp,
    fw_graph,
    joint_graph,
    block_mask,
    scale,
    kernel_options,
    score_mod_other_buffers=(),
    mask_mod_other_buffers=(),
):
    # NOTE: recomputes the forward and differentiates it with jax.vjp instead of running
    # torch's joint_graph (which holds flex_lib.zeros_and_scatter, a kernel helper); `out` and
    # `logsumexp` from the forward are not needed.
    mask, score_fn, score_metas = _prepare(
        ctx, query, key, block_mask, fw_graph, mask_mod_other_buffers
    )
    bufs = tuple(score_mod_other_buffers)
    grad_pos = [i for i, b in enumerate(bufs) if _is_float(b)]
    lse_scale = _lse_scale(kernel_options)

    def forward(q, k, v, *float_bufs):
        all_bufs = list(bufs)
        for i, b in zip(grad_pos, float_bufs, strict=True):
            all_bufs[i] = b
        o, lse, _ = _attention(
            q, k, v, score_fn, score_metas, mask, scale, tuple(all_bufs), lse_scale
        )
        return o, lse

    primals = (query, key, value, *(bufs[i] for i in grad_pos))
    (o, lse), vjp = jax.vjp(forward, *primals)
    d_out = jnp.zeros_like(o) if grad_out is None else grad_out.astype(o.dtype)
    d_lse = jnp.zeros_like(lse) if grad_logsumexp is None else grad_logsumexp.astype(lse.dtype)
    grads = vjp((d_out, d_lse))
    dq, dk, dv = grads[:3]
    buf_grads = dict(zip(grad_pos, grads[3:], strict=True))
    metas = ctx.out[3] if isinstance(ctx.out, tuple | list) and len(ctx.out) > 3 else ()
    out_bufs = []
    for i, meta in enumerate(metas):
        if isinstance(meta, torch.Tensor) and i in buf_grads:
            out_bufs.append(buf_grads[i].astype(to_jax_dtype(meta.dtype)))
        elif isinstance(meta, torch.Tensor):  # an integer buffer: torch gives no grad
            out_bufs.append(jnp.zeros(meta.shape, to_jax_dtype(meta.dtype)))
        else:
            out_bufs.append(None)
    return (
        dq.astype(ctx.out_dtype(0)),
        dk.astype(ctx.out_dtype(1)),
        dv.astype(ctx.out_dtype(2)),
        tuple(out_bufs),
    )


def _install_compile_time_device_check() -> None:
    """Let Dynamo trace ``flex_attention`` on CPU tensors that require grad.

    ``torch.nn.attention.flex_attention`` refuses CPU inputs that require grad because torch has
    no CPU backward kernel; Dynamo traces that check too, so without this no CPU (or TPU-bound:
    the backend's inputs are CPU tensors) training graph ever reaches the backend. This swaps
    the check for one without that clause *only while Dynamo traces* (``substitute_in_graph``);
    eager calls still run torch's original and still refuse. Cost: another backend compiling
    CPU flex training in this process fails in its own lowering (inductor: an IndexError)
    instead of at torch's check; the substitute cannot tell which backend Dynamo compiles for.
    """
    import torch.nn.attention.flex_attention as fa

    original = getattr(fa, "_validate_device", None)
    if original is None or getattr(original, "_tpu_inductor_substituted", False):
        return

    def _validate_device(query, key, value):
        if query.device.type == "mps" and (
            query.requires_grad or key.requires_grad or value.requires_grad
        ):
            raise NotImplementedError("FlexAttention does not support backward on MPS.")
        if query.device.type not in {"cuda", "cpu", "xpu", "hpu", "mps"}:
            raise ValueError(
                "FlexAttention is only supported on CUDA, CPU, HPU, or MPS devices. "
                f"Found input tensors on {query.device.type} device."
            )

    try:
        torch._dynamo.substitute_in_graph(original)(_validate_device)
    except (TypeError, ValueError):  # already substituted, or a torch that refuses: keep it
        return
    original._tpu_inductor_substituted = True


_install_compile_time_device_check()

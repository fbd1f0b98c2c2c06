"""FlexAttention: the ``flex_attention`` and ``flex_attention_backward`` higher-order ops.

``torch.nn.attention.flex_attention.flex_attention(q, k, v, score_mod=, block_mask=)`` reaches
the AOTAutograd graph as ``torch.ops.higher_order.flex_attention`` (forward) and
``torch.ops.higher_order.flex_attention_backward`` (backward), with the user's ``score_mod`` and
the block mask's ``mask_mod`` as ATen subgraphs (``get_attr`` GraphModules over 0-d
``score, b, h, q_idx, kv_idx`` plus captured buffers). Both subgraphs are lowered with
:func:`tpu_inductor.lowering.lower.lower_graph` and vectorized over the index grids with
``jax.vmap``, so any score/mask function built from lowerable ATen ops works.

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

On a TPU the forward and backward take splash attention instead, the block-sparse Pallas
kernel (:mod:`tpu_inductor.lowering.lowerings.splash_attention`), when the call fits it: no
score_mod or a constant soft cap, float32 or bfloat16, sequence lengths multiples of 128,
``max_scores`` not read, and a mask it can be given (:func:`_splash_plan`). Everything else,
and every other device, is the dense computation above.
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import torch
import torch.fx as fx
from torch._higher_order_ops.flex_attention import flex_attention, flex_attention_backward

from tpu_inductor.core.dtypes import to_jax_dtype
from tpu_inductor.core.errors import UnsupportedOpError
from tpu_inductor.lowering.lowerings import splash_attention as splash
from tpu_inductor.lowering.lowerings.registry import lowers

log = logging.getLogger("tpu_inductor")

_LN2 = math.log(2.0)


def _precision_name(precision) -> str:
    from tpu_inductor.lowering.lower import PRECISIONS

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
    from tpu_inductor.lowering.lower import lower_graph

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
            f"flex_attention: the {what} uses ops without a lowering, so the attention "
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


def _is_tracer(x) -> bool:
    """Whether ``x`` is known only inside the trace (a concrete array's mask can be evaluated
    while lowering, so it is not one; compare ``core.boundary.is_traced``)."""
    return isinstance(x, jax.core.Tracer)


# ops that read only a tensor's dtype and device (noop_mask: b.new_ones(()))
_METADATA_ONLY = {
    torch.ops.aten.new_ones.default,
    torch.ops.aten.new_zeros.default,
    torch.ops.aten.new_empty.default,
    torch.ops.aten.new_full.default,
}


def _placeholder_used(sub: fx.GraphModule, i: int) -> bool:
    """Whether the subgraph's ``i``-th input's value (not only its dtype) reaches its result."""
    placeholders = [n for n in sub.graph.nodes if n.op == "placeholder"]
    if i >= len(placeholders):
        return False
    return any(u.target not in _METADATA_ONLY for u in placeholders[i].users)


def _static_mask_mod(sub, mask_bufs: tuple, heads: int, M: int, N: int, precision):
    """``mask_mod`` evaluated now, as a boolean numpy ``[h, M, N]`` (``h`` is ``heads`` if it
    reads the head index, else 1). The caller checks that its buffers are concrete and that it
    ignores the batch index. Evaluated in row chunks of at most 2**24 elements."""
    mask_fn, metas = _lower_mod(sub, "mask_mod", precision)
    H = heads if _placeholder_used(sub, 1) else 1
    fn = _over_grid(mask_fn, 0, len(mask_bufs))
    rows = max(1, (1 << 24) // (H * N))
    chunks = []
    with jax.ensure_compile_time_eval():
        b, h, q, kv = _grids(metas, 0, (1, H, M, N))
        for start in range(0, M, rows):
            chunk = fn(b, h, q[start : start + rows], kv, *mask_bufs)
            chunks.append(np.asarray(chunk).astype(np.bool_))
    return np.concatenate(chunks, axis=2)[0]


def _block_matrix(num, indices, n_kv_blocks: int):
    """``[b, h, QB, KVB]`` booleans: which kv blocks each q block lists."""
    valid = jnp.arange(indices.shape[-1]) < num[..., None]
    target = jnp.where(valid, indices, n_kv_blocks).astype(jnp.int32)
    hit = jnp.zeros((*indices.shape[:-1], n_kv_blocks + 1), jnp.bool_)
    return jnp.put_along_axis(hit, target, True, axis=-1, inplace=False)[..., :n_kv_blocks]


def _block_layout(block_mask: tuple, M: int, N: int) -> tuple[int, int] | None:
    """``(q_blocks, kv_blocks)`` of the block mask's tensors when they tile ``M`` x ``N`` in
    whole blocks (or one block larger than the sequence), else ``None``."""
    q_bs, kv_bs = block_mask[-3], block_mask[-2]
    num, indices, full_num = block_mask[2], block_mask[3], block_mask[4]
    if not (isinstance(q_bs, int) and isinstance(kv_bs, int)) or num is None or indices is None:
        return None
    if (q_bs < M and M % q_bs) or (kv_bs < N and N % kv_bs):
        return None
    QB, KVB = -(-M // q_bs), -(-N // kv_bs)
    if num.shape[-1] != QB or (full_num is not None and full_num.shape[-1] != QB):
        return None
    return QB, KVB


def _tile_classes(static: np.ndarray, QB: int, KVB: int) -> tuple[np.ndarray, np.ndarray]:
    """``(any, all)`` of ``static`` ``[h, M, N]`` over each of ``QB`` x ``KVB`` tiles."""
    M, N = static.shape[1:]
    tiles = static.reshape(static.shape[0], QB, M // QB, KVB, N // KVB)
    return tiles.any(axis=(2, 4)), tiles.all(axis=(2, 4))


def _blocks_agree(block_mask: tuple, static: np.ndarray, QB: int, KVB: int):
    """Whether the block mask's tensors select exactly ``static`` (the ``[h, M, N]`` mask_mod)
    under the dense lowering's rule (visible = full block, or partial block and mask_mod): a
    boolean scalar computed in the graph from the small block tensors only.

    They agree iff every block they call full is all-True in ``static``, and every block where
    ``static`` has a True is listed (partial or full). A BlockMask from ``create_block_mask`` of
    the same mask_mod always agrees."""
    any_true, all_true = _tile_classes(static, QB, KVB)
    listed = _block_matrix(block_mask[2], block_mask[3], KVB)
    ok = jnp.bool_(True)
    if block_mask[4] is not None and block_mask[5] is not None:
        full = _block_matrix(block_mask[4], block_mask[5], KVB)
        listed = listed | full
        ok = jnp.all(jnp.where(full, all_true, True))
    return ok & jnp.all(listed | ~any_true)


class _SplashPlan:
    """How one flex_attention call runs on splash (see :func:`_splash_plan`)."""

    def __init__(self, how: str, build: Callable, describe: str):
        # build() -> ((mask, make_kernel), empty rows or None, block check or None), traced
        # inside the splash branch so that a dense branch compiles none of it
        self.how, self.build, self.describe = how, build, describe

    def run(self, splash_fn: Callable, dense_fn: Callable):
        """``splash_fn()``, or on an unknown platform ``jax.lax.platform_dependent``: splash
        where XLA lowers for a TPU, dense elsewhere (both traced, one compiled)."""
        if self.how == "platform_dependent":
            return jax.lax.platform_dependent(tpu=splash_fn, default=dense_fn)
        return splash_fn()


def _splash_plan(ctx, q, k, v, score_mod, block_mask, score_bufs, mask_bufs, *, backward: bool):
    """A :class:`_SplashPlan` when this flex_attention call can run on splash attention, else
    ``None`` (logged at DEBUG with the reason).

    The mask is given to splash in one of two forms:

    - **static**: when ``mask_mod``'s buffers are known now (none, or constants) and it ignores
      the batch index, it is evaluated at compile time into a numpy ``[h, M, N]`` mask, from
      which splash fixes its tiles and skips empty blocks with no work per call. The block
      mask's own tensors are graph inputs (values known only per call), so they are not read
      on the host: the graph checks that they agree with ``mask_mod`` (:func:`_blocks_agree`,
      a comparison of the small block tensors) and makes the whole result NaN when they do
      not, instead of silently attending where the dense rule would not.
    - **dynamic**: otherwise (a buffer that is a graph input, e.g. document ids; the batch
      index; a BlockMask whose blocks are its only mask, as ``mask_mod=noop_mask``; blocks made
      for one head under a mask_mod whose heads differ block-wise), the exact
      dense visibility is computed in the graph, as the dense lowering does, and handed to
      splash as a boolean array; splash derives its block sparsity from it per call. Memory:
      one boolean per (batch of the mask, head, q, kv), against the dense path's float32
      scores and probabilities.
    """
    how, why = splash.mode(getattr(ctx, "platform", None))
    if how is not None:
        why = splash.shape_reason(q, k, v)
    if why is None and not backward and ctx.uses_output(2):
        why = "max_scores is read (splash does not compute it)"
    if why is None and backward and not splash.backward_available():
        why = "this jax's private splash backward functions have other parameters"
    soft_cap = None
    if why is None:
        fits, soft_cap = splash.soft_cap_of(score_mod, tuple(score_bufs))
        if not fits:
            why = "score_mod is neither absent nor a constant soft cap"
    if why is None:
        _check_block_mask(block_mask)
        if not isinstance(block_mask[-1], fx.GraphModule):
            why = "mask_mod is not an ATen subgraph"
    if why is not None:
        log.debug("flex_attention%s: dense: %s", " backward" if backward else "", why)
        return None

    B, Hq, M = q.shape[:3]
    N = k.shape[2]
    sub, mask_bufs = block_mask[-1], tuple(mask_bufs)
    interpret = how == "interpret"
    sizes = splash.block_sizes(M, N, interpret)
    static = layout = None
    if not any(_is_tracer(b) for b in mask_bufs) and not _placeholder_used(sub, 0):
        static = _static_mask_mod(sub, mask_bufs, Hq, M, N, ctx.precision)
        layout = _block_layout(block_mask, M, N)
        if layout is None:  # block tensors that cannot be checked against it: the exact form
            static = None
        elif static.all() and static.shape[0] == 1 and layout != (1, 1):
            # a noop mask_mod with real block tensors: the blocks are the mask (dynamic form);
            # the one-block mask flex makes for a call without block_mask stays static
            static = None
        elif static.shape[0] > 1 and block_mask[2].shape[1] == 1:
            # blocks made for one head (create_block_mask(H=None)) under a mask_mod that reads
            # h: where heads' tiles differ they cannot agree with every head (dynamic form)
            classes = _tile_classes(static, *layout)
            if any((c != c[:1]).any() for c in classes):
                static = None

    if static is not None:
        splash_mask, kinds = splash.static_mask(static, Hq)
        empty_rows = ~static.any(axis=-1)  # [h, M]
        empty_np = empty_rows[None] if empty_rows.any() else None

        def build():
            make = functools.partial(
                splash.make_kernel, sizes=sizes, soft_cap=soft_cap, interpret=interpret
            )
            empty = None if empty_np is None else jnp.asarray(empty_np)
            return (splash_mask, make), empty, _blocks_agree(block_mask, static, *layout)

        form = f"static {kinds} mask, block tensors checked in graph"
    else:
        b_size = B if _placeholder_used(sub, 0) else 1
        h_size = Hq if _placeholder_used(sub, 1) else 1

        def build():
            vis = _mask(block_mask, mask_bufs, (b_size, h_size, M, N), ctx.precision)
            vis = jnp.broadcast_to(vis, (vis.shape[0], Hq, M, N))
            make = functools.partial(
                splash.make_kernel, sizes=sizes, soft_cap=soft_cap, interpret=interpret
            )
            return (vis, make), ~jnp.any(vis, axis=-1), None

        form = "dynamic mask"
    describe = (
        f"splash attention ({form}, soft cap {soft_cap}, blocks {sizes.block_q}x"
        f"{sizes.block_kv}, {how})"
    )
    log.debug("flex_attention%s: %s", " backward" if backward else "", describe)
    return _SplashPlan(how, build, describe)


# flex_attention(Tensor query, Tensor key, Tensor value, Callable score_mod, tuple block_mask,
#     float scale, dict kernel_options, tuple score_mod_other_buffers=(),
#     tuple mask_mod_other_buffers=()) -> (Tensor out, Tensor logsumexp, Tensor max_scores)
@lowers(flex_attention)
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
    lse_scale = _lse_scale(kernel_options)

    def dense():
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
            lse_scale,
        )
        return out, lse.astype(ctx.out_dtype(1)), mx.astype(ctx.out_dtype(2))

    plan = _splash_plan(
        ctx,
        query,
        key,
        value,
        score_mod,
        block_mask,
        score_mod_other_buffers,
        mask_mod_other_buffers,
        backward=False,
    )
    if plan is None:
        return dense()

    def on_splash():
        mask, empty, agree = plan.build()
        out, lse = splash.forward(mask, query, key, value, scale)
        if empty is not None:  # torch's values for rows that see nothing
            out = jnp.where(empty[..., None], jnp.zeros((), out.dtype), out)
            lse = jnp.where(empty, -jnp.inf, lse)
        if agree is not None:
            out, lse = jnp.where(agree, out, jnp.nan), jnp.where(agree, lse, jnp.nan)
        mx = jnp.zeros(lse.shape, ctx.out_dtype(2))  # not read (_splash_plan checked)
        return out, (lse * lse_scale).astype(ctx.out_dtype(1)), mx

    return plan.run(on_splash, dense)


def _is_float(x) -> bool:
    return isinstance(x, jax.Array | jax.core.Tracer) and jnp.issubdtype(x.dtype, jnp.inexact)


# flex_attention_backward(Tensor query, Tensor key, Tensor value, Tensor out, Tensor logsumexp,
#     Tensor? grad_out, Tensor? grad_logsumexp, Callable fw_graph, GraphModule joint_graph,
#     tuple block_mask, float scale, dict kernel_options, tuple score_mod_other_buffers=(),
#     tuple mask_mod_other_buffers=()) -> (Tensor dq, Tensor dk, Tensor dv, tuple buffer_grads)
@lowers(flex_attention_backward)
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
    lse_scale = _lse_scale(kernel_options)

    def dense():
        # NOTE: recomputes the forward and differentiates it with jax.vjp instead of running
        # torch's joint_graph (which holds flex_lib.zeros_and_scatter, a kernel helper); `out`
        # and `logsumexp` from the forward are not needed.
        mask, score_fn, score_metas = _prepare(
            ctx, query, key, block_mask, fw_graph, mask_mod_other_buffers
        )
        bufs = tuple(score_mod_other_buffers)
        grad_pos = [i for i, b in enumerate(bufs) if _is_float(b)]

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
        return _backward_outputs(ctx, *grads[:3], dict(zip(grad_pos, grads[3:], strict=True)))

    plan = _splash_plan(
        ctx,
        query,
        key,
        value,
        fw_graph,
        block_mask,
        score_mod_other_buffers,
        mask_mod_other_buffers,
        backward=True,
    )
    if plan is None:
        return dense()

    def on_splash():
        # splash's own dq/dkv kernels from the forward's out and logsumexp (natural log inside
        # splash; torch's op keeps it in lse_scale units, so its gradient scales the other way)
        mask, empty, agree = plan.build()
        d_lse = None if grad_logsumexp is None else grad_logsumexp.astype(jnp.float32)
        dq, dk, dv = splash.backward(
            mask,
            query,
            key,
            value,
            out,
            logsumexp.astype(jnp.float32) / lse_scale,
            grad_out,
            None if d_lse is None else d_lse * lse_scale,
            empty,
            scale,
        )
        if agree is not None:
            dq, dk, dv = (jnp.where(agree, g, jnp.nan) for g in (dq, dk, dv))
        return _backward_outputs(ctx, dq, dk, dv, {})

    return plan.run(on_splash, dense)


def _backward_outputs(ctx, dq, dk, dv, buf_grads: dict) -> tuple:
    """flex_attention_backward's outputs in torch's dtypes: ``buf_grads`` maps a score_mod
    buffer's position to its gradient; other tensor buffers (integer ones) get zeros."""
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

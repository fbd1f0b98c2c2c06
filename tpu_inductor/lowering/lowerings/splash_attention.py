"""Splash attention: the block-sparse Pallas TPU kernel behind ``flex_attention`` on a TPU.

``jax.experimental.pallas.ops.tpu.splash_attention`` computes softmax attention block by block
and skips the (q-block, kv-block) tiles its mask leaves empty. :mod:`flex_attention` decides
whether a call can take it (see :func:`flex_attention._splash_plan`) and this module holds what
touches the kernel: the switch, the shape/dtype/score_mod checks, the mask objects, and the
forward and backward.

What it computes, against the dense lowering:

- **q is pre-scaled**: splash has no scale argument, so ``q * scale`` (in q's dtype) goes in.
- **score_mod**: none (identity) or a soft cap ``c * tanh(score / c)`` with a constant ``c``
  (splash's ``attn_logits_soft_cap``); anything else stays dense.
- **GQA**: splash's multi-head kernel takes ``Hq`` query heads over ``Hkv`` key/value heads
  when ``Hkv`` divides ``Hq``, as flex's ``enable_gqa`` does; batches are a ``jax.vmap``.
- **logsumexp**: ``save_residuals=True`` returns it in natural log; the lowering converts it
  to the units torch's op returns (``_lse_scale``). ``max_scores`` is not available: a graph
  that reads it stays dense.
- **Fully masked rows**: splash leaves them undefined (0/0 where no block of the row is visited,
  an average under its mask value otherwise); the forward sets torch's values
  (out 0, logsumexp -inf) from the known empty rows, and the backward gives them no gradient.
- **Backward**: splash's own dq and dkv kernels (``_splash_attention_bwd_dq`` /
  ``_splash_attention_bwd_dkv``, private functions of that module), fed with the forward's
  ``out`` and ``logsumexp`` as residuals, so nothing is recomputed. Splash's public custom VJP
  cannot be used: it differentiates only ``out`` (its forward refuses ``save_residuals=True``
  under AD), while ``flex_attention_backward`` also gets a ``logsumexp`` gradient. That one is
  folded in exactly: ``d lse_i / d s_ij = p_ij``, so it enters as ``di_i -= g_i`` in the
  kernels' ``ds = p * (dp - di)``. Where this jax's private functions do not have the expected
  parameters the backward stays dense (:func:`backward_available`).

Only interpret mode (``interpret=True``, on CPU) has run here; no TPU was available.
"""

from __future__ import annotations

import functools
import inspect
import math

import jax
import jax.numpy as jnp
import numpy as np
import torch.fx as fx

from tpu_inductor.core import config

# Splash tiles both sequence axes in blocks that are multiples of 128 (NUM_LANES).
ALIGN = 128
# Block sizes tried on a TPU, largest first (the first that divides the sequence length).
# Interpret mode uses ALIGN so that small test shapes span several blocks and skip some.
TPU_BLOCKS = (512, 256, 128)

_DTYPES = (jnp.float32, jnp.bfloat16)
# Where a row sees nothing, the backward's logsumexp: exp(s - BIG) is 0 for every s the kernel
# sees (scores and its mask value), so such a row adds no gradient anywhere.
_BIG = float(np.finfo(np.float32).max) / 2


def _kernel_module():
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel

    return splash_attention_kernel


def _mask_module():
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask

    return splash_attention_mask


@functools.cache
def _importable() -> bool:
    try:
        _kernel_module()
        _mask_module()
    except ImportError:
        return False
    return True


@functools.cache
def _tpu_present() -> bool:
    try:
        return bool(jax.devices("tpu"))
    except RuntimeError:
        return False


def mode(platform: str | None) -> tuple[str | None, str]:
    """How the kernel may run for a graph compiled for ``platform``.

    Args:
        platform: ``ctx.platform`` of the lowering (``"tpu"``, ``"gpu"``, ``"cpu"``), or
            ``None`` when the lowering context does not say.

    Returns:
        ``(how, why)``: ``how`` is ``"interpret"`` (forced by the switch), ``"tpu"`` (the graph
        compiles for a TPU), ``"platform_dependent"`` (unknown platform on a host with a TPU:
        decided when XLA lowers, by ``jax.lax.platform_dependent``) or ``None`` (dense), and
        ``why`` says why not when ``how`` is ``None``.
    """
    switch = config.get("splash_attention")
    if switch == "off":
        return None, "the knob splash_attention is 'off'"
    if switch == "interpret":
        how = "interpret"
    elif platform == "tpu":
        how = "tpu"
    elif platform is not None:
        return None, f"the graph compiles for {platform!r}, not a TPU"
    elif not _tpu_present():
        return None, "no TPU in this process"
    else:
        how = "platform_dependent"
    if not _importable():  # imported only here: the Pallas TPU modules take a while
        return None, "this jax has no jax.experimental.pallas.ops.tpu.splash_attention"
    return how, ""


def shape_reason(q, k, v) -> str | None:
    """Why splash cannot take these ``[B, H, S, D]`` inputs, or ``None`` when it can."""
    if not q.dtype == k.dtype == v.dtype or q.dtype not in _DTYPES:
        return f"dtypes {q.dtype}/{k.dtype}/{v.dtype} (splash: all float32 or all bfloat16)"
    M, N = q.shape[2], k.shape[2]
    if M % ALIGN or N % ALIGN:
        return f"sequence lengths {M}, {N} are not multiples of {ALIGN}"
    if k.shape[0] != q.shape[0] or v.shape[:3] != k.shape[:3]:
        return f"batch/heads of q {q.shape}, k {k.shape}, v {v.shape}"
    if q.shape[1] % k.shape[1]:
        return f"{q.shape[1]} query heads over {k.shape[1]} kv heads"
    return None


def soft_cap_of(score_mod, score_bufs) -> tuple[bool, float | None]:
    """``(True, None)`` for an identity score_mod, ``(True, c)`` for ``c * tanh(score / c)``
    (or ``tanh(score * (1/c)) * c``) with a constant ``c``, ``(False, None)`` otherwise."""
    if score_mod is None:
        return True, None
    if score_bufs or not isinstance(score_mod, fx.GraphModule):
        return False, None
    graph = score_mod.graph
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    ops = [n for n in graph.nodes if n.op == "call_function"]
    out = next(n for n in graph.nodes if n.op == "output").args[0]
    if isinstance(out, tuple | list):
        if len(out) != 1:
            return False, None
        out = out[0]
    score = placeholders[0] if placeholders else None
    if out is score:
        return True, None
    import torch

    aten = torch.ops.aten
    if len(ops) != 3 or not isinstance(out, fx.Node) or out.target != aten.mul.Tensor:
        return False, None
    outer = [a for a in out.args if not isinstance(a, fx.Node)]
    inner = [a for a in out.args if isinstance(a, fx.Node)]
    if len(outer) != 1 or len(inner) != 1 or inner[0].target != aten.tanh.default:
        return False, None
    cap, arg = float(outer[0]), inner[0].args[0]
    if not isinstance(arg, fx.Node) or arg.args[0] is not score or len(arg.args) != 2:
        return False, None
    c = arg.args[1]
    if isinstance(c, fx.Node) or cap <= 0:
        return False, None
    if arg.target == aten.div.Tensor and float(c) == cap:
        return True, cap
    if arg.target == aten.mul.Tensor and math.isclose(float(c) * cap, 1.0, rel_tol=1e-12):
        return True, cap
    return False, None


def block_sizes(M: int, N: int, interpret: bool):
    """Splash ``BlockSizes`` (forward and both backward kernels) for ``M`` x ``N`` scores."""
    sk = _kernel_module()
    sizes = (ALIGN,) if interpret else TPU_BLOCKS
    bq = next(b for b in sizes if M % b == 0)
    bkv = next(b for b in sizes if N % b == 0)
    return sk.BlockSizes(
        block_q=bq,
        block_kv=bkv,
        block_kv_compute=bkv,
        block_q_dkv=bq,
        block_kv_dkv=bkv,
        block_kv_dkv_compute=bkv,
        block_q_dq=bq,
        block_kv_dq=bkv,
    )


def static_mask(mask: np.ndarray, heads: int) -> tuple[object, str]:
    """A splash ``MultiHeadMask`` over ``heads`` heads for a boolean ``[h, M, N]`` numpy mask
    (``h`` is 1 or ``heads``), with a description. Each head is a ``FullMask``, a
    ``CausalMask`` or a ``LocalMask`` when it is exactly one (the kernel computes those from
    indices instead of loading mask tiles), else a ``NumpyMask``."""
    sm = _mask_module()
    M, N = mask.shape[1:]
    diff = np.arange(M)[:, None] - np.arange(N)[None, :]  # q - kv

    def one(m):
        if m.all():
            return sm.FullMask((M, N)), "full"
        if np.array_equal(m, diff >= 0):
            return sm.CausalMask((M, N)), "causal"
        if m.any():
            left, right = int(diff[m].max()), int(-diff[m].min())
            if np.array_equal(m, (diff <= left) & (-diff <= right)):
                return sm.LocalMask((M, N), (left, right), 0), f"local({left}, {right})"
        return sm.NumpyMask(m), "numpy"

    per_head = [one(m) for m in mask]
    if len(per_head) == 1:
        per_head = per_head * heads
    kinds = sorted({k for _, k in per_head})
    return sm.MultiHeadMask([m for m, _ in per_head]), "/".join(kinds)


def make_kernel(mask, sizes, soft_cap: float | None, interpret: bool):
    """A splash multi-head kernel (``save_residuals=True``) for ``mask``: a ``MultiHeadMask``
    (static: tiles and block sparsity fixed now) or a boolean ``[H, M, N]`` array (dynamic:
    both computed in the graph)."""
    sk = _kernel_module()
    kernel = sk.make_splash_mha(
        mask,
        block_sizes=sizes,
        head_shards=1,
        q_seq_shards=1,
        save_residuals=True,
        attn_logits_soft_cap=soft_cap,
        interpret=interpret,
    )
    # make_splash_mha turns every MaskInfo field into an array, is_dynamic_mask too, and its
    # __call__ branches on that field in Python: inside a trace that is a tracer (an error).
    dynamic = isinstance(mask, jax.Array)
    for name in ("fwd_mask_info", "dq_mask_info", "dkv_mask_info"):
        info = getattr(kernel, name, None)
        if info is not None and "is_dynamic_mask" in info._fields:
            setattr(kernel, name, info._replace(is_dynamic_mask=dynamic))
    return kernel


def _per_batch(mask, fn, *arrays, kv_outputs: tuple[int, ...] = ()):
    """``fn(kernel, *one_batch_arrays)`` over the batch: ``mask`` is ``(static_mask, make)`` or
    ``(array [Bm, h, M, N], make)``; with ``Bm > 1`` every batch element gets its own kernel
    (its MaskInfo is batched, which Pallas runs as a loop over the batch). An array mask with
    one head (``h == 1``) under several query heads makes a one-head kernel run per head
    (:func:`_per_head`), so the mask is never copied per head; ``kv_outputs`` are the positions
    of ``fn``'s results that have key/value heads (gradients of k and v)."""
    m, make = mask
    shared = isinstance(m, jax.Array) and m.shape[1] == 1 and arrays[0].shape[1] > 1
    run = functools.partial(_per_head, fn, kv_outputs=kv_outputs) if shared else fn
    # Splash's index arithmetic assumes 32-bit Python ints (lax.div(int32, int) fails under
    # x64, which the backend traces with), so the kernel is traced with x64 off.
    with jax.enable_x64(False):
        if isinstance(m, jax.Array) and m.shape[0] > 1:
            return jax.vmap(lambda mb, *a: run(make(mb), *a))(m, *arrays)
        kernel = make(m[0] if isinstance(m, jax.Array) else m)
        return jax.vmap(lambda *a: run(kernel, *a))(*arrays)


def _per_head(fn, kernel, q, k, v, *rest, kv_outputs: tuple[int, ...] = ()):
    """``fn(kernel, q, k, v, *rest)`` for one batch element with a one-head ``kernel``: each
    query head (``q`` and ``rest`` are ``[H, ...]``) against its group's key/value head (``k``,
    ``v``: ``[Hkv, ...]``). Results are ``[H, ...]``, those at ``kv_outputs`` summed over each
    group to ``[Hkv, ...]``."""
    H, Hkv = q.shape[0], k.shape[0]

    def group(x):
        return x.reshape(Hkv, H // Hkv, *x.shape[1:])

    def one(qh, kh, vh, *r):
        return fn(kernel, qh[None], kh[None], vh[None], *(x[None] for x in r))

    n = len(rest)
    inner = jax.vmap(one, in_axes=(0, None, None) + (0,) * n)
    results = jax.vmap(inner, in_axes=(0, 0, 0) + (0,) * n)(group(q), k, v, *map(group, rest))
    flat, tree = jax.tree_util.tree_flatten(results)
    outs = []
    for i, x in enumerate(flat):  # [Hkv, G, 1, ...]
        x = x[:, :, 0]
        outs.append(
            x.astype(jnp.float32).sum(axis=1) if i in kv_outputs else x.reshape(H, *x.shape[2:])
        )
    return jax.tree_util.tree_unflatten(tree, outs)


def forward(mask, q, k, v, scale: float):
    """``(out, lse)`` of splash attention over ``[B, H, S, D]`` inputs: ``out`` in q's dtype,
    ``lse`` in natural log (float32). Rows that see nothing are left as the kernel leaves them
    (undefined; the caller sets them)."""
    qs = (q.astype(jnp.float32) * scale).astype(q.dtype)
    out, (lse,) = _per_batch(mask, lambda kernel, q, k, v: kernel(q, k, v), qs, k, v)
    return out, lse.astype(jnp.float32)


# The keyword arguments this module passes to splash's private backward functions.
_DQ_ARGS = frozenset(
    {"q", "k", "v", "segment_ids", "sinks", "logsumexp", "do", "di", "bq", "bkv", "is_mqa"}
    | {"mask_info", "mask_value", "attn_logits_soft_cap", "q_layout", "k_layout", "v_layout"}
    | {"mask_function", "interpret"}
)
_DKV_ARGS = _DQ_ARGS | {"bkv_compute", "use_fused_bwd_kernel"}


@functools.cache
def backward_available() -> bool:
    """Whether this jax's private splash backward functions take the arguments used here."""
    sk = _kernel_module()
    for name, used in (
        ("_splash_attention_bwd_dq", _DQ_ARGS),
        ("_splash_attention_bwd_dkv", _DKV_ARGS),
    ):
        fn = getattr(sk, name, None)
        if fn is None:
            return False
        params = inspect.signature(fn).parameters
        required = {n for n, p in params.items() if p.default is inspect.Parameter.empty} - {"self"}
        if not used <= set(params) or not required <= used:
            return False
    return True


def _collapse(info):
    # what splash's own entry point does to a MaskInfo before its kernels see it
    if info is None or info.partial_mask_blocks is None:
        return info
    blocks = info.partial_mask_blocks
    return info._replace(partial_mask_blocks=blocks.reshape(-1, *blocks.shape[-2:]))


def _backward_one(kernel, q, k, v, lse, do, di):
    sk = _kernel_module()
    kw = kernel.kwargs
    sizes = kw["block_sizes"]
    common = dict(
        q=q,
        k=k,
        v=v,
        segment_ids=None,
        sinks=None,
        logsumexp=lse,
        do=do,
        di=di,
        is_mqa=False,
        mask_value=kw["mask_value"],
        attn_logits_soft_cap=kw["attn_logits_soft_cap"],
        q_layout=sizes.q_layout,
        k_layout=sizes.k_layout,
        v_layout=sizes.v_layout,
        mask_function=kw["mask_function"],
        interpret=kw["interpret"],
    )
    _, dk, dv = sk._splash_attention_bwd_dkv(
        bq=sizes.block_q_dkv,
        bkv=sizes.block_kv_dkv,
        bkv_compute=sizes.block_kv_dkv_compute,
        mask_info=_collapse(kernel.dkv_mask_info),
        use_fused_bwd_kernel=False,
        **common,
    )
    dq = sk._splash_attention_bwd_dq(
        bq=sizes.block_q_dq,
        bkv=sizes.block_kv_dq,
        mask_info=_collapse(kernel.dq_mask_info),
        **common,
    )
    return dq, dk, dv


def backward(mask, q, k, v, out, lse, d_out, d_lse, empty, scale: float):
    """``(dq, dk, dv)`` (float32) of splash attention from the forward's ``out`` and natural-log
    ``lse`` and the cotangents ``d_out`` (or ``None``) and ``d_lse`` (natural log, or
    ``None``); ``empty`` (broadcastable to ``[B, H, M]``, or ``None``) marks rows that see
    nothing, which get no gradient."""
    qs = (q.astype(jnp.float32) * scale).astype(q.dtype)
    do = jnp.zeros(out.shape, q.dtype) if d_out is None else d_out.astype(q.dtype)
    g = jnp.zeros(lse.shape, jnp.float32) if d_lse is None else d_lse.astype(jnp.float32)
    lse = lse.astype(jnp.float32)
    if empty is not None:
        lse = jnp.where(empty, _BIG, lse)
        do = jnp.where(empty[..., None], jnp.zeros((), do.dtype), do)
        g = jnp.where(empty, 0.0, g)
    di = jnp.sum(out.astype(jnp.float32) * do.astype(jnp.float32), axis=-1) - g
    dq, dk, dv = _per_batch(mask, _backward_one, qs, k, v, lse, do, di, kv_outputs=(1, 2))
    dq = dq.astype(jnp.float32) * scale
    return dq, dk.astype(jnp.float32), dv.astype(jnp.float32)

"""scaled_dot_product_attention variants against CPU eager: masks, causal, grouped-query; the
inference forward also in the TPU's fused-softmax form (``attention.fused_softmax``), which these
tests run on the CPU."""

from __future__ import annotations

import operator

import pytest
import torch
import torch.nn.functional as F

import tpu_inductor
from tests.helpers import assert_same, compiled
from tpu_inductor.lowering.lowerings import attention


@pytest.fixture(params=["torch", "tpu"])
def form(request):
    """Which form of attention the CPU compiles: torch's, or the TPU's (fused softmax)."""
    platforms = ("tpu", "cpu") if request.param == "tpu" else ("tpu",)
    with tpu_inductor.config.patch(fused_softmax_platforms=platforms):
        yield request.param


@pytest.mark.parametrize(
    "kv_heads,causal,mask",
    [
        (4, True, None),
        (4, False, "bool"),
        (4, False, "float"),
        (2, True, None),
        (1, False, None),
        (2, False, "bool"),  # grouped heads, a mask shared by every head
        (2, False, "float-per-head"),  # grouped heads, one mask per query head
        (1, True, "float"),
        (4, False, "bool-empty-row"),
        (2, True, "float-empty-row"),
    ],
)
def test_sdpa_forward_and_backward(kv_heads, causal, mask):
    torch.manual_seed(0)
    q = torch.randn(2, 4, 6, 8, requires_grad=True)
    k = torch.randn(2, kv_heads, 6, 8, requires_grad=True)
    v = torch.randn(2, kv_heads, 6, 8, requires_grad=True)
    attn_mask = _mask(mask)

    def fn(q, k, v):
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=attn_mask, is_causal=causal, enable_gqa=kv_heads != 4
        )

    out = compiled(fn)(q, k, v)
    ref = fn(q, k, v)
    assert_same(out, ref)
    grads = torch.autograd.grad(out.sum(), (q, k, v))
    ref_grads = torch.autograd.grad(ref.sum(), (q, k, v))
    assert_same(grads, ref_grads)


def _mask(mask):
    """An attention mask of ``[2, 4, 6, 6]`` scores by name."""
    attn_mask = None
    if mask == "bool":
        attn_mask = torch.rand(6, 6) > 0.3
        attn_mask[:, 0] = True  # no fully masked row
    elif mask == "float":
        attn_mask = torch.randn(2, 1, 6, 6)
    elif mask == "float-per-head":
        attn_mask = torch.randn(2, 4, 6, 6)
    elif mask == "bool-empty-row":  # a query that sees no key: output 0, no NaN
        attn_mask = torch.rand(6, 6) > 0.3
        attn_mask[:, 0], attn_mask[2] = True, False
    elif mask == "float-empty-row":
        attn_mask = torch.randn(2, 1, 6, 6)
        attn_mask[:, :, 3] = -float("inf")
    return attn_mask


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "kv_heads,causal,mask",
    [
        (4, True, None),
        (4, False, None),
        (2, True, None),
        (4, False, "bool"),
        (2, False, "float-per-head"),
        (4, False, "bool-empty-row"),
        (2, True, "float-empty-row"),
    ],
)
def test_sdpa_inference(kv_heads, causal, mask, dtype, form):
    """The inference forward (nothing reads the logsumexp): on a TPU the fused-softmax form."""
    torch.manual_seed(0)
    q = torch.randn(2, 4, 6, 8, dtype=dtype)
    k, v = (torch.randn(2, kv_heads, 6, 8, dtype=dtype) for _ in range(2))
    attn_mask = _mask(mask)
    if attn_mask is not None and attn_mask.is_floating_point():
        attn_mask = attn_mask.to(dtype)

    def fn(q, k, v):
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=attn_mask, is_causal=causal, enable_gqa=kv_heads != 4
        )

    with torch.no_grad():
        out = compiled(fn)(q, k, v)
    ref = fn(q, k, v)
    tol = {} if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)
    assert_same(out, ref, **tol)


@pytest.mark.parametrize("kv_heads", [4, 2])
def test_sdpa_bfloat16_forward_and_backward(kv_heads):
    """bfloat16 attention multiplies bfloat16 operands with float32 accumulation and feeds
    bfloat16 probabilities to ``P @ V``, as torch's CPU kernel does."""
    torch.manual_seed(0)
    q = torch.randn(2, 4, 16, 8, dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(2, kv_heads, 16, 8, dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(2, kv_heads, 16, 8, dtype=torch.bfloat16, requires_grad=True)

    def fn(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=kv_heads != 4)

    out = compiled(fn)(q, k, v)
    ref = fn(q, k, v)
    assert_same(out, ref, atol=2e-2, rtol=2e-2)
    grads = torch.autograd.grad(out.float().square().sum(), (q, k, v))
    ref_grads = torch.autograd.grad(ref.float().square().sum(), (q, k, v))
    assert_same(grads, ref_grads, atol=5e-2, rtol=5e-2)


def test_fused_cpu_attention_with_dropout_is_refused_up_front():
    """torch's fused CPU attention kernel rejects ``dropout_p > 0`` (its fake function does not):
    it is refused before tracing (unsupported.REFUSED), so ``fallback="error"`` names it with
    the reason and the fix, and the default runs it in eager, which raises torch's own error."""
    import tpu_inductor

    q = torch.randn(1, 2, 4, 8)
    fused = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default

    def fn(q):
        return fused(q, q, q, 0.5)[0] * 2

    compiled = torch.compile(fn, backend="tpu", options={"fallback": "error"})
    with pytest.raises(tpu_inductor.UnsupportedOpError, match=r"(?s)dropout_p > 0.*rejects too"):
        compiled(q)
    torch._dynamo.reset()
    with pytest.raises(RuntimeError, match="do not support dropout > 0") as eager:
        fn(q)
    with pytest.warns(tpu_inductor.FallbackWarning), pytest.raises(RuntimeError) as info:
        torch.compile(fn, backend="tpu")(q)
    assert str(eager.value) in str(info.value)


def test_fused_softmax_only_where_the_logsumexp_is_not_read():
    """A TPU lowers a bf16 inference attention in the fused-softmax form (its jaxpr has no
    guarded row max); float32, a training forward (its logsumexp saved) and every other platform
    get torch's."""
    import jax

    from tpu_inductor.lowering.lowerings.registry import LoweringContext

    graph = torch.fx.Graph()
    node = graph.call_function(torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default)
    out = graph.call_function(operator.getitem, (node, 0))
    graph.output(out)

    def fused(platform, dtype=jax.numpy.bfloat16):
        ctx = LoweringContext(node, None, (), platform=platform)
        query = jax.numpy.zeros((1, 2, 4, 8), dtype)
        return attention.fused_softmax(ctx, query, attention._reads_second_output(node))

    assert fused("tpu") and not fused("cpu") and not fused(None)
    assert not fused("tpu", jax.numpy.float32)
    graph.call_function(operator.getitem, (node, 1))  # the logsumexp, read
    assert not fused("tpu")

    q = k = v = jax.numpy.ones((1, 2, 4, 8))
    for on in (False, True):
        jaxpr = jax.make_jaxpr(lambda *a, on=on: attention.attention(*a, is_causal=True, fused=on))
        assert ("is_finite" in str(jaxpr(q, k, v))) is not on


def test_bf16_products_ask_for_no_precision():
    """``registry.matmul_precision``: all-bf16 operands get none (exact at any precision, and
    XLA:TPU fuses such a product into its consumer only then); float16, float32 and mixed
    operands keep the user's float32 precision."""
    import jax.numpy as jnp
    from jax import lax

    from tpu_inductor.lowering.lowerings.registry import matmul_precision

    bf16, f16, f32 = (jnp.zeros((2, 2), d) for d in (jnp.bfloat16, jnp.float16, jnp.float32))
    highest = lax.Precision.HIGHEST
    assert matmul_precision(highest, bf16, bf16) is None
    for operands in ((f16, f16), (f32, f32), (bf16, f32)):
        assert matmul_precision(highest, *operands) is highest

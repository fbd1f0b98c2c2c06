"""Mixture-of-experts grouped GEMM: ``torch._grouped_mm`` (every form, forward and backward), the
transformers custom ops ``transformers::grouped_mm_fallback`` / ``_backward``, and MoE models
through transformers' default ``"grouped_mm"`` experts, with no op left to torch eager.

References: a per-group loop of float32 matmuls (``dense``), and torch eager where it runs on
CPU (bfloat16 ``_grouped_mm``; torch's meta function refuses float32 ``_grouped_mm``, so float32
is covered through the transformers op, which casts to the weights' dtype, and the lowering's
helper ``ragged_mm`` directly).
"""

from __future__ import annotations

import dataclasses
import types
import warnings

import jax.numpy as jnp
import numpy as np
import pytest
import torch
from jax import lax

from tests.helpers import compiled, one_torch_thread
from tests.models.harness import compare, run_forward, run_training
from tpu_inductor.core.errors import FallbackWarning
from tpu_inductor.lowering.lowerings.grouped import ragged_mm

G = 4
# Cumulative group ends: an empty first and third group, and a tail past offs[-1] that no group
# covers (torch leaves those output rows uninitialized; the lowering writes zeros).
OFFS = [0, 8, 8, 24]
TOTAL = 32

# form -> (mat_a shape, mat_b shape, offs or None); the ragged dimension has length TOTAL.
FORMS = {
    "2d_3d": ((TOTAL, 16), (G, 16, 24), OFFS),  # ragged M (MoE forward, input grad)
    "3d_2d": ((G, 16, 24), (24, TOTAL), OFFS),  # ragged N
    "2d_2d": ((16, TOTAL), (TOTAL, 24), OFFS),  # ragged K (weight grad)
    "3d_3d": ((G, 16, 24), (G, 24, 16), None),  # batched
}


def dense(a: torch.Tensor, b: torch.Tensor, offs) -> torch.Tensor:
    """``_grouped_mm(a, b, offs)`` as a per-group loop of float32 matmuls, zero where no group
    writes."""
    a, b = a.float(), b.float()
    if offs is None:
        return a @ b
    ends = [int(e) for e in offs]
    bounds = list(zip([0, *ends[:-1]], ends, strict=True))
    if a.ndim == 2 and b.ndim == 3:
        out = a.new_zeros(a.shape[0], b.shape[-1])
        for g, (s, e) in enumerate(bounds):
            out[s:e] = a[s:e] @ b[g]
        return out
    if a.ndim == 3 and b.ndim == 2:
        out = a.new_zeros(a.shape[1], b.shape[-1])
        for g, (s, e) in enumerate(bounds):
            out[:, s:e] = a[g] @ b[:, s:e]
        return out
    return torch.stack([a[:, s:e] @ b[s:e] for s, e in bounds])


def _valid(out: torch.Tensor, form: str) -> torch.Tensor:
    """The part of a ``_grouped_mm`` output that torch defines (rows/columns below offs[-1])."""
    if form == "2d_3d":
        return out[: OFFS[-1]]
    if form == "3d_2d":
        return out[:, : OFFS[-1]]
    return out


def _operands(form: str, dtype: torch.dtype):
    shape_a, shape_b, offs = FORMS[form]
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(shape_a, generator=gen).to(dtype)
    b = torch.randn(shape_b, generator=gen).to(dtype)
    offs = None if offs is None else torch.tensor(offs, dtype=torch.int32)
    return a, b, offs


def _fwd_bwd(fn, a, b, offs, tangent_seed=1):
    a = a.detach().clone().requires_grad_()
    b = b.detach().clone().requires_grad_()
    out = fn(a, b, offs)
    gen = torch.Generator().manual_seed(tangent_seed)
    t = torch.randn(out.shape, generator=gen).to(out.dtype)
    ga, gb = torch.autograd.grad(out, (a, b), t)
    return out, ga, gb, t


@pytest.fixture(autouse=True)
def _fallback_is_an_error():
    with warnings.catch_warnings():
        warnings.simplefilter("error", FallbackWarning)
        yield


# --- torch._grouped_mm ----------------------------------------------------------------------------


def _grouped_mm(a, b, offs):
    return torch._grouped_mm(a, b, offs=offs)


@pytest.mark.parametrize("form", list(FORMS))
def test_grouped_mm_bf16_forward_backward(form):
    """bfloat16, every form: values and both grads against the float32 per-group loop (to
    bfloat16 rounding), the forward bit-for-bit against eager's CPU kernel where torch defines it,
    and zeros where no group writes."""
    a, b, offs = _operands(form, torch.bfloat16)
    out, ga, gb, t = _fwd_bwd(compiled(_grouped_mm), a, b, offs)
    assert out.dtype == ga.dtype == gb.dtype == torch.bfloat16

    a32, b32 = a.float().requires_grad_(), b.float().requires_grad_()
    ref = dense(a32, b32, offs)
    ra, rb = torch.autograd.grad(ref, (a32, b32), t.float())
    tol = {"atol": 0.1, "rtol": 2e-2}  # bfloat16 outputs (8 bits of mantissa) of sums of ~24
    torch.testing.assert_close(out.float(), ref, **tol)
    torch.testing.assert_close(ga.float(), ra, **tol)
    torch.testing.assert_close(gb.float(), rb, **tol)
    if form in ("2d_3d", "3d_2d"):
        tail = out[OFFS[-1] :] if form == "2d_3d" else out[:, OFFS[-1] :]
        assert bool((tail == 0).all()), "rows/columns past offs[-1] must be zeros"

    eager = torch._grouped_mm(a, b, offs=offs)
    torch.testing.assert_close(_valid(out, form), _valid(eager, form), atol=0, rtol=0)


def test_grouped_mm_out_dtype_and_all_empty_groups():
    """``out_dtype=bfloat16`` (the one torch accepts), and offs of all zeros: every row of the
    2d x 3d product and every weight gradient is zero."""
    a, b, _ = _operands("2d_3d", torch.bfloat16)
    fn = compiled(lambda a, b: torch._grouped_mm(a, b, out_dtype=torch.bfloat16))
    a3, b3, _ = _operands("3d_3d", torch.bfloat16)
    torch.testing.assert_close(fn(a3, b3), torch._grouped_mm(a3, b3), atol=0, rtol=0)

    zeros = torch.zeros(G, dtype=torch.int32)
    out, ga, gb, _ = _fwd_bwd(compiled(_grouped_mm), a, b, zeros)
    assert out.shape == (TOTAL, 24) and not out.any() and not ga.any() and not gb.any()


@pytest.mark.parametrize("form", list(FORMS))
def test_ragged_mm_float32(form):
    """The lowering's float32 path, which torch's meta function keeps ``_grouped_mm`` from
    reaching under torch.compile (it is reached through the transformers op): every form against
    the per-group loop."""
    a, b, offs = _operands(form, torch.float32)
    jo = None if offs is None else jnp.asarray(offs.numpy())
    ja, jb = jnp.asarray(a.numpy()), jnp.asarray(b.numpy())
    out = ragged_mm(ja, jb, jo, lax.Precision.HIGHEST, jnp.float32)
    assert out.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(out), dense(a, b, offs).numpy(), atol=1e-5, rtol=1e-5)


# --- transformers::grouped_mm_fallback ------------------------------------------------------------


@pytest.mark.parametrize("offs_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_transformers_grouped_mm_fallback(dtype, offs_dtype):
    """transformers' CPU MoE op and its backward op, compiled (no fallback), against the op
    itself in eager (a loop of torch.mm) and the per-group loop."""
    pytest.importorskip("transformers")
    from transformers.integrations import moe  # noqa: F401  (defines the ops)

    op = torch.ops.transformers.grouped_mm_fallback
    a, b, _ = _operands("2d_3d", dtype)
    offs = torch.tensor(OFFS, dtype=offs_dtype)
    out, ga, gb, t = _fwd_bwd(compiled(lambda a, b, o: op(a, b, o)), a, b, offs)
    eout, ega, egb, _ = _fwd_bwd(lambda a, b, o: op(a, b, o), a, b, offs)
    tol = {"atol": 1e-5, "rtol": 1e-5} if dtype == torch.float32 else {"atol": 0.1, "rtol": 2e-2}
    for got, exp in ((out, eout), (ga, ega), (gb, egb)):
        assert got.dtype == exp.dtype and got.shape == exp.shape
        torch.testing.assert_close(got, exp, **tol)
    torch.testing.assert_close(out.float(), dense(a, b, offs), **tol)


def test_lowering_registered_by_name_binds_on_first_lookup():
    """A custom op's lowering may be registered by its qualified name before its library
    exists; it is bound when a graph first holds the op."""
    from tpu_inductor.lowering.lowerings import LOWERINGS, lowers

    name = "tpu_inductor_test_moe::triple.default"

    @lowers(name)
    def _triple(ctx, x):
        return x * 3

    assert name in LOWERINGS.pending

    @torch.library.custom_op("tpu_inductor_test_moe::triple", mutates_args=())
    def triple(x: torch.Tensor) -> torch.Tensor:
        return x * 3

    @triple.register_fake
    def _(x):
        return torch.empty_like(x)

    x = torch.arange(4.0)
    torch.testing.assert_close(compiled(triple)(x), x * 3)
    assert torch.ops.tpu_inductor_test_moe.triple.default in LOWERINGS
    assert name not in LOWERINGS.pending


# --- models ---------------------------------------------------------------------------------------


def _moe_cases():
    from tests.models.test_transformers import DECODER, T, hf_lm

    one_layer = {**DECODER, "num_hidden_layers": 1, "num_experts_per_tok": 2}
    return [
        T("qwen3_moe", hf_lm("qwen3_moe", **one_layer, num_experts=4, moe_intermediate_size=32)),
        T(
            "qwen2_moe",
            hf_lm(
                "qwen2_moe",
                **one_layer,
                num_experts=4,
                moe_intermediate_size=32,
                shared_expert_intermediate_size=32,
            ),
        ),
        T("mixtral", hf_lm("mixtral", **one_layer, num_local_experts=4)),
    ]


def _slow_cases():
    """More MoE architectures, run with TPU_INDUCTOR_SLOW=1 (~15-20 s each)."""
    from tests.models.test_transformers import DECODER, T, hf_lm

    one_layer = {**DECODER, "num_hidden_layers": 1, "num_experts_per_tok": 2}
    deepseek = {
        **one_layer,
        "num_key_value_heads": 4,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
    }
    return [
        T("olmoe", hf_lm("olmoe", **one_layer, num_experts=4)),
        T("granitemoe", hf_lm("granitemoe", **one_layer, num_local_experts=4)),
        T("phimoe", _eval_routing(hf_lm("phimoe", **one_layer, num_local_experts=4))),
        # Experts with biases and transposed weights, attention sinks.
        T("gpt_oss", hf_lm("gpt_oss", **one_layer, num_local_experts=4, sliding_window=8)),
        T(
            "deepseek_v3",
            hf_lm(
                "deepseek_v3",
                **deepseek,
                n_routed_experts=4,
                moe_intermediate_size=32,
                n_shared_experts=1,
                first_k_dense_replace=0,
                kv_lora_rank=16,
                q_lora_rank=16,
                qk_rope_head_dim=8,
                qk_nope_head_dim=8,
                v_head_dim=8,
                n_group=1,
                topk_group=1,
            ),
        ),
    ]


def _eval_routing(build):
    """phimoe's router (sparsemixer) samples experts in training mode (Gumbel noise from
    ``exponential_`` and ``rand_like``); our random streams are not torch's, so a training step
    could only match eager by chance (with 4 experts its second step's embedding grad differed in
    ~2% of elements). Its MoE blocks stay in eval mode, routing by top-k, while the rest trains."""

    def eval_train(self, mode=True):
        return torch.nn.Module.train(self, False)

    def built(train):
        model, kwargs = build(train)
        for m in model.modules():
            if type(m).__name__ == "PhimoeSparseMoeBlock":
                m.train = types.MethodType(eval_train, m)  # deepcopy rebinds it to the copy
        return model, kwargs

    return built


def model_cases() -> list:
    """Every MoE model of this file as a ModelCase (training included; the slow ones marked
    ``slow``): the rows scripts/gen_models_doc.py adds to docs/models.md."""
    # tests/models/test_transformers.py has qwen3_moe and qwen2_moe rows (2 layers, forward)
    return [
        dataclasses.replace(c, name=f"{c.name} (1 layer)", train=True) for c in _moe_cases()
    ] + [dataclasses.replace(c, train=True, slow=True) for c in _slow_cases()]


def _model_params():
    try:
        import transformers  # noqa: F401
    except ImportError:
        return [pytest.param(None, marks=pytest.mark.skip(reason="transformers not installed"))]
    cases = [pytest.param(c, id=c.name) for c in _moe_cases()]
    cases += [pytest.param(c, id=c.name, marks=pytest.mark.slow) for c in _slow_cases()]
    return cases


@pytest.fixture(autouse=True)
def _one_torch_thread():  # as for the model tests (tests/models/conftest.py says why)
    with one_torch_thread():
        yield


@pytest.mark.parametrize("case", _model_params())
def test_moe_model_forward_and_training(case):
    """transformers' default experts ("grouped_mm": tokens sorted by expert, then
    ``transformers::grouped_mm_fallback`` in float32): the inference forward and two training
    steps (loss, every grad, every parameter after AdamW) against eager, one Dynamo graph, no
    fallback."""
    with warnings.catch_warnings():
        warnings.simplefilter("always", FallbackWarning)  # counted, then asserted empty
        result, actual, expected = run_forward(case)
        compare(actual, expected, case, "forward")
        assert (result.dynamo_graphs, result.graph_breaks) == (1, 0)
        assert result.fallback_ops == set(), f"{case.name}: {sorted(result.fallback_ops)}"
        train = run_training(case)
    assert train.recompiles == 0
    assert train.fallback_ops == set(), f"{case.name} training: {sorted(train.fallback_ops)}"


def test_qwen3_moe_bfloat16_uses_grouped_mm(monkeypatch):
    """In bfloat16 transformers calls ``torch._grouped_mm`` itself (the op torch.compile can
    trace): the compiled forward lowers it and matches eager's CPU kernel."""
    pytest.importorskip("transformers")
    from tpu_inductor.lowering.lowerings import LOWERINGS

    op = torch.ops.aten._grouped_mm.default
    low, calls = LOWERINGS[op], []

    def counted(ctx, *args, **kwargs):
        calls.append(ctx.node)
        return low.fn(ctx, *args, **kwargs)

    monkeypatch.setitem(LOWERINGS, op, dataclasses.replace(low, fn=counted))
    model, kwargs = _moe_cases()[0].build(False)
    model = model.eval().to(torch.bfloat16)
    with torch.no_grad():
        expected = model(**kwargs).logits
        actual = torch.compile(model, backend="tpu")(**kwargs).logits
    assert len(calls) == 2, "expected the up and down projections through torch._grouped_mm"
    assert actual.dtype == torch.bfloat16
    torch.testing.assert_close(actual.float(), expected.float(), atol=2e-2, rtol=2e-2)


def test_add_of_a_number_and_a_bool_mask():
    """``torch.add(0.3333, mask, alpha=0.6667)`` (phimoe's router, sparsemixer): ``self`` is a
    Python number, the lowering must not ask it for a dtype."""
    mask = torch.tensor([[True], [False], [True]])
    fn = lambda m: torch.add(0.3333, m, alpha=0.6667)  # noqa: E731
    torch.testing.assert_close(compiled(fn)(mask), fn(mask))

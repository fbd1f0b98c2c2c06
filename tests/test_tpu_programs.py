"""The TPU-program benchmark (``benchmarks/tpu_programs.py``) is an honest comparison: its
hand-written JAX Llama computes what the transformers Llama computes, from the same weights
(logits, KV cache, loss, every gradient, every parameter after an AdamW step), and its runner
measures programs in --small mode without a TPU.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from benchmarks import hand_llama as H

transformers = pytest.importorskip("transformers")

SIZES = H.LlamaSizes(hidden=64, intermediate=128, layers=2, heads=4, kv_heads=2, vocab=256)


def _model(dtype=torch.float32):
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(SIZES.hf_config()).to(dtype)
    # Random (non-unit) norm weights, so a gradient or update that ignores them shows.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
    return model


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().float().numpy()


def _torch_leaves(model) -> list[torch.Tensor]:
    """The model's parameters in the order of ``H.params_from_torch``'s pytree leaves."""
    body = model.model
    out = [body.embed_tokens.weight, model.lm_head.weight]
    per_layer = []
    for layer in body.layers:
        a, m = layer.self_attn, layer.mlp
        per_layer.append(
            {
                "down": m.down_proj.weight,
                "gate": m.gate_proj.weight,
                "k": a.k_proj.weight,
                "ln1": layer.input_layernorm.weight,
                "ln2": layer.post_attention_layernorm.weight,
                "o": a.o_proj.weight,
                "q": a.q_proj.weight,
                "up": m.up_proj.weight,
                "v": a.v_proj.weight,
            }
        )
    tree = {"embed": out[0], "layers": per_layer, "norm": body.norm.weight, "lm_head": out[1]}
    return jax.tree.leaves(tree, is_leaf=lambda x: isinstance(x, torch.Tensor))


def _close(actual, expected, rtol, what):
    actual, expected = np.asarray(actual, np.float32), np.asarray(expected, np.float32)
    assert actual.shape == expected.shape, what
    # The floor: a gradient that is zero in exact arithmetic (a key bias: softmax ignores a shift
    # shared by every key) is rounding noise on both sides.
    scale = max(float(np.abs(expected).max()), 1e-3)
    err = float(np.abs(actual - expected).max())
    assert err <= rtol * scale, f"{what}: max error {err:.3g} against max |value| {scale:.3g}"


def test_hand_written_llama_matches_transformers_float32():
    model = _model()
    ids = torch.randint(0, SIZES.vocab, (2, 32), generator=torch.Generator().manual_seed(1))
    jids = jnp.asarray(ids.numpy())
    params = H.params_from_torch(model)

    out = model(ids, labels=ids)
    out.loss.backward()
    with jax.default_matmul_precision("highest"):
        logits, cache = H.forward(SIZES, params, jids, return_cache=True)
        loss, grads = jax.value_and_grad(lambda p: H.loss_fn(SIZES, p, jids))(params)
    _close(logits, _np(out.logits), 1e-5, "logits")
    for i, layer in enumerate(out.past_key_values.layers):
        _close(cache[i][0], _np(layer.keys), 1e-5, f"layer {i} keys")
        _close(cache[i][1], _np(layer.values), 1e-5, f"layer {i} values")
    assert abs(float(loss) - out.loss.item()) < 1e-5
    leaves = _torch_leaves(model)
    assert len(jax.tree.leaves(grads)) == len(leaves) == len(list(model.parameters()))
    for g, p in zip(jax.tree.leaves(grads), leaves, strict=True):
        _close(g, _np(p.grad), 1e-4, f"grad of {tuple(p.shape)}")

    # One AdamW step from the same weights: every parameter after it.
    opt = torch.optim.AdamW(model.parameters())
    opt.step()
    new_params, state, step_loss = H.jitted_train_step(SIZES)(params, H.adamw_init(params), jids)
    assert abs(float(step_loss) - out.loss.item()) < 1e-5
    assert float(state["step"]) == 1.0
    for a, p in zip(jax.tree.leaves(new_params), leaves, strict=True):
        _close(a, _np(p), 1e-5, f"parameter {tuple(p.shape)} after one step")


def test_hand_written_llama_matches_transformers_bfloat16():
    model = _model(torch.bfloat16)
    ids = torch.randint(0, SIZES.vocab, (2, 32), generator=torch.Generator().manual_seed(2))
    jids = jnp.asarray(ids.numpy())
    params = H.params_from_torch(model)
    assert params["embed"].dtype == jnp.bfloat16
    out = model(ids, labels=ids)
    out.loss.backward()
    logits = H.forward(SIZES, params, jids)
    loss, grads = jax.value_and_grad(lambda p: H.loss_fn(SIZES, p, jids))(params)
    assert logits.dtype == jnp.bfloat16
    # bfloat16 keeps 8 bits: the two programs round differently, so the check is looser.
    _close(logits, _np(out.logits), 3e-2, "bf16 logits")
    assert abs(float(loss) - out.loss.item()) < 2e-2
    leaves = _torch_leaves(model)
    for g, p in zip(jax.tree.leaves(grads), leaves, strict=True):
        assert g.dtype == jnp.bfloat16
        _close(g, _np(p.grad), 1e-1, f"bf16 grad of {tuple(p.shape)}")


def test_hand_written_vit_matches_transformers_float32():
    from benchmarks import hand_vit as V

    sizes = V.ViTSizes(hidden=32, intermediate=64, layers=2, heads=4, image=16, patch=4, labels=10)
    torch.manual_seed(0)
    model = transformers.ViTForImageClassification(sizes.hf_config()).train()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "layernorm" in name or name.endswith("bias"):
                p.uniform_(-0.5, 1.5)  # non-trivial norms and biases
    g = torch.Generator().manual_seed(3)
    pixels = torch.randn(3, 3, 16, 16, generator=g)
    labels = torch.randint(0, 10, (3,), generator=g)
    jpix, jlab = jnp.asarray(pixels.numpy()), jnp.asarray(labels.numpy())
    params = V.params_from_torch(model)
    assert len(jax.tree.leaves(params)) == len(list(model.parameters()))

    out = model(pixels, labels=labels)
    out.loss.backward()
    with jax.default_matmul_precision("highest"):
        logits = V.forward(sizes, params, jpix)
        loss, grads = jax.value_and_grad(lambda p: V.loss_fn(sizes, p, jpix, jlab))(params)
    _close(logits, _np(out.logits), 1e-5, "logits")
    assert abs(float(loss) - out.loss.item()) < 1e-5
    leaves = _vit_torch_leaves(model)
    for grad, p in zip(jax.tree.leaves(grads), leaves, strict=True):
        _close(grad, _np(p.grad), 1e-4, f"grad of {tuple(p.shape)}")

    # eps=1e-3: AdamW turns the key bias's noise gradient (~1e-10) into updates of random sign
    # with the default eps (tests/models/harness.py make_optimizer says more).
    opt = torch.optim.AdamW(model.parameters(), eps=1e-3)
    opt.step()
    step = V.jitted_train_step(sizes, H.AdamW(eps=1e-3))
    new_params, _, _ = step(params, H.adamw_init(params), jpix, jlab)
    for a, p in zip(jax.tree.leaves(new_params), leaves, strict=True):
        _close(a, _np(p), 1e-5, f"parameter {tuple(p.shape)} after one step")


def _vit_torch_leaves(model) -> list[torch.Tensor]:
    """The ViT's parameters in the order of ``hand_vit.params_from_torch``'s pytree leaves."""
    vit = model.vit
    layers = []
    for layer in vit.layers:
        a = layer.attention
        d = {
            "ln1_w": layer.layernorm_before.weight,
            "ln1_b": layer.layernorm_before.bias,
            "ln2_w": layer.layernorm_after.weight,
            "ln2_b": layer.layernorm_after.bias,
            "fc1_w": layer.mlp.fc1.weight,
            "fc1_b": layer.mlp.fc1.bias,
            "fc2_w": layer.mlp.fc2.weight,
            "fc2_b": layer.mlp.fc2.bias,
        }
        for n in "qkvo":
            d[f"{n}_w"] = getattr(a, f"{n}_proj").weight
            d[f"{n}_b"] = getattr(a, f"{n}_proj").bias
        layers.append(d)
    tree = {
        "patch_w": vit.embeddings.patch_embeddings.projection.weight,
        "patch_b": vit.embeddings.patch_embeddings.projection.bias,
        "cls": vit.embeddings.cls_token,
        "pos": vit.embeddings.position_embeddings,
        "layers": layers,
        "ln_w": vit.layernorm.weight,
        "ln_b": vit.layernorm.bias,
        "head_w": model.classifier.weight,
        "head_b": model.classifier.bias,
    }
    return jax.tree.leaves(tree, is_leaf=lambda x: isinstance(x, torch.Tensor))

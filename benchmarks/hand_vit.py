"""The transformers ViT image classifier written by hand in JAX: the second architecture of
``benchmarks.tpu_programs``.

What a JAX user would write for ``transformers.ViTForImageClassification`` (SDPA attention, no
pooler): a strided convolution for the patch embedding (NCHW, as torch lays out images and
weights), a class token and learned positions, pre-norm encoder layers (LayerNorm, attention with
q/k/v/o biases through ``jax.nn.dot_product_attention``, exact-erf GELU MLP), a final LayerNorm,
a linear classifier on the class token and a cross-entropy loss; weights in torch's layouts.
The training step is ``value_and_grad`` + the AdamW of ``benchmarks.hand_llama``, one jitted
program with parameters and optimizer state donated.

``tests/tpu/test_tpu_programs.py`` checks it against the transformers model on CPU.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from benchmarks import hand_llama


@dataclasses.dataclass(frozen=True)
class ViTSizes:
    """The fields of ``transformers.ViTConfig`` that matter here."""

    hidden: int
    intermediate: int
    layers: int
    heads: int
    image: int
    patch: int
    labels: int
    channels: int = 3
    ln_eps: float = 1e-12

    @property
    def tokens(self) -> int:
        return (self.image // self.patch) ** 2 + 1

    def hf_config(self):
        """The equivalent ``transformers.ViTConfig`` (SDPA attention)."""
        import transformers

        config = transformers.ViTConfig(
            hidden_size=self.hidden,
            intermediate_size=self.intermediate,
            num_hidden_layers=self.layers,
            num_attention_heads=self.heads,
            image_size=self.image,
            patch_size=self.patch,
            num_labels=self.labels,
            num_channels=self.channels,
            layer_norm_eps=self.ln_eps,
        )
        config._attn_implementation = "sdpa"
        return config


Params = dict[str, Any]


def params_from_torch(model) -> Params:
    """The parameters of a ``transformers.ViTForImageClassification`` as a JAX pytree."""
    arr = hand_llama.to_jax
    vit = model.vit
    emb = vit.embeddings
    layers = []
    for layer in vit.layers:
        a = layer.attention
        layers.append(
            {
                "ln1_w": arr(layer.layernorm_before.weight),
                "ln1_b": arr(layer.layernorm_before.bias),
                **{f"{n}_w": arr(getattr(a, f"{n}_proj").weight) for n in "qkvo"},
                **{f"{n}_b": arr(getattr(a, f"{n}_proj").bias) for n in "qkvo"},
                "ln2_w": arr(layer.layernorm_after.weight),
                "ln2_b": arr(layer.layernorm_after.bias),
                "fc1_w": arr(layer.mlp.fc1.weight),
                "fc1_b": arr(layer.mlp.fc1.bias),
                "fc2_w": arr(layer.mlp.fc2.weight),
                "fc2_b": arr(layer.mlp.fc2.bias),
            }
        )
    return {
        "patch_w": arr(emb.patch_embeddings.projection.weight),
        "patch_b": arr(emb.patch_embeddings.projection.bias),
        "cls": arr(emb.cls_token),
        "pos": arr(emb.position_embeddings),
        "layers": layers,
        "ln_w": arr(vit.layernorm.weight),
        "ln_b": arr(vit.layernorm.bias),
        "head_w": arr(model.classifier.weight),
        "head_b": arr(model.classifier.bias),
    }


def params_like(sizes: ViTSizes, dtype) -> Params:
    """The parameter pytree's shapes, as ``jax.ShapeDtypeStruct`` (no data)."""
    d, i = sizes.hidden, sizes.intermediate
    s = hand_llama.struct_of(dtype)
    layer = {
        "ln1_w": s(d),
        "ln1_b": s(d),
        **{f"{n}_w": s(d, d) for n in "qkvo"},
        **{f"{n}_b": s(d) for n in "qkvo"},
        "ln2_w": s(d),
        "ln2_b": s(d),
        "fc1_w": s(i, d),
        "fc1_b": s(i),
        "fc2_w": s(d, i),
        "fc2_b": s(d),
    }
    return {
        "patch_w": s(d, sizes.channels, sizes.patch, sizes.patch),
        "patch_b": s(d),
        "cls": s(1, 1, d),
        "pos": s(1, sizes.tokens, d),
        "layers": [dict(layer) for _ in range(sizes.layers)],
        "ln_w": s(d),
        "ln_b": s(d),
        "head_w": s(sizes.labels, d),
        "head_b": s(sizes.labels),
    }


def _linear(x, w, b):
    return lax.dot_general(x, w, (((x.ndim - 1,), (1,)), ((), ()))) + b


def _layer_norm(x, w, b, eps: float):
    xf = x.astype(jnp.float32)
    mean = jnp.mean(xf, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(xf - mean), axis=-1, keepdims=True)
    return ((xf - mean) * lax.rsqrt(var + eps)).astype(x.dtype) * w + b


def forward(sizes: ViTSizes, params: Params, pixels):
    """Class logits ``[b, labels]`` in the parameters' dtype."""
    b = pixels.shape[0]
    d, heads = sizes.hidden, sizes.heads
    patches = (
        lax.conv_general_dilated(
            pixels,
            params["patch_w"],
            window_strides=(sizes.patch, sizes.patch),
            padding="VALID",
            dimension_numbers=("NCHW", "OIHW", "NCHW"),
        )
        + params["patch_b"][None, :, None, None]
    )
    x = patches.reshape(b, d, -1).transpose(0, 2, 1)  # [b, patches, d]
    x = jnp.concatenate([jnp.broadcast_to(params["cls"], (b, 1, d)), x], axis=1) + params["pos"]
    t = x.shape[1]
    for layer in params["layers"]:
        h = _layer_norm(x, layer["ln1_w"], layer["ln1_b"], sizes.ln_eps)
        q, k, v = (
            _linear(h, layer[f"{n}_w"], layer[f"{n}_b"]).reshape(b, t, heads, d // heads)
            for n in "qkv"
        )
        attn = jax.nn.dot_product_attention(q, k, v, implementation="xla")
        x = x + _linear(attn.reshape(b, t, d), layer["o_w"], layer["o_b"])
        h = _layer_norm(x, layer["ln2_w"], layer["ln2_b"], sizes.ln_eps)
        h = jax.nn.gelu(_linear(h, layer["fc1_w"], layer["fc1_b"]), approximate=False)
        x = x + _linear(h, layer["fc2_w"], layer["fc2_b"])
    x = _layer_norm(x, params["ln_w"], params["ln_b"], sizes.ln_eps)
    return _linear(x[:, 0], params["head_w"], params["head_b"])


def loss_fn(sizes: ViTSizes, params: Params, pixels, labels):
    """Mean cross-entropy of the class logits (HF's single-label classification loss)."""
    logits = forward(sizes, params, pixels).astype(jnp.float32)
    picked = jnp.take_along_axis(logits, labels[:, None], axis=-1)[:, 0]
    return jnp.mean(jax.nn.logsumexp(logits, axis=-1) - picked)


def jit_train_step(loss, sizes, hp: hand_llama.AdamW | None = None):
    """``loss(sizes, params, *batch)``'s training step (loss, gradients, AdamW) jitted with
    parameters and optimizer state donated, float32 matmuls and convolutions at HIGHEST."""
    hp = hp or hand_llama.AdamW()

    def step(params, state, *batch):
        with jax.default_matmul_precision("highest"):
            value, grads = jax.value_and_grad(lambda p: loss(sizes, p, *batch))(params)
            params, state = hand_llama.adamw_update(hp, params, grads, state)
        return params, state, value

    return jax.jit(step, donate_argnums=(0, 1))


def jit_forward(forward_fn, sizes):
    """``forward_fn(sizes, params, inputs)`` jitted, float32 matmuls at HIGHEST."""

    def fwd(params, inputs):
        with jax.default_matmul_precision("highest"):
            return forward_fn(sizes, params, inputs)

    return jax.jit(fwd)


def jitted_train_step(sizes: ViTSizes, hp: hand_llama.AdamW | None = None):
    """One training step (loss, gradients, AdamW) jitted with parameters and optimizer state
    donated, float32 matmuls and convolutions at HIGHEST."""
    return jit_train_step(loss_fn, sizes, hp)


def jitted_forward(sizes: ViTSizes):
    """The inference forward (class logits), jitted."""
    return jit_forward(forward, sizes)

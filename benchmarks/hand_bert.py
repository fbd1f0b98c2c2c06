"""The transformers BERT masked-LM written by hand in JAX: the third architecture of
``benchmarks.tpu_programs``.

What a JAX user would write for ``transformers.BertForMaskedLM`` (SDPA attention, no pooler, no
dropout): word + position + token-type (all zero) embeddings and a LayerNorm, post-norm encoder
layers (attention with q/k/v/o biases through ``jax.nn.dot_product_attention``, residual +
LayerNorm, exact-erf GELU MLP, residual + LayerNorm), the prediction head (dense, GELU,
LayerNorm, then the decoder tied to the word embeddings plus its own bias) and the masked-LM loss
(cross-entropy over the positions whose label is not -100, in float32); LayerNorm statistics in
float32; weights in torch's ``[out, in]`` layout. The training step is ``value_and_grad`` + the
AdamW of ``benchmarks.hand_llama``, one jitted program with parameters and optimizer state
donated.

``tests/tpu/test_tpu_programs.py`` checks it against the transformers model on CPU: logits, loss,
every gradient and every parameter after a step, from the same weights.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from benchmarks import hand_llama
from benchmarks.hand_vit import _layer_norm, _linear, jit_forward, jit_train_step

IGNORE = -100  # torch's CrossEntropyLoss ignore_index: positions that are not predicted


@dataclasses.dataclass(frozen=True)
class BertSizes:
    """The fields of ``transformers.BertConfig`` that matter here."""

    hidden: int
    intermediate: int
    layers: int
    heads: int
    vocab: int
    positions: int = 512
    type_vocab: int = 2
    ln_eps: float = 1e-12

    def hf_config(self):
        """The equivalent ``transformers.BertConfig`` (SDPA attention, dropout off)."""
        import transformers

        config = transformers.BertConfig(
            hidden_size=self.hidden,
            intermediate_size=self.intermediate,
            num_hidden_layers=self.layers,
            num_attention_heads=self.heads,
            vocab_size=self.vocab,
            max_position_embeddings=self.positions,
            type_vocab_size=self.type_vocab,
            layer_norm_eps=self.ln_eps,
            hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0,
        )
        config._attn_implementation = "sdpa"
        return config


Params = dict[str, Any]


def torch_tree(model) -> dict:
    """The parameters of a ``transformers.BertForMaskedLM`` as a pytree of torch tensors, in the
    layout of :func:`params_like` (the decoder weight is the word embedding: not a leaf)."""
    bert, head = model.bert, model.cls.predictions
    emb = bert.embeddings
    layers = []
    for layer in bert.encoder.layer:
        a = layer.attention
        layers.append(
            {
                **{f"{n}_w": getattr(a.self, m).weight for n, m in _QKV},
                **{f"{n}_b": getattr(a.self, m).bias for n, m in _QKV},
                "o_w": a.output.dense.weight,
                "o_b": a.output.dense.bias,
                "ln1_w": a.output.LayerNorm.weight,
                "ln1_b": a.output.LayerNorm.bias,
                "fc1_w": layer.intermediate.dense.weight,
                "fc1_b": layer.intermediate.dense.bias,
                "fc2_w": layer.output.dense.weight,
                "fc2_b": layer.output.dense.bias,
                "ln2_w": layer.output.LayerNorm.weight,
                "ln2_b": layer.output.LayerNorm.bias,
            }
        )
    return {
        "word": emb.word_embeddings.weight,
        "pos": emb.position_embeddings.weight,
        "type": emb.token_type_embeddings.weight,
        "emb_ln_w": emb.LayerNorm.weight,
        "emb_ln_b": emb.LayerNorm.bias,
        "layers": layers,
        "head_w": head.transform.dense.weight,
        "head_b": head.transform.dense.bias,
        "head_ln_w": head.transform.LayerNorm.weight,
        "head_ln_b": head.transform.LayerNorm.bias,
        "decoder_b": head.bias,
    }


_QKV = (("q", "query"), ("k", "key"), ("v", "value"))


def params_from_torch(model) -> Params:
    """The parameters of a ``transformers.BertForMaskedLM`` as a JAX pytree (same dtype)."""
    from tpu_inductor.core.boundary import tensor_to_host  # bfloat16-safe numpy view

    return jax.tree.map(lambda t: jnp.array(tensor_to_host(t.detach())), torch_tree(model))


def params_like(sizes: BertSizes, dtype) -> Params:
    """The parameter pytree's shapes, as ``jax.ShapeDtypeStruct`` (no data)."""
    d, i = sizes.hidden, sizes.intermediate
    s = hand_llama.struct_of(dtype)
    layer = {
        **{f"{n}_w": s(d, d) for n in "qkvo"},
        **{f"{n}_b": s(d) for n in "qkvo"},
        "ln1_w": s(d),
        "ln1_b": s(d),
        "fc1_w": s(i, d),
        "fc1_b": s(i),
        "fc2_w": s(d, i),
        "fc2_b": s(d),
        "ln2_w": s(d),
        "ln2_b": s(d),
    }
    return {
        "word": s(sizes.vocab, d),
        "pos": s(sizes.positions, d),
        "type": s(sizes.type_vocab, d),
        "emb_ln_w": s(d),
        "emb_ln_b": s(d),
        "layers": [dict(layer) for _ in range(sizes.layers)],
        "head_w": s(d, d),
        "head_b": s(d),
        "head_ln_w": s(d),
        "head_ln_b": s(d),
        "decoder_b": s(sizes.vocab),
    }


def forward(sizes: BertSizes, params: Params, ids):
    """Prediction scores ``[b, s, vocab]`` in the parameters' dtype."""
    b, s = ids.shape
    d, heads, eps = sizes.hidden, sizes.heads, sizes.ln_eps
    x = jnp.take(params["word"], ids, axis=0) + params["type"][0] + params["pos"][:s]
    x = _layer_norm(x, params["emb_ln_w"], params["emb_ln_b"], eps)
    for layer in params["layers"]:
        q, k, v = (
            _linear(x, layer[f"{n}_w"], layer[f"{n}_b"]).reshape(b, s, heads, d // heads)
            for n in "qkv"
        )
        attn = jax.nn.dot_product_attention(q, k, v, implementation="xla")
        x = _linear(attn.reshape(b, s, d), layer["o_w"], layer["o_b"]) + x
        x = _layer_norm(x, layer["ln1_w"], layer["ln1_b"], eps)
        h = jax.nn.gelu(_linear(x, layer["fc1_w"], layer["fc1_b"]), approximate=False)
        x = _linear(h, layer["fc2_w"], layer["fc2_b"]) + x
        x = _layer_norm(x, layer["ln2_w"], layer["ln2_b"], eps)
    h = jax.nn.gelu(_linear(x, params["head_w"], params["head_b"]), approximate=False)
    h = _layer_norm(h, params["head_ln_w"], params["head_ln_b"], eps)
    return _linear(h, params["word"], params["decoder_b"])


def loss_fn(sizes: BertSizes, params: Params, ids, labels):
    """torch's ``CrossEntropyLoss`` of the scores against ``labels``, in float32, averaged over
    the positions whose label is not -100."""
    logits = forward(sizes, params, ids).astype(jnp.float32)
    keep = labels != IGNORE
    picked = jnp.take_along_axis(logits, jnp.where(keep, labels, 0)[..., None], axis=-1)[..., 0]
    per_token = jax.nn.logsumexp(logits, axis=-1) - picked
    return jnp.sum(jnp.where(keep, per_token, 0.0)) / jnp.sum(keep)


def jitted_train_step(sizes: BertSizes, hp: hand_llama.AdamW | None = None):
    """One training step (loss, gradients, AdamW) jitted with parameters and optimizer state
    donated, float32 matmuls at HIGHEST."""
    return jit_train_step(loss_fn, sizes, hp)


def jitted_forward(sizes: BertSizes):
    """The inference forward (prediction scores), jitted."""
    return jit_forward(forward, sizes)

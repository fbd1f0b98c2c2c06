"""The transformers Llama written by hand in JAX: the reference ``benchmarks.tpu_programs`` measures
our TPU programs against.

What a JAX user would write for ``transformers.LlamaForCausalLM`` (SDPA attention, untied
embeddings, no biases): parameters in a dict, weights kept in torch's ``[out, in]`` layout (so both
programs read the same parameter bytes in the same layout), RMSNorm computed in float32 as HF does,
RoPE tables in float32 cast to the model dtype, grouped-query attention through
``jax.nn.dot_product_attention`` (the K/V heads are never repeated; logits and softmax in float32),
the loss in float32 as HF's ``ForCausalLMLoss``, and torch's AdamW update (decoupled weight decay,
bias corrections from a float32 step count). A training step is ONE jitted function
(``value_and_grad`` + AdamW) whose parameters and optimizer state are donated.

``tests/tpu/test_tpu_programs.py`` checks it against the transformers model on CPU: logits, loss,
gradients and parameters after a step, from the same weights.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax


@dataclasses.dataclass(frozen=True)
class LlamaSizes:
    """The architecture's sizes (the fields of ``transformers.LlamaConfig`` that matter here)."""

    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    vocab: int
    rms_eps: float = 1e-6
    rope_theta: float = 10000.0

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def hf_config(self):
        """The equivalent ``transformers.LlamaConfig`` (SDPA attention)."""
        import transformers

        config = transformers.LlamaConfig(
            hidden_size=self.hidden,
            intermediate_size=self.intermediate,
            num_hidden_layers=self.layers,
            num_attention_heads=self.heads,
            num_key_value_heads=self.kv_heads,
            vocab_size=self.vocab,
            rms_norm_eps=self.rms_eps,
        )
        config._attn_implementation = "sdpa"
        return config


Params = dict[str, Any]


def to_jax(t):
    """A torch tensor's values as a JAX array of its dtype (bfloat16-safe, through numpy)."""
    from tpu_inductor.core.boundary import tensor_to_host

    return jnp.asarray(tensor_to_host(t.detach()))


def struct_of(dtype):
    """``s(*shape)``: a ``jax.ShapeDtypeStruct`` of ``dtype`` (parameter shapes, no data)."""
    return lambda *shape: jax.ShapeDtypeStruct(shape, dtype)


def params_from_torch(model) -> Params:
    """The parameters of a ``transformers.LlamaForCausalLM`` as a JAX pytree (same dtype)."""
    arr = to_jax
    body = model.model
    layers = []
    for layer in body.layers:
        a, m = layer.self_attn, layer.mlp
        layers.append(
            {
                "ln1": arr(layer.input_layernorm.weight),
                "q": arr(a.q_proj.weight),
                "k": arr(a.k_proj.weight),
                "v": arr(a.v_proj.weight),
                "o": arr(a.o_proj.weight),
                "ln2": arr(layer.post_attention_layernorm.weight),
                "gate": arr(m.gate_proj.weight),
                "up": arr(m.up_proj.weight),
                "down": arr(m.down_proj.weight),
            }
        )
    return {
        "embed": arr(body.embed_tokens.weight),
        "layers": layers,
        "norm": arr(body.norm.weight),
        "lm_head": arr(model.lm_head.weight),
    }


def params_like(sizes: LlamaSizes, dtype) -> Params:
    """The parameter pytree's shapes, as ``jax.ShapeDtypeStruct`` (no data)."""
    d, i, v, hd = sizes.hidden, sizes.intermediate, sizes.vocab, sizes.head_dim

    s = struct_of(dtype)

    layer = {
        "ln1": s(d),
        "q": s(sizes.heads * hd, d),
        "k": s(sizes.kv_heads * hd, d),
        "v": s(sizes.kv_heads * hd, d),
        "o": s(d, sizes.heads * hd),
        "ln2": s(d),
        "gate": s(i, d),
        "up": s(i, d),
        "down": s(d, i),
    }
    return {
        "embed": s(v, d),
        "layers": [dict(layer) for _ in range(sizes.layers)],
        "norm": s(d),
        "lm_head": s(v, d),
    }


def _linear(x, w):
    # x [..., in] . w [out, in] -> [..., out]; precision from jax.default_matmul_precision.
    return lax.dot_general(x, w, (((x.ndim - 1,), (1,)), ((), ())))


def _rms_norm(x, w, eps: float):
    xf = x.astype(jnp.float32)
    xf = xf * lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps)
    return w * xf.astype(x.dtype)


def _rope(sizes: LlamaSizes, seq: int, dtype):
    hd = sizes.head_dim
    inv_freq = 1.0 / (sizes.rope_theta ** (np.arange(0, hd, 2, dtype=np.float32) / hd))
    freqs = jnp.arange(seq, dtype=jnp.float32)[:, None] * jnp.asarray(inv_freq)[None, :]
    emb = jnp.concatenate([freqs, freqs], axis=-1)  # [seq, hd]
    return jnp.cos(emb).astype(dtype), jnp.sin(emb).astype(dtype)


def _rotate(x, cos, sin):
    # x [b, s, heads, hd]; cos/sin [s, hd]
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos[None, :, None, :] + rotated * sin[None, :, None, :]


def forward(sizes: LlamaSizes, params: Params, ids, *, return_cache: bool = False):
    """Logits ``[b, s, vocab]`` in the parameters' dtype (and, with ``return_cache``, each
    layer's keys and values ``[b, kv_heads, s, head_dim]``, as HF's cache holds them)."""
    b, s = ids.shape
    hd = sizes.head_dim
    dtype = params["embed"].dtype
    x = jnp.take(params["embed"], ids, axis=0)
    cos, sin = _rope(sizes, s, dtype)
    cache = []
    for layer in params["layers"]:
        h = _rms_norm(x, layer["ln1"], sizes.rms_eps)
        q = _linear(h, layer["q"]).reshape(b, s, sizes.heads, hd)
        k = _linear(h, layer["k"]).reshape(b, s, sizes.kv_heads, hd)
        v = _linear(h, layer["v"]).reshape(b, s, sizes.kv_heads, hd)
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        if return_cache:
            cache.append((k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)))
        attn = jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="xla")
        x = x + _linear(attn.reshape(b, s, sizes.heads * hd), layer["o"])
        h = _rms_norm(x, layer["ln2"], sizes.rms_eps)
        mlp = jax.nn.silu(_linear(h, layer["gate"])) * _linear(h, layer["up"])
        x = x + _linear(mlp, layer["down"])
    x = _rms_norm(x, params["norm"], sizes.rms_eps)
    logits = _linear(x, params["lm_head"])
    return (logits, cache) if return_cache else logits


def loss_fn(sizes: LlamaSizes, params: Params, ids):
    """HF's causal-LM loss with ``labels=ids``: float32 cross-entropy of each position's
    logits against the next token, averaged over the ``b * (s - 1)`` predicted tokens."""
    logits = forward(sizes, params, ids).astype(jnp.float32)[:, :-1]
    targets = ids[:, 1:]
    lse = jax.nn.logsumexp(logits, axis=-1)
    picked = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
    return jnp.mean(lse - picked)


@dataclasses.dataclass(frozen=True)
class AdamW:
    """torch.optim.AdamW's hyperparameters (its defaults)."""

    lr: float = 1e-3
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 1e-2


def adamw_init(params: Params) -> dict:
    """AdamW state as torch lays it out: zero moments in the parameters' dtype, step 0."""
    return {
        "step": jnp.zeros((), jnp.float32),
        "exp_avg": jax.tree.map(jnp.zeros_like, params),
        "exp_avg_sq": jax.tree.map(jnp.zeros_like, params),
    }


def adamw_like(params: Params) -> dict:
    """The AdamW state's shapes, as ``jax.ShapeDtypeStruct``."""
    return {
        "step": jax.ShapeDtypeStruct((), jnp.float32),
        "exp_avg": params,
        "exp_avg_sq": params,
    }


def adamw_update(hp: AdamW, params: Params, grads: Params, state: dict):
    """torch's single-tensor AdamW step, per parameter, in the parameter's dtype."""
    step = state["step"] + 1
    bc1 = 1 - hp.beta1**step
    bc2_sqrt = jnp.sqrt(1 - hp.beta2**step)
    step_size = hp.lr / bc1

    def one(p, g, m, v):
        c = lambda x: jnp.asarray(x, p.dtype)  # noqa: E731 - scalars in the parameter's dtype
        p = p * c(1 - hp.lr * hp.weight_decay)
        m = m + (g - m) * c(1 - hp.beta1)
        v = v * c(hp.beta2) + g * g * c(1 - hp.beta2)
        denom = jnp.sqrt(v) / c(bc2_sqrt) + c(hp.eps)
        return p - c(step_size) * (m / denom), m, v

    out = jax.tree.map(one, params, grads, state["exp_avg"], state["exp_avg_sq"])
    treedef = jax.tree.structure(params)
    leaves = treedef.flatten_up_to(out)
    new_params = treedef.unflatten([t[0] for t in leaves])
    new_m = treedef.unflatten([t[1] for t in leaves])
    new_v = treedef.unflatten([t[2] for t in leaves])
    return new_params, {"step": step, "exp_avg": new_m, "exp_avg_sq": new_v}


def train_step(sizes: LlamaSizes, hp: AdamW, params: Params, state: dict, ids):
    """One training step: loss, gradients and the AdamW update, as one function."""
    loss, grads = jax.value_and_grad(lambda p: loss_fn(sizes, p, ids))(params)
    params, state = adamw_update(hp, params, grads, state)
    return params, state, loss


def jitted_train_step(sizes: LlamaSizes, hp: AdamW = AdamW()):
    """``train_step`` jitted with parameters and optimizer state donated, float32 matmuls at
    HIGHEST (as the backend compiles them under torch's default precision)."""

    def step(params, state, ids):
        with jax.default_matmul_precision("highest"):
            return train_step(sizes, hp, params, state, ids)

    return jax.jit(step, donate_argnums=(0, 1))


def jitted_forward(sizes: LlamaSizes, *, return_cache: bool = True):
    """The inference forward (logits and, as HF returns by default, the KV cache), jitted."""

    def fwd(params, ids):
        with jax.default_matmul_precision("highest"):
            return forward(sizes, params, ids, return_cache=return_cache)

    return jax.jit(fwd)

"""The TPU-program benchmark (``benchmarks/tpu_programs.py``) is an honest comparison: its
hand-written JAX Llama, ViT, BERT and ResNet compute what the torch models compute, from the same
weights (logits, KV cache, loss, every gradient, every parameter after an AdamW step, BatchNorm's
running statistics), and its runner keeps earlier rows honestly (``--merge``).
"""

from __future__ import annotations

import json

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

    # One AdamW step from the same weights: every parameter after it (eps=1e-3, as the other
    # models' tests: with eps=1e-8 a gradient entry that is rounding noise on both sides, 2.6e-7
    # against a largest 0.045, stepped by lr * g / (|g| + eps) differed by 8.5e-7 on an AMD EPYC
    # host, over 1e-5 of the weights).
    opt = torch.optim.AdamW(model.parameters(), eps=1e-3)
    opt.step()
    step = H.jitted_train_step(SIZES, H.AdamW(eps=1e-3))
    new_params, state, step_loss = step(params, H.adamw_init(params), jids)
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


def _randomize(model, names=("LayerNorm", "layernorm", "bn", "bias")):
    """Random norm weights and biases (instead of ones and zeros), so a gradient or update that
    ignores one shows."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if any(n in name for n in names):
                p.uniform_(0.5, 1.5)


def _leaves(tree) -> list[torch.Tensor]:
    return jax.tree.leaves(tree, is_leaf=lambda x: isinstance(x, torch.Tensor))


def _mlm_batch(vocab: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (2, 16), generator=g)
    labels = torch.where(torch.rand(2, 16, generator=g) < 0.3, ids, -100)
    labels[0, 0] = ids[0, 0]  # at least one predicted position
    return ids, labels


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_hand_written_bert_matches_transformers(dtype):
    from benchmarks import hand_bert as B

    sizes = B.BertSizes(hidden=32, intermediate=64, layers=2, heads=4, vocab=96, positions=32)
    torch.manual_seed(0)
    model = transformers.BertForMaskedLM(sizes.hf_config()).to(dtype).train()
    _randomize(model)
    ids, labels = _mlm_batch(sizes.vocab, seed=4)
    jids, jlab = jnp.asarray(ids.numpy()), jnp.asarray(labels.numpy())
    params = B.params_from_torch(model)
    leaves = _leaves(B.torch_tree(model))
    # the decoder weight is the word embedding (tied): one parameter, one leaf
    assert len(leaves) == len(jax.tree.leaves(params)) == len(list(model.parameters()))

    out = model(ids, labels=labels)
    out.loss.backward()
    with jax.default_matmul_precision("highest"):
        logits = B.forward(sizes, params, jids)
        loss, grads = jax.value_and_grad(lambda p: B.loss_fn(sizes, p, jids, jlab))(params)
    assert logits.dtype == params["word"].dtype
    # bfloat16 keeps 8 bits: the two programs round differently, so its check is looser.
    tol, loss_tol, grad_tol = (1e-5, 1e-5, 1e-4) if dtype == torch.float32 else (3e-2, 2e-2, 1e-1)
    _close(logits, _np(out.logits), tol, "logits")
    assert abs(float(loss) - out.loss.item()) < loss_tol
    for g, p in zip(jax.tree.leaves(grads), leaves, strict=True):
        assert g.dtype == params["word"].dtype
        _close(g, _np(p.grad), grad_tol, f"grad of {tuple(p.shape)}")
    if dtype != torch.float32:
        return
    # One AdamW step (eps=1e-3: the key bias's gradient is rounding noise, see the ViT's test).
    torch.optim.AdamW(model.parameters(), eps=1e-3).step()
    step = B.jitted_train_step(sizes, H.AdamW(eps=1e-3))
    new_params, _, step_loss = step(params, H.adamw_init(params), jids, jlab)
    assert abs(float(step_loss) - out.loss.item()) < 1e-5
    for a, p in zip(jax.tree.leaves(new_params), leaves, strict=True):
        _close(a, _np(p), 1e-5, f"parameter {tuple(p.shape)} after one step")


@pytest.mark.parametrize(
    "dtype", [torch.float32, pytest.param(torch.bfloat16, marks=pytest.mark.slow)]
)  # bf16: 33 s under load, float32 checks the same program (65 s)
def test_hand_written_resnet_matches_timm(dtype):
    from benchmarks import hand_resnet as R

    sizes = R.ResNetSizes(layers=(1, 2, 1, 1), channels=(8, 16, 16, 32), image=32, labels=10)
    torch.manual_seed(0)
    model = sizes.timm_model().to(dtype).train()
    _randomize(model, names=("bn", "downsample.1", "fc.bias"))
    with torch.no_grad():  # running statistics that are not the initial zeros and ones
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 1.5)
    g = torch.Generator().manual_seed(5)
    pixels = torch.randn(4, 3, 32, 32, generator=g).to(dtype)
    labels = torch.randint(0, 10, (4,), generator=g)
    jpix, jlab = jnp.asarray(_np(pixels)).astype(jnp.dtype(str(dtype)[6:])), jnp.asarray(labels)
    params, stats = R.params_from_torch(model), R.stats_from_torch(model)
    leaves = _leaves(R.torch_tree(model))
    assert len(leaves) == len(jax.tree.leaves(params)) == len(list(model.parameters()))
    assert any("down_conv" in b for stage in params["stages"] for b in stage)

    logits = model(pixels)
    loss = torch.nn.functional.cross_entropy(logits.float(), labels)
    loss.backward()
    with jax.default_matmul_precision("highest"):
        jlogits, _ = R.forward(sizes, params, stats, jpix, train=True)
        (jloss, new_stats), grads = jax.value_and_grad(
            lambda p: R.loss_fn(sizes, p, stats, jpix, jlab), has_aux=True
        )(params)
    f32 = dtype == torch.float32
    tol = 1e-5 if f32 else 3e-2
    assert jlogits.dtype == params["fc_w"].dtype
    _close(jlogits, _np(logits), tol, "logits")
    assert abs(float(jloss) - loss.item()) < (1e-5 if f32 else 2e-2)
    if f32:
        for grad, p in zip(jax.tree.leaves(grads), leaves, strict=True):
            _close(grad, _np(p.grad), 1e-4, f"grad of {tuple(p.shape)}")
    else:
        # bfloat16 BatchNorm backward over 4 images: torch's own gradients are 3-40% (relative
        # L2) from float32 arithmetic on the same weights (the hand program's, checked above in
        # float32); the hand program's may be at most twice as far from it as torch's are.
        up = lambda t: jax.tree.map(lambda a: a.astype(jnp.float32), t)  # noqa: E731
        with jax.default_matmul_precision("highest"):
            exact = jax.grad(
                lambda p: R.loss_fn(sizes, p, up(stats), jpix.astype(jnp.float32), jlab)[0]
            )(up(params))
        rel = lambda a, b: float(np.linalg.norm(a - b) / np.linalg.norm(b))  # noqa: E731
        for grad, ref, p in zip(
            jax.tree.leaves(grads), jax.tree.leaves(exact), leaves, strict=True
        ):
            assert grad.dtype == jnp.bfloat16
            ours, theirs, ref = np.asarray(grad, np.float32), _np(p.grad), np.asarray(ref)
            assert rel(ours, ref) <= 2 * max(rel(theirs, ref), 0.05), p.shape
    torch_stats = _leaves(R.torch_stats(model))  # updated by the training-mode forward
    assert len(torch_stats) == 2 * sum(isinstance(m, torch.nn.BatchNorm2d) for m in model.modules())
    for a, s in zip(jax.tree.leaves(new_stats), torch_stats, strict=True):
        assert a.dtype == params["fc_w"].dtype
        _close(a, _np(s), tol, f"running statistic {tuple(s.shape)}")
    if not f32:
        return
    # One AdamW step: every parameter and running statistic after it, then inference from them
    # (eps=1e-3: gradients that are rounding noise on both sides, see the ViT's test).
    torch.optim.AdamW(model.parameters(), eps=1e-3).step()
    step = R.jitted_train_step(sizes, H.AdamW(eps=1e-3))
    new_params, _, step_stats, step_loss = step(params, H.adamw_init(params), stats, jpix, jlab)
    assert abs(float(step_loss) - loss.item()) < 1e-5
    # 2e-4 of a weight of 0.1 is 2% of one update (lr 1e-3): BatchNorm's gradients carry more
    # rounding than a transformer's (measured: 1.2e-5 on the stem's weight, float32).
    for a, p in zip(jax.tree.leaves(new_params), leaves, strict=True):
        _close(a, _np(p), 2e-4, f"parameter {tuple(p.shape)} after one step")
    for a, s in zip(jax.tree.leaves(step_stats), torch_stats, strict=True):
        _close(a, _np(s), 1e-5, f"running statistic {tuple(s.shape)} after one step")
    model.eval()
    with torch.no_grad():
        expected = model(pixels)
    _close(R.jitted_forward(sizes)(new_params, step_stats, jpix), _np(expected), 1e-5, "eval")


def test_merge_keeps_earlier_rows_of_the_same_sizes_with_their_conditions(tmp_path):
    from benchmarks import tpu_programs as T
    from benchmarks.tpu_workloads import BATCH, SIZES

    def run(date, rows, sizes=None):
        return {
            "target": "v5e:2x2",
            "small": True,
            "sizes": sizes or {m: SIZES[m][True] for m in SIZES},
            "batch": {m: list(BATCH[m][True]) for m in BATCH},
            "conditions": {"date": date, "command": "x", "load_before": [1.0]},
            "rows": rows,
        }

    path = tmp_path / "r.json"
    old_sizes = {m: SIZES[m][True] for m in SIZES}
    old_sizes["vit"] = dict(old_sizes["vit"], layers=9)  # the ViT's sizes changed since
    rows = {"train-f32": {"hand": 1}, "bert-train-f32": {"hand": 2}, "vit-train-f32": {"hand": 3}}
    path.write_text(json.dumps(run("d1", rows, old_sizes)))
    data = run("d2", {})
    T._merge_earlier(data, path, ["bert-train-f32"])
    # measured now: not kept; another size: dropped; the Llama's row: kept, with its run's date
    assert data["rows"] == {"train-f32": {"hand": 1}}
    assert data["earlier"]["train-f32"]["date"] == "d1"
    assert "train-f32" in " ".join(T._earlier_lines(data))
    # merged again later, a row keeps the conditions of the run that measured it
    path.write_text(json.dumps(data))
    again = run("d3", {})
    T._merge_earlier(again, path, [])
    assert again["earlier"]["train-f32"]["date"] == "d1"


def test_the_optimizer_files_role_of_matches_exist():
    # role_of names a graph "optimizer" by the files its ops come from; a moved file would
    # silently stop matching
    import os

    from tpu_inductor.tpu import programs

    assert os.path.exists(programs._OPTIMIZER_FILES[1])

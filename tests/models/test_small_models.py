"""Whole models through ``torch.compile(backend="tpu")`` against CPU eager.

Each model runs forward, backward (every parameter's gradient) and optimizer steps compiled and
eagerly from identical copies; outputs, gradients, parameters and buffers must match after every
step. Models are tiny: these tests check that the lowerings compose correctly, not speed.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import tpu_inductor.dynamo.backend as tpu_backend
from tests.helpers import assert_same, check_fn, check_module_training, compiled

aten = torch.ops.aten


def _randn(*shape, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g)


def _init(model: nn.Module, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    for m in model.modules():
        if hasattr(m, "reset_parameters"):
            m.reset_parameters()
    return model


def attention_adamw(params):
    """AdamW for models with attention. The key projection's bias has a true gradient of exactly
    zero (softmax ignores a shift shared by all keys), so both sides see rounding noise (~1e-8)
    there; with the default eps=1e-8 AdamW divides that noise by its own magnitude and turns it
    into +-lr updates of random sign. eps=1e-3 keeps those updates below 1e-6, while the real
    gradients (mostly 1e-3..1e-1 here) still go through AdamW's moments and normalization."""
    return torch.optim.AdamW(params, lr=1e-2, eps=1e-3)


@pytest.fixture
def aten_ops(monkeypatch):
    """The set of ATen ops in every graph the backend compiles while the test runs."""
    seen: set = set()
    original = tpu_backend.compile_graph

    def recording(gm, *args, **kwargs):
        seen.update(n.target for n in gm.graph.nodes if n.op == "call_function")
        return original(gm, *args, **kwargs)

    monkeypatch.setattr(tpu_backend, "compile_graph", recording)
    return seen


# --- MLP ----------------------------------------------------------------------------------------


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 4)
        )

    def forward(self, x):
        return self.net(x)


@pytest.mark.parametrize("opt", ["adamw", "sgd"])
def test_mlp_training(opt):
    model = _init(MLP())
    check_module_training(model, lambda step: (_randn(6, 8, seed=step),), opt=opt)


# --- CNN with BatchNorm -------------------------------------------------------------------------


class SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        # No conv bias before a train-mode BatchNorm: its true gradient is 0, so both sides get
        # rounding noise that AdamW's normalization would blow up into different updates.
        self.conv1 = nn.Conv2d(3, 4, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(4)
        self.conv2 = nn.Conv2d(4, 6, 3, stride=2, bias=False)
        self.bn2 = nn.BatchNorm2d(6, momentum=0.3)
        self.fc = nn.Linear(6, 3)

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)))
        x = F.relu(self.bn2(self.conv2(x)))
        return self.fc(x.mean(dim=(2, 3)))


def _cnn_inputs(step):
    # A non-zero mean and non-unit scale so the running statistics move visibly.
    return (_randn(4, 3, 8, 8, seed=10 + step) * 2 + 0.5,)


@pytest.mark.parametrize("opt", ["adamw", "sgd"])
def test_cnn_batchnorm_train_mode(opt):
    model = _init(SmallCNN())
    eager, comp = check_module_training(model, _cnn_inputs, steps=3, opt=opt)
    # The helper compares every buffer after every step; also check they moved at all.
    for bn_e, bn_c in ((eager.bn1, comp.bn1), (eager.bn2, comp.bn2)):
        assert int(bn_c.num_batches_tracked) == 3
        assert not torch.allclose(bn_c.running_mean, torch.zeros_like(bn_c.running_mean))
        assert not torch.allclose(bn_c.running_var, torch.ones_like(bn_c.running_var))
        assert_same(bn_c.running_mean, bn_e.running_mean, what="running_mean")
        assert_same(bn_c.running_var, bn_e.running_var, what="running_var")


def test_cnn_batchnorm_eval_mode():
    model = _init(SmallCNN())
    # Non-trivial running statistics, so eval mode really normalizes with them.
    for i, bn in enumerate((model.bn1, model.bn2)):
        bn.running_mean.copy_(_randn(bn.num_features, seed=20 + i) * 0.3)
        bn.running_var.copy_(_randn(bn.num_features, seed=30 + i).abs() + 0.5)
        bn.num_batches_tracked.fill_(7)
    model.eval()
    eager, comp = check_module_training(model, _cnn_inputs, steps=3)
    for bn in (comp.bn1, comp.bn2):
        assert int(bn.num_batches_tracked) == 7
    assert_same(comp.bn1.running_mean, model.bn1.running_mean, what="eval running_mean unchanged")


def test_cnn_batchnorm_eval_inference():
    model = _init(SmallCNN())
    for i, bn in enumerate((model.bn1, model.bn2)):
        bn.running_mean.copy_(_randn(bn.num_features, seed=40 + i) * 0.3)
        bn.running_var.copy_(_randn(bn.num_features, seed=50 + i).abs() + 0.5)
    model.eval()
    x = _cnn_inputs(0)[0]
    with torch.no_grad():
        check_fn(model, x)


# --- CNN with strided / dilated / grouped convs and pooling windows -----------------------------


class WindowCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(4, 6, 3, stride=2, padding=2, dilation=2, groups=2)
        self.maxpool = nn.MaxPool2d(3, stride=2, ceil_mode=True)
        self.conv_t = nn.ConvTranspose2d(6, 4, 3, stride=2, padding=1, output_padding=1, groups=2)
        self.avgpool = nn.AvgPool2d(3, stride=2, padding=1, count_include_pad=False)
        self.adapt = nn.AdaptiveAvgPool2d((3, 3))
        self.fc = nn.Linear(4 * 9, 5)

    def forward(self, x):
        x = torch.tanh(self.conv(x))  # 4x15x15 -> 6x8x8
        x = self.maxpool(x)  # 8x8 -> 4x4 (ceil_mode keeps the partial last window)
        x = torch.tanh(self.conv_t(x))  # 4x4 -> 8x8
        x = self.avgpool(x)  # 8x8 -> 4x4, padded edges excluded from the divisor
        x = self.adapt(x)  # 4x4 -> 3x3: overlapping, unequal windows
        return self.fc(x.flatten(1))


def test_cnn_windows_shapes_are_the_interesting_ones():
    # Guard the geometry the next test relies on (ceil_mode tail, non-divisible adaptive pool).
    m = WindowCNN()
    x = torch.randn(2, 4, 15, 15)
    h = m.conv(x)
    assert h.shape[-2:] == (8, 8)
    assert m.maxpool(h).shape[-2:] == (4, 4)
    assert F.max_pool2d(h, 3, 2, ceil_mode=False).shape[-2:] == (3, 3)


@pytest.mark.parametrize("opt", ["adamw", "sgd"])
def test_cnn_windows_training(opt):
    model = _init(WindowCNN())
    check_module_training(
        model, lambda step: (_randn(2, 4, 15, 15, seed=60 + step),), steps=2, opt=opt
    )


def test_cnn_windows_input_grad():
    model = _init(WindowCNN())

    def fn(x):
        out = model(x)
        (gx,) = torch.autograd.grad(out.pow(2).sum(), x)
        return out, gx

    x = _randn(2, 4, 15, 15, seed=70)
    expected = fn(x.clone().requires_grad_())
    actual = torch.compile(fn, backend="tpu")(x.clone().requires_grad_())
    assert_same([t.detach() for t in actual], [t.detach() for t in expected])


# --- Transformer encoder layer ------------------------------------------------------------------


def _encoder(norm_first=False, activation="relu"):
    return _init(
        nn.TransformerEncoderLayer(
            d_model=16,
            nhead=2,
            dim_feedforward=32,
            dropout=0.0,
            activation=activation,
            batch_first=True,
            norm_first=norm_first,
        )
    )


def _projection_loss(out):
    # A fixed random projection: out.pow(2).mean() of a LayerNorm output (weight 1, bias 0) is
    # constant, so its gradients would be rounding noise and the comparison meaningless.
    w = _randn(*out.shape, seed=7)
    return (out * w).sum()


@pytest.mark.parametrize(
    "norm_first,activation,opt",
    [(False, "relu", attention_adamw), (True, "gelu", attention_adamw), (False, "gelu", "sgd")],
    ids=["post_norm-relu-adamw", "norm_first-gelu-adamw", "post_norm-gelu-sgd"],
)
def test_transformer_encoder_layer_training(norm_first, activation, opt):
    model = _encoder(norm_first, activation)
    check_module_training(
        model,
        lambda step: (_randn(2, 5, 16, seed=80 + step),),
        opt=opt,
        loss_fn=_projection_loss,
    )


def _padding_mask():
    # True = ignore. No row is fully masked (that is NaN in eager too).
    return torch.tensor([[False, False, False, True, True], [False, False, False, False, True]])


def _causal_mask():
    return torch.ones(5, 5, dtype=torch.bool).triu(1)  # True = ignore (future positions)


@pytest.mark.parametrize("norm_first", [False, True], ids=["post_norm", "norm_first"])
@pytest.mark.parametrize("masks", ["none", "key_padding", "src_mask", "both"])
def test_transformer_encoder_layer_fast_path(norm_first, masks, aten_ops):
    # Eval mode + no_grad takes nn.TransformerEncoderLayer's fused inference path; each mask
    # combination reaches it with a different mask_type (none, 1: key padding, 0: (L, S),
    # 2: merged (B, H, L, S)).
    model = _encoder(norm_first, "gelu").eval()
    x = _randn(2, 5, 16, seed=90)
    src_mask = _causal_mask() if masks in ("src_mask", "both") else None
    padding = _padding_mask() if masks in ("key_padding", "both") else None
    with torch.no_grad():
        expected = model(x, src_mask, padding)
        actual = compiled(model)(x, src_mask, padding)
    assert torch.isfinite(expected).all()
    assert_same(actual, expected)
    assert aten._transformer_encoder_layer_fwd.default in aten_ops, sorted(map(str, aten_ops))


def test_transformer_encoder_layer_padding_mask_training():
    model = _encoder(False, "relu")
    mask = _padding_mask()

    class Wrapped(nn.Module):
        def __init__(self):
            super().__init__()
            self.layer = model

        def forward(self, x):
            return self.layer(x, src_key_padding_mask=mask)

    check_module_training(
        Wrapped(),
        lambda step: (_randn(2, 5, 16, seed=95 + step),),
        steps=2,
        opt=attention_adamw,
        loss_fn=_projection_loss,
    )


# --- Hand-written causal decoder block ----------------------------------------------------------


class CausalBlock(nn.Module):
    def __init__(self, vocab=11, dim=16, heads=2):
        super().__init__()
        self.heads = heads
        self.embed = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(_randn(8, dim, seed=3) * 0.02)
        self.ln1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.ln2 = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, 4 * dim)
        self.fc2 = nn.Linear(4 * dim, dim)
        self.ln_f = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, tokens):
        B, T = tokens.shape
        x = self.embed(tokens) + self.pos[:T]
        q, k, v = self.qkv(self.ln1(x)).chunk(3, dim=-1)
        q, k, v = (t.view(B, T, self.heads, -1).transpose(1, 2) for t in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(B, T, -1))
        x = x + self.fc2(F.gelu(self.fc1(self.ln2(x))))
        return self.head(self.ln_f(x))


def _tokens(step):
    g = torch.Generator().manual_seed(100 + step)
    return (torch.randint(0, 11, (2, 7), generator=g),)


@pytest.mark.parametrize("opt", [attention_adamw, "sgd"], ids=["adamw", "sgd"])
def test_causal_decoder_block_training(opt):
    model = _init(CausalBlock())
    targets = torch.randint(0, 11, (2, 7), generator=torch.Generator().manual_seed(1))
    check_module_training(
        model,
        _tokens,
        opt=opt,
        loss_fn=lambda logits: F.cross_entropy(logits.flatten(0, 1), targets.flatten()),
    )


def test_causal_decoder_block_is_causal():
    # Changing a later token must not change earlier logits, compiled.
    model = _init(CausalBlock())
    cmodel = compiled(model)
    tokens = _tokens(0)[0]
    changed = tokens.clone()
    changed[:, -1] = (changed[:, -1] + 1) % 11
    with torch.no_grad():
        a, b = cmodel(tokens), cmodel(changed)
    assert_same(a[:, :-1], b[:, :-1], what="earlier positions")
    assert not torch.allclose(a[:, -1], b[:, -1])


# --- Compiled optimizer steps -------------------------------------------------------------------


def _grads_for(model, step):
    x = _randn(6, 8, seed=200 + step)
    model(x).pow(2).mean().backward()


@pytest.mark.parametrize(
    "make_opt,update_op",
    [
        pytest.param(
            lambda ps: torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.05),
            aten.sqrt.default,
            id="adamw",
        ),
        pytest.param(
            lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9),
            aten.add.Tensor,
            id="sgd_momentum",
        ),
    ],
)
def test_compiled_optimizer_step(make_opt, update_op, aten_ops):
    # The model runs eagerly; only ``opt.step`` is compiled.
    model = _init(MLP())
    eager, comp = copy.deepcopy(model), copy.deepcopy(model)
    oe, oc = make_opt(eager.parameters()), make_opt(comp.parameters())
    step_c = torch.compile(oc.step, backend="tpu")
    for step in range(3):
        _grads_for(eager, step)
        _grads_for(comp, step)
        oe.step()
        step_c()
        oe.zero_grad()
        oc.zero_grad()
        for (name, pe), pc in zip(eager.named_parameters(), comp.parameters(), strict=True):
            assert_same(pc.detach(), pe.detach(), what=f"step {step} param {name}")
        for (name, pe), pc in zip(eager.named_parameters(), comp.parameters(), strict=True):
            se, sc = oe.state[pe], oc.state[pc]
            assert set(sc) == set(se), name
            for key in se:
                assert_same(sc[key], se[key], what=f"step {step} {name} state {key}")
    # The updates really happened, and in a graph this backend compiled.
    assert not torch.allclose(comp.net[0].weight, model.net[0].weight)
    assert update_op in aten_ops, sorted(map(str, aten_ops))

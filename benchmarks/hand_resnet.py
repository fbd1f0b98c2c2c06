"""timm's ResNet (bottleneck blocks, BatchNorm) written by hand in JAX: the fourth architecture of
``benchmarks.tpu_programs``.

What a JAX user would write for ``timm.models.resnet.ResNet(Bottleneck, layers, channels=...)``:
images and convolution weights in torch's NCHW / OIHW layouts (XLA picks the TPU's physical
layouts either way), a 7x7 stride-2 stem convolution to 64 channels, BatchNorm, ReLU and a 3x3
stride-2 max pool; stages of bottleneck blocks (1x1, 3x3 with the stage's stride, 1x1 to 4x the
stage's channels, each followed by BatchNorm; a 1x1 strided convolution + BatchNorm on the
shortcut where the shape changes); global average pooling, a linear classifier and a mean
cross-entropy loss in float32.

BatchNorm in training mode normalizes with the batch's statistics (biased variance) and returns
updated running statistics as torch does (momentum 0.1, unbiased variance); statistics are
computed in float32 and the result cast back, as torch's CPU kernel does. In inference mode it
normalizes with the running statistics. The training step is ONE jitted program (forward,
backward, the AdamW of ``benchmarks.hand_llama``, the running-statistics update) with parameters,
optimizer state and running statistics donated.

``tests/tpu/test_tpu_programs.py`` checks it against the timm model on CPU: logits, loss, every
gradient, every parameter after an AdamW step and every running statistic.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from benchmarks import hand_llama

STEM = 64  # timm's ResNet: the default stem convolution's width, whatever the stages' channels


@dataclasses.dataclass(frozen=True)
class ResNetSizes:
    """The arguments of ``timm.models.resnet.ResNet`` that matter here (bottleneck blocks)."""

    layers: tuple[int, ...]  # blocks per stage
    channels: tuple[int, ...]  # each stage's bottleneck width (its output is 4x)
    image: int
    labels: int
    in_chans: int = 3
    bn_eps: float = 1e-5
    momentum: float = 0.1

    def __post_init__(self):
        object.__setattr__(self, "layers", tuple(self.layers))
        object.__setattr__(self, "channels", tuple(self.channels))

    def blocks(self):
        """Per block: (stage, index, in channels, width, stride, has a downsample shortcut)."""
        inplanes = STEM
        for stage, (n, width) in enumerate(zip(self.layers, self.channels, strict=True)):
            for i in range(n):
                stride = 2 if stage > 0 and i == 0 else 1
                yield stage, i, inplanes, width, stride, stride != 1 or inplanes != 4 * width
                inplanes = 4 * width

    def timm_model(self):
        """The equivalent timm ``ResNet`` (random weights)."""
        from tests.models.timm_compat import import_timm

        import_timm()
        from timm.models.resnet import Bottleneck, ResNet

        return ResNet(
            Bottleneck,
            self.layers,
            num_classes=self.labels,
            in_chans=self.in_chans,
            channels=self.channels,
        )


Params = dict[str, Any]


def _stage_tree(sizes: ResNetSizes, block_of) -> list[list[dict]]:
    stages: list[list[dict]] = [[] for _ in sizes.layers]
    for stage, i, inplanes, width, stride, down in sizes.blocks():
        stages[stage].append(block_of(stage, i, inplanes, width, stride, down))
    return stages


def _stages(model) -> list:
    return [model.layer1, model.layer2, model.layer3, model.layer4]


def torch_tree(model) -> dict:
    """The parameters of a timm bottleneck ``ResNet`` as a pytree of torch tensors, in the
    layout of :func:`params_like`."""

    def bn(m):
        return {"w": m.weight, "b": m.bias}

    def block(b):
        out = {f"conv{k}": getattr(b, f"conv{k}").weight for k in (1, 2, 3)}
        out.update({f"bn{k}": bn(getattr(b, f"bn{k}")) for k in (1, 2, 3)})
        if b.downsample is not None:
            out["down_conv"], out["down_bn"] = b.downsample[0].weight, bn(b.downsample[1])
        return out

    return {
        "conv1": model.conv1.weight,
        "bn1": bn(model.bn1),
        "stages": [[block(b) for b in stage] for stage in _stages(model)],
        "fc_w": model.fc.weight,
        "fc_b": model.fc.bias,
    }


def torch_stats(model) -> dict:
    """The running statistics of every BatchNorm, in the layout of :func:`stats_like`."""

    def bn(m):
        return {"mean": m.running_mean, "var": m.running_var}

    def block(b):
        out = {f"bn{k}": bn(getattr(b, f"bn{k}")) for k in (1, 2, 3)}
        if b.downsample is not None:
            out["down_bn"] = bn(b.downsample[1])
        return out

    return {"bn1": bn(model.bn1), "stages": [[block(b) for b in stage] for stage in _stages(model)]}


def _to_jax(tree):
    from tpu_inductor.core.boundary import tensor_to_host  # bfloat16-safe numpy view

    return jax.tree.map(lambda t: jnp.array(tensor_to_host(t.detach())), tree)


def params_from_torch(model) -> Params:
    """The parameters of a timm bottleneck ``ResNet`` as a JAX pytree (same dtype)."""
    return _to_jax(torch_tree(model))


def stats_from_torch(model) -> dict:
    """The BatchNorm running statistics of a timm bottleneck ``ResNet`` as a JAX pytree."""
    return _to_jax(torch_stats(model))


def params_like(sizes: ResNetSizes, dtype) -> Params:
    """The parameter pytree's shapes, as ``jax.ShapeDtypeStruct`` (no data)."""

    s = hand_llama.struct_of(dtype)

    def bn(c):
        return {"w": s(c), "b": s(c)}

    def block(stage, i, inplanes, width, stride, down):
        out = {
            "conv1": s(width, inplanes, 1, 1),
            "conv2": s(width, width, 3, 3),
            "conv3": s(4 * width, width, 1, 1),
            "bn1": bn(width),
            "bn2": bn(width),
            "bn3": bn(4 * width),
        }
        if down:
            out["down_conv"], out["down_bn"] = s(4 * width, inplanes, 1, 1), bn(4 * width)
        return out

    return {
        "conv1": s(STEM, sizes.in_chans, 7, 7),
        "bn1": bn(STEM),
        "stages": _stage_tree(sizes, block),
        "fc_w": s(sizes.labels, 4 * sizes.channels[-1]),
        "fc_b": s(sizes.labels),
    }


def stats_like(sizes: ResNetSizes, dtype) -> dict:
    """The running statistics' shapes, as ``jax.ShapeDtypeStruct`` (in the model's dtype)."""

    def bn(c):
        return {"mean": jax.ShapeDtypeStruct((c,), dtype), "var": jax.ShapeDtypeStruct((c,), dtype)}

    def block(stage, i, inplanes, width, stride, down):
        out = {"bn1": bn(width), "bn2": bn(width), "bn3": bn(4 * width)}
        if down:
            out["down_bn"] = bn(4 * width)
        return out

    return {"bn1": bn(STEM), "stages": _stage_tree(sizes, block)}


def _conv(x, w, stride: int):
    k = w.shape[-1]
    return lax.conv_general_dilated(
        x,
        w,
        window_strides=(stride, stride),
        padding=[(k // 2, k // 2)] * 2,
        dimension_numbers=("NCHW", "OIHW", "NCHW"),
    )


def _batch_norm(sizes: ResNetSizes, x, p, s, train: bool):
    """BatchNorm2d over ``x [n, c, h, w]``: (output, updated running statistics)."""
    xf = x.astype(jnp.float32)
    if train:
        mean = jnp.mean(xf, axis=(0, 2, 3))
        var = jnp.mean(jnp.square(xf - mean[:, None, None]), axis=(0, 2, 3))
        n = x.size // x.shape[1]
        m = sizes.momentum
        new = {
            "mean": ((1 - m) * s["mean"].astype(jnp.float32) + m * mean).astype(s["mean"].dtype),
            "var": ((1 - m) * s["var"].astype(jnp.float32) + m * var * (n / (n - 1))).astype(
                s["var"].dtype
            ),
        }
    else:
        mean, var, new = s["mean"].astype(jnp.float32), s["var"].astype(jnp.float32), s
    scale = lax.rsqrt(var + sizes.bn_eps) * p["w"].astype(jnp.float32)
    shift = p["b"].astype(jnp.float32) - mean * scale
    y = xf * scale[:, None, None] + shift[:, None, None]
    return y.astype(x.dtype), new


def forward(sizes: ResNetSizes, params: Params, stats: dict, pixels, *, train: bool):
    """Class logits ``[b, labels]`` in the parameters' dtype and the running statistics (updated
    in training mode, as given in inference mode)."""

    def bn(x, p, s):
        return _batch_norm(sizes, x, p, s, train)

    x, stem = bn(_conv(pixels, params["conv1"], 2), params["bn1"], stats["bn1"])
    x = jax.nn.relu(x)
    x = lax.reduce_window(
        x, -jnp.inf, lax.max, (1, 1, 3, 3), (1, 1, 2, 2), ((0, 0), (0, 0), (1, 1), (1, 1))
    )
    new_stages = []
    blocks = iter(sizes.blocks())
    for pstage, sstage in zip(params["stages"], stats["stages"], strict=True):
        new_stage = []
        for p, s in zip(pstage, sstage, strict=True):
            stride = next(blocks)[4]
            new: dict = {}
            h, new["bn1"] = bn(_conv(x, p["conv1"], 1), p["bn1"], s["bn1"])
            h, new["bn2"] = bn(_conv(jax.nn.relu(h), p["conv2"], stride), p["bn2"], s["bn2"])
            h, new["bn3"] = bn(_conv(jax.nn.relu(h), p["conv3"], 1), p["bn3"], s["bn3"])
            if "down_conv" in p:
                x, new["down_bn"] = bn(_conv(x, p["down_conv"], stride), p["down_bn"], s["down_bn"])
            x = jax.nn.relu(h + x)
            new_stage.append(new)
        new_stages.append(new_stage)
    pooled = jnp.mean(x, axis=(2, 3))
    logits = lax.dot_general(pooled, params["fc_w"], (((1,), (1,)), ((), ()))) + params["fc_b"]
    return logits, {"bn1": stem, "stages": new_stages}


def loss_fn(sizes: ResNetSizes, params: Params, stats: dict, pixels, labels):
    """Mean cross-entropy of the class logits in training mode: (loss, updated statistics)."""
    logits, new_stats = forward(sizes, params, stats, pixels, train=True)
    logits = logits.astype(jnp.float32)
    picked = jnp.take_along_axis(logits, labels[:, None], axis=-1)[:, 0]
    return jnp.mean(jax.nn.logsumexp(logits, axis=-1) - picked), new_stats


def jitted_train_step(sizes: ResNetSizes, hp: hand_llama.AdamW | None = None):
    """One training step (loss, gradients, AdamW, running statistics) jitted with parameters,
    optimizer state and running statistics donated, float32 convolutions at HIGHEST."""
    hp = hp or hand_llama.AdamW()

    def step(params, state, stats, pixels, labels):
        with jax.default_matmul_precision("highest"):
            (loss, stats), grads = jax.value_and_grad(
                lambda p: loss_fn(sizes, p, stats, pixels, labels), has_aux=True
            )(params)
            params, state = hand_llama.adamw_update(hp, params, grads, state)
        return params, state, stats, loss

    return jax.jit(step, donate_argnums=(0, 1, 2))


def jitted_forward(sizes: ResNetSizes):
    """The inference forward (class logits, BatchNorm from the running statistics), jitted."""

    def fwd(params, stats, pixels):
        with jax.default_matmul_precision("highest"):
            return forward(sizes, params, stats, pixels, train=False)[0]

    return jax.jit(fwd)

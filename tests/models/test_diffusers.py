"""``diffusers`` models through ``torch.compile(backend="tpu")``: a tiny conditional UNet and the
``AutoencoderKL`` decoder, from small random configs, against CPU eager.

``MODELS`` here joins ``tests/models/test_transformers.py``'s table in ``docs/models.md``.
"""

from __future__ import annotations

import pytest
import torch

from tests.models.harness import Built, ModelCase, compare, run_forward, run_training
from tests.models.test_transformers import params

BATCH = 2


def _randn(*shape, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def unet(train: bool) -> Built:
    import diffusers

    model = diffusers.UNet2DConditionModel(
        sample_size=16,
        in_channels=4,
        out_channels=4,
        layers_per_block=1,
        block_out_channels=(32, 64),
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        cross_attention_dim=32,
        attention_head_dim=8,
        norm_num_groups=8,
    )
    inputs = {
        "sample": _randn(BATCH, 4, 16, 16, seed=0),
        "timestep": torch.tensor([10, 500]),
        "encoder_hidden_states": _randn(BATCH, 7, 32, seed=1),
    }
    return model, inputs


class VaeDecoder(torch.nn.Module):
    """``AutoencoderKL.decode`` as a module: latents -> image."""

    def __init__(self, vae):
        super().__init__()
        self.vae = vae

    def forward(self, latents):
        return self.vae.decode(latents).sample


def vae_decoder(train: bool) -> Built:
    import diffusers

    vae = diffusers.AutoencoderKL(
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D", "DownEncoderBlock2D"),
        up_block_types=("UpDecoderBlock2D", "UpDecoderBlock2D"),
        block_out_channels=(32, 64),
        latent_channels=4,
        norm_num_groups=8,
        sample_size=32,
        layers_per_block=1,
    )
    return VaeDecoder(vae), {"latents": _randn(BATCH, 4, 8, 8, seed=2)}


MODELS: list[ModelCase] = [
    ModelCase(
        "unet2d_condition", "diffusers", unet, outputs=("sample",), train=True, train_slow=True
    ),
    ModelCase("autoencoder_kl_decoder", "diffusers", vae_decoder, outputs=("",)),
]


@pytest.mark.parametrize("case", params(MODELS))
def test_forward(case: ModelCase):
    pytest.importorskip("diffusers")
    result, actual, expected = run_forward(case)
    compare(actual, expected, case, "forward")
    assert result.fallback_ops == set(case.fallback)
    assert (result.dynamo_graphs, result.graph_breaks) == (1, 0)


@pytest.mark.parametrize("case", params(MODELS, training=True))
def test_training(case: ModelCase):
    pytest.importorskip("diffusers")
    result = run_training(case)
    assert result.recompiles == 0
    assert result.fallback_ops == set(case.fallback)

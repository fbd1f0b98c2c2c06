"""Real ``transformers`` and ``timm`` architectures through ``torch.compile(backend="tpu")``.

Every model is built from a tiny random config (hidden size 32, two layers, a vocabulary of 128,
8-token sequences, 32-pixel images), never downloaded. Each runs an inference forward compiled and
eagerly and compares the main outputs; those marked ``train`` also run two training steps (loss,
backward, AdamW) and compare the loss, every gradient and every parameter. Ops that fall back to
torch eager are data (``fallback=``) and are checked exactly, so the table can't go stale.

Attention runs transformers' "eager" implementation (matmul + softmax), or "sdpa"
(``scaled_dot_product_attention``, transformers' default) for RoBERTa, Mistral, Qwen3, Phi-3,
Starcoder2, Whisper and CLIP, so both paths are covered.

``MODELS`` is the suite's one list: ``scripts/gen_models_doc.py`` imports it to write
``docs/models.md``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import pytest
import torch

from tests.models.harness import Built, ModelCase, compare, no_dropout, run_forward, run_training

VOCAB = 128
BATCH, SEQ = 2, 8
IMAGE = 32
NUM_LABELS = 10


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _ids(seq: int = SEQ, vocab: int = VOCAB, seed: int = 0) -> torch.Tensor:
    # Ids 0-2 are the special tokens (pad, bos, eos) of every config below.
    return torch.randint(3, vocab, (BATCH, seq), generator=_gen(seed))


def _padding_mask(seq: int = SEQ) -> torch.Tensor:
    """All ones except the second row's last two tokens (right padding)."""
    mask = torch.ones(BATCH, seq, dtype=torch.long)
    mask[1, -2:] = 0
    return mask


def _pixels(size: int = IMAGE, channels: int = 3) -> torch.Tensor:
    return torch.randn(BATCH, channels, size, size, generator=_gen(1))


def _labels() -> torch.Tensor:
    return torch.randint(0, NUM_LABELS, (BATCH,), generator=_gen(2))


# --- inputs ---------------------------------------------------------------------------------------


def text(config, train: bool) -> dict:
    ids = _ids(vocab=config.vocab_size)
    kwargs = {"input_ids": ids, "attention_mask": _padding_mask()}
    if train:
        kwargs["labels"] = ids
    return kwargs


def seq2seq(config, train: bool) -> dict:
    kwargs = {
        "input_ids": _ids(vocab=config.vocab_size),
        "attention_mask": _padding_mask(),
        "decoder_input_ids": _ids(seq=6, vocab=config.vocab_size, seed=3),
    }
    if train:
        kwargs["labels"] = _ids(seq=6, vocab=config.vocab_size, seed=4)
    return kwargs


def image(config, train: bool) -> dict:
    kwargs = {"pixel_values": _pixels()}
    if train:
        kwargs["labels"] = _labels()
    return kwargs


def whisper_audio(config, train: bool) -> dict:
    frames = 2 * config.max_source_positions
    features = torch.randn(BATCH, config.num_mel_bins, frames, generator=_gen(5))
    kwargs = {"input_features": features, "decoder_input_ids": _ids(6, config.vocab_size, 3)}
    if train:
        kwargs["labels"] = _ids(6, config.vocab_size, 4)
    return kwargs


def raw_audio(config, train: bool) -> dict:
    return {"input_values": torch.randn(BATCH, 400, generator=_gen(6))}


def text_and_image(config, train: bool) -> dict:
    kwargs = {
        "input_ids": _ids(vocab=config.text_config.vocab_size),
        "attention_mask": _padding_mask(),
        "pixel_values": _pixels(),
    }
    if train:
        kwargs["return_loss"] = True
    return kwargs


# --- builders -------------------------------------------------------------------------------------

SPECIAL = {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
# Llama-style decoders: the common subset of their configs.
DECODER = {
    "vocab_size": VOCAB,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 64,
    "use_cache": False,
    **SPECIAL,
}
ENCODER = {
    "vocab_size": VOCAB,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "max_position_embeddings": 64,
    **SPECIAL,
}
# BART-style encoder-decoders (BART, Marian, Pegasus, Whisper).
BART = {
    "vocab_size": VOCAB,
    "d_model": 32,
    "encoder_layers": 2,
    "decoder_layers": 2,
    "encoder_attention_heads": 4,
    "decoder_attention_heads": 4,
    "encoder_ffn_dim": 64,
    "decoder_ffn_dim": 64,
    **SPECIAL,
}
VIT = {
    "image_size": IMAGE,
    "patch_size": 8,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_labels": NUM_LABELS,
    # Left None, transformers' loss sets it on the first call and Dynamo recompiles.
    "problem_type": "single_label_classification",
}


def hf(
    model_type: str,
    auto: str,
    inputs: Callable[[object, bool], dict],
    attn: str | None = "eager",
    experts: str | None = None,
    **config_kwargs,
) -> Callable[[bool], Built]:
    """A builder for a ``transformers`` model: ``AutoConfig.for_model`` + ``from_config``.

    ``attn`` is the ``attn_implementation`` (``None``: the model has no choice), ``experts`` the
    ``experts_implementation`` of mixture-of-experts models.
    """

    def build(train: bool) -> Built:
        import transformers

        config = transformers.AutoConfig.for_model(model_type, **config_kwargs)
        no_dropout(config)
        cls = getattr(transformers, auto)
        extra = {"attn_implementation": attn} if attn else {}
        if experts:
            extra["experts_implementation"] = experts
        # Auto classes have from_config; a model class itself has _from_config.
        make = getattr(cls, "from_config", None) or cls._from_config
        return make(config, **extra), inputs(config, train)

    return build


def clip(train: bool) -> Built:
    import transformers

    text_config = {k: ENCODER[k] for k in ("vocab_size", "hidden_size", "intermediate_size")}
    text_config.update(num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=16)
    vision_config = {k: VIT[k] for k in ("image_size", "patch_size", "hidden_size")}
    vision_config.update(intermediate_size=64, num_hidden_layers=2, num_attention_heads=4)
    config = transformers.CLIPConfig(
        text_config=text_config, vision_config=vision_config, projection_dim=16
    )
    no_dropout(config)
    model = transformers.CLIPModel(config)
    return model, text_and_image(config, train)


class Classifier(torch.nn.Module):
    """A ``timm`` model with a cross-entropy loss, returning ``{"logits", "loss"}`` like
    ``transformers`` image classifiers."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, pixel_values, labels=None):
        logits = self.model(pixel_values)
        out = {"logits": logits}
        if labels is not None:
            out["loss"] = torch.nn.functional.cross_entropy(logits, labels)
        return out


def timm_model(name: str, size: int = IMAGE, **kwargs) -> Callable[[bool], Built]:
    """A builder for a ``timm`` model with random weights and 10 classes."""

    def build(train: bool) -> Built:
        from tests.models import timm_compat

        timm = timm_compat.import_timm()
        model = timm.create_model(name, pretrained=False, num_classes=NUM_LABELS, **kwargs)
        inputs = {"pixel_values": _pixels(size)}
        if train:
            inputs["labels"] = _labels()
        return Classifier(model), inputs

    return build


def case(name: str, library: str, build, **kwargs) -> ModelCase:
    return ModelCase(name=name, library=library, build=build, **kwargs)


def T(name: str, build, **kwargs) -> ModelCase:
    return case(name, "transformers", build, **kwargs)


def TIMM(name: str, build, **kwargs) -> ModelCase:
    return case(name, "timm", build, **kwargs)


hf_lm = functools.partial(hf, auto="AutoModelForCausalLM", inputs=text)
hf_mlm = functools.partial(hf, auto="AutoModelForMaskedLM", inputs=text)
hf_s2s = functools.partial(hf, auto="AutoModelForSeq2SeqLM", inputs=seq2seq)
hf_img = functools.partial(hf, auto="AutoModelForImageClassification", inputs=image)

MODELS: list[ModelCase] = [
    # --- encoders ---
    T("bert", hf_mlm("bert", **ENCODER), train=True),
    T("roberta", hf_mlm("roberta", **{**ENCODER, "max_position_embeddings": 72}, attn="sdpa")),
    T(
        "distilbert",
        hf_mlm(
            "distilbert",
            vocab_size=VOCAB,
            dim=32,
            hidden_dim=64,
            n_layers=2,
            n_heads=4,
            max_position_embeddings=64,
            pad_token_id=0,
        ),
    ),
    T("albert", hf_mlm("albert", **ENCODER, embedding_size=16)),
    T("electra", hf_mlm("electra", **ENCODER, embedding_size=16)),
    T("deberta-v2", hf_mlm("deberta-v2", **ENCODER, attn=None)),
    # --- decoders ---
    T(
        "gpt2",
        hf_lm(
            "gpt2",
            vocab_size=VOCAB,
            n_embd=32,
            n_layer=2,
            n_head=4,
            n_positions=64,
            use_cache=False,
            **SPECIAL,
        ),
        train=True,
    ),
    T(
        "gpt_neo",
        hf_lm(
            "gpt_neo",
            vocab_size=VOCAB,
            hidden_size=32,
            num_layers=2,
            num_heads=4,
            attention_types=[[["global", "local"], 1]],
            window_size=4,
            max_position_embeddings=64,
            use_cache=False,
            **SPECIAL,
        ),
    ),
    T("llama", hf_lm("llama", **DECODER), train=True),
    T(
        "mistral",
        hf_lm("mistral", **DECODER, sliding_window=4, attn="sdpa"),
        train=True,
        train_slow=True,
    ),
    T("qwen2", hf_lm("qwen2", **DECODER), train=True),
    T("qwen3", hf_lm("qwen3", **DECODER, head_dim=8, attn="sdpa")),
    T("gemma", hf_lm("gemma", **DECODER, head_dim=8)),
    T("gemma2", hf_lm("gemma2", **DECODER, head_dim=8, sliding_window=4), train=True),
    T("gemma3_text", hf_lm("gemma3_text", **DECODER, head_dim=8, sliding_window=4)),
    T("phi", hf_lm("phi", **DECODER), train=True),
    T("phi3", hf_lm("phi3", **DECODER, attn="sdpa")),
    T(
        "opt",
        hf_lm(
            "opt",
            vocab_size=VOCAB,
            hidden_size=32,
            ffn_dim=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            word_embed_proj_dim=32,
            max_position_embeddings=64,
            use_cache=False,
            **SPECIAL,
        ),
    ),
    T(
        "falcon",
        hf_lm(
            "falcon",
            vocab_size=VOCAB,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            use_cache=False,
            **SPECIAL,
        ),
    ),
    T("stablelm", hf_lm("stablelm", **DECODER)),
    T("gpt_neox", hf_lm("gpt_neox", **DECODER)),
    T("olmo2", hf_lm("olmo2", **DECODER)),
    T("granite", hf_lm("granite", **DECODER)),
    T("starcoder2", hf_lm("starcoder2", **DECODER, attn="sdpa")),
    # --- mixture of experts ---
    # "batched_mm" gathers each token's expert weights: static shapes, one graph. The default
    # "grouped_mm" sorts tokens by expert and calls a transformers custom op
    # (transformers::grouped_mm_fallback), lowered to a ragged matmul;
    # tests/lowering/test_grouped.py runs every MoE model through it.
    T(
        "mixtral",
        hf_lm(
            "mixtral",
            **DECODER,
            num_local_experts=4,
            num_experts_per_tok=2,
            experts="batched_mm",
        ),
        train=True,
    ),
    T(
        "qwen2_moe",
        hf_lm(
            "qwen2_moe",
            **DECODER,
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            shared_expert_intermediate_size=32,
            experts="batched_mm",
        ),
    ),
    T(
        "qwen3_moe",
        hf_lm(
            "qwen3_moe", **DECODER, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32
        ),
    ),
    # --- encoder-decoders ---
    T(
        "t5",
        hf_s2s(
            "t5",
            vocab_size=VOCAB,
            d_model=32,
            d_kv=8,
            d_ff=64,
            num_layers=2,
            num_heads=4,
            decoder_start_token_id=0,
            **SPECIAL,
        ),
        train=True,
    ),
    T(
        "bart",
        hf_s2s("bart", **BART, max_position_embeddings=64, decoder_start_token_id=2),
    ),
    T(
        "marian",
        hf_s2s("marian", **BART, max_position_embeddings=64, decoder_start_token_id=0),
    ),
    T(
        "pegasus",
        hf_s2s("pegasus", **BART, max_position_embeddings=64, decoder_start_token_id=0),
        slow=True,  # BART's architecture again (Marian runs by default)
    ),
    # --- vision ---
    T("vit", hf_img("vit", **VIT), train=True, train_slow=True),
    T("deit", hf("deit", "DeiTForImageClassification", image, **VIT)),
    T(
        "resnet",
        hf_img(
            "resnet",
            embedding_size=16,
            hidden_sizes=[16, 32],
            depths=[1, 1],
            layer_type="basic",
            num_labels=NUM_LABELS,
            problem_type="single_label_classification",
            attn=None,
        ),
        train=True,
        train_slow=True,
    ),
    T(
        "convnext",
        hf_img(
            "convnext",
            num_stages=2,
            hidden_sizes=[16, 32],
            depths=[1, 1],
            num_labels=NUM_LABELS,
            attn=None,
        ),
    ),
    T(
        "swin",
        hf_img(
            "swin",
            image_size=IMAGE,
            patch_size=4,
            embed_dim=16,
            depths=[1, 1],
            num_heads=[2, 2],
            window_size=4,
            num_labels=NUM_LABELS,
        ),
    ),
    # --- audio ---
    T(
        "whisper",
        hf(
            "whisper",
            "AutoModelForSpeechSeq2Seq",
            whisper_audio,
            attn="sdpa",
            **BART,
            num_mel_bins=16,
            max_source_positions=16,
            max_target_positions=32,
            decoder_start_token_id=1,
        ),
    ),
    T(
        "wav2vec2",
        hf(
            "wav2vec2",
            "AutoModel",
            raw_audio,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=64,
            conv_dim=(16, 16),
            conv_stride=(5, 2),
            conv_kernel=(10, 3),
            num_conv_pos_embeddings=8,
            num_conv_pos_embedding_groups=4,
        ),
        outputs=("last_hidden_state",),
    ),
    # --- multimodal ---
    T("clip", clip, outputs=("logits_per_image", "text_embeds", "image_embeds")),
    # --- timm ---
    TIMM("timm_resnet", timm_model("resnet18", size=64, layers=[1, 1, 1, 1]), train=True),
    # timm's own reduced EfficientNet (same blocks: depthwise-separable, squeeze-excite, SiLU)
    # by default; the full-depth efficientnet_b0 compiles for ~20 s.
    TIMM("timm_test_efficientnet", timm_model("test_efficientnet")),
    TIMM("timm_efficientnet_b0", timm_model("efficientnet_b0"), slow=True),
    TIMM("timm_mobilenetv3", timm_model("mobilenetv3_small_050")),
    TIMM("timm_convnext_atto", timm_model("convnext_atto", depths=(1, 1, 1, 1))),
    TIMM(
        "timm_vit_tiny",
        timm_model("vit_tiny_patch16_224", img_size=IMAGE, patch_size=8, depth=2),
        train=True,
    ),
    # timm's ViT again, with DeiT's config (timm_vit_tiny runs by default).
    TIMM(
        "timm_deit_tiny",
        timm_model("deit_tiny_patch16_224", img_size=IMAGE, depth=2),
        slow=True,
    ),
]


def params(cases: list[ModelCase], training: bool = False) -> list:
    """``pytest.param`` s for ``cases``, marked slow where the table says so."""
    slow = lambda c: c.slow or (training and c.train_slow)
    return [
        pytest.param(c, id=c.name, marks=[pytest.mark.slow] if slow(c) else [])
        for c in cases
        if c.train or not training
    ]


def _requires(library: str) -> None:
    if library == "timm":
        from tests.models import timm_compat

        if timm_compat.import_timm(skip=True) is None:
            pytest.skip("timm is not installed")
    else:
        pytest.importorskip(library)


@pytest.mark.parametrize("case", params(MODELS))
def test_forward(case: ModelCase):
    _requires(case.library)
    result, actual, expected = run_forward(case)
    compare(actual, expected, case, "forward")
    assert (result.dynamo_graphs, result.graph_breaks) == (1, 0)
    assert result.fallback_ops == set(case.fallback), (
        f"{case.name}: ops falling back to eager changed: {sorted(result.fallback_ops)} "
        f"(table says {sorted(case.fallback)}); update the table"
    )


@pytest.mark.parametrize("case", params(MODELS, training=True))
def test_training(case: ModelCase):
    _requires(case.library)
    result = run_training(case)
    # The second step reuses the first step's graphs.
    assert result.recompiles == 0, f"{case.name}: recompiled after the first training step"
    assert result.fallback_ops == set(case.fallback), (
        f"{case.name}: ops falling back to eager in training: {sorted(result.fallback_ops)} "
        f"(table says {sorted(case.fallback)})"
    )

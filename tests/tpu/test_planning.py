"""``tpu_inductor.largest_batch``: the largest batch whose training step fits, found by bisection
over deviceless TPU compiles, checked against compiles at the sizes around it."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from tpu_inductor.tpu import targets
from tpu_inductor.training.planning import _Search, causal_lm_loss, largest_batch, token_ids

pytestmark = pytest.mark.tpu_compile
transformers = pytest.importorskip("transformers")

CONFIG = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=256,
    max_position_embeddings=128,
)


def _model():
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**CONFIG))


def _search(path: str) -> _Search:
    """The planner's probe for the tiny Llama on one v5e chip, batch searched at 128 tokens."""
    return _Search(
        model_fn=_model,
        options={"target": "v5e"},
        loss_fn=causal_lm_loss,
        inputs_fn=token_ids,
        optimizer=torch.optim.AdamW,
        dtype=None,
        over="batch",
        batch=1,
        seq_len=128,
        path=path,
    )


@pytest.fixture
def small_v5e(monkeypatch):
    """One v5e chip shrunk to 10 MiB usable. Targets are cached by name, so one an earlier test
    built would still hold the full-size chip: the cache is emptied before and after."""
    monkeypatch.setitem(
        targets.CHIPS,
        "v5e",
        dataclasses.replace(targets.CHIPS["v5e"], usable_hbm_bytes=10 * 2**20),
    )
    targets._target.cache_clear()
    yield
    targets._target.cache_clear()


def test_largest_batch_is_the_boundary_of_what_fits(small_v5e):
    # one v5e chip shrunk to 10 MiB usable: the tiny step's peak grows ~1.5 MB per sequence of
    # 128 tokens (measured: 3.7 MB at batch 1, 14.4 MB at batch 8), so the boundary is a few
    plan = largest_batch(_model, "v5e", seq_len=128, checkpointing=("none",), print_table=False)
    (row,) = plan.rows
    assert row.size is not None and 1 < row.size < 16
    by_size = {p.size: p for p in row.probes}
    assert by_size[row.size].fits and row.peak_bytes <= 10 * 2**20
    assert row.tokens == row.size * 128 and row.tokens_per_second > 0
    # the next size was probed (or is implied by a larger probe) and does not fit
    above = [p for p in row.probes if p.size > row.size]
    assert above and not any(p.fits for p in above)
    # a fresh compile one above the answer agrees: it does not fit
    search = _search("one-program")
    assert not search.probe("none", row.size + 1).fits
    assert "largest batch" in str(plan) and f"{row.size:>8}" in str(plan)


def test_checkpointing_lowers_the_split_step_peak():
    # measured on this tiny Llama, batch 8 x 128: step peak none 21.7 MB, full 15.0 MB on the
    # three-program path; on the one-program path all three choices gave 14.4 MB
    search = _search("split")
    none, full = search.probe("none", 8), search.probe("full", 8)
    assert none.fits and full.fits
    assert full.peak_bytes < 0.85 * none.peak_bytes


def test_bad_choices_are_named():
    with pytest.raises(ValueError, match="unknown checkpointing"):
        largest_batch(_model, "v5e", checkpointing=("some",), print_table=False)
    with pytest.raises(ValueError, match="path"):
        largest_batch(_model, "v5e", path="two", print_table=False)


def test_the_split_path_is_the_one_searched(small_v5e, caplog, monkeypatch):
    """``path="split"`` reaches the search: through the public function, every probe compiles
    three programs (forward, backward, optimizer), and each probe says one progress line."""
    import logging

    from tpu_inductor.tpu import programs

    caplog.set_level(logging.WARNING, logger="tpu_inductor.progress")
    per_probe = []
    probe = _Search.probe

    def counted(self, choice, size):
        result = probe(self, choice, size)  # each probe starts from tpu_inductor.reset()
        per_probe.append(sorted(p.role for p in programs.PROGRAMS))
        return result

    monkeypatch.setattr(_Search, "probe", counted)
    plan = largest_batch(
        _model, "v5e", seq_len=128, checkpointing=("none",), path="split", print_table=False
    )
    assert per_probe and len(per_probe) == len(plan.rows[0].probes)
    assert all(roles == ["backward", "forward", "optimizer"] for roles in per_probe), per_probe
    said = [r.getMessage() for r in caplog.records if "tpu-inductor plan:" in r.getMessage()]
    assert len(said) == len(plan.rows[0].probes), said
    assert all("none checkpointing, batch" in m and "per chip of" in m for m in said), said

"""Activation checkpointing compiled whole: non-reentrant ``torch.utils.checkpoint``, with
dropout inside (``run_and_save_rng_state`` / ``run_with_rng_state``, lower.py), selective
checkpointing policies and transformers' ``gradient_checkpointing_enable()``: one forward and
one backward graph, no fallback, eager's gradients, the recomputation inside the backward, and
fewer bytes saved between them (``report().graphs[i].saved_bytes``)."""

from __future__ import annotations

import copy
import functools

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import (
    CheckpointPolicy,
    checkpoint,
    create_selective_checkpoint_contexts,
)

import tpu_inductor
from tests.helpers import assert_same, tiny_llama

aten = torch.ops.aten


def _save_matmuls(ctx, op, *args, **kwargs):
    if op in (aten.mm.default, aten.addmm.default):
        return CheckpointPolicy.MUST_SAVE
    return CheckpointPolicy.PREFER_RECOMPUTE


class _Block(nn.Module):
    def __init__(self, p: float):
        super().__init__()
        self.l1, self.l2, self.drop = nn.Linear(16, 64), nn.Linear(64, 16), nn.Dropout(p)

    def forward(self, x):
        return x + self.l2(self.drop(F.gelu(self.l1(x))))


class _Net(nn.Module):
    """Three residual blocks, each checkpointed per ``mode``: None, "full" or "selective"."""

    def __init__(self, p: float = 0.0):
        super().__init__()
        torch.manual_seed(0)
        self.blocks = nn.ModuleList(_Block(p) for _ in range(3))
        self.mode = None

    def forward(self, x):
        for b in self.blocks:
            if self.mode == "full":
                x = checkpoint(b, x, use_reentrant=False)
            elif self.mode == "selective":
                context = functools.partial(create_selective_checkpoint_contexts, _save_matmuls)
                x = checkpoint(b, x, use_reentrant=False, context_fn=context)
            else:
                x = b(x)
        return x.square().mean()


def _run(model, mode, compiled: bool, seed: int = 2):
    """(loss, grads, graphs as (name, ops, saved bytes)) of one forward and backward."""
    torch._dynamo.reset()
    tpu_inductor.reset()
    model = copy.deepcopy(model)
    model.mode = mode
    fn = torch.compile(model, backend="tpu", options={"fallback": "error"}) if compiled else model
    torch.manual_seed(seed)
    loss = fn(torch.randn(8, 16))
    loss.backward()
    graphs = [(g.name, g.nodes, g.saved_bytes) for g in tpu_inductor.report(False).graphs]
    return loss.detach(), [p.grad for p in model.parameters()], graphs


@pytest.mark.parametrize("mode", ["full", "selective"])
def test_checkpoint_matches_eager_and_saves_less(mode):
    model = _Net()
    e_loss, e_grads, _ = _run(model, mode, compiled=False)
    loss, grads, graphs = _run(model, mode, compiled=True)
    _, _, plain = _run(model, None, compiled=True)
    assert_same(loss, e_loss)
    assert_same(grads, e_grads, what="grads")
    (fw, fw_ops, saved), (bw, bw_ops, _) = graphs
    assert fw.endswith("forward") and bw.endswith("backward"), graphs
    (_, _, plain_saved), (_, plain_bw_ops, _) = plain
    # the recomputation is in the backward program; the forward keeps less for it
    assert bw_ops > plain_bw_ops, (graphs, plain)
    # full: the inputs of blocks 2 and 3 (8 x 16 float32; block 1's is the graph input, saved
    # as it is); selective: every matmul's output (8 x 64 and 8 x 16 per block), from which
    # the rest is recomputed
    if mode == "full":
        assert saved == 2 * 8 * 16 * 4, graphs
    else:
        assert saved == 3 * (8 * 64 + 8 * 16) * 4, graphs
    assert saved < plain_saved, (graphs, plain)


@pytest.mark.parametrize("mode", ["full", "selective"])
def test_dropout_under_checkpoint_replays_the_forward_mask(mode):
    """The backward's recomputation draws the forward's dropout mask: a checkpointed compiled
    run gives the loss and gradients of the same run without checkpointing, under the same
    seed (their random streams are the same by construction: lower.py), and another seed
    gives another loss."""
    model = _Net(p=0.25)
    loss, grads, graphs = _run(model, mode, compiled=True)
    ref_loss, ref_grads, _ = _run(model, None, compiled=True)
    assert [g[0].split("-")[1] for g in graphs] == ["forward", "backward"], graphs
    assert_same(loss, ref_loss)
    assert_same(grads, ref_grads, what="grads")
    other, _, _ = _run(model, mode, compiled=True, seed=3)
    assert not torch.equal(other, loss)
    no_dropout, _, _ = _run(_Net(p=0.0), mode, compiled=False)
    assert not torch.allclose(loss, no_dropout)  # dropout was applied


def test_recomputed_mask_is_the_forward_mask():
    """Directly: y = checkpoint(dropout)(x) * 1, so dy/dx is the mask over (1 - p), which the
    backward recomputes; it must equal y / x elementwise, the mask the forward used."""

    def f(x):
        return checkpoint(lambda t: F.dropout(t, 0.5, training=True), x, use_reentrant=False)

    x = (torch.rand(64, 64) + 0.5).requires_grad_()
    torch.manual_seed(7)
    y = torch.compile(f, backend="tpu", options={"fallback": "error"})(x)
    y.sum().backward()
    assert 0.3 < (y == 0).float().mean() < 0.7  # half is dropped
    torch.testing.assert_close(x.grad, (y / x).detach(), atol=0, rtol=1e-6)


def test_checkpoint_trains_like_eager_under_keep_on_device():
    """Three AdamW steps of a checkpointed model with device-owned state: eager's params."""
    ref, dev = _Net(), _Net()
    ref.mode = dev.mode = "full"
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    opt = torch.optim.AdamW(dev.parameters(), lr=torch.tensor(1e-2))
    tpu_inductor.keep_on_device(dev, opt)
    loss_fn = torch.compile(dev, backend="tpu", options={"fallback": "error"})
    step = torch.compile(opt.step, backend="tpu")
    for i in range(3):
        x = torch.randn(8, 16, generator=torch.Generator().manual_seed(i))
        ref(x).backward()
        ref_opt.step()
        ref_opt.zero_grad()
        loss_fn(x).backward()
        step()
        opt.zero_grad()
    assert_same([p.detach() for p in dev.parameters()], [p.detach() for p in ref.parameters()])


def _llama_grads(model, checkpointed: bool, compiled: bool, seed: int = 3):
    torch._dynamo.reset()
    tpu_inductor.reset()
    model = copy.deepcopy(model)
    model.train()
    model.config.use_cache = False  # else transformers logs a warning_once: a graph break
    if checkpointed:
        with pytest.warns(FutureWarning):  # deprecated alias of activation_checkpointing_enable
            model.gradient_checkpointing_enable()
    fn = torch.compile(model, backend="tpu", options={"fallback": "error"}) if compiled else model
    ids = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(0))
    torch.manual_seed(seed)
    loss = fn(ids, labels=ids).loss
    loss.backward()
    graphs = [(g.name, g.nodes, g.saved_bytes) for g in tpu_inductor.report(False).graphs]
    return loss.detach(), [p.grad for p in model.parameters()], graphs


@pytest.fixture
def side_effects_in_checkpoint():
    """transformers' attention wrapper (the ``kernels`` package's ``new_forward``) sets a
    context variable inside the checkpointed layer; Dynamo refuses that side effect under
    checkpointing unless told it need not replay it in the backward (the README says so)."""
    with torch._dynamo.config.patch(skip_fwd_side_effects_in_bwd_under_checkpoint=True):
        yield


def test_transformers_gradient_checkpointing_matches_eager(side_effects_in_checkpoint):
    model = tiny_llama()
    e_loss, e_grads, _ = _llama_grads(model, True, compiled=False)
    loss, grads, graphs = _llama_grads(model, True, compiled=True)
    _, _, plain = _llama_grads(model, False, compiled=True)
    assert_same(loss, e_loss)
    assert_same(grads, e_grads, what="grads")
    assert [g[0].split("-")[1] for g in graphs] == ["forward", "backward"], graphs
    assert graphs[1][1] > plain[1][1]  # the backward recomputes the layers
    assert graphs[0][2] < plain[0][2] / 3, (graphs, plain)  # saved bytes


@pytest.mark.slow  # ~20 s; the replayed mask is tested on small blocks above
def test_transformers_gradient_checkpointing_with_attention_dropout(side_effects_in_checkpoint):
    model = tiny_llama("eager", attention_dropout=0.2)
    loss, grads, graphs = _llama_grads(model, True, compiled=True)
    ref_loss, ref_grads, _ = _llama_grads(model, False, compiled=True)
    assert len(graphs) == 2, graphs
    assert_same(loss, ref_loss)
    assert_same(grads, ref_grads, what="grads")

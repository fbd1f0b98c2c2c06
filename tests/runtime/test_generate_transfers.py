"""``generate()`` of a ``keep_on_device`` model moves only the token ids per decode step.

A tiny transformers Llama generates greedily with a static cache, its ``forward`` compiled, at
batch 1 and 4. The logits stay on the device: ``outputs.logits[:, -1]`` (a view), the float
copy and the argmax run there (``device_eager``), so only the chosen ids come back; the cache's
position counters are stepped on the host too (``host_replay``), so they are not written back.
Into the device, per step, transformers sends the last ids, the position ids and a 4-D mask
(batch x cache length bools) it builds on the host; under
``tpu_inductor.transformers.inputs_in_forward`` the compiled forward builds the mask and the
positions itself, from the cache's counter already on the device, and only the ids go in.
Each step runs 3 programs: the decode graph, the float copy and the argmax. Tokens must equal
eager's.
"""

from __future__ import annotations

import copy
import functools

import pytest
import torch

import tpu_inductor
from tests.helpers import tiny_llama
from tpu_inductor.core.transfers import D2H, H2D, TOTAL
from tpu_inductor.runtime import device_eager

PROMPT = 6
MARKS: list = []


def _models(in_forward: bool = True):
    ref = tiny_llama().eval()
    ref.generation_config.pad_token_id = 0
    ref.generation_config.eos_token_id = None  # every run generates all its tokens
    dev = copy.deepcopy(ref)
    tpu_inductor.keep_on_device(dev)
    compiled = torch.compile(dev.forward, backend="tpu")

    # marks where each decode step starts (see _per_step); generate reads the forward's
    # signature (which inputs it accepts), so the wrapper keeps it, as torch.compile does
    @functools.wraps(compiled)
    def forward(*args, **kwargs):
        MARKS.append(TOTAL.copy())
        return compiled(*args, **kwargs)

    dev.forward = forward
    if in_forward:
        tpu_inductor.transformers.inputs_in_forward(dev)
    return ref, dev


def _generate(model, ids, new: int, **kwargs):
    return model.generate(
        input_ids=ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=new,
        cache_implementation="static",
        **kwargs,
    )


def _per_step(model, ids, new: int) -> tuple[torch.Tensor, list]:
    """Tokens, and the crossings of each decode step (from one forward call to the next, the
    last one to the end of generate)."""
    MARKS.clear()
    out = _generate(model, ids, new, do_sample=False)
    marks = [*MARKS, TOTAL.copy()]
    return out, [b - a for a, b in zip(marks[1:-1], marks[2:], strict=True)]


@pytest.mark.parametrize("batch", [1, 4])
def test_greedy_generate_moves_the_token_ids_per_step(batch):
    tpu_inductor.reset()
    ref, dev = _models(in_forward=True)
    ids = torch.randint(3, 128, (batch, PROMPT), generator=torch.Generator().manual_seed(batch))
    new = 8
    want = _generate(ref, ids, new, do_sample=False)
    _generate(dev, ids, new, do_sample=False), _generate(dev, ids, new // 2, do_sample=False)
    before = device_eager.STATS.copy()
    got, steps = _per_step(dev, ids, new)
    assert torch.equal(got, want)
    ids_bytes = batch * 8
    for d in steps:
        # d2h: the chosen ids (synced for the host's torch.cat); nothing written back
        assert d.bytes(D2H) == d.bytes(D2H, "sync") == ids_bytes, d.by_reason
        # h2d: the last ids, in one transfer; the mask and positions are the graph's own
        assert d.bytes(H2D) == d.bytes(H2D, "input") == ids_bytes, d.by_reason
        assert d.count(H2D) == 1, d.by_reason
    # the slice, float copy and argmax ran on the device: 2 eager programs per step, none built
    ran = device_eager.STATS.device - before.device
    assert ran == 2 * new and device_eager.STATS.programs == before.programs, ran

    # the same, measured as benchmarks.transfers does: generating new vs new // 2 tokens
    moved = []
    for n in (new, new // 2):
        start = TOTAL.copy()
        _generate(dev, ids, n, do_sample=False)
        moved.append(TOTAL.copy() - start)
    assert (moved[0].bytes(D2H) - moved[1].bytes(D2H)) / (new - new // 2) == ids_bytes


def test_transformers_inputs_cross_without_inputs_in_forward():
    """What ``inputs_in_forward`` saves: without it each decode step also sends the position
    ids (batch x 8 bytes) and the 4-D mask (batch x cache length bools), in 3 transfers."""
    tpu_inductor.reset()
    batch = 2
    ref, dev = _models(in_forward=False)
    ids = torch.randint(3, 128, (batch, PROMPT), generator=torch.Generator().manual_seed(3))
    new = 4
    want = _generate(ref, ids, new, do_sample=False)
    _generate(dev, ids, new, do_sample=False)
    got, steps = _per_step(dev, ids, new)
    assert torch.equal(got, want)
    # the static cache holds prompt + new - 1 positions (the last token's are never written)
    mask_bytes = batch * (PROMPT + new - 1)
    for d in steps:
        assert d.bytes(H2D) == d.bytes(H2D, "input") == 2 * batch * 8 + mask_bytes, d.by_reason
        assert d.count(H2D) == 3 and d.bytes(D2H) == batch * 8, d.by_reason


def test_padded_prompts_keep_transformers_inputs():
    """A left-padded batch: the positions and mask depend on the padding, which the forward
    does not see; ``inputs_in_forward`` leaves them to transformers, and tokens match eager."""
    tpu_inductor.reset()
    ref, dev = _models(in_forward=True)
    ids = torch.randint(3, 128, (2, PROMPT), generator=torch.Generator().manual_seed(5))
    mask = torch.ones_like(ids)
    mask[0, :2] = 0
    ids[0, :2] = 0
    kwargs = dict(attention_mask=mask, max_new_tokens=4, do_sample=False)
    kwargs["cache_implementation"] = "static"
    want = ref.generate(input_ids=ids, **kwargs)
    assert torch.equal(dev.generate(input_ids=ids, **kwargs), want)


def test_sampling_matches_eager():
    tpu_inductor.reset()
    ref, dev = _models()
    ids = torch.randint(3, 128, (2, PROMPT), generator=torch.Generator().manual_seed(7))
    runs = []
    for model in (ref, dev, dev):
        torch.manual_seed(11)
        runs.append(_generate(model, ids, 6, do_sample=True, top_k=20, temperature=0.9))
    assert torch.equal(runs[1], runs[0]) and torch.equal(runs[2], runs[0])


def test_view_of_a_lazy_result_is_read_on_the_device():
    """The rule underneath: a view of a device value moves nothing; an op reading it runs on
    the device over the base's array; reading the view syncs what it reads."""
    tpu_inductor.reset()
    lin = torch.nn.Linear(8, 16)
    tpu_inductor.keep_on_device(lin)
    f = torch.compile(lambda x: lin(x).reshape(2, 3, 16), backend="tpu")
    x = torch.randn(6, 8)
    with torch.no_grad():
        want = lin.weight.host().clone(), lin.bias.host().clone()
        out = f(x)
        start = TOTAL.copy()
        last = out[:, -1].to(copy=True, dtype=torch.float32)  # a contiguous view
        tok = torch.argmax(last, dim=-1)
        mid = out[:, 1:, 3:9].sum(-1)  # a strided one
        moved = TOTAL.copy() - start
        assert moved.bytes(H2D) == moved.bytes(D2H) == 0, moved.by_reason
        ref = (x @ want[0].T + want[1]).reshape(2, 3, 16)
        assert torch.equal(tok, ref[:, -1].argmax(-1))
        torch.testing.assert_close(mid, ref[:, 1:, 3:9].sum(-1))
        torch.testing.assert_close(out[:, 2], ref[:, 2])  # a plain read of a view

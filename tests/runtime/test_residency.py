"""What stays on the device across calls (residency.py) and what crosses (transfers.py), under
the autograd patterns that stress it: long training loops, graphs freed without a backward,
retain_graph, activation checkpointing, in-place changes to saved tensors, saved-tensor
hooks, values handed from one compiled module to another, and static-cache decoding. Each
test compares with CPU eager."""

from __future__ import annotations

import copy
import functools
import gc

import jax
import pytest
import torch
import torch.nn as nn
import torch.utils.checkpoint

import tpu_inductor
from tests.helpers import assert_same, tiny_llama
from tpu_inductor.core.transfers import D2H, H2D, TOTAL
from tpu_inductor.runtime import residency
from tpu_inductor.runtime.cache import STATS as cache_stats

INPLACE = "one of the variables needed for gradient computation has been modified by an inplace"


def _mlp(seed: int = 0) -> nn.Module:
    """A small MLP whose LayerNorm makes the forward save activations for the backward."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 16), nn.LayerNorm(16), nn.GELU(), nn.Linear(16, 4))


def _device_state() -> tuple[int, int, int]:
    """Live JAX arrays, device-copy table entries and the bytes the table keeps alive."""
    gc.collect()
    return len(jax.live_arrays()), len(residency.VALUES), residency.VALUES.device_bytes()


def _assert_no_growth(early, late, what: str) -> None:
    # A handful of arrays may come and go (cached zeros, an executable's constants); growth
    # per step would show as hundreds here.
    assert late[0] <= early[0] + 8, f"{what}: live JAX arrays {early[0]} -> {late[0]}"
    assert late[1] <= early[1] + 4, f"{what}: device-copy entries {early[1]} -> {late[1]}"
    assert late[2] <= early[2] + 4096, f"{what}: device-copy bytes {early[2]} -> {late[2]}"


def _graph_transfers() -> dict:
    """Each lowered graph's cumulative crossings, by graph name."""
    return {g.name: g.transfers for g in tpu_inductor.report(print_table=False).graphs}


def _graph_deltas(before: dict, after: dict) -> dict:
    empty = type(TOTAL)()
    return {name: t - before.get(name, empty) for name, t in after.items()}


# --- no growth over many steps --------------------------------------------------------------


@pytest.fixture
def one_torch_thread():
    """Eager torch on one thread: the many tiny eager reference steps below are then ~1 ms
    instead of tens of ms with OpenMP threads spinning against XLA's on a busy 2-core host."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_a_thousand_training_steps_keep_device_state_bounded(one_torch_thread):
    model = _mlp()
    ref = copy.deepcopy(model)
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=1e-2)
    cm, cstep = torch.compile(model, backend="tpu"), torch.compile(opt.step, backend="tpu")
    gen = torch.Generator().manual_seed(1)
    for i in range(1000):
        x = torch.randn(4, 8, generator=gen)  # a new per-call input (saved for the backward)
        opt.zero_grad(set_to_none=True)
        loss = cm(x).pow(2).mean()
        loss.backward()  # the step's autograd graph (and its saved activations) goes away
        cstep()
        ref_opt.zero_grad(set_to_none=True)
        ref_loss = ref(x).pow(2).mean()
        ref_loss.backward()
        ref_opt.step()
        if i % 100 == 0:
            assert_same(loss.detach(), ref_loss.detach(), what=f"step {i} loss")
        del loss, ref_loss, x
        if i == 9:
            early = _device_state()
    late = _device_state()
    _assert_no_growth(early, late, "1000 training steps")
    for (name, p), q in zip(model.named_parameters(), ref.parameters(), strict=True):
        assert_same(p.detach(), q.detach(), atol=1e-4, rtol=1e-3, what=f"param {name}")


def test_forwards_whose_graph_is_freed_without_backward_keep_device_state_bounded(
    one_torch_thread,
):
    model = _mlp()
    cm = torch.compile(model, backend="tpu")
    gen = torch.Generator().manual_seed(1)
    for i in range(1000):
        x = torch.randn(4, 8, generator=gen)
        out = cm(x)  # a training forward: activations saved on the device
        assert out.requires_grad and out.grad_fn is not None
        if i % 100 == 0:
            assert_same(out.detach(), model(x).detach(), what=f"step {i} output")
        del out, x  # the autograd graph is freed; no backward ever runs
        if i == 9:
            early = _device_state()
    late = _device_state()
    _assert_no_growth(early, late, "1000 forwards without backward")
    assert all(p.grad is None for p in model.parameters())


def test_a_deleted_module_leaves_no_device_copies_behind():
    def run_once():
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8)).eval()
        x = torch.randn(4, 8)
        with torch.no_grad():
            assert_same(torch.compile(model, backend="tpu")(x), model(x))
        assert len(residency.VALUES) > 0  # parameters and buffers are resident

    run_once()
    torch._dynamo.reset()  # Dynamo's compiled frame held the module
    gc.collect()
    # Buffers don't require grad, so their zero-copy import held them alive (see record()).
    assert len(residency.VALUES) == 0, list(residency.VALUES._entries.values())


# --- retain_graph ---------------------------------------------------------------------------


def test_retain_graph_then_second_backward_accumulates_like_eager():
    torch.manual_seed(0)
    w = torch.randn(6, 5, requires_grad=True)
    x = torch.randn(3, 6, requires_grad=True)
    fn = lambda x, w: (x @ w).tanh().pow(2).sum()  # noqa: E731
    cfn = torch.compile(fn, backend="tpu", fullgraph=True)
    wc, xc = w.detach().clone().requires_grad_(), x.detach().clone().requires_grad_()
    loss, ref = cfn(xc, wc), fn(x, w)
    assert_same(loss, ref)
    loss.backward(retain_graph=True)
    ref.backward(retain_graph=True)
    assert_same(wc.grad, w.grad, what="w.grad after one backward")
    loss.backward()
    ref.backward()
    assert_same(wc.grad, w.grad, what="w.grad after two backwards")
    assert_same(xc.grad, x.grad, what="x.grad after two backwards")


def test_layernorm_plain_step_then_retained_double_backward_like_eager():
    model = _mlp()
    ref = copy.deepcopy(model)
    cm = torch.compile(model, backend="tpu")
    x = torch.randn(5, 8, generator=torch.Generator().manual_seed(3))
    # step 1: a plain backward
    cm(x).pow(2).sum().backward()
    ref(x).pow(2).sum().backward()
    # step 2: backward(retain_graph=True) and a second backward through the same graph
    loss, ref_loss = cm(x).pow(2).sum(), ref(x).pow(2).sum()
    loss.backward(retain_graph=True)
    ref_loss.backward(retain_graph=True)
    loss.backward()
    ref_loss.backward()
    for (name, p), q in zip(model.named_parameters(), ref.parameters(), strict=True):
        assert_same(p.grad, q.grad, what=f"grad of {name} (three backwards accumulated)")


# --- activation checkpointing ---------------------------------------------------------------


class _Checkpointed(nn.Module):
    def __init__(self, use_reentrant: bool):
        super().__init__()
        self.use_reentrant = use_reentrant
        self.block = nn.Sequential(nn.Linear(8, 16), nn.LayerNorm(16), nn.GELU())
        self.head = nn.Linear(16, 3)

    def forward(self, x):
        h = torch.utils.checkpoint.checkpoint(self.block, x, use_reentrant=self.use_reentrant)
        return self.head(h)


@pytest.mark.parametrize("use_reentrant", [False, True])
def test_activation_checkpointing_inside_the_compiled_module(use_reentrant):
    # Dynamo traces both flavours into one graph (fullgraph=True holds) as the
    # tag_activation_checkpoint higher-order op; the partitioner recomputes the block.
    torch.manual_seed(0)
    model = _Checkpointed(use_reentrant)
    ref = copy.deepcopy(model)
    cm = torch.compile(model, backend="tpu", fullgraph=True)
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(4))
    xc, xe = x.clone().requires_grad_(), x.clone().requires_grad_()
    for step in range(2):
        out, expected = cm(xc), ref(xe)
        assert_same(out, expected, what=f"step {step} output")
        out.pow(2).sum().backward()
        expected.pow(2).sum().backward()
        assert_same(xc.grad, xe.grad, what=f"step {step} x.grad")
        for (name, p), q in zip(model.named_parameters(), ref.parameters(), strict=True):
            assert_same(p.grad, q.grad, what=f"step {step} grad of {name}")


# --- saved tensors changed in place before the backward -------------------------------------


def test_saved_input_mutated_before_backward_raises_like_eager():
    def run(fn):
        torch.manual_seed(0)
        x, w = torch.randn(5), torch.randn(5, requires_grad=True)
        loss = fn(x, w)  # x is saved: d loss / d w = x
        x.add_(1)
        loss.backward()

    fn = lambda x, w: (x * w).sin().sum()  # noqa: E731
    with pytest.raises(RuntimeError, match=INPLACE):
        run(fn)
    with pytest.raises(RuntimeError, match=INPLACE):
        run(torch.compile(fn, backend="tpu", fullgraph=True))


def test_saved_input_of_a_module_mutated_before_backward_raises_like_eager():
    model = _mlp()
    for m in (model, torch.compile(model, backend="tpu")):
        x = torch.randn(4, 8)
        out = m(x)  # the first Linear saves x for its weight's gradient
        with torch.no_grad():
            x.mul_(2)
        with pytest.raises(RuntimeError, match=INPLACE):
            out.sum().backward()


# exp's backward needs exp's output, so AOTAutograd saves detach(exp), which shares its version
# counter with the user's output: an in-place change of the output makes the backward raise.
# The runtime hands that saved alias back as the output's detach() (lower.py: ("detach", j)).
@pytest.mark.parametrize("under_no_grad", [False, True])
def test_saved_output_mutated_before_backward_raises_like_eager(under_no_grad):
    def run(fn):
        x = torch.randn(5, requires_grad=True)
        y = fn(x)  # exp's backward needs exp's output: y is saved
        if under_no_grad:
            with torch.no_grad():
                y.add_(1)
        else:
            y.add_(1)
        y.sum().backward()

    fn = lambda x: x.sin().exp()  # noqa: E731
    with pytest.raises(RuntimeError, match=INPLACE):
        run(fn)
    with pytest.raises(RuntimeError, match=INPLACE):
        run(torch.compile(fn, backend="tpu", fullgraph=True))


# --- saved-tensor hooks ---------------------------------------------------------------------


def test_saved_tensor_hooks_see_host_tensors_and_count_as_materialize():
    model = _mlp()
    ref = copy.deepcopy(model)
    cm = torch.compile(model, backend="tpu")
    x = torch.randn(5, 8, generator=torch.Generator().manual_seed(5))

    def step(m):
        out = m(x)
        out.pow(2).sum().backward()
        return out

    # Without hooks: saved activations stay on the device, nothing is materialized.
    before = TOTAL.copy()
    assert_same(step(cm), step(ref), what="output without hooks")
    d = TOTAL.copy() - before
    assert d.count(D2H, "materialize") == 0 and d.bytes(D2H, "materialize") == 0, str(d)

    calls = {"pack": 0, "unpack": 0, "placeholders": 0}

    def pack(t):
        calls["pack"] += 1
        calls["placeholders"] += residency.saved_value(t) is not None
        return t

    def unpack(t):
        calls["unpack"] += 1
        return t

    before = TOTAL.copy()
    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        out = step(cm)
    d = TOTAL.copy() - before
    with torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
        expected = step(ref)
    assert_same(out, expected, what="output with hooks")
    for (name, p), q in zip(model.named_parameters(), ref.parameters(), strict=True):
        assert_same(p.grad, q.grad, what=f"grad of {name} (two steps accumulated)")
    assert calls["pack"] > 0 and calls["unpack"] > 0, calls
    assert calls["placeholders"] == 0, "a hook was handed a device placeholder"
    assert d.count(D2H, "materialize") > 0 and d.bytes(D2H, "materialize") > 0, str(d)


# --- values handed from one compiled module to the next -------------------------------------


@pytest.mark.parametrize("grad", [False, True], ids=["inference", "training"])
def test_hidden_states_cross_once_until_changed_in_place(grad):
    torch.manual_seed(0)
    first = nn.Sequential(nn.Linear(8, 32), nn.GELU())
    second = nn.Sequential(nn.LayerNorm(32), nn.Linear(32, 4))
    ref1, ref2 = copy.deepcopy(first), copy.deepcopy(second)
    c1, c2 = torch.compile(first, backend="tpu"), torch.compile(second, backend="tpu")
    x = torch.randn(6, 8, generator=torch.Generator().manual_seed(6))
    with torch.set_grad_enabled(grad):
        c2(c1(x))  # compile both; parameters become resident
        h, h_ref = c1(x), ref1(x)
        assert_same(h, h_ref, what="hidden states")
        graphs, before = _graph_transfers(), TOTAL.copy()
        out = c2(h)
        d, per_graph = TOTAL.copy() - before, _graph_deltas(graphs, _graph_transfers())
        assert_same(out, ref2(h_ref), what="second module's output")
        assert d.bytes(H2D) == 0, f"the hidden states crossed again: {d}"
        ran = {n: t for n, t in per_graph.items() if t.count(H2D) or t.count(D2H)}
        assert len(ran) == 1, ran  # only the second module's (forward) graph ran
        assert all(t.bytes(H2D) == 0 for t in ran.values()), ran

        with torch.no_grad():  # changed outside a compiled region: the device copy is stale
            h.add_(1)
            h_ref.add_(1)
        before = TOTAL.copy()
        out, expected = c2(h), ref2(h_ref)
        d = TOTAL.copy() - before
        assert_same(out, expected, what="output after h.add_(1)")
        assert d.bytes(H2D, "input") == h.numel() * h.element_size(), str(d)
        assert d.bytes(H2D, "resident") == 0, str(d)
    if grad:
        out.sum().backward()
        expected.sum().backward()
        pairs = [*zip(first.named_parameters(), ref1.parameters(), strict=True)]
        pairs += [*zip(second.named_parameters(), ref2.parameters(), strict=True)]
        for (name, p), q in pairs:
            assert_same(p.grad, q.grad, what=f"grad of {name}")


# --- static-cache decoding ------------------------------------------------------------------


def _tiny_llama():
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    model = tiny_llama(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_key_value_heads=4
    ).eval()
    model.generation_config.pad_token_id = 0
    return model


def test_static_cache_decode_moves_a_small_fraction_of_the_cache_per_token():
    model = _tiny_llama()
    prompt, new = 16, 16
    ids = torch.randint(3, 256, (1, prompt), generator=torch.Generator().manual_seed(2))

    def generate():
        return model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=new,
            min_new_tokens=new,
            do_sample=False,
            cache_implementation="static",
            return_dict_in_generate=True,
        )

    expected = generate().sequences
    compiled = torch.compile(model.forward, backend="tpu")  # as benchmarks/transfers.py does
    calls = []

    @functools.wraps(compiled)  # generate() reads forward's signature
    def forward(*args, **kwargs):
        before = TOTAL.copy()
        out = compiled(*args, **kwargs)
        calls.append((kwargs["input_ids"].shape[1], TOTAL.copy() - before))
        return out

    model.forward = forward
    generate()  # compiles prefill and decode
    calls.clear()
    traces = cache_stats.traces
    result = generate()
    assert cache_stats.traces == traces, "a steady-state generate traced a graph again"
    assert torch.equal(result.sequences, expected), (result.sequences, expected)

    cache = result.past_key_values
    cache_bytes = sum(
        t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values)
    )
    decode = [d for n, d in calls if n == 1]
    assert len(calls) == new and len(decode) == new - 1, [n for n, _ in calls]
    steady = decode[1:]  # the first decode step reads what prefill left; skip it too
    moved = sum(d.bytes(H2D) + d.bytes(D2H) for d in steady)
    per_token = moved / len(steady)
    for d in steady:
        assert d.bytes(H2D, "resident") == 0 and d.bytes(D2H, "materialize") == 0, str(d)
    assert per_token <= 0.1 * cache_bytes, (
        f"{per_token:.0f} B/token against a {cache_bytes} B cache; one step: {steady[-1]}"
    )

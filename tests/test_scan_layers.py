"""``options={"scan_layers": True}``: a model's repeated layers traced once (a nested compile
region each, dynamo/regions.py) and lowered once, as a ``lax.scan`` over the stacked per-layer
weights (scan_layers.py), with the numbers of the unrolled program and of CPU eager: forward,
training (``loss.backward()`` and the gradients) and compile_step's one-program step with AdamW
(its update too, one region per layer); layers that don't match stay unrolled."""

from __future__ import annotations

import copy
import logging

import pytest
import torch
from torch import nn

import tpu_inductor
from benchmarks.scan_layers import llama
from tests.helpers import lm_train_step
from tpu_inductor.core.dtypes import tolerance
from tpu_inductor.dynamo import regions

transformers = pytest.importorskip("transformers")

ATOL, RTOL = tolerance(torch.float32, level="op")
SCAN = {"scan_layers": True}
LOGGER = "tpu_inductor.lowering.scan_layers"
REGIONS = "tpu_inductor.dynamo.regions"


def _llama(layers=4, **overrides):
    return llama(layers, **overrides)


def _ids():
    return torch.randint(0, 128, (2, 8), generator=torch.Generator().manual_seed(1))


def _scans(caplog) -> list[str]:
    """The scans lowered since the last ``caplog.clear()`` (one log line each)."""
    return [r.getMessage() for r in caplog.records if "lowered as one lax.scan" in r.getMessage()]


def _traces() -> int:
    """How many times Dynamo traced a nested compile region's body since its last reset."""
    from torch._dynamo.utils import compilation_time_metrics

    return len(compilation_time_metrics.get("invoke_subgraph_trace", []))


def _train(model, options, ids):
    """Logits, loss and gradients of one forward + backward (eager with ``options=None``)."""
    torch._dynamo.reset()
    model = copy.deepcopy(model)
    run = model if options is None else torch.compile(model, backend="tpu", options=options)
    out = run(input_ids=ids, labels=ids)
    out.loss.backward()
    grads = {n: p.grad for n, p in model.named_parameters()}
    return out.logits.detach(), out.loss.detach(), grads


def _same(a, b, *, exact=False, tight=False):
    """Same dtypes, shapes and values: within the op tolerance of eager, to the bit
    (``exact``) or within float32 rounding of a differently fused program (``tight``)."""
    for x, y in zip(a, b, strict=True):
        if isinstance(x, dict):
            assert x.keys() == y.keys()
            _same(list(x.values()), list(y.values()), exact=exact, tight=tight)
            continue
        assert x.dtype == y.dtype and x.shape == y.shape
        if exact:
            torch.testing.assert_close(x, y, atol=0, rtol=0)
        elif tight:
            torch.testing.assert_close(x, y, atol=1e-6, rtol=1e-5)
        else:
            torch.testing.assert_close(x, y, atol=ATOL, rtol=RTOL)


def test_llama_forward_is_one_scan_with_unrolled_and_eager_numbers(caplog):
    # no KV cache: a layer that updates one (a Python object) is traced again for every layer
    model, ids = _llama(use_cache=False).eval(), _ids()
    eager = model(input_ids=ids).logits
    torch._dynamo.reset()
    unrolled = torch.compile(copy.deepcopy(model), backend="tpu")(input_ids=ids).logits
    caplog.set_level(logging.INFO, logger=LOGGER)
    caplog.set_level(logging.INFO, logger=REGIONS)
    caplog.clear()
    torch._dynamo.reset()
    scanned = torch.compile(copy.deepcopy(model), backend="tpu", options=SCAN)(input_ids=ids)
    # the first graph shows the unmarked layers: they are marked and Dynamo traces again, each
    # layer into a subgraph (regions.py: no reuse of a trace), the four the same one
    messages = [r.getMessage() for r in caplog.records]
    assert (
        "scan_layers: model.layers.0..3 (4 x LlamaDecoderLayer) marked as nested compile "
        "regions" in messages
    )
    assert _traces() == 4
    assert _scans(caplog) == [
        "scan_layers: 4 calls of subgraph partitioned_fw_subgraph_0_0 (89 ops) lowered as one "
        "lax.scan"
    ]
    _same([scanned.logits], [eager])
    # A layer traced on its own (a region) is not the same ATen ops as the same layer inlined
    # (torch traces its attention mask inside it): float32 rounding apart (measured 2e-7). The
    # scan itself computes exactly what the calls it replaces compute.
    _same([scanned.logits], [unrolled], tight=True)


def test_llama_training_forward_and_backward_scan(caplog):
    model, ids = _llama().train(), _ids()
    eager = _train(model, None, ids)
    unrolled = _train(model, {}, ids)
    caplog.set_level(logging.INFO, logger=LOGGER)
    caplog.clear()
    scanned = _train(model, SCAN, ids)
    # AOTAutograd traced one layer's forward and backward: each a subgraph, every layer a call
    assert _scans(caplog) == [
        "scan_layers: 4 calls of subgraph partitioned_fw_subgraph_0_0 (82 ops) lowered as one "
        "lax.scan",
        "scan_layers: 4 calls of subgraph partitioned_bw_subgraph_0_0 (149 ops) lowered as one "
        "lax.scan",
    ]
    _same(scanned, eager)
    _same(scanned, unrolled, tight=True)  # see the forward's test


def test_scanned_backward_takes_zero_tangents_of_every_layer():
    """At 4 x 64 tokens each layer's KV-cache outputs (which nobody differentiates) get
    all-zeros tangents of 32 KB: constants of the backward (``signatures.Zeros``), stacked for
    the scanned layers as one constant (they were stacked as arrays and crashed)."""
    model = _llama().train()
    ids = torch.randint(0, 128, (4, 64), generator=torch.Generator().manual_seed(2))
    eager = _train(model, None, ids)
    _same(_train(model, SCAN, ids), eager)


def _step_run(options, layers=4, steps=2, clip=None, **adamw):
    """Losses, parameters and AdamW moments after ``steps`` compile_step calls (eager with
    ``options=None``); ``clip``: ``clip_grad_norm_`` to that norm before the update."""
    torch._dynamo.reset()
    model = _llama(layers).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, eps=1e-3, **adamw)

    train_step = lm_train_step(model, opt, clip)

    if options is not None:
        train_step = tpu_inductor.compile_step(train_step, opt, options=options)
    losses = [train_step(_ids()) for _ in range(steps)]
    moments = [opt.state[p][k] for p in model.parameters() for k in ("exp_avg", "exp_avg_sq")]
    return losses, [p.detach() for p in model.parameters()], moments


def _same_steps(scanned, eager, unrolled):
    for s, e, u in zip(scanned, eager, unrolled, strict=True):
        _same(s, e)
        # One program: XLA fuses the scanned step differently (differences of ~1e-7 measured).
        _same(s, u, tight=True)


def test_compile_step_adamw_scans_forward_backward_and_update(caplog):
    eager = _step_run(None)
    unrolled = _step_run({})
    caplog.set_level(logging.INFO, logger=LOGGER)
    caplog.clear()
    scanned = _step_run(SCAN)
    # One program (the AdamW state exists before the trace): a scan of the forward, of the
    # backward and of the 4 layers' updates (one region per layer: torch's single-tensor AdamW
    # for its 9 parameters, 24 ops each). Dynamo traced every layer and one layer's update (the
    # other three updates reuse its trace: every tensor is an argument of the region).
    assert _scans(caplog) == [
        "scan_layers: 4 calls of subgraph partitioned_fw_subgraph_0_0 (82 ops) lowered as one "
        "lax.scan",
        "scan_layers: 4 calls of subgraph partitioned_bw_subgraph_0_0 (146 ops) lowered as one "
        "lax.scan",
        "scan_layers: 4 calls of subgraph subgraph_1 (216 ops) lowered as one lax.scan",
    ]
    assert _traces() == 5
    _same_steps(scanned, eager, unrolled)


def test_compile_step_foreach_update_with_clipping_scans(caplog):
    """``foreach=True``: the update is op-major (each op for every parameter in turn), so a
    layer's update block is not contiguous; ``clip_grad_norm_`` reads each gradient's norm before
    the update, so those norms (and the gradients they read) leave the blocks and the scan reads
    them as per-layer inputs."""
    kw = {"layers": 3, "clip": 0.5, "foreach": True}
    eager = _step_run(None, **kw)
    unrolled = _step_run({}, **kw)
    caplog.set_level(logging.INFO, logger=LOGGER)
    caplog.clear()
    scanned = _step_run(SCAN, **kw)
    updates = [m for m in _scans(caplog) if "update blocks" in m]
    assert len(updates) == 1 and all(m.startswith("scan_layers: 3 update blocks") for m in updates)
    _same_steps(scanned, eager, unrolled)


class _Mixed(nn.Module):
    """Layers of one ModuleList that are not the same computation: Linear+GELU, then
    Linear+Tanh, then Linear+GELU: no two neighbours match, nothing is scanned."""

    def __init__(self):
        super().__init__()
        acts = [nn.GELU(), nn.Tanh(), nn.GELU()]
        self.layers = nn.ModuleList(nn.Sequential(nn.Linear(16, 16), a) for a in acts)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


def test_layers_that_differ_stay_unrolled_with_eager_numbers(caplog):
    torch.manual_seed(0)
    model, x = _Mixed(), torch.randn(4, 16)
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    caplog.clear()
    torch._dynamo.reset()
    out = torch.compile(copy.deepcopy(model), backend="tpu", options=SCAN)(x)
    assert _scans(caplog) == []
    assert any("matches no neighbour" in r.getMessage() for r in caplog.records)
    _same([out], [model(x)])


def test_only_the_matching_layers_of_a_mixed_stack_scan(caplog):
    """Tanh, then three GELU layers: the three are one scan, the first stays unrolled."""
    torch.manual_seed(0)
    model, x = _Mixed(), torch.randn(4, 16, requires_grad=True)
    model.layers = nn.ModuleList(
        nn.Sequential(nn.Linear(16, 16), a) for a in (nn.Tanh(), nn.GELU(), nn.GELU(), nn.GELU())
    )
    caplog.set_level(logging.INFO, logger=LOGGER)
    caplog.clear()
    torch._dynamo.reset()
    compiled = copy.deepcopy(model)
    xc = x.detach().clone().requires_grad_()
    out = torch.compile(compiled, backend="tpu", options=SCAN)(xc)
    out.sum().backward()
    eager = model(x)
    eager.sum().backward()
    # the three GELU layers are one run of regions (regions.py: the Tanh layer differs)
    assert any(m.startswith("scan_layers: 3 calls of subgraph") for m in _scans(caplog))
    _same([out.detach(), xc.grad], [eager.detach(), x.grad])
    for pc, pe in zip(compiled.parameters(), model.parameters(), strict=True):
        _same([pc.grad], [pe.grad])


def test_dropout_in_layers_stays_unrolled(caplog):
    """Each layer's dropout draws its own numbers (a different draw counter per layer): a
    forward with dropout in its layers is not scanned. Its backward draws nothing (it reads the
    saved masks, one per layer) and is. The numbers are the unrolled program's, same seed."""
    model, ids = _llama(layers=3, attention_dropout=0.5).train(), _ids()
    torch.manual_seed(5)
    unrolled = _train(model, {}, ids)
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    caplog.clear()
    torch.manual_seed(5)
    scanned = _train(model, SCAN, ids)
    assert _scans(caplog) == [  # the backward; the forward's calls draw, each its own
        "scan_layers: 3 calls of subgraph partitioned_bw_subgraph_0_0 (167 ops) lowered as one "
        "lax.scan"
    ]
    assert any("random" in r.getMessage() for r in caplog.records)
    _same(scanned, unrolled, exact=True)


def test_option_and_environment(monkeypatch):
    from tpu_inductor.dynamo.options import parse_options

    assert parse_options(None).scan_layers is False
    assert parse_options({"scan_layers": True}).scan_layers is True
    monkeypatch.setenv("TPU_INDUCTOR_SCAN_LAYERS", "1")
    assert parse_options(None).scan_layers is True
    with pytest.raises(tpu_inductor.core.errors.InvalidOptionError, match="scan_layers"):
        parse_options({"scan_layers": "yes"})


def test_an_update_scan_writes_its_new_values_into_the_input_stacks():
    """An update scan (no carry) writes each new value into the stack of an input of its shape
    and dtype (ScanGroup._scan), so the loop has no stacked outputs of its own (the TPU peak of
    compile_step's update, docs/architecture.md); the values are plain lax.scan's."""
    import jax
    import jax.numpy as jnp
    from jax import lax

    from tpu_inductor.lowering.scan_layers import ScanGroup

    graph = torch.fx.Graph()
    nodes = [graph.placeholder(f"n{i}") for i in range(3)]
    nodes[0].meta["val"] = nodes[2].meta["val"] = torch.empty(2, 3)  # a parameter, its new value
    nodes[1].meta["val"] = torch.empty(5, dtype=torch.int64)  # a step count: nothing to pair
    group = ScanGroup("t", [[nodes[2]]] * 4, [], [(nodes[0],), (nodes[1],)], [], [0], set())
    assert group._pairs() == {0: 0}

    def body(carry, x):
        return carry, (x[0] * 2 + x[1][:3].astype(x[0].dtype),)

    xs = (jnp.arange(24.0).reshape(4, 2, 3), jnp.arange(20).reshape(4, 5))
    want = lax.scan(body, (), xs)
    got = group._scan(body, (), xs)
    assert jax.tree.map(lambda a, b: bool((a == b).all()), got, want) == ((), (True,))
    (scan,) = [e for e in jax.make_jaxpr(lambda xs: group._scan(body, (), xs))(xs).eqns]
    # the loop's outputs: the index and the stack it wrote into (carries), no stacked ys
    assert scan.primitive.name == "scan" and len(scan.outvars) == scan.params["num_carry"] == 2


def test_stacked_state_crosses_once_per_kind_and_stays_stacked(monkeypatch):
    """With scan_layers the per-layer parameters and AdamW moments cross as one stacked array
    per kind (lowering/packing.py): the program's inputs do not grow with depth, the steady step
    passes back the stacks the last step returned (nothing is stacked again), the host copies
    are eager's after every step, and an eager in-place edit of one parameter between steps is
    seen (its stack is rebuilt). That the arguments stay as many at any depth is checked on the
    compiled program in tests/tpu/test_scan_sharding.py."""
    from tpu_inductor.runtime import call
    from tpu_inductor.runtime.cache import COMPILED

    stacked = []
    real = call.stack_arrays
    monkeypatch.setattr(call, "stack_arrays", lambda *a: stacked.append(1) or real(*a))

    def run(options, layers, steps=4):
        torch._dynamo.reset()
        model = _llama(layers).train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2, eps=1e-3)
        step = lm_train_step(model, opt)
        if options is not None:
            step = tpu_inductor.compile_step(step, opt, options=options)
        per_step, losses = [], []
        for i in range(steps):
            stacked.clear()
            if i == 2:  # an eager edit of one layer's weight between steps
                with torch.no_grad():
                    model.model.layers[1].mlp.up_proj.weight.mul_(0.5)
            losses.append(step(_ids()))
            per_step.append(len(stacked))
        params = [p.detach().clone() for p in model.parameters()]
        moments = [opt.state[p][k] for p in model.parameters() for k in ("exp_avg", "exp_avg_sq")]
        return per_step, (losses, params, moments)

    _, eager = run(None, 3)
    before = set(map(id, COMPILED))
    per_step, scanned = run(SCAN, 3)
    _same(scanned[0], eager[0])
    _same(scanned[1], eager[1])
    _same(scanned[2], eager[2])
    # 9 weight kinds: the first call stacks the parameters and the AdamW state made before the
    # trace (step, exp_avg, exp_avg_sq: 4 x 9); then nothing, except the edited weight's kind
    # after the edit (one stack).
    assert per_step == [36, 0, 1, 0]

    def steady_of(graphs):  # the program that takes the AdamW state (COMPILED is unordered)
        return max((c.exes for c in graphs if id(c) not in before), key=lambda e: len(e._slots))

    steady = steady_of(COMPILED)
    slots = [len(s) for s in steady._slots]
    # per kind: the parameters, step, exp_avg, exp_avg_sq
    assert slots.count(3) == 36 and max(slots) == 3


def test_stacked_state_with_keep_on_device_matches_eager():
    """keep_on_device + compile_step + scan_layers: the new parameters and moments stay layers
    of the program's stacks (no host copy per step, ``device_owned``), are read back per tensor
    with eager's values, and an eager read of one layer's weight between steps syncs just it."""
    from tpu_inductor.runtime import device_owned

    def run(compiled: bool, steps=3):
        torch._dynamo.reset()
        model = _llama(3).train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2, eps=1e-3)
        step = lm_train_step(model, opt)
        if compiled:
            tpu_inductor.keep_on_device(model, opt)
            step = tpu_inductor.compile_step(step, opt, options=SCAN)
        losses, peeks = [], []
        for _ in range(steps):
            losses.append(float(step(_ids())))
            if compiled:  # the stacked results are pending on the device, not copied back
                assert device_owned.pending_bytes() > 0
            peeks.append(model.model.layers[1].mlp.up_proj.weight.sum().item())
        params = [p.detach().clone() for p in model.parameters()]
        moments = [opt.state[p][k].clone() for p in model.parameters() for k in ("exp_avg",)]
        return [torch.tensor(losses)], [torch.tensor(peeks)], params, moments

    eager, scanned = run(False), run(True)
    for got, want in zip(scanned, eager, strict=True):
        _same(got, want)


class _BranchyLayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        y = self.lin(x)
        return x + (y if y.sum() > 0 else -y)  # a branch on a value: a graph break


class _Branchy(nn.Module):
    """Three alike layers whose forward branches on a value: Dynamo cannot trace one whole."""

    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(_BranchyLayer() for _ in range(3))

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x.square().mean()


def test_layers_that_break_the_graph_stay_unrolled_in_compile_step(caplog):
    """compile_step marks the layers before tracing; a layer that breaks the graph cannot be a
    region (torch raises), so they are unmarked and traced again, and the step, which breaks,
    runs in parts with eager autograd: eager's numbers."""
    torch.manual_seed(0)
    model, x = _Branchy(), torch.randn(4, 8)
    twin = copy.deepcopy(model)
    opt, opt_e = (torch.optim.SGD(m.parameters(), lr=0.1) for m in (model, twin))

    def step(x):
        loss = model(x)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    caplog.set_level(logging.INFO)
    compiled = tpu_inductor.compile_step(step, opt, options=SCAN)
    for _ in range(2):
        got = compiled(x)
        want = twin(x)
        want.backward()
        opt_e.step()
        opt_e.zero_grad()
        _same([got], [want.detach()])
    _same([p.detach() for p in model.parameters()], [p.detach() for p in twin.parameters()])
    messages = [r.getMessage() for r in caplog.records]
    assert "scan_layers: the layers break the graph, so they stay unrolled" in messages
    assert any("cannot be one program" in m for m in messages)
    assert not any(regions.is_marked(layer) for layer in model.layers)


def test_update_regions_follow_param_groups_with_eager_numbers(caplog):
    """AdamW with weight decay on the matrices only (two param groups, as LLM training sets
    it): each layer's update is one region per group, every run a scan; eager's numbers."""

    def run(options):
        torch._dynamo.reset()
        model = _llama(3, use_cache=False).train()
        norms = [p for n, p in model.named_parameters() if p.dim() == 1]
        mats = [p for n, p in model.named_parameters() if p.dim() > 1]
        opt = torch.optim.AdamW(
            [{"params": mats, "weight_decay": 0.1}, {"params": norms, "weight_decay": 0.0}],
            lr=1e-2,
            eps=1e-3,
        )
        step = lm_train_step(model, opt)
        if options is not None:
            step = tpu_inductor.compile_step(step, opt, options=options)
        losses = [step(_ids()) for _ in range(2)]
        return losses, [p.detach() for p in model.parameters()]

    eager = run(None)
    caplog.set_level(logging.INFO, logger=LOGGER)
    caplog.clear()
    scanned = run(SCAN)
    updates = [m for m in _scans(caplog) if "subgraph subgraph_" in m]
    assert len(updates) == 2, _scans(caplog)  # one per param group: matrices, norms
    _same(scanned[0], eager[0])
    _same(scanned[1], eager[1])


def test_a_marked_model_pickles_and_copies():
    """Marked layers keep working as modules: ``torch.save`` of the whole model, ``deepcopy``
    and eager calls give the model's own numbers."""
    import io

    model, ids = _llama(2, use_cache=False).eval(), _ids()
    want = model(input_ids=ids).logits
    regions.mark_layers([model])
    assert all(regions.is_marked(layer) for layer in model.model.layers)
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    for other in (model, copy.deepcopy(model), loaded):
        _same([other(input_ids=ids).logits], [want], exact=True)

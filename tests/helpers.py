"""Test helpers: run the same thing compiled with backend="tpu" and in CPU eager, compare."""

from __future__ import annotations

import contextlib
import copy

import pytest
import torch

from tpu_inductor.core.dtypes import tolerance

# The "op" level of the one tolerance table (tpu_inductor.core.dtypes.TOLERANCES), float32's, for
# every dtype unless a test passes its own.
ATOL, RTOL = tolerance(torch.float32, level="op")


def assert_same(actual, expected, atol=ATOL, rtol=RTOL, what="output"):
    """dtype and shape exactly, values within tolerance; recurses into tuples/lists/dicts."""
    if isinstance(expected, dict):
        assert set(actual) == set(expected), what
        for k in expected:
            assert_same(actual[k], expected[k], atol, rtol, f"{what}[{k!r}]")
        return
    if isinstance(expected, list | tuple):
        assert len(actual) == len(expected), f"{what}: {len(actual)} vs {len(expected)} items"
        for i, (a, e) in enumerate(zip(actual, expected, strict=True)):
            assert_same(a, e, atol, rtol, f"{what}[{i}]")
        return
    if isinstance(expected, torch.Tensor):
        assert isinstance(actual, torch.Tensor), f"{what}: got {type(actual)}"
        assert actual.dtype == expected.dtype, f"{what}: dtype {actual.dtype} != {expected.dtype}"
        assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
        assert actual.device.type == "cpu", f"{what}: device {actual.device}"
        torch.testing.assert_close(
            actual, expected, atol=atol, rtol=rtol, equal_nan=True, msg=lambda m: f"{what}: {m}"
        )
        return
    assert actual == expected, f"{what}: {actual!r} != {expected!r}"


@contextlib.contextmanager
def one_torch_thread():
    """torch eager with one intra-op thread inside the block (tests/models/conftest.py: why)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def compiled(fn, **options):
    """``torch.compile(fn, backend="tpu", fullgraph=True)`` with optional backend options."""
    return torch.compile(fn, backend="tpu", fullgraph=True, options=options or None)


def check_fn(fn, *args, atol=ATOL, rtol=RTOL, **options):
    """Run ``fn(*args)`` eagerly and compiled on copies of the args; compare outputs and any
    in-place changes to the args."""
    eager_args = copy.deepcopy(args)
    comp_args = copy.deepcopy(args)
    expected = fn(*eager_args)
    actual = compiled(fn, **options)(*comp_args)
    assert_same(actual, expected, atol, rtol)
    assert_same(comp_args, eager_args, atol, rtol, what="mutated args")
    return actual


def check_module_training(
    model, make_inputs, steps=3, opt="adamw", atol=ATOL, rtol=RTOL, loss_fn=None
):
    """Outputs, every parameter's gradient, and ``steps`` optimizer steps against eager.

    ``opt`` is ``"adamw"``, ``"sgd"`` (momentum 0.9) or a callable ``params -> Optimizer``."""
    eager = copy.deepcopy(model)
    comp = copy.deepcopy(model)
    cmodel = torch.compile(comp, backend="tpu")
    loss_fn = loss_fn or (lambda out: out.float().pow(2).mean())

    def make_opt(m):
        if callable(opt):
            return opt(m.parameters())
        if opt == "sgd":
            return torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)
        return torch.optim.AdamW(m.parameters(), lr=1e-2)

    oe, oc = make_opt(eager), make_opt(comp)
    for step in range(steps):
        inputs = make_inputs(step)
        out_e = eager(*copy.deepcopy(inputs))
        out_c = cmodel(*copy.deepcopy(inputs))
        assert_same(out_c, out_e, atol, rtol, f"step {step} output")
        loss_fn(out_e).backward()
        loss_fn(out_c).backward()
        for (name, pe), pc in zip(eager.named_parameters(), comp.parameters(), strict=True):
            if pe.grad is None:
                assert pc.grad is None, f"step {step}: {name} has a grad only when compiled"
                continue
            assert_same(pc.grad, pe.grad, atol, rtol, f"step {step} grad of {name}")
        oe.step()
        oc.step()
        oe.zero_grad()
        oc.zero_grad()
        for (name, pe), pc in zip(eager.named_parameters(), comp.parameters(), strict=True):
            assert_same(pc.detach(), pe.detach(), atol, rtol, f"step {step} param {name}")
        for (name, be), bc in zip(eager.named_buffers(), comp.buffers(), strict=True):
            assert_same(bc, be, atol, rtol, f"step {step} buffer {name}")
    return eager, comp


def tiny_llama(attn_implementation: str | None = None, **config):
    """A transformers ``LlamaForCausalLM`` from a tiny config with random weights (seed 0):
    vocab 128, hidden 32, 2 layers, 4 heads, 2 KV heads, unless ``config`` says otherwise, with
    transformers' default attention unless ``attn_implementation`` names one. Skips the test
    when transformers is not installed."""
    transformers = pytest.importorskip("transformers")
    defaults = dict(
        vocab_size=128,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        pad_token_id=0,
    )
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(**{**defaults, **config})
    if attn_implementation is None:
        return transformers.LlamaForCausalLM(cfg)
    return transformers.LlamaForCausalLM._from_config(cfg, attn_implementation=attn_implementation)


def kept_llama():
    """A tiny Llama and a copy kept on the device (``keep_on_device``), each with AdamW (lr
    1e-3), the copy compiled with its step, and a batch of ids: ``(ref, ref_opt, dev, opt,
    compiled model, compiled step, ids)``."""
    import tpu_inductor

    ref = tiny_llama().train()
    dev = copy.deepcopy(ref)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-3)
    opt = torch.optim.AdamW(dev.parameters(), lr=1e-3)
    tpu_inductor.keep_on_device(dev, opt)
    cm = torch.compile(dev, backend="tpu")
    step = torch.compile(opt.step, backend="tpu")
    ids = torch.randint(3, 128, (2, 12), generator=torch.Generator().manual_seed(4))
    return ref, ref_opt, dev, opt, cm, step, ids


def lm_train_step(model, opt, clip: float | None = None, **model_kwargs):
    """The step a causal LM trains with, as users write it for ``compile_step``: loss on
    ``ids`` as labels, ``backward``, ``clip_grad_norm_`` to ``clip`` if given, ``opt.step()``,
    ``opt.zero_grad()``; returns the loss (compile_step detaches it). ``model_kwargs`` go to
    the model (``use_cache=False``)."""

    def train_step(ids):
        loss = model(input_ids=ids, labels=ids, **model_kwargs).loss
        loss.backward()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        opt.zero_grad()
        return loss.detach()

    return train_step


def lm_losses(model, path: str, ids, options: dict, lr: float, steps: int = 2):
    """Train a causal LM ``steps`` steps on ``ids`` with AdamW at ``lr`` and yield each step's
    loss as a float, on ``path`` ``"step"`` (``compile_step``: one program) or ``"split"`` (the
    compiled model, ``loss.backward()`` and a compiled ``opt.step()``: three programs)."""
    import tpu_inductor

    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    if path == "step":
        step = tpu_inductor.compile_step(lm_train_step(model, opt), opt, options=options)
        for _ in range(steps):
            yield step(ids).item()
        return
    compiled = torch.compile(model, backend="tpu", options=options)
    update = torch.compile(opt.step, backend="tpu", options=options)
    for _ in range(steps):
        loss = compiled(ids, labels=ids).loss
        loss.backward()
        update()
        opt.zero_grad()
        yield loss.item()


def set_knobs(monkeypatch, **knobs) -> None:
    """Patch ``tpu_inductor.config`` for the rest of a test; undone when monkeypatch undoes its
    changes (later calls stack on earlier ones)."""
    from tpu_inductor.core import config

    frame = config.patch(**knobs).changes
    monkeypatch.setattr(config, "_PATCHES", [*config._PATCHES, frame])

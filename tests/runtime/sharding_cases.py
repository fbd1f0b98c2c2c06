"""Sharded training on 8 CPU devices, run by tests/runtime/test_sharding.py in a process of its own.

JAX reads ``XLA_FLAGS=--xla_force_host_platform_device_count=8`` when its backend starts, so
these tests need a fresh process; the file name keeps pytest from collecting it with the rest.
Every check compares against single-device CPU eager.
"""

from __future__ import annotations

import copy

import jax
import pytest
import torch
from jax.sharding import PartitionSpec as P

import tpu_inductor
from tests.helpers import lm_train_step, tiny_llama

pytestmark = pytest.mark.skipif(
    len(jax.devices()) < 8, reason="needs XLA_FLAGS=--xla_force_host_platform_device_count=8"
)

STEPS = 2


def _train(plan, mesh, *, keep=False, steps=STEPS):
    """``steps`` of (forward, backward, compiled AdamW) compiled under the plan and in eager;
    asserts loss, grads and parameters match. Returns the compiled model."""
    eager = tiny_llama()
    comp = copy.deepcopy(eager)
    opt_e = torch.optim.AdamW(eager.parameters(), lr=1e-2)
    opt_c = torch.optim.AdamW(comp.parameters(), lr=1e-2)
    if keep:
        tpu_inductor.keep_on_device(comp, opt_c)
    opts = {"mesh": mesh, "shardings": plan}
    model = torch.compile(comp, backend="tpu", options=opts)
    step = torch.compile(opt_c.step, backend="tpu", options=opts)
    ids = torch.randint(1, 128, (8, 16), generator=torch.Generator().manual_seed(0))
    for s in range(steps):
        loss_e = eager(input_ids=ids, labels=ids).loss
        loss_c = model(input_ids=ids, labels=ids).loss
        loss_e.backward()
        loss_c.backward()
        torch.testing.assert_close(loss_c.detach(), loss_e.detach(), atol=1e-5, rtol=1e-5)
        named = dict(comp.named_parameters())
        for name, pe in eager.named_parameters():
            torch.testing.assert_close(
                named[name].grad, pe.grad, atol=1e-5, rtol=1e-4, msg=f"step {s} grad {name}"
            )
        opt_e.step()
        step()
        opt_e.zero_grad()
        opt_c.zero_grad()
    for name, pe in eager.named_parameters():
        pc = dict(comp.named_parameters())[name]
        torch.testing.assert_close(pc.detach(), pe.detach(), atol=1e-4, rtol=1e-4, msg=name)
    return comp


def _spec(t) -> tuple:
    """The device copy's PartitionSpec as a tuple without trailing ``None`` (JAX drops them)."""
    spec = list(_resident(t).sharding.spec)
    while spec and spec[-1] is None:
        spec.pop()
    return tuple(spec)


def _resident(t):
    from tpu_inductor.runtime.residency import VALUES

    inner = getattr(t, "_inner", t)
    return VALUES.lookup(inner)


def _state_bytes_per_device(model, optimizer_state=()):
    """Device -> bytes of the model's parameters' device copies (each shard where it lives)."""
    from tpu_inductor.runtime.sharding import resident_bytes_per_device

    arrays = [_resident(p) for p in model.parameters()]
    assert all(a is not None for a in arrays), "a parameter has no device copy"
    return resident_bytes_per_device(arrays)


def test_dp_replicates_parameters_and_matches_eager():
    mesh = jax.make_mesh((8,), ("data",))
    comp = _train("dp", mesh)
    total = sum(p.numel() * 4 for p in comp.parameters())
    per_device = _state_bytes_per_device(comp)
    assert len(per_device) == 8 and set(per_device.values()) == {total}
    assert _spec(comp.model.layers[0].self_attn.q_proj.weight) == ()


def test_fsdp_shards_parameters_and_optimizer_state():
    mesh = jax.make_mesh((8,), ("data",))
    comp = _train("fsdp", mesh)
    total = sum(p.numel() * 4 for p in comp.parameters())
    per_device = _state_bytes_per_device(comp)
    # every weight matrix's first dimension divides by 8; the norms' 32 too
    assert max(per_device.values()) * 8 == total, per_device
    assert _spec(comp.model.layers[0].self_attn.q_proj.weight) == ("data",)
    report = tpu_inductor.report(print_table=False)
    assert len(report.resident_bytes_per_device) == 8


def test_fsdp_optimizer_state_is_placed_like_its_parameter():
    mesh = jax.make_mesh((8,), ("data",))
    eager = tiny_llama()
    opt = torch.optim.AdamW(eager.parameters(), lr=1e-2)
    opts = {"mesh": mesh, "shardings": "fsdp"}
    model = torch.compile(eager, backend="tpu", options=opts)
    ids = torch.randint(1, 128, (8, 16))
    model(input_ids=ids, labels=ids).loss.backward()
    torch.compile(opt.step, backend="tpu", options=opts)()
    for p in eager.parameters():
        for name in ("exp_avg", "exp_avg_sq"):
            got, want = _spec(opt.state[p][name]), _spec(p)
            assert got == want, (tuple(p.shape), name, got, want)


def test_tp_shards_attention_and_mlp_over_the_model_axis():
    mesh = jax.make_mesh((2, 4), ("data", "model"))
    comp = _train("tp", mesh)
    attn, mlp = comp.model.layers[0].self_attn, comp.model.layers[0].mlp
    assert _spec(attn.q_proj.weight) == ("model",)
    assert _spec(attn.o_proj.weight) == (None, "model")
    assert _spec(mlp.down_proj.weight) == (None, "model")
    per_device = _state_bytes_per_device(comp)
    total = sum(p.numel() * 4 for p in comp.parameters())
    assert max(per_device.values()) < total / 2, per_device


def test_dict_plan_with_inputs_entry():
    mesh = jax.make_mesh((2, 4), ("data", "model"))
    plan = {
        "*.mlp.gate_proj.weight": P("model", None),
        "*.mlp.up_proj.weight": P("model", None),
        "*.mlp.down_proj.weight": P(None, "model"),
        "inputs": P("data"),
    }
    comp = _train(plan, mesh)
    assert _spec(comp.model.layers[1].mlp.up_proj.weight) == ("model",)
    assert _spec(comp.model.layers[1].self_attn.q_proj.weight) == ()


def test_fsdp_with_keep_on_device():
    mesh = jax.make_mesh((8,), ("data",))
    comp = _train("fsdp", mesh, keep=True)
    assert _spec(comp.model.layers[0].mlp.up_proj.weight) == ("data",)


def test_bad_plan_lists_every_problem_at_the_first_call():
    mesh = jax.make_mesh((8,), ("data",))
    model = tiny_llama()
    plan = {
        "*.self_attn.k_proj.weight": P(None, "data"),  # fine: 32 columns
        "*.mlp.up_proj.weight": P("data", None),  # fine: 64 rows
        "*.self_attn.q_proj.bias": P("data"),  # Llama has no biases: matches nothing
        "*.input_layernorm.weight": P("data", None),  # two entries for a vector
    }
    with pytest.raises(tpu_inductor.ShardingError) as info:
        compiled = torch.compile(model, backend="tpu", options={"mesh": mesh, "shardings": plan})
        compiled(input_ids=torch.randint(1, 128, (8, 16)))
    text = str(info.value)
    assert "'*.self_attn.q_proj.bias' matches no parameter" in text
    assert "model.layers.0.input_layernorm.weight [32]" in text
    assert "k_proj" not in text and "up_proj" not in text


def test_dimension_the_axis_does_not_divide():
    mesh = jax.make_mesh((8,), ("data",))
    plan = {"*.self_attn.o_proj.weight": P("data", None), "lm_head.weight": P(("data",), None)}
    model = tiny_llama(vocab_size=100)  # lm_head.weight is [100, 32]: 100 % 8 != 0
    with pytest.raises(tpu_inductor.ShardingError, match=r"lm_head.weight \[100, 32\]"):
        torch.compile(model, backend="tpu", options={"mesh": mesh, "shardings": plan})(
            input_ids=torch.randint(1, 100, (8, 16))
        )


def test_fsdp_scan_layers_step_matches_eager(caplog):
    """compile_step with scan_layers under fsdp: the scans' stacked weights and moments keep
    each layer's placement and the carry the batch's (scan_layers.Placements); the numbers
    stay eager's, step after step, and the state stays sharded."""
    mesh = jax.make_mesh((8,), ("data",))
    eager = tiny_llama(num_hidden_layers=3)
    comp = copy.deepcopy(eager)
    opt_e = torch.optim.AdamW(eager.parameters(), lr=1e-2)
    opt_c = torch.optim.AdamW(comp.parameters(), lr=1e-2)
    ids = torch.randint(1, 128, (8, 16), generator=torch.Generator().manual_seed(0))

    options = {"mesh": mesh, "shardings": "fsdp", "scan_layers": True}
    caplog.set_level("INFO", logger="tpu_inductor.lowering.scan_layers")
    step = tpu_inductor.compile_step(lm_train_step(comp, opt_c), opt_c, options=options)
    for s in range(3):
        want = lm_train_step(eager, opt_e)(ids)
        got = step(ids)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5, msg=f"step {s} loss")
    for name, pe in eager.named_parameters():
        pc = dict(comp.named_parameters())[name]
        torch.testing.assert_close(pc.detach(), pe.detach(), atol=1e-4, rtol=1e-4, msg=name)
    scans = [r.getMessage() for r in caplog.records if "lowered as one lax.scan" in r.getMessage()]
    assert len(scans) == 3 and all(m.startswith("scan_layers: 3 calls") for m in scans), scans
    assert _spec(comp.model.layers[1].self_attn.q_proj.weight) == ("data",)
    assert _spec(opt_c.state[comp.model.layers[1].mlp.up_proj.weight]["exp_avg"]) == ("data",)

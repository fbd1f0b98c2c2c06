"""Sharding options: errors at torch.compile time, names, and the 8-device suite.

The training checks need 8 JAX CPU devices, which JAX creates only when
``XLA_FLAGS=--xla_force_host_platform_device_count=8`` is set before its backend starts, so
``test_sharded_training_on_8_devices`` runs tests/sharding_cases.py in a process of its own.
"""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path

import jax
import pytest
import torch
from jax.sharding import PartitionSpec as P

import tpu_inductor
from tpu_inductor.runtime.sharding import module_path

ROOT = Path(__file__).resolve().parent.parent


def _compile(**options):
    return torch.compile(torch.nn.Linear(4, 4), backend="tpu", options=options)


def test_option_errors_list_every_problem():
    mesh = jax.make_mesh((1,), ("data",))
    with pytest.raises(tpu_inductor.InvalidOptionError) as info:
        torch.compile(
            torch.nn.Linear(4, 4),
            backend="tpu",
            options={"mesh": mesh, "shardings": {"*.weight": P("model"), "inputs": "data"}},
        )(torch.randn(2, 4))
    text = str(info.value)
    assert "names mesh axes ['model'] the mesh lacks" in text
    assert "shardings['inputs'] must be a jax.sharding.PartitionSpec" in text


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"mesh": "8 chips", "shardings": "dp"}, "option 'mesh' must be a jax.sharding.Mesh"),
        ({"mesh": None, "shardings": "zero3"}, "option 'shardings' must be one of"),
        ({"mesh": None, "shardings": 3}, "must be 'dp', 'fsdp', 'tp' or a dict"),
    ],
)
def test_bad_mesh_or_plan(options, message):
    with pytest.raises(tpu_inductor.InvalidOptionError, match=message):
        tpu_inductor.dynamo.options.parse_options(options)


def test_tp_needs_a_model_axis():
    mesh = jax.make_mesh((1,), ("data",))
    with pytest.raises(tpu_inductor.InvalidOptionError, match="needs a mesh axis named 'model'"):
        tpu_inductor.dynamo.options.parse_options({"mesh": mesh, "shardings": "tp"})


@pytest.mark.parametrize(
    ("source", "name"),
    [
        ("L['self']._modules['model']._modules['layers']._modules['0']._parameters['weight']",
         "model.layers.0.weight"),
        ("L['args'][0]._modules['lm_head']._parameters['weight']", "lm_head.weight"),
        ("L['fn']._buffers['running_mean']", "running_mean"),
    ],
)  # fmt: skip
def test_parameter_names_from_dynamo_sources(source, name):
    assert module_path(source) == name


@pytest.mark.parametrize("plan", ["dp", "fsdp"])
def test_one_device_mesh_trains_like_eager(plan):
    """The sharded path on this process's single CPU device: same numbers as eager."""
    mesh = jax.make_mesh((1,), ("data",))
    torch.manual_seed(0)
    eager = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    comp = copy.deepcopy(eager)
    opts = {"mesh": mesh, "shardings": plan}
    opt_e = torch.optim.SGD(eager.parameters(), lr=0.1)
    opt_c = torch.optim.SGD(comp.parameters(), lr=0.1)
    model = torch.compile(comp, backend="tpu", options=opts)
    step = torch.compile(opt_c.step, backend="tpu", options=opts)
    x = torch.randn(4, 8)
    for _ in range(2):
        eager(x).square().mean().backward()
        model(x).square().mean().backward()
        opt_e.step()
        step()
        opt_e.zero_grad()
        opt_c.zero_grad()
    for pe, pc in zip(eager.parameters(), comp.parameters(), strict=True):
        torch.testing.assert_close(pc.detach(), pe.detach(), atol=1e-6, rtol=1e-5)
    assert tpu_inductor.report(print_table=False).resident_bytes_per_device


def test_sharded_training_on_8_devices():
    """dp, fsdp, tp and a dict plan train a transformers Llama like eager; fsdp/tp split the
    parameters across devices; bad plans list every problem (tests/sharding_cases.py)."""
    pytest.importorskip("transformers")
    env = {
        **os.environ,
        "XLA_FLAGS": "--xla_force_host_platform_device_count=8",
        "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
    }
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "tests/sharding_cases.py",
    ]
    run = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    tail = (run.stdout + run.stderr)[-4000:]
    assert run.returncode == 0, tail
    assert " passed" in tail, tail  # tests/slow.txt's cases skip unless TPU_INDUCTOR_SLOW=1

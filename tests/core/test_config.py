"""One configuration system (tpu_inductor/core/config.py): every knob declared once, patched by
``options={...}`` and ``config.patch``, read from its environment variable, and in every cache key
when it changes programs."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import jax
import numpy as np
import pytest
import torch

import tpu_inductor
from tpu_inductor.core import config
from tpu_inductor.dynamo import backend
from tpu_inductor.dynamo.options import parse_options, plan_of, program_fingerprint
from tpu_inductor.runtime import cache

CPU = jax.devices("cpu")[0]


def _other(knob: config.Knob):
    """A valid value of ``knob`` other than its default."""
    if knob.kind == "bool":
        return not knob.default
    if knob.kind == "int":
        return knob.default + 1
    if knob.kind == "choice":
        return next(c for c in reversed(knob.choices) if c != knob.default)
    if knob.kind == "platforms":
        return ("cpu",) if knob.default != ("cpu",) else ("tpu",)
    if knob.kind == "pad":
        return "pow2"
    if knob.kind == "target":
        return "v5e"
    if knob.kind == "path":
        return "/tmp/somewhere"
    if knob.kind == "str":
        return "DEBUG"
    raise AssertionError(f"no other value for {knob.name} ({knob.kind})")


def _torch_precision() -> str:
    return torch.get_float32_matmul_precision()


PROGRAM_KNOBS = [k for k in tpu_inductor.list_options() if k.changes_programs]


def test_every_knob_is_declared_with_help_env_and_a_valid_default():
    names = [k.name for k in tpu_inductor.list_options()]
    assert names == [f.name for f in dataclasses.fields(config.Options)]
    for knob in tpu_inductor.list_options():
        assert knob.help and knob.help[0].islower() or knob.help[0] in "'a[", knob
        assert (knob.env is None) == (knob.kind == "object"), knob
        assert knob.env in (None, f"TPU_INDUCTOR_{knob.name.upper()}")
        assert config._check(knob, knob.default)[1] is None, knob
    # the switches that used to be module globals are knobs now
    for name in ("splash_attention", "split_log_softmax", "tpu_half_dots", "eager_ops"):
        assert name in names


@pytest.mark.parametrize(
    "knob", [k for k in PROGRAM_KNOBS if k.kind != "object"], ids=lambda k: k.name
)
def test_flipping_a_program_knob_changes_every_cache_key(knob):
    """The in-memory graph key and cache_dir's fingerprint both change with the knob."""
    base = parse_options(None)
    flipped = dataclasses.replace(base, **{knob.name: _other(knob)})
    keys = [backend._config_key(o, CPU, plan_of(o)) for o in (base, flipped)]
    assert keys[0] != keys[1]
    fingerprints = [
        program_fingerprint(o, CPU, o.matmul_precision or _torch_precision(), "")
        for o in (base, flipped)
    ]
    assert fingerprints[0] != fingerprints[1]


def test_a_mesh_is_in_the_key_by_its_plan():
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("data",))
    base = parse_options(None)
    dp = parse_options({"mesh": mesh})
    fsdp = parse_options({"mesh": mesh, "shardings": "fsdp"})
    keys = {backend._config_key(o, CPU, plan_of(o)) for o in (base, dp, fsdp)}
    assert len(keys) == 3


def test_knobs_that_change_no_program_leave_the_programs_key_alone():
    base = parse_options(None)
    for knob in tpu_inductor.list_options():
        if knob.changes_programs or not knob.per_compile:
            continue
        flipped = dataclasses.replace(base, **{knob.name: _other(knob)})
        assert config.program_key(base) == config.program_key(flipped), knob.name


def test_options_win_over_patch_which_wins_over_env_which_wins_over_default(monkeypatch):
    assert parse_options(None).long_attention_min_length == 1024
    monkeypatch.setenv("TPU_INDUCTOR_LONG_ATTENTION_MIN_LENGTH", "512")
    assert parse_options(None).long_attention_min_length == 512
    with config.patch(long_attention_min_length=256):
        assert parse_options(None).long_attention_min_length == 256
        assert config.get("long_attention_min_length") == 256
        opts = parse_options({"long_attention_min_length": 128})
        assert opts.long_attention_min_length == 128
    assert config.get("long_attention_min_length") == 512
    with config.scope(opts):  # a compile's own values, whatever the patches say
        with config.patch(long_attention_min_length=64):
            assert config.get("long_attention_min_length") == 128


def test_environment_values_are_parsed_and_bad_ones_name_the_variable(monkeypatch):
    monkeypatch.setenv("TPU_INDUCTOR_SPLIT_LOG_SOFTMAX", "0")
    monkeypatch.setenv("TPU_INDUCTOR_FUSED_SOFTMAX_PLATFORMS", "tpu, cpu")
    opts = parse_options(None)
    assert opts.split_log_softmax is False
    assert opts.fused_softmax_platforms == ("cpu", "tpu")
    monkeypatch.setenv("TPU_INDUCTOR_SPLASH_ATTENTION", "sometimes")
    with pytest.raises(tpu_inductor.InvalidOptionError, match="TPU_INDUCTOR_SPLASH_ATTENTION"):
        parse_options(None)
    with pytest.raises(tpu_inductor.InvalidOptionError, match="TPU_INDUCTOR_SPLASH_ATTENTION"):
        config.get("splash_attention")


def test_patch_checks_names_and_values_at_once():
    with pytest.raises(tpu_inductor.InvalidOptionError) as e:
        config.patch(splash_atention="off", tpu_half_dots="yes", recast_platforms=("tpuv9",))
    message = str(e.value)
    assert "did you mean 'splash_attention'" in message
    assert "'tpu_half_dots' must be True or False" in message
    assert "'recast_platforms' must be a list of" in message


def test_process_wide_knobs_are_refused_as_compile_options():
    with pytest.raises(tpu_inductor.InvalidOptionError, match=r"config.patch\(eager_ops=...\)"):
        parse_options({"eager_ops": "host"})


def test_patch_is_a_decorator_too():
    @config.patch(partitioner="default")
    def inside():
        return config.get("partitioner")

    assert inside() == "default"
    assert config.get("partitioner") == "min_cut"


def test_a_graph_keeps_the_knobs_it_was_compiled_with_and_a_flip_compiles_anew():
    def f(x):
        return torch.nn.functional.log_softmax(x @ x.T, -1)

    x = torch.randn(8, 8)
    before = set(cache.COMPILED)
    with config.patch(tpu_half_dots=False):
        torch.compile(f, backend="tpu")(x)
    (graph,) = set(cache.COMPILED) - before
    assert graph.exes.config.tpu_half_dots is False  # later traces of it run with this value

    def built():
        return cache.STATS.graphs - cache.STATS.hits

    builds = built()
    torch._dynamo.reset()  # a new Dynamo graph, identical, under the default knobs
    torch.testing.assert_close(torch.compile(f, backend="tpu")(x), f(x))
    assert built() == builds + 1  # the knob is in the key: not the old program
    torch._dynamo.reset()
    torch.compile(f, backend="tpu", options={"tpu_half_dots": False})(x)
    assert built() == builds + 1  # the first program again, from the in-memory cache


def test_list_options_is_documented_in_docs_options_md():
    """docs/options.md is generated from the declarations (scripts/gen_options_doc.py)."""
    out = subprocess.run(
        [sys.executable, "scripts/gen_options_doc.py", "--check"],
        capture_output=True,
        text=True,
        cwd=config.__file__.rsplit("/tpu_inductor/", 1)[0],
    )
    assert out.returncode == 0, out.stdout + out.stderr

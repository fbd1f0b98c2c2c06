"""TPU targets (targets.py) and the provenance every lowered op carries (sources.provenance).

These run in the default suite, without libtpu: target names are parsed and checked without it,
and the module path and source line of each op are visible in the StableHLO dumped on the CPU.
Compiling for a target is tested in tests/tpu/ (needs libtpu).
"""

from __future__ import annotations

import dataclasses
import importlib.util

import numpy as np
import pytest
import torch

import tpu_inductor
from tpu_inductor.core.errors import InvalidOptionError
from tpu_inductor.tpu import targets

HAS_LIBTPU = importlib.util.find_spec("libtpu") is not None


@pytest.mark.parametrize(
    "name, generation, grid",
    [
        ("v5e:2x2", "v5e", (2, 2)),
        ("v5e", "v5e", (1, 1)),
        ("v5e-8", "v5e", (2, 4)),
        ("v5litepod-16", "v5e", (4, 4)),
        ("v6e-1", "v6e", (1, 1)),
        ("v6e:4x4", "v6e", (4, 4)),
        ("v4-8", "v4", (2, 2, 1)),  # v4 and v5p count TensorCores: 8 cores = 4 chips
        ("v5p-16", "v5p", (2, 2, 2)),
        ("v4:2x2x1", "v4", (2, 2, 1)),
        ("TPU v5p", "v5p", (1, 1, 1)),
        ("tpu7x:2x2x1", "tpu7x", (2, 2, 1)),
        ("tpu7x-8", "tpu7x", (2, 2, 1)),  # 8 TensorCores: 4 chips of 2 (8 JAX devices)
        ("ironwood", "tpu7x", (1, 1, 1)),
    ],
)
def test_target_names(name, generation, grid):
    assert targets.parse_name(name) == (generation, grid)


@pytest.mark.parametrize(
    "name, says",
    [
        ("v9z:2x2", "Generations: v4, v5e, v5p, v6e, tpu7x"),
        ("v5e:2x2x1", "v5e chips form a 2-D grid"),
        ("v4-3", "the count is TensorCores (2 per chip), got 3"),
        ("v5e-6", "6 chips is not a slice size"),
        ("gpu", "unknown TPU target 'gpu'"),
    ],
)
def test_bad_target_name_says_what_is_accepted(name, says):
    with pytest.raises(InvalidOptionError) as info:
        targets.parse_name(name)
    assert says in str(info.value)


def test_bad_target_option_fails_at_the_first_call_with_every_problem():
    model = torch.compile(torch.nn.Linear(4, 4), backend="tpu", options={"target": "v9z"})
    with pytest.raises(InvalidOptionError) as info:
        model(torch.randn(2, 4))
    assert "unknown TPU target 'v9z'" in str(info.value)
    model = torch.compile(
        torch.nn.Linear(4, 4), backend="tpu", options={"target": "v5e", "device": "cpu"}
    )
    with pytest.raises(InvalidOptionError, match="can't go with device='cpu'"):
        model(torch.randn(2, 4))


@pytest.mark.skipif(HAS_LIBTPU, reason="libtpu is installed here")
def test_target_without_libtpu_says_how_to_install_it():
    model = torch.compile(torch.nn.Linear(4, 4), backend="tpu", options={"target": "v5e"})
    with pytest.raises(InvalidOptionError, match=r"pip install 'tpu-inductor\[tpu\]'"):
        model(torch.randn(2, 4))


def test_chip_peaks_follow_precision():
    chip = targets.CHIPS["v5e"]
    assert chip.peak_flops("bf16") == 197e12
    assert chip.peak_flops("f32", "highest") == pytest.approx(197e12 / 6)
    assert chip.peak_flops("f32", "high") == pytest.approx(197e12 / 3)
    assert chip.peak_flops("s8") == 394e12


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)
        self.norm = torch.nn.LayerNorm(8)

    def forward(self, x):
        return self.norm(torch.relu(self.proj(x)))  # the line the program must name


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList([Block(), Block()])

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return x.sum()


def test_program_names_module_path_aten_op_and_source_line(tmp_path):
    """Every lowered op carries its module path, ATen op and the user's line into the
    program, forward and backward (what a TPU profile shows later)."""
    torch.manual_seed(0)
    net = Net()
    x = torch.randn(4, 8, requires_grad=True)
    cm = torch.compile(net, backend="tpu", options={"dump_dir": str(tmp_path)})
    out = cm(x)
    out.backward()
    expected = Net()
    expected.load_state_dict(net.state_dict())
    x2 = x.detach().clone().requires_grad_()
    ref = expected(x2)
    ref.backward()
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(x.grad, x2.grad)
    texts = {p.parent.name: p.read_text() for p in tmp_path.glob("*/executable0.stablehlo.mlir")}
    forward = next(t for name, t in texts.items() if name.endswith("forward"))
    backward = next(t for name, t in texts.items() if name.endswith("backward"))
    for i in (0, 1):
        assert f"blocks.{i}.proj/aten::addmm" in forward
        assert f"blocks.{i}.norm/aten::native_layer_norm" in forward
        assert f"backward/blocks.{i}.proj/aten::mm" in backward
    line = Block.forward.__code__.co_firstlineno + 1
    assert f'"{__file__}":{line}' in forward
    assert f'"{__file__}":{line}' in backward
    # JAX attributes nothing to the lowering modules themselves
    assert "tpu_inductor/lowerings" not in forward + backward


def test_report_of_no_target_says_how_to_get_one():
    assert "options={'target'" in str(tpu_inductor.tpu_report(print_table=False))


@pytest.mark.parametrize(
    "name, base, slices",
    [("v5e:2x2x2slices", "v5e:2x2", 2), ("v5p-8 x 4 slices", "v5p-8", 4), ("v6e-4", "v6e-4", 1)],
)
def test_multi_slice_names(name, base, slices):
    assert targets.split_slices(name) == (base, slices)


def test_chip_figures_are_googles_published_ones():
    """From https://docs.cloud.google.com/tpu/docs/tpu7x's table (v5p, v6e, TPU7x columns) and
    the v5e page; TPU7x is two devices per chip, each given half the chip's figures."""
    v6e, v5p, v5e, tpu7x = (targets.CHIPS[g] for g in ("v6e", "v5p", "v5e", "tpu7x"))
    assert (v6e.hbm_bytes_per_s, v6e.bf16_flops, v6e.ici_bytes_per_s) == (1.638e12, 918e12, 800e9)
    assert (v5p.hbm_bytes_per_s, v5p.ici_bytes_per_s) == (2.765e12, 1200e9)
    assert (v5e.hbm_bytes_per_s, v5e.ici_bytes_per_s) == (819e9, 400e9)
    assert tpu7x.devices_per_chip == 2
    assert tpu7x.hbm_bytes * 2 == 192 * 2**30 and tpu7x.bf16_flops * 2 == 2307e12
    assert tpu7x.hbm_bytes_per_s * 2 == 7.38e12 and tpu7x.ici_bytes_per_s * 2 == 1200e9
    for chip in targets.CHIPS.values():  # libtpu keeps a little HBM for itself, never more
        assert 0.95 * chip.hbm_bytes < chip.usable_hbm_bytes <= chip.hbm_bytes
        assert chip.source.startswith("https://")
    # v5p: the page's "95 GiB" is below the 95.74 GiB libtpu allows; JAX's table has 103 GB
    assert targets.CHIPS["v5p"].hbm_bytes == 103_000_000_000
    assert "tpu_info.py" in targets.CHIPS["v5p"].hbm_source
    with pytest.raises(ValueError, match="above the capacity"):
        dataclasses.replace(targets.CHIPS["v5e"], usable_hbm_bytes=17 * 2**30)


_HLO = """HloModule m
ENTRY %main {
  %p = f32[64,64]{1,0} parameter(0)
  %all-gather.1 = f32[256,64]{1,0} all-gather(%p), channel_id=1, replica_groups=mesh['axis_0'=2,'axis_1'=2] {'axis_1'}, dimensions={0}, metadata={op_name="jit(g)/model.q_proj/aten::mm/dot_general"}
  %reduce-scatter.2 = f32[16,64]{1,0} reduce-scatter(%p), channel_id=2, replica_groups={{0,1,2,3}}, dimensions={0}
  %all-reduce.3 = (f32[8]{0}, f32[32,64]{1,0}) all-reduce(%a, %b), channel_id=3, replica_groups=[2,2]<=[2,2]T(1,0)
  %all-gather-start.4 = (f32[8,64]{1,0}, f32[16,64]{1,0}) all-gather-start(%p), channel_id=4, replica_groups=[2,2]<=[4]
  %send.5 = (f32[2,128]{1,0}, u32[], token[]) send(%x, %t), channel_id=5, is_host_transfer=true, frontend_attributes={_xla_host_transfer_handler_name="xla_megascale_runtime"}
}
"""  # noqa: E501


def test_collectives_are_read_from_every_replica_group_spelling():
    from tpu_inductor.tpu import hlo

    ops = hlo.collectives(_HLO, 4)
    got = [(c.kind, c.bytes, c.group) for c in ops]
    assert got == [
        ("all-gather", 256 * 64 * 4, (0, 1)),  # mesh axes: axis_1 varies fastest
        ("reduce-scatter", 16 * 64 * 4 * 4, (0, 1, 2, 3)),  # the input: result x group
        ("all-reduce", (8 + 32 * 64) * 4, (0, 2)),  # a combined all-reduce: every operand
        ("all-gather", 16 * 64 * 4, (0, 1)),  # async: the result half of its tuple
        ("dcn-send", 2 * 128 * 4, ()),
    ]
    assert ops[0].scope == "model.q_proj/aten::mm"
    # ring model: all-gather (n-1)/n of its bytes, all-reduce twice that
    assert ops[0].ring_bytes() == 256 * 64 * 4 / 2
    assert ops[2].ring_bytes() == 2 * (8 + 32 * 64) * 4 / 2


def test_bound_says_ici_when_collectives_dominate():
    from jax.sharding import Mesh

    from tpu_inductor.tpu import hlo, programs

    chip = targets.CHIPS["v5e"]

    class Dev:  # a device as a mesh holds it: only its slice matters here
        def __init__(self, i):
            self.id, self.slice_index = i, 0

    devices = tuple(Dev(i) for i in range(4))
    target = targets.Target(name="v5e:2x2", topology="v5e:2x2", chip=chip, devices=devices)
    mesh = Mesh(np.array(devices, dtype=object).reshape(2, 2), ("data", "model"))
    op = hlo.Collective(
        name="ar", kind="all-reduce", bytes=2**30, group=(0, 1), scope="", source=None
    )
    (comm,) = programs.place_collectives([op], target, mesh)
    assert (comm.axes, comm.link) == ("model", "ICI")
    assert comm.seconds == pytest.approx(2 * 2**30 * 0.5 / 400e9)
    program = programs.Program(
        name="g#0",
        graph="g",
        kind="forward",
        role="forward",
        target=target,
        chips=4,
        inputs=[],
        donated_bytes=0,
        error=None,
        compile_seconds=0.0,
    )
    program.hbm_traffic = 1e6
    program.comms = [comm]
    assert program.bound == "ICI" and program.roofline_seconds == comm.seconds


def test_tensor_keys_outlive_reused_ids():
    """A step's report names tensors by ``programs.tensor_key``, not ``id``: a tensor made after
    another died often gets its id (CPython), and the report then took the optimizer's moments
    for the backward's freed arguments (its step peak 8 MiB short in the README sample)."""
    from tpu_inductor.tpu.programs import tensor_key

    a = torch.empty(4, device="meta")
    key_a, id_a = tensor_key(a), id(a)
    assert tensor_key(a) == key_a  # the same tensor, the same key
    del a
    for _ in range(1000):  # CPython hands the freed id on: find a tensor that got it
        b = torch.empty(4, device="meta")
        if id(b) == id_a:
            break
    else:
        pytest.skip("no id reused in 1000 tries")
    assert tensor_key(b) != key_a


class LlamaLike(torch.nn.Module):
    pass


@pytest.mark.parametrize(
    "stack, expected",
    [
        # compile_step over a closure's model, its layer's forward wrapped (checkpointing)
        (
            [
                ("L['fn'].__closure__[1].cell_contents", LlamaLike),
                (
                    "L['fn'].__closure__[1].cell_contents.model.layers[0].forward"
                    ".__kwdefaults__['_inner'].__self__.self_attn",
                    torch.nn.Module,
                ),
            ],
            "model.layers.0.self_attn",
        ),
        # compile_step over a global model variable: the variable's name is not a module
        (
            [
                ("G['__import___main__'].model", LlamaLike),
                ("G['__import___main__'].model.model.layers[0].mlp", torch.nn.Module),
            ],
            "model.layers.0.mlp",
        ),
        # torch.compile(model): its own root is L['args'][0] (or L['self'])
        ([("L['args'][0].lm_head", torch.nn.Linear)], "lm_head"),
        ([("L['args'][0].model.layers[0].__dict__['mlp']", torch.nn.Module)], "model.layers.0.mlp"),
        ([("L['self'].blocks[0].proj", torch.nn.Linear)], "blocks.0.proj"),
        ([("L['fn'].__closure__[1].cell_contents", LlamaLike)], "LlamaLike"),
    ],
)
def test_module_paths_are_the_models_named_modules(stack, expected):
    """Ops are named as the model's ``named_modules()`` names its modules, whatever chain of
    variables and wrappers Dynamo recorded on the way there."""
    import types

    from tpu_inductor.core import sources

    node = types.SimpleNamespace(meta={"nn_module_stack": {str(i): e for i, e in enumerate(stack)}})
    assert sources.module_path(node) == expected

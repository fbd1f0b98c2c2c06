"""TPU targets (targets.py) and the provenance every lowered op carries (sources.provenance).

These run in the default suite, without libtpu: target names are parsed and checked without it,
and the module path and source line of each op are visible in the StableHLO dumped on the CPU.
Compiling for a target is tested in tests/tpu/ (needs libtpu).
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

import tpu_inductor
from tpu_inductor import targets
from tpu_inductor.errors import InvalidOptionError

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
    ],
)
def test_target_names(name, generation, grid):
    assert targets.parse_name(name) == (generation, grid)


@pytest.mark.parametrize(
    "name, says",
    [
        ("v9z:2x2", "Generations: v4, v5e, v5p, v6e"),
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

"""The op table has one way in (``registry.install``): ATen ops, higher-order ops and wrapper
ops are rows of it, and a wrapper's row says where the op it wraps is."""

from __future__ import annotations

import pytest
import torch
import torch.fx as fx

from tpu_inductor.lowering.lower import is_lowerable, why_unsupported
from tpu_inductor.lowering.lowerings import LOWERINGS
from tpu_inductor.lowering.lowerings.registry import Lowering, install, lowers, uninstall
from tpu_inductor.lowering.lowerings.wrappers import RUN_AND_SAVE_RNG, RUN_WITH_RNG, WITH_EFFECTS

aten = torch.ops.aten


def test_wrapper_ops_are_rows_that_name_the_wrapped_position():
    assert LOWERINGS[WITH_EFFECTS].wraps == 1
    assert LOWERINGS[RUN_AND_SAVE_RNG].wraps == 0
    assert LOWERINGS[RUN_WITH_RNG].wraps == 1


def test_higher_order_ops_are_rows():
    from torch._higher_order_ops.flex_attention import flex_attention, flex_attention_backward

    assert flex_attention in LOWERINGS
    assert flex_attention_backward in LOWERINGS


def test_registering_an_op_twice_raises():
    with pytest.raises(ValueError, match="registered twice"):
        lowers(aten.add.Tensor)(lambda ctx, a, b: a + b)


def test_install_and_uninstall_are_the_way_in_and_out():
    def mine(x):
        return x

    install(Lowering(op=mine, fn=lambda ctx, x: x))
    try:
        assert LOWERINGS[mine].fn is not None
        with pytest.raises(ValueError, match="registered twice"):
            install(Lowering(op=mine, fn=lambda ctx, x: x))
    finally:
        uninstall(mine)
    assert mine not in LOWERINGS


def test_lowers_refuses_what_is_no_op():
    with pytest.raises(TypeError, match="lowers expects"):
        lowers(len)(lambda ctx, x: x)


def _run_with_rng_node(wrapped) -> fx.Node:
    graph = fx.Graph()
    state, x = graph.placeholder("state"), graph.placeholder("x")
    return graph.call_function(RUN_WITH_RNG, (state, wrapped, x))


def test_a_wrapper_is_lowerable_when_the_op_it_wraps_is():
    assert is_lowerable(_run_with_rng_node(aten.exp.default))
    unlowered = aten._cudnn_rnn.default
    assert unlowered not in LOWERINGS
    node = _run_with_rng_node(unlowered)
    assert not is_lowerable(node)
    assert why_unsupported(node) == why_unsupported(
        fx.Graph().call_function(unlowered, node.args[2:])
    )

"""``hlo.hbm_bytes``: what a TPU program moves through HBM, against XLA's "bytes accessed"
(compile only, v5e)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import SingleDeviceSharding

from tpu_inductor.tpu import hlo
from tpu_inductor.tpu.targets import tpu_target

pytestmark = pytest.mark.tpu_compile


def _compiled(fn, *shapes, dtype=jnp.float32):
    device = tpu_target("v5e").devices[0]
    args = [jax.ShapeDtypeStruct(s, dtype, sharding=SingleDeviceSharding(device)) for s in shapes]
    compiled = jax.jit(fn).lower(*args).compile()
    cost = compiled.cost_analysis()
    return compiled.as_text(), (cost[0] if isinstance(cost, list) else cost)["bytes accessed"]


def test_nothing_on_chip_counts_what_cost_analysis_counts():
    """Arrays of 256 MiB do not fit in on-chip memory: both count 3 arrays of an add."""
    n = 1 << 26
    text, accessed = _compiled(lambda a, b: a + b, (n,), (n,))
    assert hlo.hbm_bytes(text) == accessed == 3 * 4 * n


def test_a_value_kept_on_chip_is_not_hbm_traffic():
    """An MLP's hidden activation stays on chip: HBM sees its inputs and output once (67.1 MB),
    "bytes accessed" counts the prefetched weights and the activation again (335.6 MB)."""
    x, w1, w2 = (4096, 1024), (1024, 4096), (4096, 1024)
    text, accessed = _compiled(lambda x, a, b: jax.nn.gelu(x @ a) @ b, x, w1, w2)
    inputs_and_output = 4 * 4096 * 1024 * 4
    assert hlo.hbm_bytes(text) == inputs_and_output
    assert accessed > 4 * inputs_and_output

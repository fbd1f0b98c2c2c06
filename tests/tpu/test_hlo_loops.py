"""Loop bodies counted once per run: ``hlo_loops.computation_counts`` (a while body's trip
count, from ``known_trip_count`` or the loop condition's ``i < N``), the collectives of a body
listed once per trip, and a ``lax.scan`` body's matmul FLOPs counted ``length`` times."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from tpu_inductor.tpu import hlo, hlo_loops

# the shape of libtpu's optimized HLO for scan_layers' loop (libtpu 0.0.42.1: no
# known_trip_count; the condition compares the counter against the scan's length)
MODULE = """HloModule jit_step

%add (a: f32[], b: f32[]) -> f32[] {
  ROOT %s = f32[] add(%a, %b)
}

%cond (p: (u32[], f32[8])) -> pred[] {
  %c0 = s32[]{:T(128)} constant(0)
  %c32 = u32[]{:T(128)} constant(32)
  %i = u32[]{:T(128)} get-tuple-element(%p), index=0
  %lt.1 = pred[] compare(%i, %c32), direction=LT
  %lt.2 = pred[] compare(%i, %c0), direction=EQ
  ROOT %o = pred[] or(%lt.1, %lt.2)
}

%body (p: (u32[], f32[8])) -> (u32[], f32[8]) {
  %x = f32[8]{0} get-tuple-element(%p), index=1
  %all-reduce.1 = f32[8]{0} all-reduce(%x), replica_groups={{0,1}}, to_apply=%add
  ROOT %t = (u32[], f32[8]) tuple(%i, %all-reduce.1)
}

ENTRY %main (a: f32[8]) -> f32[8] {
  %all-reduce.0 = f32[8]{0} all-reduce(%a), replica_groups={{0,1}}, to_apply=%add
  %w = (u32[], f32[8]) while(%init), condition=%cond, body=%body
  ROOT %r = f32[8]{0} get-tuple-element(%w), index=1
}
"""


def test_while_body_counts_its_trip_count():
    counts = hlo_loops.computation_counts(MODULE)
    assert counts["main"] == 1 and counts["body"] == 32 and counts["add"] == 32


def test_collectives_in_a_loop_are_listed_once_per_trip():
    ops = hlo.collectives(MODULE, 2)
    assert [o.name for o in ops].count("all-reduce.0") == 1
    assert [o.name for o in ops].count("all-reduce.1") == 32
    assert sum(o.bytes for o in ops) == 33 * 8 * 4


def test_known_trip_count_is_used_when_given():
    text = MODULE.replace("body=%body", 'body=%body, backend_config={"known_trip_count":{"n":"5"}}')
    assert hlo_loops.computation_counts(text)["body"] == 5


def test_scan_matmul_flops_count_every_layer():
    def step(ws, x):
        return jax.lax.scan(lambda c, w: (c @ w, None), x, ws)[0]

    ws, x = jnp.ones((6, 16, 16)), jnp.ones((4, 16))
    flops = hlo.matmul_flops(jax.make_jaxpr(step)(ws, x))
    assert sum(flops.values()) == 6 * 2 * 4 * 16 * 16

    def unrolled(ws, x):
        for i in range(6):
            x = x @ ws[i]
        return x

    assert hlo.matmul_flops(jax.make_jaxpr(unrolled)(ws, x)) == flops


def test_ragged_dot_matmul_flops_every_form():
    """An MoE's grouped GEMM (``ragged_mm``'s three ragged forms) counts the FLOPs of its
    per-group products, as the same products written as one dense matmul per group do (the
    ragged-K form, a weight gradient, contracts each group's share of K only)."""
    from tpu_inductor.lowering.lowerings.grouped import ragged_mm

    offs = jnp.array([8, 8, 24, 32])  # groups of 8, 0, 16, 8 rows
    forms = {  # (a, b) -> the dense products' FLOPs: 2 x M x K x N over the groups
        "ragged M": (jnp.ones((32, 16), jnp.bfloat16), jnp.ones((4, 16, 24), jnp.bfloat16)),
        "ragged K": (jnp.ones((16, 32)), jnp.ones((32, 24))),
        "ragged N": (jnp.ones((4, 16, 24)), jnp.ones((24, 32))),
    }
    for name, (a, b) in forms.items():
        jaxpr = jax.make_jaxpr(lambda a, b: ragged_mm(a, b, offs, None, jnp.float32))(a, b)
        flops = hlo.matmul_flops(jaxpr)
        assert sum(flops.values()) == 2 * 32 * 16 * 24, name
        assert list(flops) == [("bf16" if a.dtype == jnp.bfloat16 else "f32", "default")], name


def test_hbm_bytes_counts_only_memory_space_zero():
    """An op's operands and results in HBM; a prefetch's HBM side once; on-chip (``S(1)``)
    values and the async ops' ``done`` halves not at all."""
    from tpu_inductor.tpu import hlo

    text = """HloModule m

ENTRY %main (p0: f32[1024], p1: f32[2048]) -> f32[1024] {
  %p0 = f32[1024]{0} parameter(0)
  %p1 = f32[2048]{0} parameter(1)
  %copy-start = (f32[1024]{0:S(1)}, f32[1024]{0}, u32[]{:S(2)}) copy-start(%p0)
  %copy-done = f32[1024]{0:S(1)} copy-done(%copy-start)
  %slice-start = ((f32[2048]{0}), f32[1024]{0:S(1)}, s32[]{:S(2)}) slice-start(%p1)
  %slice-done = f32[1024]{0:S(1)} slice-done(%slice-start)
  %fusion = f32[1024]{0:S(1)} fusion(%copy-done, %slice-done), kind=kLoop, calls=%f
  ROOT %fusion.1 = f32[1024]{0} fusion(%fusion), kind=kLoop, calls=%g
}
"""
    # prefetch of p0 (4 KiB read) + slice of p1 (4 KiB read) + fusion.1's result (4 KiB)
    assert hlo.hbm_bytes(text) == 3 * 4096


_LOOP = """HloModule m

%body (s: (s32[], f32[4,1024])) -> (s32[], f32[4,1024]) {
  %s = (s32[], f32[4,1024]{1,0}) parameter(0)
  %i = s32[] get-tuple-element(%s), index=0
  %x = f32[4,1024]{1,0} get-tuple-element(%s), index=1
  %one = s32[] constant(1)
  %next = s32[] add(%i, %one), backend_config={"estimated_cycles":"10"}
  %y = f32[4,1024]{1,0} fusion(%x), kind=kLoop, calls=%f, backend_config={"estimated_cycles":"100"}
  ROOT %t = (s32[], f32[4,1024]{1,0}) tuple(%next, %y)
}

%cond (s: (s32[], f32[4,1024])) -> pred[] {
  %s = (s32[], f32[4,1024]{1,0}) parameter(0)
  %i = s32[] get-tuple-element(%s), index=0
  %n = s32[] constant(4)
  ROOT %lt = pred[] compare(%i, %n), direction=LT
}

%f (a: f32[4,1024]) -> f32[4,1024] {
  %a = f32[4,1024]{1,0} parameter(0)
  ROOT %m = f32[4,1024]{1,0} multiply(%a, %a), backend_config={"estimated_cycles":"999"}
}

ENTRY %main (p: f32[4,1024]) -> f32[4,1024] {
  %p = f32[4,1024]{1,0} parameter(0)
  %zero = s32[] constant(0)
  %init = (s32[], f32[4,1024]{1,0}) tuple(%zero, %p)
  %w = (s32[], f32[4,1024]{1,0}) while(%init), condition=%cond, body=%body
  ROOT %out = f32[4,1024]{1,0} get-tuple-element(%w), index=1
}
"""


def test_a_loop_body_counts_once_per_trip_and_its_state_not_at_all():
    """HBM bytes, bytes moved and the compiler's cycles of a ``while``: its body's ops once per
    trip (4) and its condition's once more, the loop's own state (passed by reference) not at
    all, a fusion's inside not again (it is the fusion's)."""
    from tpu_inductor.tpu import hlo

    fusion = 2 * 4 * 1024 * 4  # its operand and result, f32[4,1024]
    add = 3 * 4  # two s32 operands and a result
    compare = 4 + 4 + 1  # the condition's, run once more than the body
    assert hlo.hbm_bytes(_LOOP) == 4 * (fusion + add) + 5 * compare
    assert hlo.bytes_moved(_LOOP) == hlo.hbm_bytes(_LOOP)  # nothing on chip here
    assert hlo.estimated_cycles(_LOOP) == 4 * (100 + 10)


_STACK = """HloModule m

%f (p0: f32[8,1024], p1: s32[], p2: f32[8,1024]) -> f32[8,1024] {
  %p0 = f32[8,1024]{1,0} parameter(0)
  %p1 = s32[] parameter(1)
  %p2 = f32[8,1024]{1,0} parameter(2)
  %zero = s32[] constant(0)
  %row = f32[1,1024]{1,0} dynamic-slice(%p2, %p1, %zero), dynamic_slice_sizes={1,1024}
  %twice = f32[1,1024]{1,0} add(%row, %row)
  ROOT %dus = f32[8,1024]{1,0} dynamic-update-slice(%p0, %twice, %p1, %zero)
}

ENTRY %main (a: f32[8,1024], b: f32[8,1024], i: s32[]) -> f32[8,1024] {
  %a = f32[8,1024]{1,0} parameter(0)
  %b = f32[8,1024]{1,0} parameter(1)
  %i = s32[] parameter(2)
  ROOT %y = f32[8,1024]{1,0} fusion(%a, %i, %b), kind=kLoop, calls=%f
}
"""


def test_a_slice_reads_the_slice_and_an_update_in_place_writes_the_update():
    """One layer of an ``[8, 1024]`` stack read and one written in place (what a scan over
    layers does each trip): a row each way, not the stacks."""
    from tpu_inductor.tpu import hlo

    row = 1024 * 4
    assert hlo.hbm_bytes(_STACK) == row + 4 + row  # the row read, the index, the row written

"""Repeated blocks lowered once: a run of identical layers becomes one ``jax.lax.scan``.

A transformer's ``model.layers.0 .. N-1`` trace to N copies of the same ATen ops on different
weights; unrolled, XLA compiles every copy again, so compile time grows with depth. With
``options={"scan_layers": True}`` :func:`plan_scans` finds, in the graph ``lower.py`` walks,
runs of consecutive blocks that are the same computation and lowers each run once, as the body
of a ``lax.scan``:

- a *block* is the contiguous nodes whose module path (``nn_module_stack``, in a backward graph
  ``fwd_nn_module_stack``) is under the same ``<prefix>.<i>`` (the outermost numbered module:
  ``model.layers.3``), plus the nodes without a module path that follow them (AOTAutograd's own
  ops, such as gradient sums);
- blocks ``i`` and ``i+1`` match when they have the same ops in the same order, with the same
  non-tensor arguments and the same output shapes and dtypes, and read the same things: a
  block's own earlier node, the previous block (the *carry*: the hidden state, its gradient),
  the same outside value in every block (a *constant*: rotary tables, masks) or a different
  outside value per block of one shape (the *per-layer inputs*: weights, saved activations,
  stacked with ``jnp.stack`` as the scan's ``xs``);
- a block's values used after the run (saved activations, weight gradients, a KV cache) come
  out as the scan's stacked ``ys`` and are sliced apart; the last block's carry is the result.

compile_step's optimizer update of those layers (no module path) is scanned by
:mod:`tpu_inductor.lowering.scan_updates`, called at the end of :func:`plan_scans` (``then``).

Anything else stays unrolled, with the reason logged at DEBUG on
``tpu_inductor.lowering.scan_layers``:
a block with a random op (each layer's draw number differs), an in-place input update, an
effect token or symbolic-size arithmetic; a graph with symbolic sizes; a block that reads a
value two blocks back. The body is traced from the first block of the run, so the program's
op metadata names that block's module path (``model.layers.0.mlp``) for every layer.

Cost: ``jnp.stack`` copies the per-layer inputs once per call (the weights, in a training
step; the saved activations, in a backward), and ``ys`` are sliced apart (a copy each); an
update scan writes its new values into its input stacks instead of stacked ``ys``. Under a
sharding plan the stacks and the carry keep the plan's placements (:class:`Placements`). The
docs/architecture.md gives the compile times and bytes (measured: ``python -m
benchmarks.scan_layers``).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import logging
import re
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import torch
import torch.fx as fx
from jax import lax
from torch._subclasses.fake_tensor import unset_fake_temporarily
from torch.fx.node import map_arg

from tpu_inductor.core import sources

log = logging.getLogger("tpu_inductor.lowering.scan_layers")

# The first numbered module in a path: "L['self'].model.layers.3.mlp" -> ("...layers", 3).
_NUMBERED = re.compile(r"^(.*?[A-Za-z_]\w*)\.(\d+)(?=\.|$)")
_OUTSIDE = ("", -1)  # a node with a module path that is in no numbered module

# The placements of the inputs of the graph being traced, and the plan's batch sharding: set
# by the runtime (``runtime/call.py``) around ``jax.jit(...).trace`` under a sharding plan.
# Inside the trace a parameter's placement is invisible (an ``Auto`` mesh axis leaves it out of
# the array's type), so a scan would leave the sharding of its stacked weights and of its carry
# to XLA's propagation through the ``while`` loop (see :class:`Placements`).
_PLAN: contextvars.ContextVar[tuple | None] = contextvars.ContextVar(
    "tpu_inductor_scan_plan", default=None
)


@contextlib.contextmanager
def input_shardings(shardings: Sequence, batch: Any = None) -> Iterator[None]:
    """While tracing a graph under a sharding plan: its inputs' shardings (one per input,
    ``None`` for none) and the plan's batch sharding (``Plan.inputs`` on its mesh), which the
    graph's scans keep (:class:`Placements`)."""
    token = _PLAN.set((tuple(shardings), batch))
    try:
        yield
    finally:
        _PLAN.reset(token)


@dataclasses.dataclass
class Placements:
    """Where a sharding plan puts what a scan reads (empty without a plan).

    Attributes:
        of: ``id(input value) -> NamedSharding`` of the traced graph's inputs placed over a
            mesh of more than one device (parameters, optimizer state: the plan's placement).
        batch: the plan's batch sharding (``PartitionSpec("data")`` on its mesh), or ``None``.

    Why: without these constraints XLA may shard the scanned layers' hidden state on its
    hidden dimension instead of the batch, with all-to-alls between layers and more HBM traffic
    than the unrolled step (``tests/tpu/test_scan_sharding.py`` checks it).
    """

    of: dict
    batch: Any = None

    @classmethod
    def of_inputs(cls, inputs: Sequence) -> Placements:
        """The placements :func:`input_shardings` set for the graph traced with ``inputs``."""
        plan = _PLAN.get()
        if plan is None or len(plan[0]) != len(inputs):
            return cls({})
        shardings, batch = plan
        of = {
            id(v): s
            for v, s in zip(inputs, shardings, strict=True)
            if isinstance(s, jax.sharding.NamedSharding) and s.mesh.size > 1
        }
        if not isinstance(batch, jax.sharding.NamedSharding) or batch.mesh.size == 1:
            batch = None
        return cls(of, batch)

    def stack(self, stacked, values: list):
        """``stacked`` (``jnp.stack(values)``) constrained to the values' own placement on its
        per-layer axes, its layer axis unsharded, when every value has the same one (fsdp: each
        layer's weight sharded on its first dimension)."""
        placed = {self.of.get(id(v)) for v in values}
        if len(placed) != 1 or None in placed:
            return stacked
        (sharding,) = placed
        spec = (None, *sharding.spec)
        spec += (None,) * (stacked.ndim - len(spec))
        return _constrain(stacked, sharding.mesh, spec)

    def carry(self, value):
        """A scan's carry (the hidden state, its gradient) sharded as the plan shards a batch:
        on its first dimension when that divides, the rule ``Plan.input_sharding`` applies to
        every unplaced input."""
        if self.batch is None or getattr(value, "ndim", 0) < 2:
            return value
        spec = tuple(self.batch.spec)
        if not spec or spec[0] is None:
            return value
        axes = spec[0] if isinstance(spec[0], tuple) else (spec[0],)
        size = 1
        for a in axes:
            size *= self.batch.mesh.shape[a]
        if value.shape[0] % size:
            return value
        return _constrain(value, self.batch.mesh, (spec[0],) + (None,) * (value.ndim - 1))


def _constrain(value, mesh, spec: tuple):
    sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(*spec))
    return jax.lax.with_sharding_constraint(value, sharding)


def layer_of(node: fx.Node) -> tuple[str, int] | None:
    """The numbered module a node belongs to (``("model.layers", 3)``), :data:`_OUTSIDE` for a
    node in no numbered module, ``None`` for a node with no module path at all."""
    stack = node.meta.get("nn_module_stack") or node.meta.get("fwd_nn_module_stack")
    if not stack:
        return None
    for entry in stack.values():
        path = entry[0] if isinstance(entry, tuple | list) else str(entry)
        m = _NUMBERED.match(str(path))
        if m:
            return m.group(1), int(m.group(2))
    return _OUTSIDE


def _labels(nodes: list[fx.Node], shared: set) -> dict:
    """Each node's numbered module (:func:`layer_of`). The backward that ``compile_step``
    traces (``autograd.grad`` inside the graph: nodes marked ``autograd_backward``) carries no
    module path; its nodes take the layer of the forward values they read (a shared value
    excepted), else of the backward values they read when those agree (the open block's
    when it is one of them), so each layer's
    gradient ops line up as a block as they do in AOTAutograd's own backward graph."""
    labels: dict = {}
    current = None
    for n in nodes:
        lab = layer_of(n)
        if lab is None and n.meta.get("autograd_backward"):
            fwd, bwd = set(), set()
            for a in n.all_input_nodes:
                if a in shared:
                    continue
                if a.meta.get("autograd_backward"):
                    bwd.add(labels.get(a))
                else:
                    fwd.add(layer_of(a))
            layers = [{x for x in fwd if x not in (None, _OUTSIDE)}, bwd - {None, _OUTSIDE}]
            if current in layers[0] | layers[1]:
                lab = current  # a node between two layers stays in the open block
            else:
                lab = next((ls.pop() for ls in layers if len(ls) == 1), None)
            if lab is None and not any(layers) and _OUTSIDE in fwd | bwd:
                lab = _OUTSIDE
        labels[n] = lab
        if lab is not None and n not in shared:
            current = lab
    return labels


def _runs(nodes: list[fx.Node], shared: set, labels: dict) -> list[list[list[fx.Node]]]:
    """Runs of consecutive blocks of one numbered module list (each block a list of nodes)."""
    runs: list[list[list[fx.Node]]] = []
    run: list[list[fx.Node]] | None = None
    seen: list[tuple[str, int]] = []

    def close():
        nonlocal run
        if run is not None and len(run) >= 2:
            runs.append(run)
        run = None
        seen.clear()

    for n in nodes:
        if n in shared:
            continue
        if n.op not in ("call_function", "get_attr"):
            close()
            continue
        lab = labels[n]
        if lab is None:  # no module path: AOTAutograd's own op, part of the open block
            if run is not None:
                run[-1].append(n)
            continue
        if lab == _OUTSIDE:
            close()
            continue
        if run is not None and lab == seen[-1]:
            run[-1].append(n)
        elif run is not None and lab[0] == seen[-1][0] and lab not in seen:
            run.append([n])
            seen.append(lab)
        else:
            close()
            run, seen[:] = [[n]], [lab]
    close()
    return runs


def _shared(nodes: list[fx.Node]) -> set:
    """Nodes computed from outside values only (inputs, nodes of no numbered module) and read
    by several layers: the rotary tables' ``unsqueeze`` that Dynamo's CSE left in the first
    layer, the ``sin``/``cos`` the min-cut partitioner recomputes where the backward first
    needs them. They are in no block: the main walk lowers them before the scan reads them."""
    outside_only: set = set()
    for n in nodes:
        if n.op in ("call_function", "get_attr") and all(
            a.op == "placeholder" or a in outside_only or layer_of(a) == _OUTSIDE
            for a in n.all_input_nodes
        ):
            outside_only.add(n)
    shared: set = set()
    for n in reversed(nodes):
        if n not in outside_only:
            continue
        layers = {layer_of(u) for u in n.users} - {None, _OUTSIDE}
        if len(layers) >= 2 or any(u in shared for u in n.users):
            shared.add(n)
    return shared


class _Const:
    """A ``get_attr`` tensor compared by value (each block's constant is its own attribute)."""

    def __init__(self, value):
        self.value = value

    def __eq__(self, other):
        a, b = self.value, getattr(other, "value", None)
        if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
            if a.dtype != b.dtype or a.shape != b.shape:
                return False
            with unset_fake_temporarily():  # lower_graph may run under AOTAutograd's fake mode
                return bool(torch.equal(a, b))
        return type(a) is type(b) and a == b


def _freeze(a) -> Any:
    """Arguments made comparable with ``==`` (a tensor argument compares by identity)."""
    if isinstance(a, list | tuple):
        return (type(a).__name__, tuple(_freeze(x) for x in a))
    if isinstance(a, dict):
        return ("dict", tuple((k, _freeze(v)) for k, v in a.items()))
    if isinstance(a, slice):
        return ("slice", _freeze(a.start), _freeze(a.stop), _freeze(a.step))
    if isinstance(a, torch.Tensor):
        return ("tensor", id(a))
    if isinstance(a, torch.SymInt | torch.SymFloat | torch.SymBool):
        return ("sym", str(a))  # symbolic values do not hash; their expressions compare
    if isinstance(a, float) and a != a:
        return ("nan",)
    return a


def _spec(val) -> Any:
    """A value's shape and dtype (what must agree block to block)."""
    if isinstance(val, torch.Tensor):
        return ("T", tuple(_freeze(d) for d in val.shape), val.dtype)
    if isinstance(val, list | tuple):
        return tuple(_spec(v) for v in val)
    return ("V", type(val).__name__, _freeze(val))


def _describe(block: list[fx.Node], prev: list[fx.Node] | None, gm_attrs) -> tuple[list, list]:
    """A block's structure (ops, arguments with reads of its own nodes as positions, specs) and
    its other reads, leaf by leaf in ``map_arg`` order: ``("prev", pos)`` for the previous
    block's node at ``pos``, ``("ext", node)`` for anything else."""
    pos = {n: i for i, n in enumerate(block)}
    prev_pos = {n: i for i, n in enumerate(prev)} if prev else {}
    struct, refs = [], []
    for p, n in enumerate(block):
        leaves: list[fx.Node] = []

        def sub(a, p=p, leaves=leaves):
            if a in pos and pos[a] < p:
                return ("local", pos[a])
            leaves.append(a)
            return ("slot",)

        args = _freeze(map_arg((n.args, dict(n.kwargs)), sub))
        target = _Const(gm_attrs(n.target)) if n.op == "get_attr" else n.target
        struct.append((n.op, target, args, _spec(n.meta.get("val"))))
        refs += [("prev", prev_pos[a]) if a in prev_pos else ("ext", a) for a in leaves]
    return struct, refs


@dataclasses.dataclass(kw_only=True)
class ScanGroup:
    """A run of matching blocks, lowered as one ``lax.scan`` at the run's last node.

    Attributes:
        blocks: the blocks, each a list of nodes; ``blocks[0]`` is traced as the body.
        leaves: per body node, the kind of each non-local argument leaf in ``map_arg`` order:
            ``("const", node)``, ``("xs", k)`` or ``("carry", k)``.
        xs: per scanned input, the node of each block.
        carry: per carry, ``(position in a block, initial node)``.
        ys: positions whose value of every block is an output (stacked by the scan).
        nodes: every node of the run (skipped by the main walk).
    """

    name: str
    blocks: list[list[fx.Node]]
    leaves: list[list[tuple]]
    xs: list[tuple[fx.Node, ...]]
    carry: list[tuple[int, fx.Node]]
    ys: list[int]
    needed: set
    nodes: set = dataclasses.field(default_factory=set)

    def run(self, env: dict, run_node, stacks: dict) -> None:
        """Lower the run as one ``lax.scan``, putting each value used after it into ``env``.

        ``run_node(node, args, kwargs)`` lowers one node (lower.py's dispatch). ``stacks``
        (one per trace) maps each value an earlier scan sliced out of its ``ys`` to the stacked
        array and index, so a later scan that reads them all (the backward reading the
        forward's saved activations) takes the stacked array instead of stacking copies."""
        template = self.blocks[0]
        tpos = {n: i for i, n in enumerate(template)}
        values = [[env[n] for n in nodes] for nodes in self.xs]
        # the backward reads the forward's stacks last layer first: it runs them reversed
        # instead of flipping a copy of each (lax.scan's reverse=True)
        orders = [_order(v, stacks) for v in values]
        reverse = "reverse" in orders and "forward" not in orders and not self._pairs()
        xs = tuple(_stacked(v, stacks, reverse=reverse) for v in values)
        placed = stacks.get("placed") or Placements({})
        init = tuple(placed.carry(env[node]) for _, node in self.carry)

        def body(carry, x):
            carry = tuple(placed.carry(c) for c in carry)
            local: list[Any] = []
            for p, n in enumerate(template):
                kinds = iter(self.leaves[p])

                def sub(a, p=p, kinds=kinds):
                    if a in tpos and tpos[a] < p:
                        return local[tpos[a]]
                    kind, v = next(kinds)
                    return env[v] if kind == "const" else x[v] if kind == "xs" else carry[v]

                args, kwargs = map_arg((n.args, dict(n.kwargs)), sub)
                local.append(run_node(n, args, kwargs))
            new = tuple(
                local[p].astype(c.dtype) for (p, _), c in zip(self.carry, carry, strict=True)
            )
            return new, tuple(local[p] for p in self.ys)

        first = next((n for n in self.blocks[0] if sources.module_path(n)), self.blocks[0][0])
        with sources.provenance(first, self.scope()):
            final, ys = self._scan(body, init, xs, reverse=reverse)
        last = len(self.blocks) - 1
        for k, p in enumerate(self.ys):
            for i, block in enumerate(self.blocks):
                if block[p] in self.needed:
                    at = last - i if reverse else i
                    env[block[p]] = ys[k][at]
                    stacks[id(env[block[p]])] = (ys[k], at, env[block[p]])
        for k, (p, _) in enumerate(self.carry):
            last = self.blocks[-1][p]
            if last in self.needed and last not in env:
                env[last] = final[k]

    def scope(self) -> str:
        """The named scope of the loop in the program: the layers it runs, as the model names
        them (``model.layers.0-31/lax::scan``, ``backward/`` in front for a backward run), so
        the report names the loop by the user's modules."""
        first = next((n for n in self.blocks[0] if sources.module_path(n)), self.blocks[0][0])
        last = self.blocks[-1][self.blocks[0].index(first)]
        backward = "backward/" if first.meta.get("autograd_backward") else ""
        path = sources.run_path(first, last)
        if path is None:  # an optimizer's update of each layer's parameters
            traces = (n.meta.get("stack_trace") or "" for n in self.blocks[0])
            optim = ("/torch/optim/", "/tpu_inductor/dynamo/optimizers.py")
            path = "optimizer" if any(o in t for t in traces for o in optim) else self.name
        return f"{backward}{path}/lax::scan"

    def _pairs(self) -> dict[int, int]:
        """For a scan with no carry (an optimizer update): ``ys`` index -> the ``xs`` index
        whose stack holds it, the first unpaired input of the same per-layer shape and dtype.
        Any pairing computes the same numbers (layer ``i`` reads its inputs before writing
        there) and saves the same bytes (one output stack per new value)."""
        if self.carry:
            return {}
        free = {j: _spec(nodes[0].meta.get("val")) for j, nodes in enumerate(self.xs)}
        pairs = {}
        for k, p in enumerate(self.ys):
            want = _spec(self.blocks[0][p].meta.get("val"))
            j = next((j for j, spec in free.items() if spec == want), None)
            if j is not None:
                pairs[k] = j
                del free[j]
        return pairs

    def _scan(self, body, init, xs, reverse: bool = False):
        """``lax.scan(body, init, xs)``; for an update scan, each new value is written into
        the stack of an input it replaces (``_pairs``: read at layer ``i``, then overwritten
        at ``i``), so the loop holds one stacked copy of the state, not an input and an
        output stack (``scan_updates``' peak; see docs/architecture.md)."""
        pairs = self._pairs()
        if not pairs:
            return lax.scan(body, init, xs, length=len(self.blocks), reverse=reverse)
        order = list(pairs.items())  # (ys index, xs index)
        inner = [j for j in range(len(xs)) if j not in pairs.values()]

        def step(state, x_rest):
            i, bufs, carry = state
            x = [None] * len(xs)
            for (_, j), buf in zip(order, bufs, strict=True):
                x[j] = lax.dynamic_index_in_dim(buf, i, keepdims=False)
            for j, v in zip(inner, x_rest, strict=True):
                x[j] = v
            carry, ys = body(carry, tuple(x))
            bufs = tuple(
                lax.dynamic_update_index_in_dim(buf, ys[k].astype(buf.dtype), i, 0)
                for (k, _), buf in zip(order, bufs, strict=True)
            )
            rest = tuple(y for k, y in enumerate(ys) if k not in pairs)
            return (i + 1, bufs, carry), rest

        start = (jnp.int32(0), tuple(xs[j] for _, j in order), init)
        rest_xs = tuple(xs[j] for j in inner)
        (_, bufs, final), rest = lax.scan(step, start, rest_xs, length=len(self.blocks))
        ys, it, by_k = [], iter(rest), {k: b for (k, _), b in zip(order, bufs, strict=True)}
        for k in range(len(self.ys)):
            ys.append(by_k[k] if k in by_k else next(it))
        return final, tuple(ys)


def _order(values: list, stacks: dict) -> str | None:
    """``"forward"`` or ``"reverse"`` when ``values`` are an earlier scan's stack, all of it, in
    its order or reversed; else ``None``."""
    found = [stacks.get(id(v)) for v in values]
    if not all(f is not None and f[2] is v for f, v in zip(found, values, strict=True)):
        return None
    whole = found[0][0]
    if not all(f[0] is whole for f in found) or len(values) != whole.shape[0]:
        return None
    index = [f[1] for f in found]
    if index == list(range(len(values))):
        return "forward"
    if index == list(range(len(values)))[::-1]:
        return "reverse"
    return None


def _stacked(values: list, stacks: dict, reverse: bool = False):
    """``jnp.stack(values)`` (``values[::-1]`` with ``reverse``), or the array they were sliced
    from when an earlier scan made them (:func:`_order`; flipped only where its order is not
    the one asked for)."""
    order = _order(values, stacks)
    if order is not None:
        whole = stacks[id(values[0])][0]
        return whole if (order == "reverse") == reverse else jnp.flip(whole, 0)
    if reverse:
        values = values[::-1]
    key = ("stack", *map(id, values))  # the same values stacked twice (weights: forward, update)
    hit = stacks.get(key)
    if hit is not None and all(a is b for a, b in zip(hit[1], values, strict=True)):
        return hit[0]
    stacked = jnp.stack(values)
    if "placed" in stacks:  # under a sharding plan: each layer's placement, kept
        stacked = stacks["placed"].stack(stacked, values)
    stacks[key] = (stacked, values)
    return stacked


def _analyze(name, blocks, keep, gm_attrs, *, carry_required=True) -> ScanGroup | str:
    """The scan of a run of blocks of equal structure, or why it can't be one (a run of layers
    must pass a value from block to block; an optimizer update, ``carry_required=False``, not)."""
    window = {n for b in blocks for n in b}
    per_block = [
        _describe(b, blocks[i - 1] if i else None, gm_attrs)[1] for i, b in enumerate(blocks)
    ]
    leaves_flat, xs, carry = [], [], {}
    for col in zip(*per_block, strict=True):
        for kind, v in col:
            if kind == "ext" and v in window:
                return f"a block reads {v.name}, a value of a block before the previous one"
        first_kind, first = col[0]
        if all(c == ("ext", first) for c in col):
            leaves_flat.append(("const", first))
        elif first_kind == "ext" and len({c for c in col[1:]}) == 1 and col[1][0] == "prev":
            p = col[1][1]
            if carry.setdefault(p, first) is not first:
                return f"the carry into position {p} starts from two different values"
            leaves_flat.append(("carry", p))
        elif all(k == "ext" for k, _ in col):
            nodes = tuple(v for _, v in col)
            specs = {_spec(n.meta.get("val")) for n in nodes}
            if len(specs) != 1 or next(iter(specs))[0] != "T":
                return f"per-layer inputs {', '.join(n.name for n in nodes)} differ in shape"
            if nodes not in xs:
                xs.append(nodes)
            leaves_flat.append(("xs", nodes))
        else:
            return "an argument is the previous block's value in some blocks only"
    if not carry and carry_required:
        return "no value flows from one block to the next (not a stack of layers)"
    carry_list = sorted(carry.items())
    carry_index = {p: k for k, (p, _) in enumerate(carry_list)}
    for p, init in carry_list:
        want = _spec(blocks[0][p].meta.get("val"))
        if want[0] != "T" or _spec(init.meta.get("val")) != want:
            return f"the carry {init.name} -> {blocks[0][p].name} changes shape or dtype"
    needed, ys = set(), []
    for p in range(len(blocks[0])):
        used = [b[p] for b in blocks if b[p] in keep or any(u not in window for u in b[p].users)]
        if not used:
            continue
        needed.update(used)
        if used == [blocks[-1][p]] and p in carry_index:
            continue  # the final carry
        if _spec(blocks[0][p].meta.get("val"))[0] != "T":
            return f"{blocks[0][p].name}, used after the run, is not a tensor"
        ys.append(p)
    leaves, it = [], iter(leaves_flat)
    for n in blocks[0]:
        count = 0
        pos = {m: i for i, m in enumerate(blocks[0])}

        def tally(a, n=n, pos=pos):
            nonlocal count
            if not (a in pos and pos[a] < pos[n]):
                count += 1
            return a

        map_arg((n.args, dict(n.kwargs)), tally)
        row = []
        for _ in range(count):
            kind, v = next(it)
            if kind == "xs":
                v = xs.index(v)
            elif kind == "carry":
                v = carry_index[v]
            row.append((kind, v))
        leaves.append(row)
    return ScanGroup(
        name=name,
        blocks=blocks,
        leaves=leaves,
        xs=xs,
        carry=carry_list,
        ys=ys,
        needed=needed,
        nodes=window,
    )


def plan_scans(
    nodes: list[fx.Node],
    *,
    keep: set,
    unscannable: set,
    dynamic: bool,
    gm: fx.GraphModule,
    calls: Callable | None = None,
    then: Callable | None = None,
) -> dict[fx.Node, ScanGroup]:
    """Find the runs of matching blocks in a graph and plan one scan for each.

    Args:
        nodes: the graph's nodes, in order.
        keep: nodes the lowered function returns besides through ``users`` (mutation deltas).
        unscannable: nodes that can't be in a scan body (random draws, in-place updates, values
            read while tracing, symbolic-size arithmetic).
        dynamic: whether the graph has symbolic sizes (then nothing is scanned).
        gm: the graph module (for ``get_attr`` constants).
        calls: a planner of scans of runs of subgraph calls, which come first (``lower.py``
            passes :func:`tpu_inductor.lowering.scan_calls.plan_call_scans`).
        then: a planner of further scans given what this one found (``lower.py`` passes
            :func:`tpu_inductor.lowering.scan_updates.plan_update_scans`, which builds on this
            module: taken as an argument so the two don't import each other).

    Returns:
        Each scan by the last node of its run (where it is lowered: every value it reads from
        outside, such as a hoisted constant, comes before that node).
    """
    if dynamic:
        log.debug("scan_layers: a graph with symbolic sizes stays unrolled")
        return {}

    def gm_attrs(target):
        return getattr(gm, target)

    all_nodes = nodes
    groups: dict[fx.Node, ScanGroup] = calls(nodes, gm, keep, unscannable) if calls else {}
    called = {n for g in groups.values() for n in g.nodes}
    nodes = [n for n in nodes if n not in called]
    shared = _shared(nodes)
    labels = _labels(all_nodes, shared)  # a call of a layer carries its module path too
    for run in _runs(nodes, shared, labels):
        name = "{}.{}..".format(*labels[run[0][0]])
        s = 0
        while s < len(run) - 1:
            members, j = [run[s]], s + 1
            if any(n in unscannable for n in run[s]):
                log.debug("scan_layers: %s stays unrolled (a random, in-place or size op)", name)
                s += 1
                continue
            extra = len(run[s]) - len(run[s + 1])
            if extra > 0:  # ops of the model's tail at the start of the backward's first block
                head = run[s][extra:]
                if _describe(head, None, gm_attrs)[0] == _describe(run[s + 1], head, gm_attrs)[0]:
                    run[s] = head
            members = [run[s]]
            tmpl = _describe(run[s], None, gm_attrs)[0]
            while j < len(run):
                cand = run[j]
                cut = len(cand) > len(run[s])
                if cut and all(labels[n] is None for n in cand[len(run[s]) :]):
                    cand = cand[: len(run[s])]  # AOTAutograd's ops after the run's last block
                else:
                    cut = False
                if any(n in unscannable for n in cand):
                    break
                if _describe(cand, members[-1], gm_attrs)[0] != tmpl:
                    break
                members.append(cand)
                j += 1
                if cut:
                    break
            if len(members) >= 2:
                group = _analyze(name, members, keep, gm_attrs)
                if isinstance(group, str):
                    log.debug("scan_layers: %s stays unrolled: %s", name, group)
                else:
                    groups[members[-1][-1]] = group  # after everything the scan reads
                    log.info(
                        "scan_layers: %d blocks of %d ops from %s lowered as one lax.scan",
                        len(members),
                        len(members[0]),
                        members[0][0].name,
                    )
            else:
                log.debug("scan_layers: block %d of %s matches no neighbour", s, name)
            s = max(j, s + 1)
    if then is None:
        return groups
    groups.update(
        then(
            all_nodes,
            labels=labels,
            groups=groups,
            unscannable=unscannable,
            keep=keep,
            gm_attrs=gm_attrs,
        )
    )
    return groups

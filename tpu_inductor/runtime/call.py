"""The call: RNG seeds, executables per signature, and :class:`CompiledGraph`, which runs one
graph.

The device and the compiler options are chosen in ``core/devices.py``; how a tensor crosses is
``boundary.py``; what stays on the device (and when a host tensor may use its device copy) is
``residency.py``; every crossing is counted in ``transfers.py``.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import logging
import pathlib
import threading
import time
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
import torch

from tpu_inductor.core import config, hints
from tpu_inductor.core.boundary import (
    EFFECT_TOKEN,
    jax_to_host,
    nbytes,
    quiet_readonly_numpy_warning,
    tensor_to_host,
    tensor_to_jax,
)
from tpu_inductor.core.devices import compile_lowered
from tpu_inductor.core.dtypes import describe_tensor, to_jax_dtype
from tpu_inductor.core.errors import TpuInductorError, raise_failed_assert
from tpu_inductor.core.shapes import strided_index
from tpu_inductor.core.transfers import D2H, H2D, Counter
from tpu_inductor.lowering import mesh_scope
from tpu_inductor.lowering.host_replay import replay
from tpu_inductor.runtime import cache, device_owned
from tpu_inductor.runtime.device_owned import (
    DeviceTensor,
    is_owned,
    lazy_output,
    mark_pending,
    unwrap,
)
from tpu_inductor.runtime.graph_stats import GraphStats
from tpu_inductor.runtime.residency import (
    VALUES,
    StackSlice,
    device_zeros,
    is_all_zeros,
    saved_handle,
    saved_tensors_hooks_active,
    saved_value,
)
from tpu_inductor.runtime.signatures import (
    Zeros,
    fmt_spec,
    python_scalar,
    signature_of,
    without_zeros,
    zero_positions,
    zeros_of,
)
from tpu_inductor.runtime.stacks import member_sharding, stack_arrays

log = logging.getLogger(__name__)  # TORCH_LOGS="+tpu_inductor.runtime.call"


def draw_seed() -> np.ndarray:
    """Two uint32 words drawn from torch's default CPU generator.

    Drawing advances torch's RNG, so ``torch.manual_seed`` makes compiled random ops repeatable
    and successive calls differ, exactly like eager.
    """
    words = torch.randint(0, 2**32, (2,), dtype=torch.int64)
    return words.numpy().astype(np.uint32)


@dataclasses.dataclass(kw_only=True)
class Build:
    """Why and how fast one executable was built (for ``tpu_inductor.report()``)."""

    signature: tuple
    reason: str
    seconds: float
    calls: int = 0  # the graph's calls (hits + misses) when it was built, this one included
    xla_seconds: float = 0.0  # of ``seconds``, XLA's compile (the rest: JAX's trace and lower)


class Executables:
    """One XLA executable per concrete input signature of a lowered graph, LRU-bounded.

    A signature is the (shape, dtype) of every tensor input plus the values of the static
    (Python scalar) inputs, and which tangents are :class:`Zeros`. Dynamic graphs get one
    executable per concrete shape; Dynamo never sees a size change. Thread-safe: each signature
    is compiled once, however many threads ask for it at the same time.
    """

    def __init__(
        self,
        lowered,
        max_entries: int,
        name: str,
        dump_dir: pathlib.Path | None = None,
        lower_seconds: float = 0.0,
        compiler_options: dict | None = None,
        transfers: str = "count",
        donate: Sequence[int] = (),
        plan=None,
        platform: str = "cpu",
    ):
        self.lowered = lowered
        self.platform = platform  # the device kind it compiles for (exports name it)
        # With cache_dir: how an executable is built so that it is kept for later processes
        # (program_store.StoreSlot: exported, saved, compiled from the export); None: directly
        self.store = None
        self.plan = plan
        self.config = config.current()  # the knobs its compile ran with, for each later trace
        self.donated = frozenset(donate)  # input positions whose buffers the executable reuses
        # Under a sharding plan: graph output -> the sharding its updated input keeps.
        self._constraints: dict[int, object] = {}
        self.transfers = Counter(name, transfers)
        self.compiler_options = compiler_options or {}
        self.max_entries = max_entries
        self.name = name
        self.dump_dir = dump_dir
        self.lower_seconds = lower_seconds
        self.entries: collections.OrderedDict[tuple, object] = collections.OrderedDict()
        self.builds: list[Build] = []
        self.stats = GraphStats()  # what report() shows, hints and buckets remember
        self._lock = threading.Lock()
        # The executable's inputs: the graph's, or with stacked state (lowering/packing.py) one
        # per packed slot (a stack stands for its members). Positions below are slots.
        packing = lowered.packing
        tensors = set(lowered.tensor_inputs)
        slots = packing.slots if packing else tuple((i,) for i in range(len(lowered.input_metas)))
        self._slots = slots
        self._static = tuple(s + 1 for s, slot in enumerate(slots) if slot[0] not in tensors)
        self._tensor_pos = tuple(s for s, slot in enumerate(slots) if slot[0] in tensors)
        self._donated_slots = tuple(
            s for s, slot in enumerate(slots) if all(p in self.donated for p in slot)
        )

        self._jitted: dict[tuple, object] = {}  # per set of Zeros slots: jax.jit of the graph

    def _jit(self, zeros: tuple[int, ...] = ()):
        """``jax.jit`` of the lowered graph (a fresh function: JAX's caches of traces, modules and
        executables are keyed weakly on it, so dropping it frees them: ``release``), with the
        slots ``zeros`` taken as :class:`Zeros` (static)."""
        fn = self.lowered.packed

        def traced(seed, *inputs):  # named after the graph: jit(graph3_forward)/... in profiles
            cache.STATS.traces += 1
            if zeros:
                inputs = [jnp.zeros(a.shape, a.dtype) if type(a) is Zeros else a for a in inputs]
            mesh = (self.plan.mesh, self.plan.inputs) if self.plan else ()
            with config.scope(self.config), mesh_scope.tracing_on(*mesh):
                outs = fn(seed, *inputs)
            if self._constraints:
                outs = list(outs)
                for j, where in self._constraints.items():
                    outs[j] = jax.lax.with_sharding_constraint(outs[j], where)
            return outs

        traced.__name__ = traced.__qualname__ = self.name.replace("-", "_")
        # Donation (TPU/GPU only: on CPU a donated input would alias users' memory): inputs the
        # graph overwrites, whose old device value nothing reads after the call.
        return jax.jit(
            traced,
            static_argnums=tuple(sorted((*self._static, *(s + 1 for s in zeros)))),
            donate_argnums=tuple(s + 1 for s in self._donated_slots if s not in zeros),
        )

    def _jitted_for(self, zeros: tuple[int, ...]):
        jitted = self._jitted.get(zeros)
        if jitted is None:
            jitted = self._jitted[zeros] = self._jit(zeros)
        return jitted

    def pack(self, values: list, stack) -> list:
        """Per tensor input -> per tensor slot: the executable's calling convention
        (``stack(members)`` makes a stacked slot's array); unchanged without stacked state."""
        if self.lowered.packing is None:
            return values
        at = dict(zip(self.lowered.tensor_inputs, values, strict=True))
        return [
            at[slot[0]] if len(slot) == 1 else stack([at[p] for p in slot])
            for slot in (self._slots[s] for s in self._tensor_pos)
        ]

    def unpack(self, outs, part) -> list:
        """The executable's results -> ``LoweredGraph.fn``'s (``part(stack, k)`` for member
        ``k`` of a stacked result); unchanged without stacked state."""
        if self.lowered.packing is None:
            return outs
        return self.lowered.packing.unpack(outs, part)

    def release(self) -> None:
        """Drop every compiled executable (rebuilt on next use, reason "evicted earlier")."""
        with self._lock:
            self.entries.clear()
            self._jitted = {}

    def get(self, signature: tuple, seed, arrays: list, statics: list):
        """The executable for ``signature``, compiling it on first use."""
        exe = self.entries.get(signature)
        if exe is not None:
            self.stats.hits += 1
            if len(self.entries) > 1:
                self.entries.move_to_end(signature)
            return exe
        with self._lock:
            exe = self.entries.get(signature)
            if exe is not None:
                return exe
            self.stats.misses += 1
            start = time.perf_counter()
            with compile_progress(self.name, sum(self.lowered.ops.values())):
                if self.store is not None:
                    lowered = None
                    traced, exe, xla = self.store.build(self, signature, seed, arrays, statics)
                else:
                    traced = self.trace(seed, arrays, statics)
                    lowered = traced.lower()
                    xla_start = time.perf_counter()
                    exe = compile_lowered(lowered, self.compiler_options)
                    xla = time.perf_counter() - xla_start
            seconds = time.perf_counter() - start
            reason = self.record_build(signature, traced, lowered, seconds, xla)
            self.entries[signature] = exe
            if len(self.entries) > self.max_entries:
                self.entries.popitem(last=False)
                self.stats.evictions += 1
            log.info(
                "%s: built executable #%d (%s) in %.2fs",
                self.name,
                len(self.builds),
                reason,
                self.builds[-1].seconds,
            )
            hints.after_build(self)
            return exe

    def trace(self, seed, arrays: list, statics: list):
        """``jax.jit(fn).trace`` at one signature: ``arrays`` (arrays, or ``ShapeDtypeStruct``s
        when compiling for a target) for the tensor inputs, ``statics`` for the rest."""
        args = [None] * len(self._slots)
        for pos, a in zip(self._tensor_pos, arrays, strict=True):
            args[pos] = a
        jitted = self._jitted_for(tuple(self._tensor_pos[k] for k in zero_positions(arrays)))
        it = iter(statics)
        for i in range(len(args)):
            if i not in self._tensor_pos:
                args[i] = next(it)
        if self.plan is not None:  # updated inputs keep their placement (sharding.py)
            packing = self.lowered.packing
            slot_of = packing.slot_of() if packing else {i: i for i in range(len(args))}
            result_of = packing.result_of() if packing else None
            self._constraints = {}
            for m in self.lowered.mutations:
                a = args[slot_of[m.input_index]]
                if isinstance(a, jax.Array | jax.ShapeDtypeStruct):
                    r = m.value_index if result_of is None else result_of[m.value_index]
                    self._constraints[r] = a.sharding
            # scan_layers' stacked per-layer weights and state keep their layers' placement
            from tpu_inductor.lowering.scan_layers import input_shardings

            per_input = [None] * len(self.lowered.input_metas)
            for slot, a in zip(self._slots, args, strict=True):
                where = getattr(a, "sharding", None)
                if len(slot) > 1:
                    where = member_sharding(where)
                for p in slot:
                    per_input[p] = where
            batch = jax.sharding.NamedSharding(self.plan.mesh, self.plan.inputs)
            with input_shardings(per_input, batch):
                return jitted.trace(seed, *args)
        return jitted.trace(seed, *args)

    def record_build(
        self, signature: tuple, traced, lowered, seconds: float, xla_seconds: float = 0.0
    ) -> str:
        """Note one executable built (for ``report()`` and ``dump_dir``); returns why."""
        reason = self._reason(signature)
        if self.dump_dir is not None:
            n = len(self.builds)
            (self.dump_dir / f"executable{n}.jaxpr.txt").write_text(str(traced.jaxpr))
            if lowered is None:  # built from an export (cache_dir): lowered the same way
                lowered = traced.lower()
            (self.dump_dir / f"executable{n}.stablehlo.mlir").write_text(
                lowered.as_text(debug_info=True)  # locations: module path, op, source line
            )
            (self.dump_dir / f"executable{n}.reason.txt").write_text(reason + "\n")
        self.builds.append(
            Build(
                signature=signature,
                reason=reason,
                seconds=seconds,
                calls=self.stats.hits + self.stats.misses,
                xla_seconds=xla_seconds,
            )
        )
        return reason

    def _reason(self, signature: tuple) -> str:
        if not self.builds:
            return "first call"
        prev = self.builds[-1].signature
        changed = [
            f"input {i}: {fmt_spec(a)} -> {fmt_spec(b)}"
            for i, (a, b) in enumerate(zip(prev[0], signature[0], strict=True))
            if a != b
        ]
        changed += [
            f"scalar {i}: {a!r} -> {b!r}"
            for i, (a, b) in enumerate(zip(prev[1], signature[1], strict=True))
            if a != b
        ]
        zeros, prev_zeros = zeros_of(signature), zeros_of(prev)
        changed += [
            f"input {i}: " + ("all zeros" if i in zeros else "no longer all zeros")
            for i in sorted(set(zeros) ^ set(prev_zeros))
        ]
        if len(self.entries) >= self.max_entries:
            changed.append("(an older executable was evicted: max_executables reached)")
        return "; ".join(changed) or "evicted earlier, rebuilt"


# A compile that takes longer than this says so (then every PROGRESS_EVERY_S seconds) on the
# "tpu_inductor.progress" logger, at WARNING so it shows without any logging set up; silence it
# with logging.getLogger("tpu_inductor.progress").setLevel(logging.ERROR).
PROGRESS_AFTER_S = 5.0
PROGRESS_EVERY_S = 10.0
progress_log = logging.getLogger("tpu_inductor.progress")


@contextlib.contextmanager
def compile_progress(name: str, ops: int):
    """Report a long XLA compile of graph ``name`` (``ops`` ATen ops) while it runs."""
    start = time.perf_counter()
    state = {"said": False, "timer": None}
    lock = threading.Lock()

    def tick():
        with lock:
            if state["timer"] is None:
                return
            state["said"] = True
            progress_log.warning(
                "tpu-inductor: still compiling %s (%d ops), %.0f s so far",
                name,
                ops,
                time.perf_counter() - start,
            )
            state["timer"] = threading.Timer(PROGRESS_EVERY_S, tick)
            state["timer"].daemon = True
            state["timer"].start()

    with lock:
        state["timer"] = threading.Timer(PROGRESS_AFTER_S, tick)
        state["timer"].daemon = True
        state["timer"].start()
    try:
        yield
    finally:
        with lock:
            state["timer"].cancel()
            state["timer"] = None
        if state["said"]:
            progress_log.warning(
                "tpu-inductor: compiled %s in %.1f s", name, time.perf_counter() - start
            )


class CompiledGraph:
    """The callable handed back to AOTAutograd for one graph (boxed calling convention).

    Called with a list of torch tensors (and Python scalars for static inputs); returns a list
    of CPU torch tensors, placeholders for saved activations, and Python scalars. Where each
    value lives:

    - every tensor input is looked up in ``residency.VALUES`` first (a parameter, a value an
      earlier graph returned, a mutated input's new value): if current, nothing crosses;
    - parameters and buffers (``static_positions``) missing there are imported and recorded;
      other inputs cross as zero-copy numpy views (``input``), except inputs the backward will
      need again (saved as they are), which are imported once and recorded;
    - outputs come back to the host (``output``) and are recorded, except saved activations
      (``saved_outputs`` of a training forward), which stay on the device behind placeholders;
    - inputs the graph updates in place are written back on the host (only the changed slice
      for ``index_copy_`` and slice assignment) and their new device value is recorded.

    Nothing returned aliases a buffer this object keeps.
    """

    def __init__(
        self,
        exes: Executables,
        device: jax.Device,
        name: str,
        *,
        static_positions: Sequence[int] = (),
        saved_outputs: Sequence[int] = (),
        bumped: frozenset = frozenset(),
        backward: bool = False,
        plan=None,
    ):
        # An instance attribute: Dynamo's disable() wrapper copies __dict__, not class attributes.
        self._boxed_call = True
        self.exes = exes
        low = exes.lowered
        self.lowered = low
        self.device = device
        self.plan = plan  # a sharding.Plan: inputs go to the mesh, not to ``device``
        self.name = name
        self.transfers = exes.transfers
        self._tensor_inputs = frozenset(low.tensor_inputs)
        self._scalar_outputs = low.scalar_outputs
        self._static_positions = frozenset(static_positions)
        self._saved = frozenset(saved_outputs)
        self._bumped = bumped
        self._backward = backward
        self._zeros: dict = {}  # residency.device_zeros: zero inputs, dying with this graph
        self._tangents = low.tangent_inputs
        # Per-call inputs the backward takes back unchanged (saved as they are): import once.
        self._keep = frozenset(
            low.output_plan[j][1] for j in self._saved if low.output_plan[j][0] == "input"
        )
        # Views of symbolic layout (x[:, n:n + 2] under dynamic shapes or an unbacked n) are
        # handed back with that layout: AOTAutograd rebuilds such an output from its base with
        # as_strided and the strides/offset of the tensor it gets (view replay is off for
        # symbolic views), so a fresh contiguous tensor would read the wrong elements.
        self._views = low.view_outputs if not backward else frozenset()
        self._plain = low.plain_outputs and not saved_outputs and not self._views
        # A static graph has one signature (Dynamo's guards fix every input's shape and dtype):
        # after the first call its executable is used without rebuilding the signature. A
        # backward has one per set of zero tangents (signatures.Zeros).
        self._static_exe = None
        self._one_signature = (
            not low.dynamic
            and len(self._tensor_inputs) == len(low.input_metas)
            and not low.tangent_inputs
        )
        # Device-owned state (device_owned.py): whether the last call read it, so returned
        # lazy results; a backward whose forward did returns lazy gradients.
        self.lazy = False
        self.forward: CompiledGraph | None = None
        # No input needs more than the table's answer first (no bumped versions to allow for,
        # no saved handles or zero tangents): then the call loop looks it up itself.
        self._lookup_first = not backward and not bumped
        # Only switch JAX's default device when it is not already ours (a cost on every call).
        self._needs_default_device = jax.devices()[0] != device
        quiet_readonly_numpy_warning()

    def call_unboxed(self, *args) -> list:
        """The same call with Dynamo's calling convention, for graphs called without
        AOTAutograd's runtime wrapper (see ``capture.passes_through``)."""
        return self(list(args))

    def release_caches(self, executables: bool = True) -> None:
        """Drop what this graph caches for reuse: device arrays (zero tangents) and, with
        ``executables``, its compiled executables; each is rebuilt on demand if it runs again.

        ``torch._dynamo.reset()`` calls this for every graph (``backend._on_dynamo_reset``),
        with ``executables`` where the in-memory cache no longer holds them (an identical graph
        handed over again reuses those it holds, up to ``cache.MAX_ENTRIES``): Dynamo's leftover
        ``__compiled_fn_*`` globals keep graphs alive after its reset, and each XLA:CPU
        executable holds memory maps of JIT code, so a long process would run into the
        kernel's limit on memory maps.
        """
        self._zeros.clear()
        if executables:
            self._static_exe = None
            self.exes.release()

    def _input(self, i: int, t, private: bool = False):
        """Graph input ``i`` as an array the executable takes (see the class docstring);
        ``private``: never an alias of host memory (see ``device_input``)."""
        if t is None:
            return EFFECT_TOKEN  # AOTAutograd passes None for an effect token (float32[0])
        if type(t) is DeviceTensor:  # an output of ours autograd saved for the backward
            t = t._inner
        if self._backward:
            arr = saved_value(t)
            if arr is not None:
                return arr
            if VALUES.lookup(t) is None and is_all_zeros(t):
                # autograd filled a tangent with zeros (an output nobody differentiated): a
                # constant of the program; any other zero input is made on the device instead
                # of being sent
                if i in self._tangents and self.exes.config.zero_tangents:
                    return Zeros.like(t)
                where = self.plan.replicated() if self.plan is not None else self.device
                return device_zeros(tuple(t.shape), to_jax_dtype(t.dtype), where, self._zeros)
        return device_input(
            t,
            i,
            self.device,
            self.transfers,
            resident=i in self._static_positions,
            keep=i in self._keep,
            # AOTAutograd bumps a DeviceTensor's own version, not its inner tensor's
            bumped=i in self._bumped and not is_owned(t),
            plan=self.plan,
            private=private,
        )

    def _packed_inputs(self, args: list, get) -> tuple[list, list]:
        """The executable's arrays and static values for a graph with stacked state: a stack
        slot takes the stacked array the members' current values are layers of (what the last
        call returned: nothing is stacked), else their values stacked on the device."""
        exes = self.exes
        tensor_slots = frozenset(exes._tensor_pos)
        arrays, statics = [], []
        for s, slot in enumerate(exes._slots):
            if s not in tensor_slots:
                statics.append(python_scalar(args[slot[0]]))
                continue
            if len(slot) == 1:
                arrays.append(get(slot[0], args[slot[0]]))
                continue
            members = [args[p] for p in slot]
            inner = [unwrap(m) for m in members]
            pairs = zip(slot, inner, strict=True)
            bumped = [p in self._bumped and not is_owned(m) for p, m in pairs]
            stack = VALUES.stack_of(inner, bumped) if not self._backward else None
            if stack is None:
                parts = [get(p, m) for p, m in zip(slot, members, strict=True)]
                stack = self._stack(parts)
            arrays.append(stack)
        return arrays, statics

    def _stack(self, parts: list):
        """Members of one stack slot as the executable takes them. Zero tangents stay a
        constant of the program (one :class:`Zeros` of the stacked shape) when every member is
        one; beside real arrays they are made on the device and stacked with them."""
        zeros = [type(p) is Zeros for p in parts]
        if all(zeros):
            return Zeros((len(parts), *parts[0].shape), parts[0].dtype)
        if any(zeros):
            where = self.plan.replicated() if self.plan is not None else self.device
            parts = [
                device_zeros(p.shape, p.dtype, where, self._zeros) if type(p) is Zeros else p
                for p in parts
            ]
        return stack_arrays(parts, self.device if self.plan is None else None)

    def _executable(self, seed, arrays: list, statics: list):
        """The executable for this call's signature (compiled on first use); kept as the only
        one when the graph can have no other."""
        signature = signature_of(arrays, statics, shardings=self.plan is not None)
        exe = self.exes.get(signature, seed, arrays, statics)
        if self._one_signature:
            self._static_exe = exe
        return exe

    def _output(self, arr) -> torch.Tensor | None:
        return output_to_host(arr, self.transfers)

    def __call__(self, args: list) -> list:
        seed = draw_seed() if self.lowered.has_rng else None
        lazy = bool(device_owned.ACTIVE[0]) and (
            any(is_owned(a) for a in args) or (self.forward is not None and self.forward.lazy)
        )
        self.lazy = lazy
        inputs = args if self._plain and not lazy else list(args)
        view_key = self.lowered.binding_key(args) if self._views else None
        with jax.enable_x64(True):  # without it, DLPack would turn int64 into int32
            exe = self._static_exe
            # A lazy call returns before the executable has run: it must not read host memory
            # that eager code may change meanwhile (see device_input's ``private``).
            get = functools.partial(self._input, private=True) if lazy else self._input
            if self.lowered.packing is not None:  # stacked state (lowering/packing.py)
                arrays, statics = self._packed_inputs(args, get)
                args.clear()
                if exe is None:
                    exe = self._executable(seed, arrays, statics)
                else:
                    self.exes.stats.hits += 1
            elif exe is not None:
                if self._lookup_first:  # parameters first: their device copies, one call each
                    lookup = VALUES.lookup
                    arrays = []
                    for i, a in enumerate(args):
                        arr = (
                            lookup(a)
                            if isinstance(a, torch.Tensor) and type(a) is not DeviceTensor
                            else None
                        )
                        arrays.append(get(i, a) if arr is None else arr)
                else:
                    arrays = [get(i, a) for i, a in enumerate(args)]
                args.clear()
                self.exes.stats.hits += 1
            else:
                tensor_inputs = self._tensor_inputs
                arrays, statics = [], []
                for i, a in enumerate(args):
                    if i in tensor_inputs:
                        arrays.append(get(i, a))
                    else:
                        statics.append(python_scalar(a))
                args.clear()
                exe = self._executable(seed, arrays, statics)
            if self._tangents and zero_positions(arrays):  # constants of the executable
                arrays = without_zeros(arrays)
            try:
                if self._needs_default_device:
                    with jax.default_device(self.device):
                        outs = exe(seed, *arrays)
                else:
                    outs = exe(seed, *arrays)
            except jax.errors.JaxRuntimeError as e:
                raise_failed_assert(e)
                raise
            del arrays
            outs = self.exes.unpack(outs, StackSlice)
            layouts = self.lowered.layouts.get(view_key) if self._views else None
            if lazy:
                result = self._assemble(outs, inputs, lazy=True, layouts=layouts)
                if self.lowered.mutations:
                    self._write_back(outs, inputs, lazy=True)
                self.transfers.steady = True
                return result
            if self._plain and not self._scalar_outputs:
                result = [self._output(o) for o in outs]
            else:
                result = self._assemble(outs, inputs, layouts=layouts)
            if self.lowered.mutations:
                self._write_back(outs, inputs)
        self.transfers.steady = True
        return result

    def _assemble(self, outs, inputs: list, lazy: bool = False, layouts=None) -> list:
        """The declared outputs from the executable's results (see ``LoweredGraph``).

        ``lazy``: the graph read device-owned state, so its results are DeviceTensors that
        cross only when read (see ``device_owned.py``). ``layouts``: the view outputs'
        layouts in this call (``LoweredGraph.view_layouts``)."""
        handles = bool(self._saved) and not saved_tensors_hooks_active()
        result = []
        saved_bytes = 0
        for j, (kind, k) in enumerate(self.lowered.output_plan):
            if kind == "input":
                result.append(inputs[k])
            elif kind == "dup":
                result.append(result[k])
            elif kind == "detach":  # a saved alias of output k: share its version counter
                r = result[k]
                result.append(r if saved_value(r) is not None else r.detach())
            elif j in self._scalar_outputs:
                result.append(outs[k].item())
            elif j in self._saved and isinstance(outs[k], jax.Array):
                o = outs[k]
                saved_bytes += o.nbytes
                if handles:
                    h = saved_handle(o, self.lowered.output_metas[j].dtype)
                    if lazy:
                        setattr(h, device_owned.OWNED, True)  # so the backward is lazy too
                    result.append(h)
                else:
                    result.append(output_to_host(o, self.transfers, "materialize"))
            elif j in self._views and isinstance(outs[k], jax.Array):
                result.append(with_layout(self._output(outs[k]), (layouts or {}).get(j), j))
            elif lazy and isinstance(outs[k], jax.Array):
                result.append(lazy_output(outs[k], self.lowered.output_metas[j].dtype))
            else:
                result.append(self._output(outs[k]))
        if self._saved:
            self.exes.stats.saved_bytes = saved_bytes
        return result

    def _write_back(self, outs, inputs: list, lazy: bool = False) -> None:
        """Host copies of the inputs the graph updated in place; their new device values are
        recorded as current, so the next graph reading them sends nothing. With ``lazy``,
        device-owned inputs get no host copy: it is made when they are read."""
        hosts: dict = {}  # a stacked result's host copy, made once for all its members
        with torch.no_grad():
            for m in self.lowered.mutations:
                t, new = inputs[m.input_index], outs[m.value_index]
                if lazy and is_owned(t):
                    mark_pending(t, new)
                    VALUES.record(t, new)
                    continue
                if m.replay is not None:  # the host computes it: nothing crosses
                    t.copy_(replay(m.replay, t))
                    VALUES.record(t, new)
                    continue
                if isinstance(new, StackSlice):
                    host = hosts.get(id(new.stack))
                    if host is None:
                        host = hosts[id(new.stack)] = jax_to_host(new.stack)[0]
                        self.transfers.add(D2H, "write-back", new.stack.nbytes)
                    t.copy_(host[new.index])
                    VALUES.record(t, new)
                    continue
                delta = m.delta
                if delta is not None and delta[0] == "index_copy":
                    _, dim, index, source = delta
                    idx, src = jax_to_host(outs[index])[0], jax_to_host(outs[source])[0]
                    moved = outs[index].nbytes + outs[source].nbytes
                    t.index_copy_(dim, idx, src)
                elif delta is not None:
                    _, dim, begin, end, step, source = delta
                    src = jax_to_host(outs[source])[0]
                    moved = outs[source].nbytes
                    t[(slice(None),) * (dim % t.dim()) + (slice(begin, end, step),)].copy_(src)
                else:
                    t.copy_(jax_to_host(new)[0])
                    moved = new.nbytes
                self.transfers.add(D2H, "write-back", moved)
                VALUES.record(t, new)


def device_input(
    t: torch.Tensor,
    i: int,
    device: jax.Device,
    counter: Counter,
    *,
    resident: bool = False,
    keep: bool = False,
    bumped: bool = False,
    plan=None,
    private: bool = False,
):
    """What an executable takes for host tensor ``t`` (graph input ``i``): its device copy when
    ``residency.VALUES`` has a current one (nothing crosses); else, for a parameter or buffer
    (``resident``) or a value needed again (``keep``), an import that is recorded; else a
    zero-copy numpy view the executable copies in. ``bumped``: see ``DeviceValues.lookup``.
    Under a sharding ``plan`` every input is placed on the mesh (see ``sharding.py``).

    ``private``: copied on the host now, not aliased: JAX reads an aliased view when the
    executable runs, so a lazy call (keep_on_device) would see later eager writes to it."""
    arr = VALUES.lookup(t, bumped)
    if arr is not None:
        return arr
    device_owned.sync(t)  # a device-owned value whose device copy is gone: its host copy first
    recorded = resident or keep or is_owned(t)
    if plan is not None:
        arr = plan.put(t, tensor_to_host(t))
        sent = sum(s.data.size for s in arr.addressable_shards) * arr.dtype.itemsize
    elif private:
        arr, sent = jax.device_put(tensor_to_host(t).copy(), device), nbytes(t)
    elif recorded:
        arr, sent = tensor_to_jax(t, device), nbytes(t)
    else:
        counter.add(H2D, "input", nbytes(t))
        return tensor_to_host(t)
    if recorded:
        VALUES.record(t, arr)
        reason = "resident" if resident else "input"
        counter.add(H2D, reason, sent, f"input {i} ({describe_tensor(t.dtype, t.shape)})")
    else:
        counter.add(H2D, "input", sent)
    return arr


def output_to_host(arr, counter: Counter, reason: str = "output") -> torch.Tensor | None:
    """One result back on the host, recorded so a later graph can take it back for free."""
    if not isinstance(arr, jax.Array):
        return arr  # None for an output torch leaves undefined (e.g. a masked-out gradient)
    t, owner = jax_to_host(arr)
    counter.add(D2H, reason, owner.nbytes)  # numpy's nbytes: jax.Array's is slower
    VALUES.record(t, arr, owner)
    return t


def with_layout(t: torch.Tensor, layout, position: int) -> torch.Tensor:
    """``t``'s values in a tensor of ``layout`` = ``(size, stride, storage_offset)``: the layout
    of the view it stands for, which AOTAutograd applies to the view's base (``as_strided``)
    to rebuild it. Elements several positions share (overlapping strides) hold one value in
    eager too."""
    if layout is None:
        raise TpuInductorError(
            f"output {position} is a view whose position in its base is read in the program "
            "(a size or offset taken from a tensor's values), so the tensor handed back could "
            "not be placed in its base. What to do: torch._check the value against a bound, "
            "or clone() the view before returning it."
        )
    size, stride, offset = layout
    if tuple(t.shape) != tuple(size):
        raise TpuInductorError(f"output {position}: shape {list(t.shape)}, its view says {size}")
    if t.stride() == tuple(stride) and t.storage_offset() == offset:
        return t
    index = torch.from_numpy(strided_index(size, stride, offset))
    extent = int(index.max()) + 1 if index.numel() else offset
    base = torch.empty(extent, dtype=t.dtype)
    base[index.reshape(-1)] = t.reshape(-1)
    return base.as_strided(size, stride, offset)

"""The compile-only call: with ``options={"target": ...}`` a graph is compiled for a TPU
topology and described, and nothing runs.

:class:`TargetGraph` stands where ``runtime.CompiledGraph`` would: AOTAutograd and Dynamo call
it the same way. Per new input signature it traces the lowered graph on ``ShapeDtypeStruct``s
placed on the target's devices (one chip, or the mesh of a sharding plan), compiles it with
libtpu's TPU compiler and records a :class:`~tpu_inductor.tpu.programs.Program`. It reads no
tensor data, so a model on the ``meta`` device works as well as a real one, and it returns
placeholders shaped as the program's outputs: meta tensors when any input is on ``meta``, else
zeros on the CPU (nothing was computed; in-place updates are not applied). A program that does
not compile (too big for the chip's HBM, an op the TPU compiler refuses) is recorded with its
error and the user's source line, and the placeholders still come back, so the rest of a step
(the backward, the optimizer) is compiled and reported too.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import jax
import numpy as np
import torch
from jax.sharding import SingleDeviceSharding

from tpu_inductor.core import config
from tpu_inductor.core.dtypes import JAX_TO_TORCH, to_jax_dtype
from tpu_inductor.core.shapes import bind, concrete
from tpu_inductor.runtime.call import Executables
from tpu_inductor.runtime.residency import ZERO_CHECK_BYTES, is_all_zeros
from tpu_inductor.runtime.signatures import Zeros, python_scalar, signature_of, without_zeros
from tpu_inductor.runtime.stacks import stacked_sharding
from tpu_inductor.tpu import programs
from tpu_inductor.tpu.targets import Target


class TargetGraph:
    """Compiles one lowered graph for a TPU target per input signature; runs nothing.

    Args:
        exes: the graph's :class:`~tpu_inductor.runtime.call.Executables` (its jitted function,
            donation and sharding constraints are the ones a real TPU run would use).
        target: the topology it compiles for.
        kind: AOTAutograd's kind of graph (``forward``, ``backward``, ``inference``, ...).
        role: what the graph does in a step (``programs.role_of``; refined per program by
            ``programs.cache_role``).
        plan: a sharding plan over the target's devices, or ``None`` for one chip.
    """

    def __init__(self, exes: Executables, target: Target, kind: str, role: str, plan=None):
        self._boxed_call = True
        self.exes = exes
        self.lowered = exes.lowered
        self.target = target
        self.kind = kind
        self.role = role
        self.plan = plan
        self._one_chip = SingleDeviceSharding(target.devices[0])
        self._tensor_inputs = frozenset(self.lowered.tensor_inputs)
        self._seen: dict[tuple, programs.Program] = {}

    def release_caches(self, executables: bool = True) -> None:
        """Nothing to drop: a compile-only graph holds no device arrays (``_on_dynamo_reset``)."""

    def call_unboxed(self, *args) -> list:
        """Dynamo's calling convention (an inference graph called without AOTAutograd)."""
        return self(list(args))

    def _spec(self, t) -> jax.ShapeDtypeStruct:
        if t is None:  # an effect token
            return jax.ShapeDtypeStruct((0,), np.float32, sharding=self._replicated())
        inner = getattr(t, "_inner", t)  # a DeviceTensor's data, as the runtime would take it
        dtype = to_jax_dtype(inner.dtype)
        if self.plan is not None:
            from tpu_inductor.runtime.sharding import placement

            where = placement(t, self.plan.mesh) or self.plan.input_sharding(tuple(t.shape))
        else:
            where = self._one_chip
        return jax.ShapeDtypeStruct(tuple(t.shape), dtype, sharding=where)

    def _replicated(self):
        return self.plan.replicated() if self.plan is not None else self._one_chip

    def __call__(self, args: list) -> list:
        inputs = list(args)
        args.clear()
        specs, statics = [], []
        for i, a in enumerate(inputs):
            if i in self._tensor_inputs:
                zero = i in self.lowered.tangent_inputs and _zero_tangent(a)
                specs.append(Zeros.like(a) if zero else self._spec(a))
            else:
                statics.append(python_scalar(a))
        signature = signature_of(specs, statics, shardings=True)
        program = self._seen.get(signature)
        if program is None:
            program = self._compile(specs, statics, self._values(inputs, specs))
            self._seen[signature] = program
        return self._placeholders(program, inputs, specs, statics)

    def _values(self, inputs: list, specs: list) -> list[programs.Value]:
        """Each tensor input as the step's memory sees it: which tensor, what kind, bytes per
        device (its shard's)."""
        mutated = {m.input_index for m in self.lowered.mutations}
        values = []
        tensors = [i for i in range(len(inputs)) if i in self._tensor_inputs]
        for i, spec in zip(tensors, specs, strict=True):
            if type(spec) is Zeros:  # a constant of the program, not an argument
                continue
            t = inputs[i]
            if isinstance(t, torch.nn.Parameter):
                kind = "parameter"
            elif i in mutated:
                kind = "state"
            else:
                kind = "other"
            shape = spec.sharding.shard_shape(spec.shape) if spec.shape else spec.shape
            nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(spec.dtype).itemsize
            read = None
            rows = self.lowered.gathered.get(i)
            if rows is not None and spec.shape:  # its rows, on this device's share of them
                read = min(nbytes, rows * nbytes // spec.shape[0])
            values.append(programs.Value(programs.tensor_key(t), kind, nbytes, read))
        return values

    def _compile(self, specs: list, statics: list, values=()) -> programs.Program:
        exes = self.exes
        seed = None
        if self.lowered.has_rng:
            seed = jax.ShapeDtypeStruct((2,), np.uint32, sharding=self._replicated())
        start = time.perf_counter()
        error = compiled = None
        lowered, spaces = None, {}
        packed = exes.pack(specs, _stacked_spec)  # stacked state (lowering/packing.py)
        xla_start = None
        with jax.enable_x64(True):
            traced = exes.trace(seed, packed, statics)
            try:  # the TPU lowering's or compiler's refusal is the report's finding
                lowered = traced.lower()
                xla_start = time.perf_counter()
                compiled, spaces = programs.compile_measured(lowered, exes.compiler_options)
            except Exception as e:
                error = e
        end = time.perf_counter()
        seconds = end - start
        exes.stats.misses += 1
        if lowered is not None:  # as the runtime's signature: no shardings
            xla = end - xla_start if xla_start is not None else 0.0
            exes.record_build(signature_of(specs, statics), traced, lowered, seconds, xla)
        donated = [packed[exes._tensor_pos.index(s)] for s in exes._donated_slots]
        out_info = exes.unpack(list(traced.out_info), _member_spec)
        role = programs.cache_role(self.role, self.lowered, out_info)
        graph = exes.name  # named by its role (backend.py); a KV-cache one: graph3-decode
        if graph.endswith(f"-{self.kind}") and role != self.kind:
            graph = graph[: -len(self.kind)] + role.replace(" ", "-")
        program = programs.record(
            name=f"{graph}#{len(self._seen)}",
            graph=exes.name,
            kind=self.kind,
            role=role,
            target=self.target,
            chips=1 if self.plan is None else self.plan.mesh.devices.size,
            inputs=without_zeros(packed),
            out_info=traced.out_info,
            compiled=compiled,
            error=error,
            jaxpr=traced.jaxpr,
            seconds=seconds,
            donated=donated,
            mesh=None if self.plan is None else self.plan.mesh,
            values=values,
            spaces=spaces,
        )
        program.tokens = programs.cache_tokens(self.lowered, out_info)
        return program

    def _placeholders(self, program, inputs: list, specs: list, statics: list) -> list:
        """What the graph returns, shaped as the program's outputs; no values (nothing ran)."""
        low = self.lowered
        meta = any(isinstance(a, torch.Tensor) and a.device.type == "meta" for a in inputs)
        device = "meta" if meta else "cpu"
        outs = self.exes.unpack(list(program.out_info), _member_spec)
        bindings = None
        result: list = []
        for j, (kind, k) in enumerate(low.output_plan):
            if kind == "input":
                result.append(inputs[k])
            elif kind == "dup":
                result.append(result[k])
            elif kind == "detach":
                result.append(result[k].detach())
            elif j in low.scalar_outputs:
                if bindings is None:
                    bindings = bind(low.input_metas, _concrete_inputs(low, specs, statics))
                result.append(concrete(low.output_metas[j], bindings))
            elif outs[k] is None:
                result.append(None)
            else:
                info = outs[k]
                dtype = JAX_TO_TORCH[np.dtype(info.dtype)]
                result.append(torch.zeros(tuple(info.shape), dtype=dtype, device=device))
        return result


def _member_spec(stack, k: int) -> jax.ShapeDtypeStruct:
    """Member ``k`` of a stacked result, as the graph's own output (lowering/packing.py)."""
    return jax.ShapeDtypeStruct(tuple(stack.shape[1:]), stack.dtype)


def _stacked_spec(members: list) -> jax.ShapeDtypeStruct:
    """What a stack of ``members`` (``ShapeDtypeStruct``s of one shape) is to the program."""
    first = members[0]
    return jax.ShapeDtypeStruct(
        (len(members), *first.shape), first.dtype, sharding=stacked_sharding(first.sharding)
    )


def _zero_tangent(t) -> bool:
    """Whether a backward's tangent is autograd's zeros for an output nobody differentiated, as
    the runtime decides it (``CompiledGraph._input``): by its values on the CPU; on ``meta``,
    where there are none, any tangent the runtime would check (autograd materializes zeros
    there too; a meta gradient a user passes for a big output is taken as zeros)."""
    t = getattr(t, "_inner", t)  # a DeviceTensor's data
    if not config.get("zero_tangents") or not isinstance(t, torch.Tensor) or t.is_complex():
        return False
    if t.device.type == "meta":
        return t.numel() * t.element_size() >= ZERO_CHECK_BYTES
    return is_all_zeros(t)


def _concrete_inputs(low, specs: Sequence, statics: Sequence) -> list:
    values, tensors, rest = [], iter(specs), iter(statics)
    for i in range(len(low.input_metas)):
        values.append(next(tensors) if i in low.tensor_inputs else next(rest))
    return values

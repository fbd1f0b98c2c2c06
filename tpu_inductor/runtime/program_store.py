"""Programs kept across processes: with ``cache_dir``, a restart skips AOTAutograd, our lowering
and XLA for every graph a previous process compiled.

Dynamo still traces the user's code in a new process (its guards and bytecode are not saved:
torch's own format for them is a pickle, and nothing loaded from ``cache_dir`` may run code).
The graph it hands the backend is looked up by :func:`key_for`, a hash of the graph (code,
inputs' shapes, dtypes, strides and ``requires_grad``, constants), the grad mode and the
*fingerprint* of everything else that shapes a program (``dynamo/options.program_fingerprint``:
the package's own sources, every option and switch, the torch, jax, jaxlib and libtpu versions,
the device kind). A hit is run without AOTAutograd:

- an inference graph (an inference forward; compile_step's step and a compiled ``opt.step``,
  whose in-place updates the program makes and the runtime writes back) by its
  :class:`CompiledGraph`, the versions of its updated inputs raised as AOTAutograd raises them;
- a training graph by :class:`WarmTraining`, an ``autograd.Function`` that runs the forward
  program, saves what the backward reads (inputs with their version checked, as AOTAutograd
  saves them) and runs the backward program.

Which graphs are kept (:func:`storable`): static shapes, every input a plain tensor, nothing
AOTAutograd's runtime wrapper would have to do beyond those two (no outputs that alias inputs,
no effect tokens, no tensor subclasses such as ``keep_on_device``'s, no saved sizes), no eager
fallback, no sharding plan, not compiled for a TPU target. Anything else compiles as before.

On disk, under ``<cache_dir>/tpu_inductor/programs/``: one ``<key>.json`` manifest per graph (what
each program is, how to call it, its executables' signatures) and ``blobs/<sha256>.jaxexport``,
one per executable (``jax.export``'s serialized StableHLO, compiled from the same module in both
processes, so XLA's own persistent cache, also in ``cache_dir``, answers the second). Files
appear whole (written aside, then renamed); a manifest that is not JSON, is of another format,
fingerprint or key, or names a blob missing or not matching its hash is set aside with one
warning and the graph compiled again. Two processes sharing ``cache_dir`` each read whole files
and write whole files; the last manifest written wins, and an executable it lacks is compiled
again on the next start.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import pathlib
import tempfile
import threading
import time
import uuid
import weakref
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
import torch
import torch.fx as fx

from tpu_inductor.core.devices import compile_lowered
from tpu_inductor.core.graph_kind import GraphKind
from tpu_inductor.runtime import cache
from tpu_inductor.runtime.call import CompiledGraph, Executables
from tpu_inductor.runtime.residency import device_zeros
from tpu_inductor.runtime.signatures import Zeros, signature_of, zero_positions, zeros_of

log = logging.getLogger(__name__)  # TORCH_LOGS="+tpu_inductor.runtime.program_store"
progress = logging.getLogger("tpu_inductor.progress")  # speaks without logging set up

FORMAT = 1


def folder(cache_dir: str) -> pathlib.Path:
    """Where saved programs live under ``cache_dir``."""
    return pathlib.Path(cache_dir) / "tpu_inductor" / "programs"


def _manifest_path(cache_dir: str, key: str) -> pathlib.Path:
    return folder(cache_dir) / f"{key}.json"


def key_for(gm: fx.GraphModule, example_inputs: Sequence, fingerprint: dict) -> str | None:
    """The key of a Dynamo graph's saved programs, or ``None`` when it cannot be kept: an input
    that is not a plain tensor of static shape (a size, a scalar, a tensor subclass)."""
    specs = []
    for t in example_inputs:
        if not isinstance(t, torch.Tensor) or _is_subclass(t):
            return None
        if any(not isinstance(d, int) for d in (*t.shape, *t.stride())):
            return None
        specs.append(
            (str(t.dtype), tuple(t.shape), tuple(t.stride()), t.requires_grad, t.device.type)
        )
    extra = (tuple(specs), torch.is_grad_enabled(), json.dumps(fingerprint, sort_keys=True))
    # parameters and buffers of the graph module: AOTAutograd makes them inputs (lifted)
    lifted = [*gm.parameters(), *gm.buffers()]
    for t in lifted:
        if _is_subclass(t):
            return None
        extra += ((str(t.dtype), tuple(t.shape), tuple(t.stride()), t.requires_grad),)
    return cache.graph_key(gm, extra, frozenset(map(id, lifted)))


def lifted_inputs(gm: fx.GraphModule) -> list:
    """The tensors AOTAutograd puts before a Dynamo graph's own inputs: its module's parameters
    and buffers, in ``aot_module_simplified``'s order."""
    params = dict(gm.named_parameters(remove_duplicate=False))
    buffers = dict(gm.named_buffers(remove_duplicate=False))
    return [*params.values(), *buffers.values()]


def _is_subclass(t: torch.Tensor) -> bool:
    if isinstance(t, torch._subclasses.FakeTensor):
        return False
    return type(t) not in (torch.Tensor, torch.nn.Parameter)


# ---------------------------------------------------------------------------------------------
# What a cold compile records


class Entry:
    """The programs one Dynamo graph compiled to: recorded as the backend builds them, written
    to ``cache_dir`` (:meth:`save`) whenever one of them builds an executable."""

    def __init__(self, cache_dir: str, key: str, fingerprint: dict):
        self.cache_dir, self.key, self.fingerprint = cache_dir, key, fingerprint
        self.graphs: dict[str, dict] = {}  # kind -> the program's record (its exes under "exes")
        self.runtime: dict | None = None  # the Dynamo-level calling convention
        self.why_not: str | None = None
        self._lock = threading.Lock()

    def refuse(self, why: str) -> None:
        """This graph is not kept (said once, at DEBUG)."""
        if self.why_not is None:
            self.why_not = why
            log.debug("not saving graph %s: %s", self.key[:12], why)

    def add(self, kind: GraphKind, compiled: CompiledGraph, **record) -> None:
        """Record one of the graph's programs; its executables are saved as they are built."""
        exes = compiled.exes
        if type(exes) is not Executables or exes.store is not None and exes.store.entry is not self:
            self.refuse(f"its {kind} program is shared or not plain")
            return
        record.update(name=exes.name, kind=compiled.name, exes=exes)
        self.graphs[kind] = record
        exes.store = StoreSlot(self)

    def save(self) -> None:
        """Write the manifest of every program recorded so far (whole; see the module
        docstring). Nothing when the graph is not kept."""
        if self.why_not is not None or self.runtime is None:
            return
        with self._lock:
            graphs = {}
            for role, g in self.graphs.items():
                exes = g["exes"]
                graphs[role] = {
                    **{k: v for k, v in g.items() if k != "exes"},
                    "lowered": lowered_record(exes.lowered),
                    "compiler_options": dict(exes.compiler_options),
                    "executables": list(exes.store.records),
                }
            manifest = {
                "format": FORMAT,
                "key": self.key,
                "fingerprint": self.fingerprint,
                "runtime": self.runtime,
                "graphs": graphs,
            }
            path = _manifest_path(self.cache_dir, self.key)
            path.parent.mkdir(parents=True, exist_ok=True)
            _write_whole(path, json.dumps(manifest, indent=1).encode())


class StoreSlot:
    """An ``Executables``' way to build an executable when its graph is kept: the program is
    exported (``jax.export``), the export saved, and the executable compiled from it, exactly
    as a later process compiles it from the saved file (so XLA's persistent cache hits)."""

    def __init__(self, entry: Entry):
        self.entry = entry
        self.records: list[dict] = []

    def build(self, exes: Executables, signature: tuple, seed, arrays: list, statics: list):
        """Trace, export, save and compile one signature; returns ``(traced, executable, XLA
        seconds)``. A backward's signature with zero tangents is also saved with them as arrays
        (exported, not compiled), for a later call whose tangents are zeros elsewhere."""
        platform = exes.platform
        traced = exes.trace(seed, arrays, statics)
        data = export_traced(traced, platform)
        zeros = [exes._tensor_pos[k] for k in zero_positions(arrays)]
        donate = _export_donations(exes, zeros)
        live = [seed, *(a for a in arrays if type(a) is not Zeros)]
        exe, xla = compile_export(data, donate, exes.compiler_options, live)
        self._add(signature, data, donate)
        if zeros:
            plain = [
                jax.ShapeDtypeStruct(a.shape, a.dtype) if type(a) is Zeros else a for a in arrays
            ]
            plain_sig = signature_of(plain, statics)
            if not any(r["signature"] == signature_record(plain_sig) for r in self.records):
                seed_spec = None if seed is None else jax.ShapeDtypeStruct((2,), np.uint32)
                more = export_traced(exes.trace(seed_spec, plain, statics), platform)
                self._add(plain_sig, more, _export_donations(exes, []))
        self.entry.save()
        return traced, exe, xla

    def _add(self, signature: tuple, data: bytes, donate: list[int]) -> None:
        record = {"signature": signature_record(signature), "donate": donate}
        record.update(save_blob(self.entry.cache_dir, data))
        self.records.append(record)


def _export_donations(exes: Executables, zeros: Sequence[int]) -> list[int]:
    """The donated inputs as positions of the exported call ``(seed, *arrays without zeros)``."""
    live = [s for s in exes._tensor_pos if s not in zeros]
    return [1 + live.index(s) for s in exes._donated_slots if s in live]


def _write_whole(path: pathlib.Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that readers see either the old file or the whole new one."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        pathlib.Path(tmp).unlink(missing_ok=True)
        raise


def save_blob(cache_dir: str, data: bytes) -> dict:
    """Write one executable's export (content-addressed: a blob is written once, whoever
    needs it); returns its manifest record."""
    digest = hashlib.sha256(data).hexdigest()
    path = folder(cache_dir) / "blobs" / f"{digest}.jaxexport"
    path.parent.mkdir(parents=True, exist_ok=True)
    if not (path.exists() and hashlib.sha256(path.read_bytes()).hexdigest() == digest):
        _write_whole(path, data)
    return {"file": path.name, "sha256": digest, "size": len(data)}


# ---------------------------------------------------------------------------------------------
# Signatures and lowered graphs as JSON


def signature_record(signature: tuple) -> dict:
    """A runtime signature (``signatures.signature_of`` of a static graph) as JSON."""
    arrays = [[list(map(int, shape)), str(np.dtype(dtype))] for shape, dtype in signature[0]]
    return {"arrays": arrays, "statics": list(signature[1]), "zeros": list(zeros_of(signature))}


def lowered_record(low) -> dict:
    """What the runtime reads of a ``LoweredGraph`` (everything but its function), as JSON."""
    packing = low.packing
    return {
        "tensor_inputs": list(low.tensor_inputs),
        "has_rng": low.has_rng,
        "num_outputs": low.num_outputs,
        "input_metas": [_meta_record(m) for m in low.input_metas],
        "output_metas": [_meta_record(m) for m in low.output_metas],
        "ops": dict(low.ops),
        "output_plan": [list(p) for p in low.output_plan],
        "mutations": [
            [m.input_index, m.value_index, None if m.delta is None else list(m.delta)]
            for m in low.mutations
        ],
        "packing": None
        if packing is None
        else {
            "slots": [list(s) for s in packing.slots],
            "results": [list(r) for r in packing.results],
        },
        "tangent_inputs": sorted(low.tangent_inputs),
    }


def _meta_record(m):
    if m is None:
        return None
    if not isinstance(m, torch.Tensor):
        raise TypeError(f"not a tensor: {type(m).__name__}")
    return {"shape": [int(d) for d in m.shape], "dtype": str(m.dtype).removeprefix("torch.")}


def lowered_from(record: dict):
    """A ``LoweredGraph`` with no function (the runtime calls a loaded executable instead)."""
    from tpu_inductor.lowering.inputs import Mutation
    from tpu_inductor.lowering.lower import LoweredGraph
    from tpu_inductor.lowering.packing import Packing

    packing = record["packing"]
    return LoweredGraph(
        fn=None,
        tensor_inputs=tuple(int(i) for i in record["tensor_inputs"]),
        has_rng=bool(record["has_rng"]),
        num_outputs=int(record["num_outputs"]),
        input_metas=tuple(_meta_from(m) for m in record["input_metas"]),
        output_metas=tuple(_meta_from(m) for m in record["output_metas"]),
        ops={str(k): int(v) for k, v in record["ops"].items()},
        output_plan=tuple((str(k), int(i)) for k, i in record["output_plan"]),
        mutations=tuple(
            Mutation(int(i), int(v), None if d is None else tuple(d))
            for i, v, d in record["mutations"]
        ),
        packing=None
        if packing is None
        else Packing(
            tuple(tuple(int(p) for p in s) for s in packing["slots"]),
            tuple(tuple(int(j) for j in r) for r in packing["results"]),
        ),
        tangent_inputs=frozenset(int(i) for i in record["tangent_inputs"]),
    )


def _meta_from(m):
    if m is None:
        return None
    dtype = getattr(torch, str(m["dtype"]), None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"not a dtype: {m['dtype']!r}")
    return torch.empty(tuple(int(d) for d in m["shape"]), dtype=dtype, device="meta")


# ---------------------------------------------------------------------------------------------
# Loading


class BadEntry(Exception):
    """A saved entry that cannot be used (the message says why)."""


def load(
    cache_dir: str, key: str, fingerprint: dict, device: jax.Device, gm: fx.GraphModule
) -> Any | None:
    """The runtime callable for ``key`` from ``cache_dir`` (Dynamo's calling convention), or
    ``None``: nothing saved, not complete yet (a training graph whose backward never ran), or
    not usable (set aside with one warning naming why; the graph is compiled again)."""
    path = _manifest_path(cache_dir, key)
    if not path.exists():
        return None
    start = time.perf_counter()
    try:
        manifest = _read_manifest(path, key, fingerprint)
        runtime = _runtime(manifest, folder(cache_dir) / "blobs", device, gm)
    except BadEntry as e:
        _set_aside(path, str(e))
        return None
    if runtime is not None:
        runtime.load_seconds = time.perf_counter() - start
        cache.STATS.exports_loaded += 1
        log.info("warm start: graph %s from %s", key[:12], path)
    return runtime


def _read_manifest(path: pathlib.Path, key: str, fingerprint: dict) -> dict:
    try:
        manifest = json.loads(path.read_bytes())
    except (OSError, ValueError) as e:
        raise BadEntry(f"its manifest is not readable JSON ({type(e).__name__})") from e
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        found = manifest.get("format") if isinstance(manifest, dict) else None
        raise BadEntry(f"it is of another format ({found!r}, not {FORMAT})")
    if manifest.get("key") != key:
        raise BadEntry("it was saved under another key")
    saved = manifest.get("fingerprint")
    if saved != fingerprint:
        raise BadEntry(f"it was saved {_difference(saved, fingerprint)}")
    return manifest


def _difference(saved, current: dict) -> str:
    """Which part of the fingerprint differs, in words."""
    if not isinstance(saved, dict):
        return "without a fingerprint"
    for part in sorted({*saved, *current}):
        a, b = saved.get(part), current.get(part)
        if a == b:
            continue
        if part == "package":
            return "by other tpu-inductor sources"
        if isinstance(a, dict) and isinstance(b, dict):
            names = sorted(k for k in {*a, *b} if a.get(k) != b.get(k))
            return f"with other {part} ({', '.join(names)})"
        return f"with another {part}"
    return "with another fingerprint"


def _set_aside(path: pathlib.Path, why: str) -> None:
    """Move a bad manifest out of the way (one rename: a reader never sees half of it)."""
    progress.warning(
        "tpu-inductor: ignoring the saved program %s: %s; compiling it again", path, why
    )
    trash = path.with_name(f".bad-{path.stem}-{uuid.uuid4().hex[:8]}.json")
    try:
        os.rename(path, trash)
        trash.unlink()
    except OSError:  # another process set it aside first
        pass


def _read_blob(blobs: pathlib.Path, record: dict) -> bytes:
    """An executable's export bytes, checked against the manifest's size and hash."""
    name = str(record.get("file", ""))
    if not name.endswith(".jaxexport") or "/" in name or name.startswith("."):
        raise BadEntry(f"it names an unexpected file ({name!r})")
    try:
        data = (blobs / name).read_bytes()
    except OSError as e:
        raise BadEntry(f"its file {name} is missing ({type(e).__name__})") from e
    digest = hashlib.sha256(data).hexdigest()
    if len(data) != record.get("size") or digest != record.get("sha256"):
        raise BadEntry(f"its file {name} is truncated or changed (size or hash differs)")
    return data


def _runtime(manifest: dict, blobs: pathlib.Path, device: jax.Device, gm: fx.GraphModule):
    """The callable a manifest describes, or ``None`` when it is not complete."""
    try:
        runtime = manifest["runtime"]
        graphs = manifest["graphs"]
        kind = runtime["kind"]
        kinds = {
            "inference": (GraphKind.INFERENCE,),
            "training": (GraphKind.FORWARD, GraphKind.BACKWARD),
        }[kind]
        if any(not graphs.get(k, {}).get("executables") for k in kinds):
            return None  # e.g. a backward that never ran in the process that saved it
        compiled = {k: _graph(graphs[k], blobs, device) for k in kinds}
    except (KeyError, TypeError, ValueError, IndexError) as e:
        raise BadEntry(f"its manifest is malformed ({type(e).__name__}: {e})") from e
    if kind == "inference":
        return WarmInference(compiled[GraphKind.INFERENCE], runtime, gm)
    forward, backward = compiled[GraphKind.FORWARD], compiled[GraphKind.BACKWARD]
    backward.forward = forward
    return WarmTraining(forward, backward, runtime, gm)


def _graph(record: dict, blobs: pathlib.Path, device: jax.Device) -> CompiledGraph:
    lowered = lowered_from(record["lowered"])
    builds = {}
    for ex in record["executables"]:
        builds[json.dumps(ex["signature"], sort_keys=True)] = (
            _read_blob(blobs, ex),
            [int(d) for d in ex["donate"]],
        )
    exes = StoredExecutables(
        lowered,
        record["name"],
        builds,
        dict(record["compiler_options"]),
        [int(i) for i in record["donate_inputs"]],
    )
    compiled = CompiledGraph(
        exes,
        device,
        str(record["kind"]),
        static_positions=[int(i) for i in record["static_positions"]],
        saved_outputs=[int(i) for i in record["saved_outputs"]],
        bumped=frozenset(int(i) for i in record["bumped"]),
        backward=bool(record["backward"]),
    )
    cache.COMPILED.add(compiled)
    return compiled


class StoredExecutables(Executables):
    """A graph's executables compiled from saved exports (its lowering never ran here)."""

    def __init__(self, lowered, name: str, builds: dict, options: dict, donate: Sequence[int]):
        super().__init__(lowered, 64, name, compiler_options=options, donate=donate)
        self._saved = builds  # signature JSON -> (export bytes, donated positions)

    def get(self, signature: tuple, seed, arrays: list, statics: list):
        """The executable for ``signature``, compiled from its saved export on first use (XLA's
        persistent cache answers); a backward's zero tangents in a pattern never saved take the
        saved all-arrays executable, the zeros made on the device."""
        exe = self.entries.get(signature)
        if exe is not None:
            self.stats.hits += 1
            return exe
        with self._lock:
            self.stats.misses += 1
            start = time.perf_counter()
            record = signature_record(signature)
            found = self._saved.get(json.dumps(record, sort_keys=True))
            zeros = zero_positions(arrays)
            live = [seed, *(a for a in arrays if type(a) is not Zeros)]
            if found is None and zeros:
                plain = {**record, "zeros": []}
                found = self._saved.get(json.dumps(plain, sort_keys=True))
                if found is not None:
                    data, donate = found
                    full, xla = compile_export(
                        data,
                        donate,
                        self.compiler_options,
                        [seed, *(jax.ShapeDtypeStruct(a.shape, a.dtype) for a in arrays)],
                    )
                    exe = _with_zeros(full, arrays, zeros)
                    found = ()
            if found is None:
                raise RuntimeError(
                    f"tpu-inductor: {self.name} was loaded from cache_dir without an executable "
                    f"for this call ({record}); clear the cache_dir entry to compile it again"
                )
            if found:
                data, donate = found
                exe, xla = compile_export(data, donate, self.compiler_options, live)
            self.builds.append(
                _build(signature, "loaded from cache_dir", time.perf_counter() - start, xla)
            )
            self.entries[signature] = exe
            return exe


def _build(signature, reason, seconds, xla):
    from tpu_inductor.runtime.call import Build

    return Build(signature=signature, reason=reason, seconds=seconds, xla_seconds=xla)


def _with_zeros(exe, arrays: list, zeros: Sequence[int]):
    """An executable taking every tangent as an array, called with the zero ones left out."""
    specs = {k: arrays[k] for k in zeros}
    where = jax.devices()[0]

    def call(seed, *live):
        full, it = [], iter(live)
        for k in range(len(arrays)):
            if k in specs:
                z = specs[k]
                full.append(device_zeros(tuple(z.shape), z.dtype, where, {}))
            else:
                full.append(next(it))
        return exe(seed, *full)

    return call


# ---------------------------------------------------------------------------------------------
# Executables built from exports


def export_traced(traced, platform: str) -> bytes:
    """The serialized ``jax.export`` of a traced program (``jit(...).trace(...)``), without
    tracing it again where this JAX allows."""
    try:
        from jax._src.export import _export as internal
        from jax._src.interpreters import mlir

        lowered = traced.lower(
            lowering_platforms=(platform,),
            _private_parameters=mlir.LoweringParameters(
                for_export=True, hoist_constants_as_args=False
            ),
        )
        exported = internal._export_lowered(lowered, traced.jaxpr, traced.fun_name)
    except (ImportError, AttributeError, TypeError):  # another JAX: the public API
        exported = jax.export.export(traced.fun, platforms=[platform])(*traced.args_info)
    return bytes(exported.serialize())


def compile_export(data: bytes, donate: Sequence[int], options: dict, arrays: Sequence):
    """Compile a serialized export for the call's ``arrays`` (its seed first, ``None`` when the
    program draws nothing); returns the executable and XLA's compile seconds."""
    exported = jax.export.deserialize(bytearray(data))
    specs = [None if a is None else jax.ShapeDtypeStruct(a.shape, a.dtype) for a in arrays]
    lowered = jax.jit(exported.call, donate_argnums=tuple(donate)).lower(*specs)
    start = time.perf_counter()
    exe = compile_lowered(lowered, options)
    return exe, time.perf_counter() - start


# ---------------------------------------------------------------------------------------------
# The Dynamo-level callables


class WarmInference:
    """A saved inference graph as Dynamo calls it: the program's in-place updates of its inputs
    are the runtime's (written back, device copies current), and those inputs' versions go up
    by one first, as AOTAutograd's runtime wrapper raises them."""

    def __init__(self, graph: CompiledGraph, runtime: dict, gm: fx.GraphModule):
        self.graph = graph
        self.bumped = tuple(int(i) for i in runtime["bumped"])
        self.gm = gm  # its parameters and buffers come first (lifted_inputs)
        self.load_seconds = 0.0

    def __call__(self, *args):
        args = [*lifted_inputs(self.gm), *args]
        if self.bumped:
            torch.autograd.graph.increment_version(tuple(args[i] for i in self.bumped))
        return self.graph(args)


class WarmTraining:
    """A saved training graph (forward and backward programs) as Dynamo calls it: an
    ``autograd.Function`` whose forward runs the forward program and saves what the backward
    reads (as AOTAutograd saves it: inputs with their version checked), and whose backward runs
    the backward program on the saved values and the tangents of the outputs that need one."""

    def __init__(
        self, forward: CompiledGraph, backward: CompiledGraph, runtime: dict, gm: fx.GraphModule
    ):
        self.forward, self.backward = forward, backward
        self.gm = gm  # its parameters and buffers come first (lifted_inputs)
        self.returns = int(runtime["num_forward_returns"])
        self.saved_vc = int(runtime["saved_with_version_check"])
        self.saved_plain = int(runtime["saved_without_version_check"])
        self.requires_grad = [bool(r) for r in runtime["output_requires_grad"]]
        self.load_seconds = 0.0

    def __call__(self, *args):
        return list(_Training.apply(self, *lifted_inputs(self.gm), *args))


class _Training(torch.autograd.Function):
    @staticmethod
    def forward(ctx, warm: WarmTraining, *args):
        outs = warm.forward(list(args))
        n, vc = warm.returns, warm.saved_vc
        user = outs[:n]
        saved = outs[n : n + vc]
        plain = outs[n + vc : n + vc + warm.saved_plain]
        ctx.save_for_backward(*(t.detach() if t._is_view() else t for t in saved))
        ctx.plain = plain
        ctx.warm = weakref.ref(warm)
        ctx.metas = [(tuple(o.shape), o.dtype) for o in user]
        pairs = zip(user, warm.requires_grad, strict=True)
        ctx.mark_non_differentiable(*(o for o, r in pairs if not r))
        return tuple(user)

    @staticmethod
    def backward(ctx, *grads):
        warm = ctx.warm()
        tangents = [
            (torch.zeros(shape, dtype=dtype) if g is None else g.contiguous())
            for g, (shape, dtype), r in zip(grads, ctx.metas, warm.requires_grad, strict=True)
            if r
        ]
        args = [*ctx.saved_tensors, *ctx.plain, *tangents]
        ctx.plain = None
        return (None, *warm.backward(args))

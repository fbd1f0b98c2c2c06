"""The torch <-> JAX boundary: device choice, weight residency, RNG seeds, executables, outputs.

Measured on a 2-core CPU host (``python -m benchmarks.boundary``): per-call inputs cross as
zero-copy numpy views handed straight to the XLA executable (~7 us per small tensor, against
~29 us through ``jax.dlpack.from_dlpack``), and outputs come back as numpy views of fresh XLA
buffers (~1 us, against ~4 us for ``torch.from_dlpack``); on TPU/GPU the executable does the
host -> device copy. Parameters and buffers are imported once through DLPack (zero-copy on CPU)
and reused while their version counter is unchanged.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import logging
import pathlib
import threading
import time
import warnings
import weakref
from collections.abc import Sequence

import jax
import numpy as np
import torch

from tpu_inductor import buckets, cache
from tpu_inductor.dtypes import to_jax_dtype
from tpu_inductor.errors import InvalidOptionError
from tpu_inductor.shapes import bind, concrete

log = logging.getLogger("tpu_inductor")

_PLATFORM_OF = {"tpu": "tpu", "gpu": "gpu", "cpu": "cpu"}


@functools.cache
def select_device(name: str | None) -> jax.Device:
    """The JAX device to compile for: the named kind, else TPU, then GPU, then CPU.

    Args:
        name: ``"tpu"``, ``"gpu"``, ``"cpu"`` or ``None`` for the best one present.

    Raises:
        InvalidOptionError: if the named kind is not present, listing what is.
    """
    kinds = [name] if name else ["tpu", "gpu", "cpu"]
    for kind in kinds:
        try:
            devices = jax.devices(kind)
        except RuntimeError:
            continue
        if devices:
            return devices[0]
    have = sorted({d.platform for d in jax.devices()})
    raise InvalidOptionError(
        f"device={name!r} was asked for but JAX sees only {have}; install the matching extra "
        "(pip install 'tpu-inductor[tpu]' or '[cuda]') or drop the 'device' option"
    )


# NOTE: XLA:CPU (jaxlib 0.10) hands convolutions and the ops around them to YNNPACK as one large
# fusion that re-lays-out every NCHW weight on each call. In inference that costs ResNet-18 2x
# (29 ms against 14 ms with YNNPACK kept to single matmuls; transformers unchanged), but a
# training step (forward, backward, AdamW) got slower without it (102 ms against 125-134 ms),
# so only inference executables on CPU get this option (2-core CPU host, one thread). It is
# per executable, never set globally, and dropped (once, with a log line) by a jaxlib that
# doesn't know it.
CPU_INFERENCE_OPTIONS = {
    "xla_cpu_experimental_ynn_fusion_type": "LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT",
}
_rejected_options: set[str] = set()


def compiler_options(platform: str, kind: str) -> dict:
    """XLA compiler options for one executable: ``kind`` is the graph's kind (``"inference"``,
    ``"forward"``, ``"backward"``, with an ``-island`` suffix for fallback pieces)."""
    if platform != "cpu" or not kind.startswith("inference"):
        return {}
    return {k: v for k, v in CPU_INFERENCE_OPTIONS.items() if k not in _rejected_options}


def compile_lowered(lowered, options: dict):
    """``lowered.compile()`` with ``options``; without them if this jaxlib rejects them."""
    if not options:
        return lowered.compile()
    try:
        return lowered.compile(compiler_options=options)
    except Exception as e:
        # Only an error naming one of our options means this jaxlib doesn't know it; any other
        # compile error is the user's and propagates unchanged.
        unknown = {k for k in options if k in str(e)}
        if not unknown:
            raise
        _rejected_options.update(unknown)
        log.info("compiling without %s: %s", sorted(unknown), e)
        return lowered.compile(
            compiler_options={k: v for k, v in options.items() if k not in unknown} or None
        )


def platform_of(device: jax.Device) -> str:
    """``"tpu"``, ``"gpu"`` or ``"cpu"`` (CUDA and ROCm devices both count as ``"gpu"``)."""
    return "gpu" if device.platform in ("gpu", "cuda", "rocm") else device.platform


def _materialize(t: torch.Tensor) -> torch.Tensor:
    """A detached, contiguous, CPU tensor with conj/neg bits resolved (same values)."""
    if t.requires_grad:
        t = t.detach()
    if t.is_conj() or t.is_neg():
        t = t.resolve_conj().resolve_neg()
    if not t.is_contiguous():
        t = t.contiguous()
    if t.device.type != "cpu":
        t = t.cpu()
    return t


# Dtypes numpy knows only through ml_dtypes: cross as same-width unsigned ints.
_BITCAST = {
    torch.bfloat16: (torch.uint16, np.dtype(jax.numpy.bfloat16)),
    torch.float8_e4m3fn: (torch.uint8, np.dtype(jax.numpy.float8_e4m3fn)),
    torch.float8_e5m2: (torch.uint8, np.dtype(jax.numpy.float8_e5m2)),
}
_BITCAST_BACK = {np_dt: tdt for tdt, (_, np_dt) in _BITCAST.items()}


_EFFECT_TOKEN = np.zeros((0,), np.float32)


def tensor_to_host(t: torch.Tensor | None) -> np.ndarray:
    """A zero-copy numpy view of a tensor, for passing straight to an XLA executable.

    Handing executables numpy arrays is the cheapest way in: on a 2-core CPU host, ~7 us per
    call for a small input against ~29 us through ``jax.dlpack.from_dlpack`` (see
    ``python -m benchmarks.boundary``); on TPU/GPU the executable copies it to the device.
    """
    if t is None:
        return _EFFECT_TOKEN  # AOTAutograd passes None for an effect token (float32[0])
    t = _materialize(t)
    special = _BITCAST.get(t.dtype)
    if special is not None:
        return t.view(special[0]).numpy().view(special[1])
    return t.numpy()


def tensor_to_jax(t: torch.Tensor, device: jax.Device) -> jax.Array:
    """Move one torch tensor to ``device`` as a ``jax.Array`` with the same dtype and values.

    Zero-copy on CPU for contiguous tensors (DLPack). Non-contiguous, channels_last,
    conjugated or negated views are materialized first. Must run with
    ``jax.enable_x64(True)`` so 64-bit dtypes survive.
    """
    t = _materialize(t)
    if t.numel() == 0:
        arr = jax.numpy.zeros(tuple(t.shape), dtype=to_jax_dtype(t.dtype))
    else:
        arr = jax.dlpack.from_dlpack(t)
    if device.platform != "cpu":
        arr = jax.device_put(arr, device)
    return arr


def jax_to_tensor(arr) -> torch.Tensor | None:
    """Turn one output array into a CPU torch tensor.

    On CPU this is a zero-copy view of the (fresh, never reused) output buffer, ~1 us against
    ~4 us for ``torch.from_dlpack``; elsewhere ``np.asarray`` is the device-to-host copy.
    """
    if not isinstance(arr, jax.Array):
        return arr  # None for an output torch leaves undefined (e.g. a masked-out gradient)
    host = np.asarray(arr)
    back = _BITCAST_BACK.get(host.dtype)
    if back is not None:
        return torch.from_numpy(host.view(f"u{host.dtype.itemsize}")).view(back)
    return torch.from_numpy(host)


@functools.cache
def _quiet_readonly_numpy_warning() -> None:
    """Outputs are views of read-only numpy arrays over fresh XLA buffers that nothing else
    holds, so torch's one-time "non-writable NumPy array" warning doesn't apply; spend it."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ro = np.zeros(1)
        ro.flags.writeable = False
        torch.from_numpy(ro)


class ResidentInputs:
    """Keeps parameters and buffers on the device between calls.

    One slot per static input position (parameters and buffers, as AOTAutograd reports them).
    A slot is reused while it holds the same tensor object at the same version counter and
    data pointer; any in-place change (an eager optimizer step, ``copy_``, ``load_state_dict``)
    bumps the version and the tensor is transferred again. On CPU the import is zero-copy.
    """

    def __init__(self, positions: Sequence[int], device: jax.Device):
        self.positions = frozenset(positions)
        self.device = device
        self._slots: dict[int, tuple[weakref.ref, int, int, jax.Array]] = {}

    def get(self, i: int, t: torch.Tensor) -> jax.Array | np.ndarray:
        if i not in self.positions:
            return tensor_to_host(t)
        slot = self._slots.get(i)
        if (
            slot is not None
            and slot[0]() is t
            and slot[1] == t._version
            and slot[2] == t.data_ptr()
        ):
            return slot[3]
        arr = tensor_to_jax(t, self.device)
        self._slots[i] = (weakref.ref(t), t._version, t.data_ptr(), arr)
        cache.STATS.transfers += 1
        return arr


def draw_seed() -> np.ndarray:
    """Two uint32 words drawn from torch's default CPU generator.

    Drawing advances torch's RNG, so ``torch.manual_seed`` makes compiled random ops repeatable
    and successive calls differ, exactly like eager.
    """
    words = torch.randint(0, 2**32, (2,), dtype=torch.int64)
    return words.numpy().astype(np.uint32)


@dataclasses.dataclass
class Build:
    """Why and how fast one executable was built (for ``tpu_inductor.report()``)."""

    signature: tuple
    reason: str
    seconds: float


class Executables:
    """One XLA executable per concrete input signature of a lowered graph, LRU-bounded.

    A signature is the (shape, dtype) of every tensor input plus the values of the static
    (Python scalar) inputs. Dynamic graphs get one executable per concrete shape; Dynamo never
    sees a size change. Thread-safe: each signature is compiled once, however many threads
    ask for it at the same time.
    """

    def __init__(
        self,
        lowered,
        max_entries: int,
        name: str,
        dump_dir: pathlib.Path | None = None,
        lower_seconds: float = 0.0,
        compiler_options: dict | None = None,
    ):
        self.lowered = lowered
        self.compiler_options = compiler_options or {}
        self.max_entries = max_entries
        self.name = name
        self.dump_dir = dump_dir
        self.lower_seconds = lower_seconds
        self.entries: collections.OrderedDict[tuple, object] = collections.OrderedDict()
        self.builds: list[Build] = []
        self.hits = 0
        self.misses = 0
        self.evictions = 0
        self.checked: set = set()  # padded signatures already compared with an exact run
        self.padding_off = False
        self._lock = threading.Lock()
        n = len(lowered.input_metas)
        self._static = tuple(i + 1 for i in range(n) if i not in set(lowered.tensor_inputs))
        self._tensor_pos = lowered.tensor_inputs

        def traced(seed, *inputs):
            cache.STATS.traces += 1
            return lowered.fn(seed, *inputs)

        self._jitted = jax.jit(traced, static_argnums=self._static)

    def get(self, signature: tuple, seed, arrays: list, statics: list):
        """The executable for ``signature``, compiling it on first use."""
        exe = self.entries.get(signature)
        if exe is not None:
            self.hits += 1
            if len(self.entries) > 1:
                self.entries.move_to_end(signature)
            return exe
        with self._lock:
            exe = self.entries.get(signature)
            if exe is not None:
                return exe
            self.misses += 1
            start = time.perf_counter()
            args = [None] * len(self.lowered.input_metas)
            for pos, a in zip(self._tensor_pos, arrays, strict=True):
                args[pos] = a
            it = iter(statics)
            for i in range(len(args)):
                if i not in self._tensor_pos:
                    args[i] = next(it)
            traced = self._jitted.trace(seed, *args)
            lowered = traced.lower()
            exe = compile_lowered(lowered, self.compiler_options)
            reason = self._reason(signature)
            if self.dump_dir is not None:
                n = len(self.builds)
                (self.dump_dir / f"executable{n}.jaxpr.txt").write_text(str(traced.jaxpr))
                (self.dump_dir / f"executable{n}.stablehlo.mlir").write_text(lowered.as_text())
                (self.dump_dir / f"executable{n}.reason.txt").write_text(reason + "\n")
            self.builds.append(Build(signature, reason, time.perf_counter() - start))
            self.entries[signature] = exe
            if len(self.entries) > self.max_entries:
                self.entries.popitem(last=False)
                self.evictions += 1
            log.info(
                "%s: built executable #%d (%s) in %.2fs",
                self.name,
                len(self.builds),
                reason,
                self.builds[-1].seconds,
            )
            return exe

    def _reason(self, signature: tuple) -> str:
        if not self.builds:
            return "first call"
        prev = self.builds[-1].signature
        changed = [
            f"input {i}: {_fmt(a)} -> {_fmt(b)}"
            for i, (a, b) in enumerate(zip(prev[0], signature[0], strict=True))
            if a != b
        ]
        changed += [
            f"scalar {i}: {a!r} -> {b!r}"
            for i, (a, b) in enumerate(zip(prev[1], signature[1], strict=True))
            if a != b
        ]
        if len(self.entries) >= self.max_entries:
            changed.append("(an older executable was evicted: max_executables reached)")
        return "; ".join(changed) or "evicted earlier, rebuilt"


def _fmt(spec) -> str:
    shape, dtype = spec
    return f"{dtype}{list(shape)}"


class CompiledGraph:
    """The callable handed back to AOTAutograd for one graph (boxed calling convention).

    Called with a list of torch tensors (and Python scalars for static inputs); returns a list
    of fresh CPU torch tensors. Nothing returned aliases a buffer this object keeps.
    """

    def __init__(
        self,
        exes: Executables,
        device: jax.Device,
        resident: ResidentInputs,
        name: str,
        pad_to=None,
        gm=None,
    ):
        # An instance attribute: Dynamo's disable() wrapper copies __dict__, not class attributes.
        self._boxed_call = True
        self.exes = exes
        # Shape buckets apply to dynamic graphs only; gm runs the exact-shape check in torch.
        self.pad_to = pad_to if exes.lowered.dynamic else None
        self.gm = gm
        self.lowered = exes.lowered
        self.device = device
        self.resident = resident
        self.name = name
        self._tensor_inputs = frozenset(self.lowered.tensor_inputs)
        self._scalar_outputs = self.lowered.scalar_outputs
        # A static graph has one signature (Dynamo's guards fix every input's shape and dtype):
        # after the first call its executable is used without rebuilding the signature.
        self._static_exe = None
        self._one_signature = not self.lowered.dynamic and len(self._tensor_inputs) == len(
            self.lowered.input_metas
        )
        # Only switch JAX's default device when it is not already ours (costs ~1 us per call).
        self._needs_default_device = jax.devices()[0] != device
        _quiet_readonly_numpy_warning()

    def call_unboxed(self, *args) -> list:
        """The same call with Dynamo's calling convention, for graphs called without
        AOTAutograd's runtime wrapper (see ``capture.passes_through``)."""
        return self(list(args))

    def __call__(self, args: list) -> list:
        if self.pad_to is not None and not self.exes.padding_off:
            return self._call_padded(args)
        get = self.resident.get
        seed = draw_seed() if self.lowered.has_rng else None
        with jax.enable_x64(True):  # without it, DLPack would turn int64 into int32
            exe = self._static_exe
            if exe is not None:
                arrays = [get(i, a) for i, a in enumerate(args)]
                args.clear()
                self.exes.hits += 1
            else:
                tensor_inputs = self._tensor_inputs
                arrays, statics = [], []
                for i, a in enumerate(args):
                    if i in tensor_inputs:
                        arrays.append(get(i, a))
                    else:
                        statics.append(_python_scalar(a))
                args.clear()
                signature = (tuple((x.shape, x.dtype) for x in arrays), tuple(statics))
                exe = self.exes.get(signature, seed, arrays, statics)
                if self._one_signature:
                    self._static_exe = exe
            if self._needs_default_device:
                with jax.default_device(self.device):
                    outs = exe(seed, *arrays)
            else:
                outs = exe(seed, *arrays)
            if self._scalar_outputs:
                return [
                    o.item() if i in self._scalar_outputs else jax_to_tensor(o)
                    for i, o in enumerate(outs)
                ]
            return [jax_to_tensor(o) for o in outs]

    def _call_padded(self, args: list) -> list:
        low = self.lowered
        seed = draw_seed() if low.has_rng else None
        originals = list(args)
        with jax.enable_x64(True):
            values = [
                self.resident.get(i, a) if i in self._tensor_inputs else _python_scalar(a)
                for i, a in enumerate(args)
            ]
            args.clear()
            real = bind(low.input_metas, values)
            padded = buckets.padded_bindings(real, self.pad_to)
            values = [
                buckets.pad_array(v, m, padded)
                if isinstance(m, torch.Tensor)
                else concrete(m, padded)
                for v, m in zip(values, low.input_metas, strict=True)
            ]
            arrays = [v for i, v in enumerate(values) if i in self._tensor_inputs]
            statics = [v for i, v in enumerate(values) if i not in self._tensor_inputs]
            signature = (tuple((x.shape, x.dtype) for x in arrays), tuple(statics))
            with jax.default_device(self.device):
                outs = self.exes.get(signature, seed, arrays, statics)(seed, *arrays)
            result = [
                buckets.slice_output(o, m, real)
                if i in self._scalar_outputs
                else jax_to_tensor(buckets.slice_output(o, m, real))
                for i, (o, m) in enumerate(zip(outs, low.output_metas, strict=True))
            ]
        if signature not in self.exes.checked and not low.has_rng:
            self.exes.checked.add(signature)
            exact = list(self.gm(*originals))
            if not buckets.results_match(result, exact):
                self.exes.padding_off = True
                buckets.warn_padding_changed_results(self.exes.name, signature)
                return exact
        return result


def _python_scalar(v):
    """SymInts/SymFloats that reach a graph are concrete here; make them plain Python."""
    if isinstance(v, torch.SymInt):
        return int(v)
    if isinstance(v, torch.SymFloat):
        return float(v)
    if isinstance(v, torch.SymBool):
        return bool(v)
    if isinstance(v, torch.Tensor):
        return v.item()
    return v

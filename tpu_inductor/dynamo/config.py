"""The one home of tpu-inductor's configuration.

Options come from ``torch.compile(..., backend="tpu", options={...})``; each also has a
``TPU_INDUCTOR_*`` environment variable that supplies its default. Options win over the
environment. Unknown options and bad values raise :class:`InvalidOptionError`, which lists
every problem at once together with the known options.

torch hands a custom backend its ``options`` (and ``mode``) only when Dynamo calls it with the
first graph, i.e. at the first call of the compiled function, never at ``torch.compile(...)``
time: ``torch._TorchCompileWrapper.__init__`` only stores them in ``self.kwargs`` and
``__call__(model_, inputs_)`` passes them on. That first call is where they are checked.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import json
import logging
import os
from collections.abc import Mapping
from typing import Any

from tpu_inductor.core.errors import InvalidOptionError
from tpu_inductor.runtime import sharding

DEVICES = ("tpu", "gpu", "cpu")
FALLBACKS = ("eager", "error")
TRANSFER_POLICIES = ("count", "log", "error")

# torch.compile's ``mode`` values and what each means here. torch passes ``mode=`` to a custom
# backend only when it is not "default" (torch/__init__.py, _TorchCompileWrapper.__init__). None
# of them changes what this backend builds, so they are not part of any cache key.
MODES = {
    "default": "compile each graph for the JAX device, one XLA executable per input signature",
    "reduce-overhead": (
        "the same as default: Inductor's mode captures CUDA graphs to cut per-call Python and "
        "launch overhead; here each graph is already one cached XLA executable per shape, "
        "called directly (no CUDA graphs, nothing more to capture)"
    ),
    "max-autotune": (
        "the same as default: Inductor's mode benchmarks Triton kernel choices; XLA has no "
        "such switch for us to turn on (on GPU it already autotunes GEMMs and convolutions by "
        "default, on TPU and CPU it picks its own tilings)"
    ),
    "max-autotune-no-cudagraphs": "the same as default (max-autotune without CUDA graphs)",
}


@dataclasses.dataclass(frozen=True)
class Options:
    """Validated backend options (see the README's options table).

    Attributes:
        device: ``"tpu"``, ``"gpu"``, ``"cpu"`` or ``None`` for the best device JAX has.
        fallback: what to do with ops that have no lowering: ``"eager"`` runs them in torch
            on the CPU between compiled JAX islands and warns once per graph naming them;
            ``"error"`` raises :class:`~tpu_inductor.core.errors.UnsupportedOpError` listing all.
        check_meta: check every lowered value's shape and dtype against the FX node's
            ``meta["val"]`` while tracing (a debugging aid for lowerings; costs nothing per call).
        cache_dir: a folder for JAX's persistent compilation cache, or ``None``.
        matmul_precision: ``None`` follows ``torch.get_float32_matmul_precision()``; or one of
            ``"highest"``, ``"high"``, ``"medium"`` to override it for this compile.
        max_executables: how many XLA executables (one per concrete input shape) each graph
            keeps; the least recently used is dropped beyond that.
        dump_dir: a folder where each graph's FX code, and each executable's jaxpr and
            StableHLO, are written (for debugging), or ``None``.
        pad_to: shape buckets for dynamic graphs: ``"pow2"`` or a list of sizes; symbolic
            sizes are padded up to their bucket and outputs sliced back (see buckets.py).
        transfers: ``"count"`` counts every host <-> device crossing (``report().transfers``);
            ``"log"`` also logs each unexpected one in steady state (a parameter re-sent, a
            saved activation brought to the host); ``"error"`` raises
            :class:`~tpu_inductor.core.errors.TransferError` for it (see transfers.py).
        mesh: a ``jax.sharding.Mesh`` to run SPMD over (see sharding.py), or ``None``.
        shardings: with ``mesh``: ``"dp"`` (the default), ``"fsdp"``, ``"tp"`` or a dict of
            parameter-name patterns to ``PartitionSpec`` (plus ``"inputs"`` for the batch).
        target: a TPU topology (``"v5e:2x2"``, ``"v6e-8"``, ``"v5p"``; see
            :func:`tpu_inductor.tpu_target`) to compile every graph for, on any machine (libtpu
            needed, no TPU): nothing runs, graphs return placeholders, and
            :func:`tpu_inductor.tpu_report` describes each program. With ``mesh``, the mesh must
            be over the target's chips (``tpu_target(name).mesh(...)``).
        scan_layers: lower a model's repeated blocks (``model.layers.0 .. N-1``: the same ops
            on different weights) once, as a ``jax.lax.scan`` over the stacked per-layer
            weights, so compile time stops growing with depth (see scan_layers.py); blocks that
            don't match stay unrolled.
    """

    device: str | None = None
    fallback: str = "eager"
    check_meta: bool = False
    cache_dir: str | None = None
    matmul_precision: str | None = None
    max_executables: int = 64
    dump_dir: str | None = None
    pad_to: str | tuple[int, ...] | None = None
    transfers: str = "count"
    mesh: Any = None
    shardings: Any = None
    target: str | None = None
    scan_layers: bool = False

    @functools.cached_property
    def plan(self) -> sharding.Plan | None:
        """The sharding plan of ``mesh`` and ``shardings`` (``None`` without a mesh), parsed once
        per compile instead of by every stage that needs it."""
        return sharding.parse_plan(self.mesh, self.shardings)


# Options that only make sense in code (objects, not strings) have no environment variable.
_NO_ENV = frozenset({"mesh", "shardings"})

_ENV = {
    "device": "TPU_INDUCTOR_DEVICE",
    "fallback": "TPU_INDUCTOR_FALLBACK",
    "check_meta": "TPU_INDUCTOR_CHECK_META",
    "cache_dir": "TPU_INDUCTOR_CACHE_DIR",
    "matmul_precision": "TPU_INDUCTOR_MATMUL_PRECISION",
    "max_executables": "TPU_INDUCTOR_MAX_EXECUTABLES",
    "dump_dir": "TPU_INDUCTOR_DUMP_DIR",
    "pad_to": "TPU_INDUCTOR_PAD_TO",
    "transfers": "TPU_INDUCTOR_TRANSFERS",
    "target": "TPU_INDUCTOR_TARGET",
    "scan_layers": "TPU_INDUCTOR_SCAN_LAYERS",
}

_CHOICES = {
    "device": DEVICES,
    "fallback": FALLBACKS,
    "matmul_precision": ("highest", "high", "medium"),
    "transfers": TRANSFER_POLICIES,
}


def _from_env(name: str, field: dataclasses.Field) -> Any:
    if name in _NO_ENV:
        return field.default
    raw = os.environ.get(_ENV[name])
    if raw is None or raw == "":
        return field.default
    if field.type in ("bool", bool):
        return raw.strip().lower() in ("1", "true", "yes", "on")
    if field.type in ("int", int):
        try:
            return int(raw)
        except ValueError:
            return raw  # reported as a bad value below
    return raw


def parse_options(options: Mapping[str, Any] | None, mode: str | None = None) -> Options:
    """Validate user options (and torch.compile's ``mode``) and fill the rest from the
    environment.

    Args:
        options: the ``options`` dict given to ``torch.compile``, or ``None``.
        mode: the ``mode`` given to ``torch.compile``: ``None`` or one of :data:`MODES`
            (validated only; none of them changes what is compiled).

    Returns:
        A frozen :class:`Options`.

    Raises:
        InvalidOptionError: listing every problem at once: options that are not a dict, each
            unknown option (with the closest known name), each bad value or type, a bad mesh
            or sharding plan, and an unknown mode.

    Example:
        >>> parse_options({"device": "cpu"}).device
        'cpu'
    """
    fields = {f.name: f for f in dataclasses.fields(Options)}
    problems = []
    if mode is not None and mode not in MODES:
        problems.append(
            f"mode {mode!r} is not a torch.compile mode; valid modes: "
            + ", ".join(repr(m) for m in MODES)
            + " (all compile the same way here: see the README's Options)"
        )
    if options is not None and not isinstance(options, Mapping):
        problems.append(
            "options must be a dict of option names to values, e.g. options={'device': 'cpu'}; "
            f"got {type(options).__name__} {options!r}"
        )
        options = None
    options = dict(options or {})
    for key in sorted(set(options) - set(fields), key=repr):
        close = difflib.get_close_matches(key, fields, n=1) if isinstance(key, str) else []
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        problems.append(f"unknown option {key!r}{hint}")
    values = {}
    for name, field in fields.items():
        value = options[name] if name in options else _from_env(name, field)
        choices = _CHOICES.get(name)
        if field.type in ("bool", bool) and not isinstance(value, bool):
            problems.append(f"option {name!r} must be True or False, got {value!r}")
        elif choices is not None and value is not None and value not in choices:
            problems.append(f"option {name!r} must be one of {choices} or None, got {value!r}")
        elif field.type in ("int", int) and (
            not isinstance(value, int) or isinstance(value, bool) or value < 1
        ):
            problems.append(f"option {name!r} must be a positive int, got {value!r}")
        elif (
            name in ("cache_dir", "dump_dir")
            and value is not None
            and not isinstance(value, str | os.PathLike)
        ):
            problems.append(f"option {name!r} must be a path, got {value!r}")
        values[name] = value
    pad = values.get("pad_to")
    if isinstance(pad, str) and pad != "pow2":
        try:
            pad = [int(p) for p in pad.split(",")]
        except ValueError:
            problems.append(f"option 'pad_to' must be 'pow2' or a list of sizes, got {pad!r}")
            pad = None
    if isinstance(pad, list | tuple):
        if not pad or not all(isinstance(p, int) and p > 0 for p in pad):
            problems.append(f"option 'pad_to' must be 'pow2' or positive sizes, got {pad!r}")
        else:
            pad = tuple(sorted(set(pad)))
    elif pad is not None and pad != "pow2":
        problems.append(f"option 'pad_to' must be 'pow2' or a list of sizes, got {pad!r}")
    values["pad_to"] = pad
    try:
        sharding.parse_plan(values["mesh"], values["shardings"])  # a bad mesh or plan
    except InvalidOptionError as e:
        problems.append(str(e).replace("\n", "\n    "))
    problems += _target_problems(values)
    if problems:
        known = ", ".join(f"{n} (env {_ENV[n]})" if n in _ENV else n for n in fields)
        raise InvalidOptionError(
            "invalid tpu-inductor options:\n  - "
            + "\n  - ".join(problems)
            + f"\nKnown options: {known}."
        )
    for name in ("cache_dir", "dump_dir"):
        if values[name] is not None:
            values[name] = os.fspath(values[name])
    return Options(**values)


def _target_problems(values: dict) -> list[str]:
    """What is wrong with the ``target`` option and the options it must agree with."""
    from tpu_inductor.tpu.targets import Target, parse_name, split_slices, tpu_target

    target = values.get("target")
    if isinstance(target, Target):
        values["target"] = target = target.name
    if target is None:
        return []
    if not isinstance(target, str):
        return [f"option 'target' must be a TPU topology name like 'v5e:2x2', got {target!r}"]

    try:
        parse_name(split_slices(target)[0])
    except InvalidOptionError as e:
        return [str(e)]
    problems = []
    if values.get("device") not in (None, "tpu"):
        problems.append(
            f"option 'target' compiles for a TPU; it can't go with device={values['device']!r} "
            "(drop 'device')"
        )
    mesh = values.get("mesh")
    if mesh is not None and hasattr(mesh, "devices"):
        try:
            ours = set(tpu_target(target).devices)
        except InvalidOptionError as e:
            return problems + [str(e)]
        if not set(mesh.devices.flat) <= ours:
            problems.append(
                f"option 'mesh' is not over the chips of target {target!r}: make it with "
                f"tpu_inductor.tpu_target({target!r}).mesh({{'data': n, ...}})"
            )
    return problems


# TPU_INDUCTOR_EAGER_OPS (where eager ops on keep_on_device state run) is read by the runtime
# itself, where it is used: tpu_inductor/runtime/device_eager.py, eager_ops().


_logging_configured = False


def configure_logging() -> None:
    """Honour ``TPU_INDUCTOR_LOG`` (``DEBUG``, ``INFO``, ``WARNING`` or ``1`` for INFO).

    Called on first use of the backend, never on import; touches only the ``tpu_inductor``
    logger, adding a stderr handler when the variable is set.
    """
    global _logging_configured
    if _logging_configured:
        return
    _logging_configured = True
    level = os.environ.get("TPU_INDUCTOR_LOG", "").strip().upper()
    if not level:
        return
    level = "INFO" if level in ("1", "TRUE", "ON") else level
    logger = logging.getLogger("tpu_inductor")
    logger.setLevel(getattr(logging, level, logging.INFO))
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("[tpu_inductor %(levelname)s] %(message)s"))
    logger.addHandler(handler)


# Module-level switches that change the programs built (benchmarks and tests flip them to
# measure a lever): each is in every cache key, the in-memory one and cache_dir's.
SWITCHES = (
    ("tpu_inductor.capture.aot", "SPLIT_LOG_SOFTMAX"),
    ("tpu_inductor.capture.aot", "RECAST_PARAMETERS"),
    ("tpu_inductor.runtime.signatures", "ZERO_TANGENTS"),
    ("tpu_inductor.lowering.lowerings.linalg", "TPU_HALF_DOTS"),
    ("tpu_inductor.lowering.lowerings.splash_attention", "SPLASH_ATTENTION"),
    ("tpu_inductor.lowering.lowerings.attention", "FUSED_SOFTMAX_PLATFORMS"),
    ("tpu_inductor.lowering.lowerings.long_attention", "PLATFORMS"),
    ("tpu_inductor.lowering.lowerings.long_attention", "MIN_LENGTH"),
    ("tpu_inductor.lowering.leading_dims", "PLATFORMS"),
    ("tpu_inductor.dynamo.backend", "DONATE_ON_CPU"),
)


def switch_values() -> tuple:
    """The current value of every program-changing switch (:data:`SWITCHES`)."""
    import importlib

    out = []
    for module, name in SWITCHES:
        value = getattr(importlib.import_module(module), name)
        out.append((f"{module}.{name}", sorted(value) if isinstance(value, set) else value))
    return tuple((k, tuple(v) if isinstance(v, list) else v) for k, v in out)


# Options that change no program: where files go (cache_dir, dump_dir), how many executables a
# graph keeps, how crossings are reported.
_NOT_IN_PROGRAMS = frozenset({"cache_dir", "dump_dir", "max_executables", "transfers"})


def program_fingerprint(opts: Options, device, precision: str, custom_ops: str) -> dict:
    """Everything besides the graph that shapes a program, as JSON-able values: the key of a
    program saved in ``cache_dir`` (runtime/program_store.py) holds it, and a saved manifest
    whose fingerprint differs is set aside, naming the part that differs.

    Args:
        opts: the parsed options (every option that changes programs is in).
        device: the JAX device compiled for (its platform and kind).
        precision: the float32 matmul precision in effect.
        custom_ops: the fingerprint of the lowerings users registered.
    """
    options = {
        f.name: repr(getattr(opts, f.name))
        for f in dataclasses.fields(Options)
        if f.name not in _NOT_IN_PROGRAMS
    }
    options["plan"] = repr(None if opts.plan is None else opts.plan.key())
    options["matmul_precision"] = precision
    return json.loads(  # exactly as a saved manifest reads back (tuples become lists)
        json.dumps(
            {
                "package": package_hash(),
                "versions": _versions(),
                "options": options,
                "switches": {k: repr(v) for k, v in switch_values()},
                "device": {
                    "platform": getattr(device, "platform", str(device)),
                    "kind": getattr(device, "device_kind", ""),
                    "target": opts.target or "",
                },
                "custom_ops": custom_ops,
            }
        )
    )


@functools.cache
def package_hash() -> str:
    """A hash of every source file of the installed tpu_inductor package (a changed lowering
    is a changed program)."""
    import hashlib
    import pathlib

    root = pathlib.Path(__file__).resolve().parent.parent
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        h.update(str(path.relative_to(root)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def _versions() -> dict:
    import importlib.metadata

    import jax
    import jaxlib
    import torch

    versions = {"torch": torch.__version__, "jax": jax.__version__, "jaxlib": jaxlib.__version__}
    try:
        versions["libtpu"] = importlib.metadata.version("libtpu")
    except importlib.metadata.PackageNotFoundError:
        versions["libtpu"] = ""
    return versions

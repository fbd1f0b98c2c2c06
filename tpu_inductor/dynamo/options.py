"""A compile's options, checked: ``torch.compile(..., backend="tpu", options={...})`` over the
knobs of :mod:`tpu_inductor.core.config` (where each is declared, with its environment variable).
Unknown options and bad values raise :class:`InvalidOptionError`, which lists every problem at
once; here are the checks that need the stages above the core (a mesh's plan, a TPU target),
the program fingerprint of ``cache_dir``, and logging.

torch hands a custom backend its ``options`` (and ``mode``) only when Dynamo calls it with the
first graph, i.e. at the first call of the compiled function, never at ``torch.compile(...)``
time: ``torch._TorchCompileWrapper.__init__`` only stores them in ``self.kwargs`` and
``__call__(model_, inputs_)`` passes them on. That first call is where they are checked.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Mapping
from typing import Any

from tpu_inductor.core import config
from tpu_inductor.core.config import Options
from tpu_inductor.core.errors import InvalidOptionError
from tpu_inductor.runtime import sharding

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


def parse_options(options: Mapping[str, Any] | None, mode: str | None = None) -> Options:
    """Validate user options (and torch.compile's ``mode``) and fill the rest from
    :mod:`tpu_inductor.core.config` (``config.patch``, the environment, the defaults).

    Args:
        options: the ``options`` dict given to ``torch.compile``, or ``None``.
        mode: the ``mode`` given to ``torch.compile``: ``None`` or one of :data:`MODES`
            (validated only; none of them changes what is compiled).

    Returns:
        A frozen :class:`~tpu_inductor.core.config.Options`, every knob's value for this compile.

    Raises:
        InvalidOptionError: listing every problem at once: options that are not a dict, each
            unknown option (with the closest known name), each bad value or type, a bad mesh
            or sharding plan, and an unknown mode.

    Example:
        >>> parse_options({"device": "cpu"}).device
        'cpu'
    """
    problems = []
    if mode is not None and mode not in MODES:
        problems.append(
            f"mode {mode!r} is not a torch.compile mode; valid modes: "
            + ", ".join(repr(m) for m in MODES)
            + " (all compile the same way here: see docs/options.md)"
        )
    if options is not None and not isinstance(options, Mapping):
        problems.append(
            "options must be a dict of option names to values, e.g. options={'device': 'cpu'}; "
            f"got {type(options).__name__} {options!r}"
        )
        options = None
    values, found = config.resolve(options)
    problems += found
    try:
        sharding.parse_plan(values["mesh"], values["shardings"])  # a bad mesh or plan
    except InvalidOptionError as e:
        problems.append(str(e).replace("\n", "\n    "))
    problems += _target_problems(values)
    if problems:
        known = ", ".join(k.name for k in config.list_options() if k.per_compile)
        raise InvalidOptionError(
            "invalid tpu-inductor options:\n  - "
            + "\n  - ".join(problems)
            + f"\nKnown options: {known} (tpu_inductor.list_options() describes each)."
        )
    return Options(**values)


def plan_of(opts: Options) -> sharding.Plan | None:
    """The sharding plan of ``opts.mesh`` and ``opts.shardings`` (``None`` without a mesh)."""
    return sharding.parse_plan(opts.mesh, opts.shardings)


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
    level = config.get("log").strip().upper()
    if not level:
        return
    level = "INFO" if level in ("1", "TRUE", "ON") else level
    logger = logging.getLogger("tpu_inductor")
    logger.setLevel(getattr(logging, level, logging.INFO))
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("[tpu_inductor %(levelname)s] %(message)s"))
    logger.addHandler(handler)


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
    options = {name: repr(value) for name, value in config.program_key(opts)}
    plan = plan_of(opts)
    options["plan"] = repr(None if plan is None else plan.key())
    options["matmul_precision"] = precision
    return json.loads(  # exactly as a saved manifest reads back (tuples become lists)
        json.dumps(
            {
                "package": package_hash(),
                "versions": _versions(),
                "options": options,
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

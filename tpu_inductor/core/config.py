"""The one home of tpu-inductor's configuration: every knob declared once.

Each knob is a field of :class:`Options`, declared with its default, its ``TPU_INDUCTOR_*``
environment variable, its help, and whether it changes the programs built. A value comes from,
first to last: ``torch.compile(..., options={...})``, :func:`patch`, the environment variable,
the default. A compile takes one snapshot of every knob (an :class:`Options`) and runs its
stages inside :func:`scope`, so a lowering reads ``config.get("splash_attention")`` and sees
that compile's value whenever its program is traced; every knob that changes programs is in
every cache key (:func:`program_key`), by construction.

Imitates Inductor's config module (``config.patch``, ``list_options``) and JAX's flags
(``include_in_jit_key``).

Example:
    >>> from tpu_inductor import config
    >>> with config.patch(splash_attention="off"):
    ...     config.get("splash_attention")
    'off'
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import difflib
import os
from collections.abc import Iterator, Mapping
from typing import Any

from tpu_inductor.core.errors import InvalidOptionError

PLATFORMS = ("tpu", "gpu", "cpu")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Knob:
    """One declared knob (what :func:`list_options` returns).

    Attributes:
        name: the option's name (``options={name: ...}``, ``config.patch(name=...)``).
        default: its value when nothing sets it.
        help: what it does, in a sentence or two.
        kind: ``"bool"``, ``"int"``, ``"choice"`` (one of ``choices``), ``"platforms"`` (a
            tuple of JAX platform names), ``"path"``, ``"pad"``, ``"target"`` or ``"object"``.
        choices: the values a ``"choice"`` knob takes.
        env: its environment variable, or ``None`` (objects can't come from one).
        changes_programs: whether it changes what is compiled (then it is in every cache key).
        per_compile: whether ``options={...}`` may set it; process-wide knobs (logging, where
            eager ops on device-owned state run) are set by :func:`patch` or the environment.
        advanced: a switch for measuring a lowering choice or testing a form on the CPU, not
            for everyday use.
    """

    name: str
    default: Any
    help: str
    kind: str
    choices: tuple = ()
    env: str | None = None
    changes_programs: bool = True
    per_compile: bool = True
    advanced: bool = False


def _knob(default, help: str, kind: str, **declared) -> Any:
    return dataclasses.field(
        default=default, metadata={"knob": dict(help=help, kind=kind, **declared)}
    )


@dataclasses.dataclass(frozen=True, kw_only=True)
class Options:
    """One compile's value of every knob (see :func:`list_options` for their help)."""

    # --- what users set ---
    device: str | None = _knob(
        None,
        "'tpu', 'gpu' or 'cpu'; None picks the best device JAX has",
        "choice",
        choices=PLATFORMS,
    )
    fallback: str = _knob(
        "eager",
        "ops with no lowering: 'eager' runs them in torch on the CPU between compiled JAX "
        "islands and warns once per graph naming them; 'error' raises UnsupportedOpError "
        "listing every one",
        "choice",
        choices=("eager", "error"),
    )
    matmul_precision: str | None = _knob(
        None,
        "float32 matmul precision: None follows torch.get_float32_matmul_precision(); "
        "'highest', 'high' or 'medium' overrides it for this compile",
        "choice",
        choices=("highest", "high", "medium"),
    )
    pad_to: str | tuple[int, ...] | None = _knob(
        None,
        "shape buckets for dynamic graphs: 'pow2' or a list of sizes; symbolic sizes are "
        "padded up to their bucket and outputs sliced back",
        "pad",
    )
    mesh: Any = _knob(None, "a jax.sharding.Mesh to run SPMD over (see docs/training.md)", "object")
    shardings: Any = _knob(
        None,
        "with mesh: 'dp' (the default), 'fsdp', 'tp' or a dict of parameter-name patterns to "
        "PartitionSpec (plus 'inputs' for the batch)",
        "object",
    )
    target: str | None = _knob(
        None,
        "a TPU topology ('v5e:2x2', 'v6e-8', 'v5p') to compile every graph for, on any "
        "machine (libtpu needed, no TPU): nothing runs, tpu_report() describes each program",
        "target",
    )
    scan_layers: bool = _knob(
        False,
        "lower a model's repeated blocks (model.layers.0 .. N-1) once, as a lax.scan over "
        "stacked weights, so compile time stops growing with depth",
        "bool",
    )
    cache_dir: str | None = _knob(
        None,
        "a folder for compiled programs: a restart loads what it can prove unchanged",
        "path",
        changes_programs=False,
    )
    # --- debugging aids ---
    check_meta: bool = _knob(
        False,
        "check every lowered value's shape and dtype against the FX node's meta['val'] while "
        "tracing (a debugging aid for lowerings)",
        "bool",
    )
    dump_dir: str | None = _knob(
        None,
        "a folder where each graph's FX code, jaxpr and StableHLO are written",
        "path",
        changes_programs=False,
    )
    transfers: str = _knob(
        "count",
        "'count' counts every host <-> device crossing (report().transfers); 'log' also logs "
        "each unexpected one in steady state; 'error' raises TransferError for it",
        "choice",
        choices=("count", "log", "error"),
        changes_programs=False,
    )
    max_executables: int = _knob(
        64,
        "how many XLA executables (one per input signature) each graph keeps, least recently "
        "used dropped first",
        "int",
        changes_programs=False,
    )
    # --- process-wide ---
    eager_ops: str = _knob(
        "device",
        "where eager torch ops on keep_on_device state run: 'device' (through the lowering "
        "table) or 'host' (sync what they read to the host and run them in torch)",
        "choice",
        choices=("device", "host"),
        changes_programs=False,
        per_compile=False,
    )
    log: str = _knob(
        "",
        "log level of the 'tpu_inductor' logger to stderr: DEBUG, INFO, WARNING, or 1 for INFO",
        "str",
        changes_programs=False,
        per_compile=False,
    )
    # --- switches: a lowering choice each, for measuring it or testing its form on the CPU ---
    splash_attention: str = _knob(
        "auto",
        "'auto': the Pallas splash-attention kernel where a graph compiles for a TPU and the "
        "call fits it; 'off': dense attention everywhere; 'interpret': the kernel in Pallas "
        "interpret mode on any device (tests on the CPU)",
        "choice",
        choices=("auto", "off", "interpret"),
        advanced=True,
    )
    long_attention_platforms: tuple[str, ...] = _knob(
        ("tpu",),
        "platforms where attention over long sequences takes a form that never builds "
        "[heads, L, S] scores (splash or blockwise)",
        "platforms",
        advanced=True,
    )
    long_attention_min_length: int = _knob(
        1024,
        "query rows from which attention takes the long-sequence form",
        "int",
        advanced=True,
    )
    decode_key_chunk: int = _knob(
        1024,
        "the fewest key positions per step of attention for few queries over a long KV cache "
        "on the long-attention platforms (a running softmax; from two chunks of keys up)",
        "int",
        advanced=True,
    )
    fused_softmax_platforms: tuple[str, ...] = _knob(
        ("tpu",),
        "platforms where bf16 inference attention takes the fused-softmax form",
        "platforms",
        advanced=True,
    )
    tpu_half_dots: bool = _knob(
        True,
        "on a TPU, a half-precision product is computed in its own dtype (with a float32 "
        "accumulator) unless the graph converts it to float32 next",
        "bool",
        advanced=True,
    )
    leading_dims_platforms: tuple[str, ...] = _knob(
        ("tpu",),
        "platforms where a matmul's leading dimensions stay apart instead of being flattened "
        "by views (saves the relayout copies around each product)",
        "platforms",
        advanced=True,
    )
    conv_patches_platforms: tuple[str, ...] = _knob(
        ("tpu",),
        "platforms where a strided convolution over few input channels (a CNN's stem) takes "
        "its weight gradient as one product of patches (slower on XLA:CPU)",
        "platforms",
        advanced=True,
    )
    partitioner: str = _knob(
        "min_cut",
        "how AOTAutograd splits forward and backward: 'min_cut' (the backward recomputes cheap "
        "ops instead of the forward saving them) or 'default' (save every intermediate)",
        "choice",
        choices=("min_cut", "default"),
        advanced=True,
    )
    split_log_softmax: bool = _knob(
        True,
        "the backward recomputes log_softmax from its row statistics instead of the forward "
        "saving it",
        "bool",
        advanced=True,
    )
    recast_parameters: bool = _knob(
        True,
        "under autocast the backward recasts float32 parameters instead of the forward saving "
        "their bf16 copies",
        "bool",
        advanced=True,
    )
    recast_platforms: tuple[str, ...] = _knob(
        ("tpu",), "platforms where recast_parameters applies", "platforms", advanced=True
    )
    zero_tangents: bool = _knob(
        True,
        "a backward's all-zeros tangent is a constant of its program, not an array of zeros "
        "sent to it",
        "bool",
        advanced=True,
    )
    donate_on_cpu: bool = _knob(
        False,
        "donate updated inputs on the CPU too (on accelerators they always are; on the CPU a "
        "donated buffer may be a user's tensor memory, so only tests turn this on)",
        "bool",
        advanced=True,
    )


def _declare() -> dict[str, Knob]:
    knobs = {}
    for f in dataclasses.fields(Options):
        declared = dict(f.metadata["knob"])
        env = None if declared["kind"] == "object" else f"TPU_INDUCTOR_{f.name.upper()}"
        knobs[f.name] = Knob(name=f.name, default=f.default, env=env, **declared)
    return knobs


KNOBS: dict[str, Knob] = _declare()


def list_options() -> list[Knob]:
    """Every knob: its name, default, environment variable, help and whether it changes
    programs (then it is in every cache key).

    Example:
        >>> [k.name for k in list_options()][:3]
        ['device', 'fallback', 'matmul_precision']
    """
    return list(KNOBS.values())


# --- where a value comes from ---

_PATCHES: list[dict[str, Any]] = []  # config.patch(...) frames, innermost last
_SCOPE: contextvars.ContextVar[Options | None] = contextvars.ContextVar(
    "tpu_inductor_config", default=None
)


def _from_env(knob: Knob, raw: str) -> Any:
    """The value an environment variable spells (unparseable text stays a string, for
    :func:`_check` to report)."""
    text = raw.strip()
    if knob.kind == "bool":
        low = text.lower()
        if low in ("1", "true", "yes", "on"):
            return True
        if low in ("0", "false", "no", "off"):
            return False
        return text
    if knob.kind == "int":
        try:
            return int(text)
        except ValueError:
            return text
    if knob.kind == "platforms":
        return tuple(p.strip() for p in text.split(",") if p.strip())
    if knob.kind == "pad" and text != "pow2":
        try:
            return tuple(int(p) for p in text.split(","))
        except ValueError:
            return text
    return text


def _check(knob: Knob, value: Any) -> tuple[Any, str | None]:
    """``(normalized value, None)``, or ``(value, what is wrong)``."""
    name, kind = knob.name, knob.kind
    if kind == "bool" and not isinstance(value, bool):
        return value, f"option {name!r} must be True or False, got {value!r}"
    if kind == "int" and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
        return value, f"option {name!r} must be a positive int, got {value!r}"
    if kind == "choice" and value is not None and value not in knob.choices:
        return value, f"option {name!r} must be one of {knob.choices} or None, got {value!r}"
    if kind == "path" and value is not None:
        if not isinstance(value, str | os.PathLike):
            return value, f"option {name!r} must be a path, got {value!r}"
        return os.fspath(value), None
    if kind == "platforms":
        if isinstance(value, str) or not all(p in PLATFORMS for p in _iter(value)):
            return value, f"option {name!r} must be a list of {PLATFORMS}, got {value!r}"
        return tuple(sorted(set(value))), None
    if kind == "pad" and value is not None and value != "pow2":
        if isinstance(value, str):
            value = _from_env(knob, value)  # "4,8" as the environment spells it
        sizes = list(value) if isinstance(value, list | tuple) else None
        if not sizes or not all(
            isinstance(p, int) and not isinstance(p, bool) and p > 0 for p in sizes
        ):
            return (
                value,
                f"option 'pad_to' must be 'pow2' or a list of positive sizes, got {value!r}",
            )
        return tuple(sorted(set(sizes))), None
    if kind == "str" and not isinstance(value, str):
        return value, f"option {name!r} must be a string, got {value!r}"
    return value, None


def _iter(value) -> tuple:
    try:
        return tuple(value)
    except TypeError:
        return (object(),)  # not iterable: fails the membership check


def _unknown(names) -> list[str]:
    problems = []
    for key in sorted(set(names) - set(KNOBS), key=repr):
        close = difflib.get_close_matches(key, KNOBS, n=1) if isinstance(key, str) else []
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        problems.append(f"unknown option {key!r}{hint}")
    return problems


def resolve(options: Mapping[str, Any] | None = None) -> tuple[dict[str, Any], list[str]]:
    """Every knob's value for a compile given its ``options``, and every problem found.

    Returns:
        ``(values, problems)``: ``values`` maps each knob to its normalized value (options, then
        :func:`patch`, then the environment, then the default); ``problems`` lists unknown
        names (with the closest known one), bad values (naming the environment variable when
        that is where a value came from) and process-wide knobs passed as options.
    """
    options = dict(options or {})
    problems = _unknown(options)
    values = {}
    for name, knob in KNOBS.items():
        where = ""
        if name in options:
            value = options[name]
            if not knob.per_compile:
                problems.append(
                    f"option {name!r} is process-wide: set it with "
                    f"tpu_inductor.config.patch({name}=...) or {knob.env}, not options={{...}}"
                )
        else:
            value, where = _default(knob)
        value, problem = _check(knob, value)
        if problem:
            problems.append(problem + where)
        values[name] = value
    return values, problems


def _default(knob: Knob) -> tuple[Any, str]:
    """A knob's value outside any compile's options, and where it came from (for errors)."""
    for frame in reversed(_PATCHES):
        if knob.name in frame:
            return frame[knob.name], ""
    raw = os.environ.get(knob.env) if knob.env else None
    if raw is None or raw == "":
        return knob.default, ""
    return _from_env(knob, raw), f" (from {knob.env}={raw!r})"


def get(name: str) -> Any:
    """The value of knob ``name`` for the work at hand: the compile in :func:`scope`, else
    :func:`patch`, the environment and the default.

    Raises:
        InvalidOptionError: an unknown name, or a bad value in the environment.
    """
    scope = _SCOPE.get()
    if scope is not None:
        return getattr(scope, name)
    knob = KNOBS.get(name)
    if knob is None:
        raise InvalidOptionError("; ".join(_unknown([name])))
    value, where = _default(knob)
    value, problem = _check(knob, value)
    if problem:
        raise InvalidOptionError(problem + where)
    return value


def current() -> Options:
    """The :class:`Options` in :func:`scope`, else one made of :func:`patch`, the environment
    and the defaults."""
    scope = _SCOPE.get()
    if scope is not None:
        return scope
    values, problems = resolve()
    if problems:
        raise InvalidOptionError(
            "invalid tpu-inductor configuration:\n  - " + "\n  - ".join(problems)
        )
    return Options(**values)


@contextlib.contextmanager
def scope(opts: Options) -> Iterator[Options]:
    """Run a compile's stages (capture, lowering, each trace of its programs) with ``opts``."""
    token = _SCOPE.set(opts)
    try:
        yield opts
    finally:
        _SCOPE.reset(token)


class patch(contextlib.ContextDecorator):
    """Set knobs for the compiles that start inside it (a context manager or a decorator).

    Values are checked at once; an unknown name or a bad value raises
    :class:`~tpu_inductor.core.errors.InvalidOptionError` listing every problem. A graph
    compiled inside keeps what it was compiled with; ``options={...}`` still wins over it.

    Example:
        >>> from tpu_inductor import config
        >>> with config.patch(long_attention_min_length=256, splash_attention="interpret"):
        ...     config.get("long_attention_min_length")
        256
    """

    def __init__(self, changes: Mapping[str, Any] | None = None, **kwargs: Any):
        changes = {**(changes or {}), **kwargs}
        problems = _unknown(changes)
        self.changes = {}
        for name, value in changes.items():
            if name in KNOBS:
                value, problem = _check(KNOBS[name], value)
                if problem:
                    problems.append(problem)
                self.changes[name] = value
        if problems:
            raise InvalidOptionError("config.patch:\n  - " + "\n  - ".join(problems))

    def __enter__(self) -> patch:
        _PATCHES.append(self.changes)
        return self

    def __exit__(self, *exc) -> None:
        del _PATCHES[max(i for i, f in enumerate(_PATCHES) if f is self.changes)]


def program_key(opts: Options) -> tuple:
    """The values of every knob that changes programs (part of every cache key)."""
    return tuple(
        (k.name, _hashable(getattr(opts, k.name)))
        for k in KNOBS.values()
        if k.changes_programs and k.kind != "object"  # mesh and shardings: by their plan's key
    )


def _hashable(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value

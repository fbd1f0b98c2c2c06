"""transformers' own compile path in ``generate()`` (``compile_config=``) with this backend.

``model.generate(..., cache_implementation="static", compile_config=CompileConfig(...))``
compiles the model's forward for the decode steps only when
``GenerationMixin._valid_auto_compile_criteria`` allows it (transformers 5.x,
``generation/utils.py``): the cache must be compilable (static) and either
``model.device.type`` is one of ``cuda, xpu, neuron, tpu, mps``, or the config carries
transformers' own flag ``CompileConfig._compile_all_devices`` ("used to flag our `generate`
call to compile on e.g. CPU"). With tpu-inductor the model lives on the CPU by design, so a
plain ``CompileConfig(backend="tpu")`` is skipped with only a one-time log warning.

- :func:`compile_config` builds a ``CompileConfig`` for this backend with that flag set: no
  patching, nothing global; pass it to ``generate(compile_config=...)``.
- :func:`enable` makes one model do it by default (its ``generation_config.compile_config``),
  and, for as long as it is enabled, also honours a plain ``CompileConfig(backend="tpu")``
  passed to that model's ``generate``. It is scoped to the model and undone by
  :meth:`Enabled.disable` or at the end of a ``with`` block.
- :func:`inputs_in_forward` makes one model's ``generate()`` leave the 4-D attention mask and
  the position ids of a static-cache decode step to the model's forward, which builds them
  inside its compiled graph from the cache's position counter (already on the device), instead
  of building them on the host every step and sending them in. Also scoped to the model.

transformers is imported only when these functions are called, never on import.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable, Mapping
from typing import Any

from tpu_inductor.core.errors import InvalidOptionError
from tpu_inductor.dynamo.options import parse_options

#: backend names and functions that are this backend.
BACKEND_NAMES = ("tpu", "tpu_inductor")

# transformers' CompileConfig defaults to mode="reduce-overhead", which torch.compile refuses
# together with options ("Either mode or options can be specified"); here it means nothing.
_TRANSFORMERS_DEFAULT_MODE = "reduce-overhead"


def compile_config(
    *,
    backend: str | Callable = "tpu",
    fullgraph: bool = False,
    dynamic: bool | None = None,
    mode: str | None = None,
    options: Mapping[str, Any] | None = None,
):
    """A ``transformers.CompileConfig`` for this backend that ``generate()`` honours on CPU.

    Sets transformers' ``_compile_all_devices`` flag on the instance (the models stay on the
    CPU, which transformers otherwise never compiles for). ``options`` and ``mode`` are checked
    here, at once, rather than at the first decode step.

    Args:
        backend: ``"tpu"`` or ``"tpu_inductor"`` (or the backend function).
        fullgraph: ``torch.compile``'s ``fullgraph``.
        dynamic: ``torch.compile``'s ``dynamic``.
        mode: ``None`` or a ``torch.compile`` mode (all compile the same way here).
        options: backend options (docs/options.md); not together with ``mode``.

    Returns:
        A ``transformers.CompileConfig``.

    Raises:
        InvalidOptionError: bad options or mode, both ``mode`` and ``options``, or another
            backend.

    Example:
        >>> cc = compile_config(options={"device": "cpu"})
        >>> out = model.generate(ids, cache_implementation="static", compile_config=cc)
    """
    import transformers

    if not is_ours(backend):
        raise InvalidOptionError(
            f"compile_config() is for tpu-inductor's backends {BACKEND_NAMES}, got {backend!r}; "
            "use transformers.CompileConfig directly for another backend"
        )
    if mode is not None and options is not None:
        raise InvalidOptionError(
            "torch.compile takes mode or options, not both; give only options (every mode "
            "compiles the same way with tpu-inductor)"
        )
    parse_options(options, mode)
    config = transformers.CompileConfig(
        fullgraph=fullgraph,
        dynamic=dynamic,
        backend=backend,
        mode=mode,
        options=dict(options) if options is not None else None,
    )
    config._compile_all_devices = True  # transformers' flag: compile a CPU-resident model
    return config


def is_ours(backend: Any) -> bool:
    """Whether ``backend`` (a ``torch.compile`` backend name or function) is tpu-inductor."""
    if isinstance(backend, str):
        return backend in BACKEND_NAMES
    from tpu_inductor.dynamo.backend import tpu_backend, tpu_inductor_backend

    return backend in (tpu_backend, tpu_inductor_backend)


def _for_cpu(config):
    """A copy of a ``CompileConfig`` naming this backend, flagged to compile on CPU; any other
    config (or ``None``) unchanged."""
    if config is None or not is_ours(getattr(config, "backend", None)):
        return config
    if getattr(config, "_compile_all_devices", None) and not (
        config.options is not None and config.mode is not None
    ):
        return config
    config = copy.copy(config)
    config._compile_all_devices = True
    if config.options is not None and config.mode == _TRANSFORMERS_DEFAULT_MODE:
        config.mode = None  # transformers' default, not the user's: torch refuses both
    return config


class Enabled:
    """What :func:`enable` did to one model; undo it with :meth:`disable` or ``with``."""

    def __init__(self, model, config) -> None:
        self.model = model
        self.config = config
        gen = model.generation_config
        self._saved_config = gen.compile_config
        self._saved_generate = model.__dict__.get("generate")
        self._saved_attrs = {
            name: model.__dict__[name]
            for name in ("_compiled_call", "_last_compile_config")
            if name in model.__dict__
        }
        gen.compile_config = config
        generate = model.generate

        @functools.wraps(generate)
        def generate_on_tpu(*args, **kwargs):
            if "compile_config" in kwargs:
                kwargs["compile_config"] = _for_cpu(kwargs["compile_config"])
            given = kwargs.get("generation_config")
            cc = getattr(given, "compile_config", None)
            if given is not None and _for_cpu(cc) is not cc:
                given = copy.deepcopy(given)
                given.compile_config = _for_cpu(cc)
                kwargs["generation_config"] = given
            return generate(*args, **kwargs)

        generate_on_tpu.__tpu_inductor_enabled__ = self
        model.generate = generate_on_tpu
        self.active = True

    def disable(self) -> None:
        """Restore the model's ``generate``, its ``generation_config.compile_config`` and
        transformers' cached compiled forward as they were before :func:`enable`."""
        if not self.active:
            return
        self.active = False
        model = self.model
        if self._saved_generate is None:
            model.__dict__.pop("generate", None)
        else:
            model.generate = self._saved_generate
        model.generation_config.compile_config = self._saved_config
        for name in ("_compiled_call", "_last_compile_config"):
            if name in self._saved_attrs:
                setattr(model, name, self._saved_attrs[name])
            else:
                model.__dict__.pop(name, None)

    def __enter__(self) -> Enabled:
        return self

    def __exit__(self, *exc) -> bool:
        self.disable()
        return False


def enable(model, **compile_kwargs) -> Enabled:
    """Make ``model.generate()`` compile its forward with tpu-inductor, the transformers way.

    Sets ``model.generation_config.compile_config`` to :func:`compile_config` (so a
    ``generate(..., cache_implementation="static")`` compiles its decode steps through this
    backend with no ``compile_config`` argument) and, while enabled, lets a
    ``CompileConfig(backend="tpu")`` passed to this model's ``generate`` (directly or inside a
    ``generation_config``) through transformers' device check: a copy of it gets transformers'
    ``_compile_all_devices`` flag, and if it has ``options`` its default
    ``mode="reduce-overhead"`` is dropped (torch refuses both together; the mode means nothing
    here). Other backends' configs and other models are untouched. transformers compiles only
    with a compilable (static) cache: its rule, not ours.

    Args:
        model: a transformers model with ``generate`` (a ``GenerationMixin``).
        **compile_kwargs: passed to :func:`compile_config` (``options``, ``dynamic``, ...).

    Returns:
        An :class:`Enabled` handle; ``with enable(model): ...`` disables it at the end.

    Raises:
        TypeError: ``model`` has no ``generate`` or ``generation_config``.
        InvalidOptionError: bad ``options`` or ``mode`` (checked here, not at the first call).
        RuntimeError: ``model`` is already enabled.

    Example:
        >>> with tpu_inductor.transformers.enable(model):
        ...     out = model.generate(ids, max_new_tokens=20, cache_implementation="static")
    """
    if not hasattr(model, "generate") or getattr(model, "generation_config", None) is None:
        raise TypeError(
            f"{type(model).__name__} has no generate() and generation_config: "
            "enable() is for transformers models that generate (GenerationMixin)"
        )
    if hasattr(model.__dict__.get("generate"), "__tpu_inductor_enabled__"):
        raise RuntimeError("this model is already enabled; disable() the first handle first")
    return Enabled(model, compile_config(**compile_kwargs))


class InForward:
    """What :func:`inputs_in_forward` did to one model; undo it with :meth:`disable` or ``with``."""

    _NAMES = ("create_masks_for_generate", "_prepare_position_ids_for_generation")

    def __init__(self, model) -> None:
        from transformers.generation.utils import GenerationMixin
        from transformers.masking_utils import create_masks_for_generate

        self.model = model
        self._saved = {n: model.__dict__[n] for n in self._NAMES if n in model.__dict__}
        cls = type(model)
        # Only where the model uses transformers' own functions, whose results are known to be
        # what its forward computes from the cache (a model that overrides them, e.g. for
        # token types or 3-D rope positions, keeps its own).
        masks = getattr(cls, "create_masks_for_generate", None)
        if masks is None or masks is create_masks_for_generate:

            def masks_in_forward(*args, **kwargs):
                if _forward_builds_mask(kwargs):
                    return None  # the forward builds it in its graph
                return create_masks_for_generate(*args, **kwargs)

            model.create_masks_for_generate = masks_in_forward
        positions = GenerationMixin._prepare_position_ids_for_generation
        if getattr(cls, "_prepare_position_ids_for_generation", None) is positions:

            def positions_in_forward(inputs_tensor, model_kwargs):
                if _forward_counts_positions(inputs_tensor, model_kwargs):
                    return None  # the forward counts them from the cache, in its graph
                return positions(model, inputs_tensor, model_kwargs)

            model._prepare_position_ids_for_generation = positions_in_forward
        self.active = True

    def disable(self) -> None:
        """Give the model back transformers' mask and position-id preparation."""
        if not self.active:
            return
        self.active = False
        for name in self._NAMES:
            if name in self._saved:
                setattr(self.model, name, self._saved[name])
            else:
                self.model.__dict__.pop(name, None)

    def __enter__(self) -> InForward:
        return self

    def __exit__(self, *exc) -> bool:
        self.disable()
        return False


def _forward_builds_mask(kwargs: dict) -> bool:
    """Whether the forward, given no mask, builds the same 4-D mask generate would: generate
    has no 2-D mask (it drops an all-ones one) and nothing else that shapes the mask."""
    if kwargs.get("attention_mask") is not None:
        return False  # padding: the forward would need the 2-D mask, which grows every step
    extra = ("or_mask_function", "and_mask_function", "block_sequence_ids")
    return all(kwargs.get(k) is None for k in extra)


def _forward_counts_positions(inputs_tensor, model_kwargs: dict) -> bool:
    """Whether the positions generate would compute are the forward's own (``arange`` past the
    cache's length): no padding, and the mask, if any, covers exactly the new tokens of an
    empty cache."""
    import torch

    if model_kwargs.get("input_ids") is not None or inputs_tensor.ndim != 2:
        return False  # multimodal inputs, or embeddings: their own rules
    cache = model_kwargs.get("cache")
    if cache is not None:
        past = cache.get_seq_length()
        if isinstance(past, torch.Tensor) or past != 0:
            return False
    mask = model_kwargs.get("attention_mask")
    if mask is None:
        return True
    return mask.ndim == 2 and mask.shape == inputs_tensor.shape and bool((mask == 1).all())


def inputs_in_forward(model) -> InForward:
    """Make ``model.generate()`` leave the attention mask and position ids of each decode step
    to the model's forward, where they are the same values.

    With a static cache, transformers' ``generate`` builds a 4-D bool mask (batch x cache
    length) and the position ids on the host before every forward, so a compiled forward
    receives them as inputs: bytes and transfers into the device per generated token. When the
    prompt has no padding (its 2-D mask is all ones, which generate then drops) the forward
    builds the same mask, and counts the same positions, itself from the cache's position
    counter, inside its compiled graph, where the counter already is: then only the token ids
    go in. This sets, on this model only, ``create_masks_for_generate`` (transformers' hook for
    models with their own masks) and ``_prepare_position_ids_for_generation`` to versions that
    return ``None`` in that case and defer to transformers' otherwise (padding, an already
    filled cache, models that override either). Checked against transformers 5.25.

    Args:
        model: a transformers model with ``generate`` (a ``GenerationMixin``).

    Returns:
        An :class:`InForward` handle; ``with inputs_in_forward(model): ...`` undoes it at the
        end.

    Raises:
        TypeError: ``model`` has no ``generate``.

    Example:
        >>> model.forward = torch.compile(model.forward, backend="tpu")
        >>> with tpu_inductor.transformers.inputs_in_forward(model):
        ...     out = model.generate(ids, max_new_tokens=20, cache_implementation="static")
    """
    if not hasattr(model, "generate") or not hasattr(model, "_prepare_position_ids_for_generation"):
        raise TypeError(
            f"{type(model).__name__} has no generate(): inputs_in_forward() is for "
            "transformers models that generate (GenerationMixin)"
        )
    return InForward(model)

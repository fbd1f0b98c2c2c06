"""Warm starts: inference graphs saved as serialized JAX exports, keyed by the Dynamo graph.

JAX's persistent compilation cache (``cache_dir``) skips XLA compilation in a new process, but
AOTAutograd's tracing, our lowering and JAX tracing still run, and on CPU they cost more than
XLA does. So with ``cache_dir`` set, an inference graph that AOTAutograd passes through
unchanged (no input mutations, no aliased outputs, no effect tokens) is also saved as a
``jax.export`` artifact keyed by the Dynamo graph. In a new process the backend finds it before
running AOTAutograd and calls the deserialized executable directly (XLA compilation then hits
the persistent cache). Training graphs always take the full path.
"""

from __future__ import annotations

import logging
import os
import pathlib
import pickle
import tempfile
from collections.abc import Sequence

import jax
import numpy as np
import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import unset_fake_temporarily

from tpu_inductor.core import VERSION
from tpu_inductor.core.boundary import quiet_readonly_numpy_warning
from tpu_inductor.core.devices import compile_lowered, compiler_options, platform_of
from tpu_inductor.core.transfers import Counter
from tpu_inductor.runtime import cache
from tpu_inductor.runtime.call import device_input, draw_seed, output_to_host

log = logging.getLogger(__name__)  # TORCH_LOGS="+tpu_inductor.runtime.export_cache"

FORMAT = 1


def _folder(cache_dir: str) -> pathlib.Path:
    return pathlib.Path(cache_dir) / "tpu_inductor_exports"


def key_for(gm: fx.GraphModule, example_inputs: Sequence, extra: tuple) -> str | None:
    """A key for a Dynamo graph called in inference, or ``None`` when it can't be cached."""
    if torch.is_grad_enabled() and any(
        isinstance(t, torch.Tensor) and t.requires_grad for t in example_inputs
    ):
        return None  # training: AOTAutograd's forward/backward split is needed
    specs = []
    for t in example_inputs:
        if not isinstance(t, torch.Tensor):
            return None  # scalars and SymInts: dynamic graphs take the full path
        if any(not isinstance(d, int) for d in t.shape):
            return None
        specs.append((str(t.dtype), tuple(t.shape), isinstance(t, torch.nn.Parameter)))
    versions = (FORMAT, VERSION, torch.__version__, jax.__version__)
    return cache.graph_key(gm, (tuple(specs), extra, versions))


def save(cache_dir: str, key: str, lowered, static_positions: Sequence[int]) -> None:
    """Export ``lowered`` at its (static) input shapes and write it under ``cache_dir``."""
    from jax import export

    from tpu_inductor.core.dtypes import to_jax_dtype

    structs = [
        jax.ShapeDtypeStruct(tuple(m.shape), to_jax_dtype(m.dtype)) for m in lowered.input_metas
    ]
    seed = jax.ShapeDtypeStruct((2,), np.uint32) if lowered.has_rng else None
    # Tracing reads the graph's constant tensors: real tensors, outside AOTAutograd's fake mode.
    with unset_fake_temporarily(), jax.enable_x64(True):
        exported = export.export(jax.jit(lowered.fn))(seed, *structs)
        blob = exported.serialize()
    payload = {
        "format": FORMAT,
        "exported": bytes(blob),
        "has_rng": lowered.has_rng,
        "static_positions": tuple(static_positions),
        "ops": lowered.ops,
    }
    folder = _folder(cache_dir)
    folder.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, suffix=".tmp")
    with os.fdopen(fd, "wb") as f:
        pickle.dump(payload, f)
    os.replace(tmp, folder / f"{key}.pkl")
    log.info("saved inference graph %s for warm starts", key[:12])


def load(cache_dir: str, key: str, device: jax.Device):
    """The saved graph for ``key`` as a Dynamo-ready callable, or ``None``."""
    path = _folder(cache_dir) / f"{key}.pkl"
    if not path.exists():
        return None
    try:
        with open(path, "rb") as f:
            payload = pickle.load(f)
        if payload.get("format") != FORMAT:
            return None
        from jax import export

        exported = export.deserialize(bytearray(payload["exported"]))
    except Exception as e:  # a corrupt or foreign file: rebuild instead of failing the user
        log.warning("ignoring unreadable warm-start entry %s: %s", path, e)
        return None
    log.info("warm start: reusing saved inference graph %s", key[:12])
    return ExportedGraph(exported, payload, device)


class ExportedGraph:
    """Runs a deserialized export in place of AOTAutograd's inference function."""

    def __init__(self, exported, payload: dict, device: jax.Device):
        self.has_rng = payload["has_rng"]
        self.static_positions = frozenset(payload["static_positions"])
        self.transfers = Counter("warm-start inference graph")
        self.ops = payload["ops"]
        self.device = device
        with jax.enable_x64(True), jax.default_device(device):
            lowered = jax.jit(exported.call).lower(
                jax.ShapeDtypeStruct((2,), np.uint32) if self.has_rng else None,
                *[
                    jax.ShapeDtypeStruct(a.shape, a.dtype)
                    for a in exported.in_avals[1 if self.has_rng else 0 :]
                ],
            )
            self._exe = compile_lowered(lowered, compiler_options(platform_of(device), "inference"))
        quiet_readonly_numpy_warning()
        cache.STATS.exports_loaded += 1

    def __call__(self, *args):
        seed = draw_seed() if self.has_rng else None
        static, device, counter = self.static_positions, self.device, self.transfers
        with jax.enable_x64(True):
            arrays = [
                device_input(a, i, device, counter, resident=i in static)
                for i, a in enumerate(args)
            ]
            outs = self._exe(seed, *arrays)
            return tuple(output_to_host(o, counter) for o in outs)

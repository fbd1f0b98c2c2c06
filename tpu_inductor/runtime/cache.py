"""Compiled executables, cached in memory by graph + input avals + config.

``jax.jit`` already caches one XLA executable per input aval signature for a given function;
this module adds the level above it: the same ATen graph handed over again (Dynamo recompiling
after a guard failure, two identical modules, ``torch._dynamo.reset()``) reuses the jitted
function instead of lowering and compiling again. JAX's persistent compilation cache
(``cache_dir`` option or ``TPU_INDUCTOR_CACHE_DIR``) adds a cache across processes.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import logging
import threading
import weakref
from collections.abc import Callable

import jax
import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import unset_fake_temporarily

log = logging.getLogger(__name__)  # TORCH_LOGS="+tpu_inductor.runtime.cache"

MAX_ENTRIES = 512


@dataclasses.dataclass(kw_only=True)
class CacheStats:
    """Counters a test or a user can read: ``tpu_inductor.runtime.cache.STATS``."""

    graphs: int = 0  # graphs handed to the backend's compilers
    hits: int = 0  # of those, found already lowered and jitted
    traces: int = 0  # times a lowered graph was traced by jax.jit (one per new input signature)
    exports_loaded: int = 0  # inference graphs reused from the warm-start cache on disk

    def reset(self) -> None:
        """Zero all counters."""
        for f in dataclasses.fields(self):
            setattr(self, f.name, 0)


STATS = CacheStats()
# Every live CompiledGraph, for introspection (tests, reports); weak so Dynamo owns lifetimes.
COMPILED: weakref.WeakSet = weakref.WeakSet()
# "op(args) at source line" for every op that fell back to eager, in compile order.
FALLBACK_OPS: list[str] = []
_lock = threading.Lock()
_entries: collections.OrderedDict[str, object] = collections.OrderedDict()
_persistent_dir: str | None = None


def graph_key(gm: fx.GraphModule, extra: tuple, inputs_by_meta: frozenset = frozenset()) -> str:
    """A fingerprint of a graph's code, its inputs' avals, its constants and ``extra``.
    ``inputs_by_meta``: ids of ``get_attr`` tensors that are program inputs, not constants
    (a module's parameters AOTAutograd lifts), hashed by shape, stride and dtype only."""
    with unset_fake_temporarily():  # compilers run under AOTAutograd's fake mode
        return _graph_key(gm, extra, inputs_by_meta)


def _graph_key(gm: fx.GraphModule, extra: tuple, inputs_by_meta: frozenset = frozenset()) -> str:
    h = hashlib.sha256(gm.code.encode())
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            val = node.meta.get("val")
            if isinstance(val, torch.Tensor):
                h.update(f"{val.dtype}{tuple(val.shape)}".encode())
            else:
                h.update(repr(val).encode())
        elif node.op == "get_attr":
            const = getattr(gm, node.target)
            if isinstance(const, torch.Tensor) and id(const) in inputs_by_meta:
                h.update(f"input {const.dtype}{tuple(const.shape)}{const.stride()}".encode())
            elif isinstance(const, torch.Tensor):
                t = const.detach().contiguous().reshape(-1)
                h.update(f"{t.dtype}{tuple(const.shape)}".encode())
                h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
            elif isinstance(const, fx.GraphModule):
                # a higher-order op's subgraph (flex_attention's score_mod): repr() has no code
                h.update(_graph_key(const, ()).encode())
            else:
                h.update(repr(const).encode())
    h.update(repr(extra).encode())
    return h.hexdigest()


def get_or_create(key: str, create: Callable[[], object]) -> object:
    """Return the cached entry for ``key``, creating (and LRU-evicting) under a lock."""
    with _lock:
        STATS.graphs += 1
        entry = _entries.get(key)
        if entry is not None:
            STATS.hits += 1
            _entries.move_to_end(key)
            return entry
        entry = create()
        _entries[key] = entry
        if len(_entries) > MAX_ENTRIES:
            _entries.popitem(last=False)
        return entry


def is_cached(entry: object) -> bool:
    """Whether ``entry`` (a graph's ``Executables``) is still one of this cache's entries."""
    with _lock:
        return any(e is entry for e in _entries.values())


def clear() -> None:
    """Forget every cached executable (those live graphs hold too: each compiles again if it
    runs again), the fallback list and the counters.

    Part of ``tpu_inductor.reset()`` (:func:`tpu_inductor.dynamo.backend.reset`, which clears every
    stage's state); the persistent cache on disk is left alone.
    """
    with _lock:
        _entries.clear()
        graphs = list(COMPILED)
        COMPILED.clear()
        FALLBACK_OPS.clear()
        STATS.reset()
    for graph in graphs:  # a graph that runs again compiles again (CompiledGraph.release_caches)
        graph.release_caches()


def enable_persistent_cache(path: str) -> None:
    """Point JAX's persistent compilation cache at ``path`` (process-wide, on request only).

    Called only when the user sets ``cache_dir`` / ``TPU_INDUCTOR_CACHE_DIR``; every executable
    is cached regardless of its size or compile time so that warm starts are fast.
    """
    global _persistent_dir
    if _persistent_dir == path:
        return
    if _persistent_dir is not None:
        log.warning("persistent cache already at %s; ignoring %s", _persistent_dir, path)
        return
    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    _persistent_dir = path
    log.info("JAX persistent compilation cache at %s", path)

"""One graph's record beside its executables: what ``report()`` shows per graph and what the
recompile hints and shape buckets remember about it.

:class:`~tpu_inductor.runtime.call.Executables` owns one (``exes.stats``); each field names the
one module that writes it, so the executables' cache itself holds only executables.
"""

from __future__ import annotations

import dataclasses

from tpu_inductor.core.stages import FrameStages


@dataclasses.dataclass(kw_only=True)
class GraphStats:
    """Counters and facts of one graph.

    Attributes:
        hits: calls that found their executable (runtime/call.py).
        misses: calls that built one (runtime/call.py, a compile-only target, a warm start).
        evictions: executables dropped beyond ``max_executables`` (runtime/call.py).
        saved_bytes: activations the last training forward kept for the backward
            (runtime/call.py's CompiledGraph).
        padding_checked: padded signatures already compared with an exact run
            (runtime/buckets.py).
        padding_off: shape buckets turned off after a padded run differed (runtime/buckets.py).
        input_names: the user's names of the graph's inputs (the backend, from Dynamo's graph).
        hinted: a recompile hint was said for this graph (core/hints.py).
        frame: its Dynamo graph's seconds by stage (the backend).
        frame_owner: whether ``report()`` counts ``frame`` on this graph (the backend: one
            program of each Dynamo graph does).
    """

    hits: int = 0
    misses: int = 0
    evictions: int = 0
    saved_bytes: int = 0
    padding_checked: set = dataclasses.field(default_factory=set)
    padding_off: bool = False
    input_names: list | None = None
    hinted: bool = False
    frame: FrameStages | None = None
    frame_owner: bool = False

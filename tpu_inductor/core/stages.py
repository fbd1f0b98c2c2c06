"""Where the first call's seconds go, per Dynamo graph: Dynamo's tracing, AOTAutograd, our
lowering (ATen -> JAX, then JAX's trace of it) and XLA's compile, or the load of a saved program
on a warm start. ``tpu_inductor.report()`` shows them per graph; ``benchmarks/first_step.py``
sums them per run."""

from __future__ import annotations

import dataclasses
import time

STAGES = ("dynamo", "aot", "lower", "xla", "load")


@dataclasses.dataclass
class FrameStages:
    """Seconds one Dynamo graph spent before its programs existed.

    Attributes:
        dynamo: from the start of Dynamo's compile of the frame (restarts included) to the
            backend's call.
        aot: AOTAutograd, less the lowering done inside it by our compilers.
        load: reading saved programs instead (a warm start, ``cache_dir``).
    """

    dynamo: float = 0.0
    aot: float = 0.0
    load: float = 0.0


def dynamo_seconds() -> float:
    """Seconds since Dynamo started compiling the frame being compiled (0 when unknown)."""
    try:
        from torch._dynamo.utils import get_metrics_context

        start_ns = get_metrics_context()._start_time_ns  # torch 2.13's record of the start
    except (ImportError, AttributeError):
        return 0.0
    if not start_ns:
        return 0.0
    return max(0.0, time.time() - start_ns / 1e9)

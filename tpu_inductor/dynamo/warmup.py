"""Compile ahead of time for a list of input shapes, so first calls don't stall."""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable, Sequence

import torch


def _materialize(spec, dtype: torch.dtype):
    if isinstance(spec, torch.Tensor):
        return spec
    if isinstance(spec, tuple) and len(spec) == 2 and isinstance(spec[1], torch.dtype):
        shape, dt = spec
        return torch.zeros(shape, dtype=dt)
    if isinstance(spec, tuple | list | torch.Size) and all(isinstance(d, int) for d in spec):
        return torch.zeros(tuple(spec), dtype=dtype)
    return spec  # a Python scalar or other non-tensor argument, passed as is


def warmup(
    compiled: Callable,
    inputs: Sequence,
    *,
    background: bool = False,
    grad: bool = False,
    dtype: torch.dtype = torch.float32,
) -> concurrent.futures.Future | None:
    """Call ``compiled`` once per entry of ``inputs`` so every executable is built up front.

    Args:
        compiled: a ``torch.compile(..., backend="tpu")`` model or function.
        inputs: one entry per call: a tuple of arguments, each a tensor, a shape (zeros of
            ``dtype``), a ``(shape, dtype)`` pair, or a plain Python value. A single argument
            may be given bare instead of as a 1-tuple.
        background: compile in a background thread and return a ``Future`` at once (calls made
            meanwhile are correct; they may wait for a compile in progress).
        grad: run with autograd on, so the training-mode forward graphs are the ones built.
        dtype: the dtype of tensors given as bare shapes.

    Returns:
        ``None``, or a ``Future`` that resolves to the number of calls made.

    Example:
        >>> warmup(cmodel, [((8, 128), torch.int64), ((8, 256), torch.int64)])
    """

    def run() -> int:
        with torch.set_grad_enabled(grad):
            for entry in inputs:
                args = entry if isinstance(entry, tuple) and not _is_spec(entry) else (entry,)
                compiled(*(_materialize(a, dtype) for a in args))
        return len(inputs)

    if not background:
        run()
        return None
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="tpu-warmup")
    future = pool.submit(run)
    pool.shutdown(wait=False)
    return future


def _is_spec(entry) -> bool:
    """A bare shape tuple or (shape, dtype) pair, rather than a tuple of arguments."""
    if all(isinstance(d, int) for d in entry):
        return True
    return len(entry) == 2 and isinstance(entry[1], torch.dtype) and isinstance(entry[0], tuple)

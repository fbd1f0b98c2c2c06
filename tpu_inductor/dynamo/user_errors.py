"""How our errors reach the user through Dynamo: our message first, Dynamo's frames left out.

A :class:`~tpu_inductor.core.errors.CompileError` passes through Dynamo unwrapped (it is a
``ShortenTraceback``), so ``except tpu_inductor.InvalidOptionError`` works. Python prints an
uncaught error's message after its traceback, though, and the frames from the user's call down to
Dynamo alone take about 20 lines; so the backend also says the message once, with the user's
line, on the ``tpu_inductor.progress`` logger before the traceback, and trims the traceback
below Dynamo to the frame that raised (``TORCHDYNAMO_VERBOSE=1`` shows every frame).
"""

from __future__ import annotations

import functools
import logging
import os
import sys
import sysconfig

import torch

from tpu_inductor.core.errors import CompileError

progress_log = logging.getLogger("tpu_inductor.progress")  # speaks without logging set up

_PACKAGES = (
    os.path.dirname(torch.__file__) + os.sep,
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep,  # tpu_inductor/
)
_STDLIB = sysconfig.get_paths()["stdlib"] + os.sep
_SITE = tuple(sysconfig.get_paths()[k] + os.sep for k in ("purelib", "platlib"))


def _is_library(filename: str) -> bool:
    """A file of torch, of this package or of Python's standard library (not site-packages)."""
    if filename.startswith(_PACKAGES) or filename.startswith("<frozen "):
        return True
    return filename.startswith(_STDLIB) and not filename.startswith(_SITE)


def user_call_site() -> str | None:
    """``"file:line"`` of the innermost frame on the stack outside torch, this package and the
    standard library: the user's call that set off this compile (``None`` if there is none)."""
    frame = sys._getframe(1)
    while frame is not None:
        if not _is_library(frame.f_code.co_filename):
            return f"{frame.f_code.co_filename}:{frame.f_lineno}"
        frame = frame.f_back
    return None


def said_first(error: CompileError) -> CompileError:
    """Log ``error`` once with the user's line and keep only its raising frame below Dynamo.

    Returns the same error, to be re-raised: its type and message are unchanged, so callers
    catching it see exactly what they saw before.
    """
    tb = error.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    if tb is not None and getattr(error, "first_useful_frame", None) is None:
        error.first_useful_frame = tb.tb_frame  # Dynamo's remove_dynamo_frames cuts here
    where = user_call_site()
    at = f" at {where}" if where else ""
    progress_log.error("tpu-inductor: %s%s: %s", type(error).__name__, at, error)
    return error


def our_errors_first(backend):
    """Wrap a Dynamo backend so that every :class:`CompileError` it raises goes through
    :func:`said_first`."""

    @functools.wraps(backend)
    def wrapper(*args, **kwargs):
        try:
            return backend(*args, **kwargs)
        except CompileError as e:
            said_first(e)
            raise

    return wrapper

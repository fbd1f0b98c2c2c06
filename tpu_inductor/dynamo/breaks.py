"""Graph breaks said once per site, and optimizer steps that join the compiled function.

**Graph breaks.** Dynamo splits a compiled function where it can't trace (a graph break): the
code before the break and after it become separate programs and the call at the break runs in
Python, every call. Dynamo says so only under ``TORCH_LOGS=graph_breaks``. Every graph Dynamo
hands the backend carries why it ended (``gm.compile_subgraph_reason``, torch 2.13's
``GraphCompileReason``: the reason text and the user stack at the break);
:func:`report_graph_break` turns each break into one WARNING on the ``tpu_inductor.progress``
logger, once per site: where (the user's line and the line that broke), why, what it costs
(programs and the bytes that cross back to Python at the break) and the fix. It reads Dynamo's
record of every break too, so a break that handed the backend no graph (a nested call with no op
before it in its frame) is said at the next graph.

**Optimizer steps.** ``opt.step()`` inside a compiled function breaks the graph twice: torch's
``Optimizer.step`` calls ``torch._dynamo.graph_break()`` on purpose, and an LR scheduler wraps
``opt.step`` in a function from ``torch/optim/lr_scheduler.py``, a file Dynamo refuses to trace
("``Adam.step`` in ``lr_scheduler.py`` should not be traced"). So ``clip_grad_norm_`` followed by
``opt.step()`` in one compiled ``update()`` was two programs. When the backend compiles such a
step as a program of its own (its frame's ``self`` is an Adam, AdamW or SGD that
:mod:`tpu_inductor.dynamo.optimizers` can trace), :func:`join_optimizer_step` gives that optimizer
instance a ``step`` that, under Dynamo, is ``compile_step``'s traceable functional update (torch's
``adam``/``sgd`` on the optimizer's own state: eager's numbers) and, outside compiled code, calls
the ``step`` it replaced (the scheduler's wrapper, hooks and all).

Where that happens decides the first call. :func:`restart_to_join_step`: when the graph Dynamo
hands the backend ends at such an ``opt.step()`` and the optimizer is a value the compiled frame
reads (a local, a global it names, a closure cell, or an attribute of one of those, e.g.
``self.opt``), the step is made traceable there and Dynamo is asked to trace the frame again
(the one restart a backend may raise, ``TensorifyScalarRestartAnalysis``, after emptying the
frame's speculation log, which would otherwise replay the break): the first call is one program
(``tests/test_readme.py`` and ``tests/test_optimizers.py`` count the programs). An optimizer found
nowhere in the frame (stepped from a helper's locals) is joined when Dynamo compiles its ``step``
as a frame of its own (:func:`join_optimizer_step`); Dynamo guards on ``opt.step``, so the next
call compiles once more, into one program: the first call is then two programs.
"""

from __future__ import annotations

import logging
import os
import types
import weakref
from typing import Any

import torch
import torch.fx as fx

from tpu_inductor.dynamo import optimizers

progress_log = logging.getLogger("tpu_inductor.progress")
log = logging.getLogger(__name__)

_SAID: set = set()  # (file, line, reason) of breaks already reported
_LIBRARY_DIRS = tuple(
    os.path.dirname(os.path.dirname(m.__file__)) + os.sep for m in (torch, logging)
) + (os.path.dirname(os.path.dirname(__file__)) + os.sep + "tpu_inductor" + os.sep,)

# (substring of Dynamo's reason, the fix to print). First match wins.
FIXES: list[tuple[str, str]] = [
    (
        "Mutating a variable from outside the scope of this HOP",
        "under activation checkpointing, set torch._dynamo.config."
        "skip_fwd_side_effects_in_bwd_under_checkpoint = True before the first call (safe "
        "when the checkpointed code's Python side effects need not run again in the backward's "
        "recomputation, as for transformers with the kernels package, whose attention wrapper "
        "sets a context variable and resets it in the same layer; docs/training.md, Training loop)",
    ),
    (
        "lr_scheduler.py",
        "tpu-inductor makes an Adam, AdamW or SGD step traceable after its first call (the "
        "function compiles once more, into one program); for another optimizer, "
        "torch.compile(opt.step) apart or tpu_inductor.compile_step",
    ),
    (
        "torch._dynamo.graph_break()",
        "if this is opt.step(): tpu-inductor makes an Adam, AdamW or SGD step traceable after "
        "its first call; else remove the torch._dynamo.graph_break() call",
    ),
    (
        "backward",
        "compile the whole step with tpu_inductor.compile_step (traces loss.backward()), or "
        "compile the loss function and call backward() outside it",
    ),
    ("warning_once", "model.config.use_cache = False (transformers logs a warning_once)"),
]


def _is_library(filename: str) -> bool:
    return filename.startswith(_LIBRARY_DIRS) or "site-packages" in filename


def _site(frame) -> str:
    return f"{frame.filename}:{frame.lineno}"


def _bytes_out(gm: fx.GraphModule) -> int:
    """Bytes of the tensors the graph hands back to Python at the break."""
    total = 0
    for node in gm.graph.find_nodes(op="output"):
        for arg in torch.utils._pytree.tree_leaves(node.args):
            val = arg.meta.get("example_value") if isinstance(arg, fx.Node) else None
            if isinstance(val, torch.Tensor):
                total += val.numel() * val.element_size()
    return total


def _fmt_bytes(n: int) -> str:
    for unit, size in (("MB", 1e6), ("KB", 1e3)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def _fix(reason: str) -> str:
    for key, fix in FIXES:
        if key in reason:
            return fix
    hints = [line.strip()[5:].strip() for line in reason.splitlines() if "Hint:" in line]
    return (hints[0] if hints else "see TORCH_LOGS=graph_breaks").rstrip(".")


_SEEN_REASONS: list = [0, None]  # how many of Dynamo's graph_break_reasons were read, the last


class StepSplit(Exception):
    """Raised by the backend when a ``compile_step`` step breaks the graph (see
    :func:`refuse_split_step`); ``compile_step`` then runs the step as several programs."""


# compile_step's call in progress: [mode, Dynamo's break count at its start, graphs compiled].
# mode: True while it traces loss.backward() into the program, False once the step broke the
# graph and runs in parts, None outside compile_step.
ONE_PROGRAM_STEP: list = [None, 0, 0]


def refuse_split_step(gm: fx.GraphModule) -> None:
    """In a ``compile_step`` call that traces ``loss.backward()`` into the program, raise
    :class:`StepSplit` at the first graph when Dynamo broke the step's graph (Dynamo traces the
    whole outer frame before compiling any part of it, so nothing of the step has run yet).

    Why: with ``torch._dynamo.config.trace_autograd_ops`` on, a frame that resumes after a break
    and calls ``loss.backward()`` on a loss computed before the break traced no gradient at all
    in torch 2.13 (every ``.grad`` stayed ``None`` and the optimizer step changed nothing, with
    no error). Without it, Dynamo runs ``backward()`` in eager autograd: correct gradients, in
    several programs. A break found after a part of the step ran is an error, not a silent
    step without gradients.
    """
    from torch._dynamo.utils import graph_break_reasons

    mode, breaks_before, graphs = ONE_PROGRAM_STEP
    if mode is not True:
        return
    ONE_PROGRAM_STEP[2] = graphs + 1
    reason = getattr(gm, "compile_subgraph_reason", None)
    broke = len(graph_break_reasons) > breaks_before or getattr(reason, "graph_break", False)
    if not broke:
        return
    new = list(graph_break_reasons[breaks_before:]) or [reason]
    text = str(new[0].reason).strip().splitlines()[0]
    if graphs == 0:
        raise StepSplit(text)
    raise RuntimeError(
        f"tpu-inductor: compile_step: the step broke the graph ({text}) after a part of it "
        "had run, so this step's gradients would be lost (torch 2.13 traces no gradient "
        "across a break). Remove the break (the warning above names its line), or compile "
        "the model with torch.compile and call loss.backward() and opt.step() yourself."
    )


def report_graph_break(gm: fx.GraphModule) -> list[str]:
    """Warn once per site for each graph break Dynamo took since the last call.

    The graph Dynamo hands the backend carries why it ended, but a break inside a nested call
    whose frame had no op before it (``model(...)`` as the compiled function's first line, the
    break in a checkpointed layer) hands no graph at all: Dynamo runs that call in Python and
    compiles the frames under it. So the breaks are read from Dynamo's own record of every
    break reason (``torch._dynamo.utils.graph_break_reasons``; emptied by
    ``torch._dynamo.reset()``), new entries since the last call, plus ``gm``'s own.

    Args:
        gm: the Dynamo graph, as given to the backend.

    Returns:
        The messages said (empty: no new break, or every site was reported before).
    """
    from torch._dynamo.utils import graph_break_reasons

    seen, last = _SEEN_REASONS
    if seen > len(graph_break_reasons) or (seen and graph_break_reasons[seen - 1] is not last):
        seen = 0  # Dynamo was reset since (its record emptied and refilled)
    reasons = list(graph_break_reasons[seen:])
    _SEEN_REASONS[:] = [len(graph_break_reasons), reasons[-1] if reasons else last]
    own = getattr(gm, "compile_subgraph_reason", None)
    if own is not None and getattr(own, "graph_break", False) and own not in reasons:
        reasons.append(own)
    if ONE_PROGRAM_STEP[0] is False:  # compile_step in parts: its warning said why
        reasons = [r for r in reasons if "Tensor.backward()" not in str(r.reason)]
    said = []
    for reason in reasons:
        msg = _say(reason, gm if reason is own else None)
        if msg is not None:
            said.append(msg)
    return said


def _say(reason, gm: fx.GraphModule | None) -> str | None:
    stack = list(getattr(reason, "user_stack", None) or [])
    text = str(reason.reason)
    headline = next((line.strip() for line in text.splitlines() if line.strip()), text)
    explanation = next(
        (line.strip()[12:].strip() for line in text.splitlines() if "Explanation:" in line), ""
    )
    inner = stack[-1] if stack else None
    user = next((f for f in stack if not _is_library(f.filename)), inner)
    key = (inner.filename, inner.lineno, headline) if inner else (None, None, headline)
    if key in _SAID:
        return None
    _SAID.add(key)
    where = "an unknown line"
    if user is not None:
        where = f"{user.name} ({_site(user)})"
        if inner is not None and inner is not user:
            where += f", breaking at {_site(inner)}"
    why = (headline + (f": {explanation}" if explanation else "")).rstrip(".")
    crossing = (
        f"{_fmt_bytes(_bytes_out(gm))} leave the program at the break and come back after it"
        if gm is not None
        else "the call runs in Python with the program's values as torch tensors"
    )
    msg = (
        f"tpu-inductor: graph break in {where}: {why}. Cost: the compiled function splits here "
        f"into separate programs and this call runs in Python (eager) every time; {crossing}. "
        f"Fix: {_fix(text).rstrip('.')}."
    )
    if _joinable_step(text, inner):
        # restart_to_join_step or join_optimizer_step fix it (or warn why they can't)
        log.info(msg)
    else:
        progress_log.warning(msg)
    return msg


def _joinable_step(reason: str, inner) -> bool:
    """The break is at ``opt.step()`` of a class :mod:`tpu_inductor.dynamo.optimizers` traces."""
    names = {f"`{cls.__name__}.step`" for cls in optimizers.STEPS}
    if "lr_scheduler.py" in reason and any(n in reason for n in names):
        return True
    return inner is not None and inner.filename.endswith(
        os.path.join("torch", "optim", "optimizer.py")
    )


def current_tx():
    """The instruction translator of the frame Dynamo is tracing (``None`` outside one)."""
    try:
        from torch._dynamo.symbolic_convert import InstructionTranslator

        return InstructionTranslator.current_tx()
    except AttributeError:  # not called from Dynamo's tracing (a direct backend call)
        return None


def _optimizers_in_frame(tx) -> list[torch.optim.Optimizer]:
    """The optimizers the frame Dynamo traces reads: its locals, the globals it names, its
    closure cells, and one attribute level of each (``self.opt``), each once."""
    values = list(getattr(tx, "f_locals", {}).values())
    f_globals = getattr(tx, "f_globals", {})
    values += [f_globals[n] for n in tx.f_code.co_names if n in f_globals]
    for cell in getattr(tx, "closure", None) or ():
        try:
            values.append(cell.cell_contents)
        except ValueError:  # an empty cell
            pass
    found: dict[int, torch.optim.Optimizer] = {}
    for v in values:
        inner = [v]
        if not isinstance(v, (torch.optim.Optimizer, types.ModuleType)):
            inner += list(getattr(v, "__dict__", {}).values())
        for o in inner:
            if isinstance(o, torch.optim.Optimizer):
                found.setdefault(id(o), o)
    return list(found.values())


def _traceable(opt: torch.optim.Optimizer) -> bool:
    current = opt.__dict__.get("step")
    return not getattr(current, "_tpu_inductor_step", False) and not (
        optimizers.unsupported_reason(opt) or _global_hooks()
    )


def restart_to_join_step(gm: fx.GraphModule) -> None:
    """If the graph ended at ``opt.step()`` of an optimizer the frame reads and
    :mod:`tpu_inductor.dynamo.optimizers` traces, make its step traceable and have Dynamo trace
    the frame again (raises ``TensorifyScalarRestartAnalysis``), so the first call is one program
    (module docstring). Returns without doing anything otherwise.

    Args:
        gm: the Dynamo graph, as given to the backend.
    """
    reason = getattr(gm, "compile_subgraph_reason", None)
    if reason is None or not getattr(reason, "graph_break", False):
        return
    stack = list(getattr(reason, "user_stack", None) or [])
    if not _joinable_step(str(reason.reason), stack[-1] if stack else None):
        return
    tx = current_tx()
    speculation = getattr(tx, "speculation_log", None)
    if tx is None or speculation is None or not hasattr(speculation, "clear"):
        return
    found = [o for o in _optimizers_in_frame(tx) if _traceable(o)]
    if not found:
        return
    for opt in found:
        _install(opt, opt.__dict__.get("step"))
    optimizers.create_state(found)  # the retrace is then the steady step: traced once
    names = ", ".join(sorted({type(o).__name__ for o in found}))
    log.info("%s.step made traceable; Dynamo traces %s again", names, tx.f_code.co_name)
    speculation.clear()  # it holds the break at opt.step(); the retrace must try the call again
    from torch._dynamo.exc import TensorifyScalarRestartAnalysis

    raise TensorifyScalarRestartAnalysis(restart_reason=f"tpu-inductor joined {names}.step")


def join_optimizer_step() -> torch.optim.Optimizer | None:
    """If the frame Dynamo is compiling is an optimizer's ``step`` that
    :mod:`tpu_inductor.dynamo.optimizers` can trace, give that instance a ``step`` Dynamo traces
    (see
    the module docstring) and return the optimizer; else ``None``."""
    tx = current_tx()
    opt = getattr(tx, "f_locals", {}).get("self") if tx is not None else None
    if not isinstance(opt, torch.optim.Optimizer) or tx.f_code.co_name != "step":
        return None
    current = opt.__dict__.get("step")
    if getattr(current, "_tpu_inductor_step", False):
        return None
    why = optimizers.unsupported_reason(opt) or (_global_hooks() and "global optimizer hooks")
    if why:
        if (id(type(opt)), why) not in _SAID:
            _SAID.add((id(type(opt)), why))
            progress_log.warning(
                "tpu-inductor: %s.step() is compiled as a program of its own (%s): a function "
                "that calls it splits there. Adam, AdamW and SGD without hooks join the "
                "function's program.",
                type(opt).__name__,
                why,
            )
        return None
    original = current if current is not None else None
    _install(opt, original)
    log.info("%s.step made traceable for compiled callers", type(opt).__name__)
    return opt


def _global_hooks() -> bool:
    from torch.optim import optimizer

    return bool(optimizer._global_optimizer_pre_hooks or optimizer._global_optimizer_post_hooks)


def _install(opt: torch.optim.Optimizer, original: Any) -> None:
    traced, _ = optimizers.traceable_methods(opt)
    ref = weakref.ref(opt)
    scheduled = getattr(original, "_wrapped_by_lr_sched", False)

    def step(self, closure=None):
        if torch.compiler.is_compiling() and closure is None:
            if scheduled:
                self._opt_called = True  # what the scheduler's wrapper records of a step
            return traced()
        if original is not None:
            return original(closure) if closure is not None else original()
        return type(self).step(self, closure)

    step._tpu_inductor_step = True
    if scheduled:
        # installed inside the first compiled call of opt.step(): what the scheduler's wrapper
        # records (its first step() warns without it; Dynamo's replay of the store in the traced
        # step above was not seen on an attribute opt lacked, torch 2.13)
        opt._opt_called = True
        step._wrapped_by_lr_sched = True  # a later scheduler must not wrap it again
    # a bound method: a scheduler built later reads step.__func__ (lr_scheduler.py)
    opt.__dict__["step"] = types.MethodType(step, ref())

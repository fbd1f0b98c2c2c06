"""``tpu_inductor.largest_batch``: how large a training step fits on a TPU you don't have.

For a model (built on ``meta``: nothing is allocated), a target, a sharding plan and each
activation-checkpointing choice, the largest global batch (or sequence length) whose whole
training step fits in every chip's HBM, found by bisection over deviceless compiles (libtpu's
real compiler, ``options={"target": ...}``), and what that step would cost: its step peak per
chip, its roofline time, its MFU ceiling and its tokens/s ceiling.

A probe is one compile of the whole step (``compile_step``: forward, backward and the optimizer
in one program, ``fullgraph=True`` so that no part of it silently runs in eager and escapes the
count), with ``scan_layers`` on by default (its layers compiled once: the compile does not grow
with depth). Each probe says one line on the ``tpu_inductor.progress`` logger (shown without
any logging set up): the size, the step peak, whether it fits, the seconds. Peak memory grows
close to linearly with the batch, so the search probes two sizes, fits a line through them,
probes the size the line predicts to be the last that fits and the one above it; when the
prediction is off it fits the line again through the two nearest probes, and bisects only when
that does not converge: about four probes per checkpointing choice.

Anchor: MaxText's ``estimator.py`` (bisection over compiles of its own JAX train step).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

log = logging.getLogger("tpu_inductor.progress")

CHECKPOINTING = ("none", "full", "selective")

# The selective policy saves what is expensive to recompute (matmuls and attention) and
# recomputes the rest (norms, activations, elementwise): PyTorch's SAC with the policy its
# docs use as the example, and what MaxText calls "save_dot_except_mlp"-style policies.
_SAVE_OPS = frozenset(
    {
        "aten::mm",
        "aten::addmm",
        "aten::bmm",
        "aten::baddbmm",
        "aten::_scaled_dot_product_flash_attention",
        "aten::_scaled_dot_product_flash_attention_for_cpu",
        "aten::_scaled_dot_product_efficient_attention",
        "aten::_scaled_dot_product_cudnn_attention",
        "aten::convolution",
    }
)


@dataclasses.dataclass(kw_only=True)
class Probe:
    """One compile of the step at one size: ``fits``, ``peak_bytes`` per chip, ``seconds``."""

    size: int
    fits: bool
    peak_bytes: int
    roofline_seconds: float
    mfu_ceiling: float | None
    seconds: float
    error: str | None = None


@dataclasses.dataclass(kw_only=True)
class FitRow:
    """The largest size that fits for one checkpointing choice, and that step's figures.

    Attributes:
        checkpointing: ``"none"``, ``"full"`` or ``"selective"``.
        size: the largest global batch (or sequence length) whose step fits; ``None`` when even
            the smallest probed does not.
        tokens: tokens per step at that size (batch x sequence).
        peak_bytes, hbm_bytes: the step's peak per chip and one chip's usable HBM.
        roofline_seconds: the step's roofline time (a lower bound), ``mfu_ceiling``: its model
            FLOP utilization at best, ``tokens_per_second``: tokens over the roofline time.
        probes: every compile the search made, in order.
    """

    checkpointing: str
    size: int | None
    tokens: int
    peak_bytes: int
    hbm_bytes: int
    roofline_seconds: float
    mfu_ceiling: float | None
    tokens_per_second: float | None
    probes: list[Probe]

    @property
    def compile_seconds(self) -> float:
        """Wall time of all the probes' compiles."""
        return sum(p.seconds for p in self.probes)


@dataclasses.dataclass(kw_only=True)
class FitPlan:
    """What :func:`largest_batch` found: one :class:`FitRow` per checkpointing choice."""

    target: str
    over: str
    batch: int
    seq_len: int
    shardings: str | None
    rows: list[FitRow]
    path: str = "one-program"

    def __str__(self) -> str:
        size = "batch" if self.over == "batch" else "seq len"
        fixed = f"seq len {self.seq_len}" if self.over == "batch" else f"batch {self.batch}"
        lines = [
            f"tpu-inductor plan: largest {size} whose training step fits on {self.target} "
            f"({self.shardings or 'one chip, no plan'}; {fixed}; {self.path} step); figures per "
            "device, from deviceless TPU compiles of the whole step; the MFU ceiling counts "
            "recomputed matmuls",
            f"  {'checkpointing':<13} {size:>8} {'tokens/step':>11} {'step peak':>10} "
            f"{'of HBM':>7} {'roofline ms':>11} {'MFU ceiling':>11} {'tokens/s ceiling':>16} "
            f"{'probes':>6} {'compile s':>9}",
        ]
        for r in self.rows:
            if r.size is None:
                lines.append(
                    f"  {r.checkpointing:<13} {'none fits':>8}  (smallest probe: "
                    f"{_gib(r.probes[0].peak_bytes)} of {_gib(r.hbm_bytes)}"
                    f"{'; ' + r.probes[0].error if r.probes[0].error else ''})"
                )
                continue
            mfu = "-" if r.mfu_ceiling is None else f"{r.mfu_ceiling:.1%}"
            tps = "-" if r.tokens_per_second is None else f"{r.tokens_per_second:,.0f}"
            lines.append(
                f"  {r.checkpointing:<13} {r.size:>8} {r.tokens:>11,} {_gib(r.peak_bytes):>10} "
                f"{r.peak_bytes / r.hbm_bytes:>7.1%} {r.roofline_seconds * 1e3:>11,.1f} "
                f"{mfu:>11} {tps:>16} {len(r.probes):>6} {r.compile_seconds:>9.1f}"
            )
        return "\n".join(lines)


def _gib(n: float) -> str:
    return f"{n / 2**30:,.2f} GiB"


def causal_lm_loss(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """The default loss: a transformers causal LM's next-token loss on ``ids``."""
    return model(ids, labels=ids, use_cache=False).loss


def token_ids(batch: int, seq_len: int, device: str | torch.device = "meta") -> tuple:
    """The default inputs: a ``[batch, seq_len]`` int64 token tensor on ``meta``."""
    return (torch.empty(batch, seq_len, dtype=torch.long, device=device),)


def largest_batch(
    model_fn: Callable[[], torch.nn.Module],
    target: str,
    *,
    seq_len: int = 2048,
    batch: int = 1,
    over: str = "batch",
    mesh_axes: dict[str, int] | Sequence[str] | None = None,
    shardings: Any = None,
    checkpointing: Sequence[str] = CHECKPOINTING,
    optimizer: Callable[[Any], torch.optim.Optimizer] = torch.optim.AdamW,
    loss_fn: Callable[..., torch.Tensor] = causal_lm_loss,
    inputs_fn: Callable[[int, int], tuple] = token_ids,
    dtype: torch.dtype | None = None,
    path: str = "one-program",
    scan_layers: bool = True,
    max_size: int = 1 << 16,
    print_table: bool = True,
) -> FitPlan:
    """Find, per checkpointing choice, the largest batch (or sequence) whose training step fits.

    Each probe builds the model with ``model_fn()`` under ``torch.device("meta")``, applies the
    checkpointing choice to its repeated blocks, and compiles one step (``compile_step`` with
    ``fullgraph=True``: forward, ``backward()``, the optimizer and ``zero_grad`` as one program)
    for ``target`` with libtpu, running nothing. The step fits when its peak per chip (the
    report's step peak) is within one chip's usable HBM.

    Args:
        model_fn: builds the model (called under the meta device; nothing is allocated).
        target: a TPU target name (``"v5p-8"``, ``"v6e:2x2"``; see ``tpu_target``).
        seq_len, batch: the sizes; the one named by ``over`` is searched, the other fixed.
        over: ``"batch"`` (global batch, in multiples of the mesh's data axis) or ``"seq"``
            (sequence length, in multiples of 128).
        mesh_axes, shardings: a mesh over the target's chips (``Target.mesh(mesh_axes)``) and a
            plan (``"dp"``, ``"fsdp"``, ``"tp"`` or a dict), as ``options={"mesh", "shardings"}``.
        checkpointing: the choices to try: ``"none"``, ``"full"`` (each repeated block
            recomputed in the backward) and ``"selective"`` (matmul and attention outputs saved,
            the rest recomputed).
        optimizer: builds the optimizer from the parameters (AdamW by default).
        loss_fn: ``loss_fn(model, *inputs)`` -> the scalar loss (a causal LM's loss by default).
        inputs_fn: ``inputs_fn(batch, seq_len)`` -> the step's inputs on ``meta``.
        dtype: cast the model to this dtype (``torch.bfloat16``) after building it.
        path: ``"one-program"`` (``compile_step``: forward, backward and optimizer in one XLA
            program) or ``"split"`` (compiled model, ``loss.backward()``, compiled
            ``opt.step()``: three programs, what plain ``torch.compile`` users run).
        scan_layers: compile the repeated layers once, as a scan (``options["scan_layers"]``;
            the default: a probe's compile then does not grow with depth).
        max_size: stop growing the search here.
        print_table: print the plan.

    Returns:
        A :class:`FitPlan` (``str()`` is the table): per choice the largest size, step peak per
        chip, roofline step time, MFU ceiling, tokens/s ceiling and every probe.

    Example:
        >>> cfg = transformers.LlamaConfig(hidden_size=4096, num_hidden_layers=32, ...)
        >>> plan = tpu_inductor.largest_batch(
        ...     lambda: transformers.LlamaForCausalLM(cfg), "v5p-8", seq_len=8192,
        ...     mesh_axes=("data",), shardings="fsdp", dtype=torch.bfloat16)
    """
    from tpu_inductor.tpu.targets import tpu_target

    if path not in ("one-program", "split"):
        raise ValueError(f"largest_batch: path must be 'one-program' or 'split', got {path!r}")
    if over not in ("batch", "seq"):
        raise ValueError(f"largest_batch: over must be 'batch' or 'seq', got {over!r}")
    bad = [c for c in checkpointing if c not in CHECKPOINTING]
    if bad:
        raise ValueError(
            f"largest_batch: unknown checkpointing choice(s) {bad}; use any of {CHECKPOINTING}"
        )
    t = tpu_target(target)
    options: dict[str, Any] = {"target": target, "scan_layers": scan_layers}
    unit = 128 if over == "seq" else 1
    if shardings is not None or mesh_axes is not None:
        mesh = t.mesh(mesh_axes or ("data",))
        options |= {"mesh": mesh, "shardings": shardings or "dp"}
        if over == "batch":
            unit = _data_degree(mesh)
    search = _Search(
        model_fn=model_fn,
        options=options,
        loss_fn=loss_fn,
        inputs_fn=inputs_fn,
        optimizer=optimizer,
        dtype=dtype,
        over=over,
        batch=batch,
        seq_len=seq_len,
        path=path,
    )
    rows = [search.row(choice, unit, max_size) for choice in checkpointing]
    plan = FitPlan(
        target=target,
        over=over,
        batch=batch,
        seq_len=seq_len,
        shardings=_plan_name(shardings, mesh_axes),
        rows=rows,
        path=path,
    )
    if print_table:
        print(plan)
    return plan


def _plan_name(shardings, mesh_axes) -> str | None:
    if shardings is None and mesh_axes is None:
        return None
    return f"{shardings if isinstance(shardings, str) else 'custom plan'} over {mesh_axes}"


def _data_degree(mesh) -> int:
    # a batch is split over the mesh's "data" axis (the plans' input sharding); other axes
    # replicate it
    return int(dict(mesh.shape).get("data", 1))


@dataclasses.dataclass(kw_only=True)
class _Search:
    model_fn: Callable
    options: dict
    loss_fn: Callable
    inputs_fn: Callable
    optimizer: Callable
    dtype: torch.dtype | None
    over: str
    batch: int
    seq_len: int
    path: str = "one-program"

    def row(self, choice: str, unit: int, max_size: int) -> FitRow:
        """The largest size (a multiple of ``unit``, at most ``max_size``) whose step fits."""
        probes: dict[int, Probe] = {}

        def probe(n: int) -> Probe:
            if n not in probes:
                probes[n] = self.probe(choice, n)
            return probes[n]

        size = _largest_fitting(probe, unit, max_size, self._hbm)
        found = list(probes.values())
        return self._row(choice, size, found, probes.get(size) if size else None)

    @functools.cached_property
    def _hbm(self) -> int:
        from tpu_inductor.tpu.targets import tpu_target

        return tpu_target(self.options["target"]).chip.usable_hbm_bytes

    def _row(self, choice: str, size: int | None, probes: list, best: Probe | None = None):
        if best is None:
            return FitRow(
                checkpointing=choice,
                size=None,
                tokens=0,
                peak_bytes=0,
                hbm_bytes=self._hbm,
                roofline_seconds=0.0,
                mfu_ceiling=None,
                tokens_per_second=None,
                probes=probes,
            )
        b, s = (size, self.seq_len) if self.over == "batch" else (self.batch, size)
        tokens = b * s
        tps = tokens / best.roofline_seconds if best.roofline_seconds else None
        return FitRow(
            checkpointing=choice,
            size=size,
            tokens=tokens,
            peak_bytes=best.peak_bytes,
            hbm_bytes=self._hbm,
            roofline_seconds=best.roofline_seconds,
            mfu_ceiling=best.mfu_ceiling,
            tokens_per_second=tps,
            probes=probes,
        )

    def probe(self, choice: str, size: int) -> Probe:
        """Compile the whole step once at ``size`` and read its step figures."""
        from tpu_inductor.dynamo.backend import reset
        from tpu_inductor.tpu.tpu_report import tpu_report
        from tpu_inductor.training.train_step import compile_step

        b, s = (size, self.seq_len) if self.over == "batch" else (self.batch, size)
        reset()
        torch._dynamo.reset()
        start = time.perf_counter()
        with torch.device("meta"):
            model = self.model_fn()
        if self.dtype is not None:
            model = model.to(self.dtype)
        model.train()
        checkpoint_blocks(model, choice)
        opt = self.optimizer(model.parameters())
        inputs = self.inputs_fn(b, s)
        loss_fn = self.loss_fn

        def train_step(*xs):
            loss = loss_fn(model, *xs)
            loss.backward()
            opt.step()
            opt.zero_grad()
            return loss.detach()

        # transformers' kernels layers set a context variable in each block's forward; skipping
        # that side effect in the recompute changes no number (README, Training loop)
        with torch._dynamo.config.patch(skip_fwd_side_effects_in_bwd_under_checkpoint=True):
            if self.path == "one-program":
                compile_step(train_step, opt, options=self.options, fullgraph=True)(*inputs)
            else:  # compiled model, loss.backward(), compiled opt.step: three programs
                compiled = torch.compile(model, backend="tpu", options=self.options, fullgraph=True)
                loss_fn(compiled, *inputs).backward()
                torch.compile(opt.step, backend="tpu", options=self.options)()
        report = tpu_report(print_table=False)
        seconds = time.perf_counter() - start
        errors = [p.error for p in report.programs if not p.compiled]
        training = [st for st in report.steps if st.name.startswith("training")]
        if not training and errors:  # refused, e.g. too big for HBM: it does not fit
            error = errors[0].splitlines()[0]
            log.warning(
                "tpu-inductor plan: %s checkpointing, %s %d: the TPU compiler refused the step "
                "(%s), so it does not fit (%.0f s)",
                choice,
                self.over,
                size,
                error,
                seconds,
            )
            return Probe(
                size=size,
                fits=False,
                peak_bytes=0,
                roofline_seconds=0.0,
                mfu_ceiling=None,
                seconds=seconds,
                error=error,
            )
        if not training:
            raise RuntimeError(
                "largest_batch: the step compiled no training-step program; "
                f"programs: {[(p.name, p.role) for p in report.programs]}"
            )
        st = training[0]
        peak = st.peak[0]
        fits = not errors and st.fits
        log.warning(
            "tpu-inductor plan: %s checkpointing, %s %d: step peak %s per chip of %s, %s (%.0f s)",
            choice,
            self.over,
            size,
            _gib(peak),
            _gib(self._hbm),
            "fits" if fits else "does not fit",
            seconds,
        )
        return Probe(
            size=size,
            fits=fits,
            peak_bytes=peak,
            roofline_seconds=st.roofline_seconds,
            mfu_ceiling=st.mfu_ceiling,
            seconds=seconds,
            error=errors[0].splitlines()[0] if errors else None,
        )


def _largest_fitting(probe: Callable[[int], Probe], unit: int, top: int, hbm: int) -> int | None:
    """The largest multiple of ``unit`` up to ``top`` whose probe fits, or ``None``.

    Two probes give a line (peak against size); the size it predicts to be the last that fits
    is probed, and the one above it to confirm. A wrong prediction adds its probe to the line
    (the largest size that fits and the smallest that does not) and predicts again; after four
    predictions the rest is bisection between them.
    """
    fits: dict[int, Probe] = {}
    fails: dict[int, Probe] = {}

    def ask(n: int) -> bool:
        p = probe(n)
        (fits if p.fits else fails)[n] = p
        return p.fits

    if not ask(unit):
        return None
    if 2 * unit > top or not ask(2 * unit):
        return unit
    for _ in range(4):
        lo = max(fits)
        hi = min(fails) if fails else None
        if hi is not None and hi - lo <= unit:
            return lo
        guess = _predict(fits, fails, unit, hbm)
        guess = max(lo + unit, min(guess, top, (hi - unit) if hi is not None else top))
        if guess <= lo or guess in fits or guess in fails:
            break
        if ask(guess):
            if guess + unit > top or not ask(guess + unit):
                return guess
        elif guess - unit in fits:
            return guess - unit
    lo = max(fits)
    hi = min(fails) if fails else None
    while hi is None and lo < top:  # only fits so far: grow until one does not
        nxt = min(2 * lo, top)
        if not ask(nxt):
            hi = nxt
        lo = max(fits)
        if nxt == top and hi is None:
            return top
    while hi is not None and hi - lo > unit:
        mid = lo + ((hi - lo) // unit // 2) * unit
        if ask(mid):
            lo = mid
        else:
            hi = mid
    return lo


def _predict(fits: dict, fails: dict, unit: int, hbm: int) -> int:
    """The size a line predicts to be the last that fits (a peak just under ``hbm``), as a
    multiple of ``unit``: the line through the largest size that fits and the smallest that
    does not, or through the two largest that fit."""
    lo = max(fits)
    measured = [n for n in fails if fails[n].peak_bytes]  # a refused compile has no peak
    if measured:
        (s1, p1), (s2, p2) = (lo, fits[lo]), (min(measured), fails[min(measured)])
    else:
        s1, s2 = sorted(fits)[-2:]
        p1, p2 = fits[s1], fits[s2]
    a1, a2 = p1.peak_bytes, p2.peak_bytes
    if s2 == s1 or a2 <= a1:  # no slope to fit
        return 2 * lo
    per = (a2 - a1) / (s2 - s1)
    return int((s1 + (hbm - a1) / per) // unit) * unit


def checkpoint_blocks(model: torch.nn.Module, choice: str) -> int:
    """Apply an activation-checkpointing choice to ``model``'s repeated blocks, in place.

    The repeated blocks are the children of the model's largest ``nn.ModuleList`` whose children
    are all one class (a transformer's layers). ``"full"`` recomputes each block in the backward
    (``torch.utils.checkpoint``, non-reentrant); ``"selective"`` saves matmul and attention
    outputs and recomputes the rest (PyTorch's selective activation checkpointing); ``"none"``
    changes nothing.

    Returns:
        How many blocks were wrapped.
    """
    if choice == "none":
        return 0
    if choice not in CHECKPOINTING:
        raise ValueError(f"checkpointing must be one of {CHECKPOINTING}, got {choice!r}")
    blocks = _repeated_blocks(model)
    if not blocks:
        raise ValueError(
            f"checkpointing={choice!r}: {type(model).__name__} has no nn.ModuleList of blocks "
            "of one class to checkpoint; pass checkpointing=('none',) or wrap its blocks in "
            "torch.utils.checkpoint yourself"
        )
    from torch.utils.checkpoint import checkpoint, create_selective_checkpoint_contexts

    context_fn = None
    if choice == "selective":
        context_fn = functools.partial(create_selective_checkpoint_contexts, _selective_policy)
    for block in blocks:
        inner = block.forward

        def forward(*args, _inner=inner, **kwargs):
            extra = {} if context_fn is None else {"context_fn": context_fn}
            return checkpoint(_inner, *args, use_reentrant=False, **extra, **kwargs)

        block.forward = forward
    return len(blocks)


def _selective_policy(ctx, op, *args, **kwargs):
    from torch.utils.checkpoint import CheckpointPolicy

    name = getattr(op, "_schema", None)
    name = name.name if name is not None else str(op)
    return CheckpointPolicy.MUST_SAVE if name in _SAVE_OPS else CheckpointPolicy.PREFER_RECOMPUTE


def _repeated_blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    best: list[torch.nn.Module] = []
    for module in model.modules():
        if isinstance(module, torch.nn.ModuleList) and len(module) > len(best):
            children = list(module)
            if len({type(c) for c in children}) == 1:
                best = children
    return best


__all__ = ["CHECKPOINTING", "FitPlan", "FitRow", "Probe", "checkpoint_blocks", "largest_batch"]

"""``tpu_inductor.serving_plan``: how many sequences a TPU slice you don't have can serve.

For a transformers causal LM (built on ``meta``: nothing is allocated), a target and a context
length, per mesh plan (``data`` x ``model``: the batch over ``data``, tensor parallelism over
the attention heads on ``model``), the largest concurrent batch whose decode step fits in every
chip's usable HBM: the weights, the ``StaticCache`` of that many sequences at the full context,
and the decode program's own peak (the report's step peak). Then what that serves, per chip:
the decode step's tokens/s at the HBM limit (its minimum traffic at the chip's bandwidth), at
its roofline and as predicted from the compiler's estimates, and a prefill's tokens/s at the
compute ceiling and as predicted.

Each probe is one deviceless compile of one decode step (``options={"target", "mesh",
"shardings"}``), as ``largest_batch`` does for training steps. The decode peak grows linearly
with the batch (weights, then the KV cache and activations per sequence): one probe at one
sequence per data shard, a first guess from the cache's growth per sequence, then lines through
the probes nearest the limit, and the batch above the largest that fits: about four probes per
plan, and one prefill compile. A plan whose weights alone exceed a
chip (the parameters over its ``model`` degree) is not compiled.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from tpu_inductor.training.planning import _predict

log = logging.getLogger("tpu_inductor.progress")


@dataclasses.dataclass(kw_only=True)
class ServingProbe:
    """One compile at one batch: ``fits``, the step ``peak_bytes`` per chip, the decode
    program's figures (``x_minimum``: its HBM traffic over the minimum; ``rates``: tokens/s
    per chip, ``Program.tokens_per_s_per_chip``), ``seconds`` of compiling, ``error``."""

    size: int
    fits: bool
    peak_bytes: int
    kv_bytes: int = 0
    x_minimum: float = 0.0
    rates: dict = dataclasses.field(default_factory=dict)
    seconds: float = 0.0
    error: str | None = None


@dataclasses.dataclass(kw_only=True)
class ServingRow:
    """One mesh plan's largest batch and what it serves, per chip.

    Attributes:
        data, model: the mesh (``data`` x ``model`` chips' devices).
        batch: the largest concurrent batch whose decode step fits (``None``: none does).
        peak_bytes / kv_bytes / hbm_bytes: the decode step's peak, its KV cache and one
            device's usable HBM, per device.
        x_minimum: the decode program's HBM traffic over its minimum (weights, KV cache, new
            rows, logits).
        decode: decode tokens/s per chip: ``limit`` (HBM bandwidth at the minimum traffic),
            ``roofline``, ``predicted``.
        prefill: prefill tokens/s per chip: ``compute`` (matmuls at the bf16 peak),
            ``roofline``, ``predicted`` (empty when not compiled).
        note: why a plan has no batch (its weights do not fit, the compiler refused it).
        probes: every decode compile, in order.
    """

    data: int
    model: int
    batch: int | None
    peak_bytes: int = 0
    kv_bytes: int = 0
    hbm_bytes: int = 0
    x_minimum: float = 0.0
    decode: dict = dataclasses.field(default_factory=dict)
    prefill: dict = dataclasses.field(default_factory=dict)
    note: str = ""
    probes: list = dataclasses.field(default_factory=list)
    prefill_seconds: float = 0.0

    @property
    def plan(self) -> str:
        """``one chip``, ``tp 8``, ``dp 8``, ``dp 2 x tp 4``."""
        if self.data == self.model == 1:
            return "one chip"
        if self.model == 1:
            return f"dp {self.data}"
        return f"tp {self.model}" if self.data == 1 else f"dp {self.data} x tp {self.model}"

    @property
    def compile_seconds(self) -> float:
        """Wall time of the plan's compiles (decode probes and the prefill)."""
        return sum(p.seconds for p in self.probes) + self.prefill_seconds


@dataclasses.dataclass(kw_only=True)
class ServingPlan:
    """What :func:`serving_plan` found: one :class:`ServingRow` per mesh plan."""

    target: str
    context: int
    prompt: int
    dtype: str
    rows: list[ServingRow]

    def __str__(self) -> str:
        head = (
            f"tpu-inductor serving plan on {self.target}: context {self.context:,} tokens per "
            f"sequence ({self.dtype}), prefill of {self.prompt:,} tokens; figures per chip, from "
            "deviceless TPU compiles of one decode step (and one prefill) per plan"
        )
        cols = (
            f"  {'plan':<14} {'batch':>6} {'KV cache':>10} {'step peak':>10} {'of HBM':>7} "
            f"{'x min':>6} {'decode tok/s/chip: limit':>24} {'roofline':>9} {'predicted':>9} "
            f"{'prefill tok/s/chip: compute':>27} {'predicted':>9} {'compile s':>9}"
        )
        lines = [head, cols]
        for r in self.rows:
            if r.batch is None:
                lines.append(f"  {r.plan:<14} {'none':>6}  ({r.note})")
                continue
            d, p = r.decode, r.prefill
            lines.append(
                f"  {r.plan:<14} {r.batch:>6} {_gib(r.kv_bytes):>10} {_gib(r.peak_bytes):>10} "
                f"{r.peak_bytes / r.hbm_bytes:>7.1%} {r.x_minimum:>6.2f} "
                f"{d.get('limit', 0):>24,.0f} {d.get('roofline', 0):>9,.0f} "
                f"{d.get('predicted', 0):>9,.0f} {p.get('compute', 0):>27,.0f} "
                f"{p.get('predicted', 0):>9,.0f} {r.compile_seconds:>9.0f}"
            )
        lines.append(
            "  (batch: concurrent sequences whose weights + KV cache + decode peak fit each "
            "chip; x min: the decode step's HBM traffic over its minimum; limit: tokens/s at "
            "HBM bandwidth for that minimum, an upper bound no kernel passes; roofline and "
            "predicted: the compiled program's, as tpu_report() gives them)"
        )
        return "\n".join(lines)


def _gib(n: float) -> str:
    return f"{n / 2**30:,.2f} GiB"


def serving_plan(
    model_fn: Callable[[], torch.nn.Module],
    target: str,
    *,
    context: int = 8192,
    prompt: int | None = None,
    meshes: Sequence[tuple[int, int]] | None = None,
    dtype: torch.dtype = torch.bfloat16,
    max_batch: int = 4096,
    print_table: bool = True,
) -> ServingPlan:
    """Find, per mesh plan, the largest concurrent batch a decode step serves on ``target``.

    Each probe builds the model with ``model_fn()`` under ``torch.device("meta")``, makes a
    ``transformers.StaticCache`` of ``context`` positions for the batch, and compiles one decode
    step (one new token per sequence) for ``target`` with libtpu, running nothing; it fits when
    the report's step peak per chip (weights, KV cache, the program's temporaries) is within one
    chip's usable HBM. The KV cache is placed with the batch over ``data`` and the kv heads over
    ``model`` (``sharding.Plan.kv_spec``).

    Args:
        model_fn: builds a transformers causal LM (called under the meta device).
        target: a TPU target name (``"v5e-8"``, ``"v6e-1"``, ``"v6e:2x4"``; see
            ``tpu_target``).
        context: positions per sequence in the cache (prompt + generated tokens).
        prompt: the prefill's length (default ``min(context, 2048)``), one sequence per
            ``data`` shard.
        meshes: ``(data, model)`` degrees to try; default every split of the target's devices
            whose ``model`` divides the kv heads (``data`` alone is plain dp, ``model`` alone
            tensor parallelism over the heads).
        dtype: the weights' and cache's dtype.
        max_batch: stop growing the batch here.
        print_table: print the plan.

    Returns:
        A :class:`ServingPlan` (``str()`` is the table).

    Example:
        >>> cfg = transformers.LlamaConfig(hidden_size=4096, num_hidden_layers=32, ...)
        >>> plan = tpu_inductor.serving_plan(
        ...     lambda: transformers.LlamaForCausalLM(cfg), "v5e-8", context=8192)
    """
    from tpu_inductor.tpu.targets import tpu_target

    t = tpu_target(target)
    with torch.device("meta"):
        probe_model = model_fn()
    sizes = _sizes(probe_model)
    n = t.num_devices
    if meshes is None:
        meshes = [(n // m, m) for m in _divisors(n) if sizes["kv_heads"] % m == 0]
    bad = [m for m in meshes if len(m) != 2 or m[0] * m[1] != n]
    if bad:
        raise ValueError(
            f"serving_plan: meshes {bad} must be (data, model) pairs whose product is the "
            f"target's {n} devices"
        )
    itemsize = torch.empty((), dtype=dtype).element_size()
    weights = sum(p.numel() for p in probe_model.parameters()) * itemsize
    sizes["kv_bytes"] *= itemsize
    search = _Serving(model_fn=model_fn, target=t, context=context, dtype=dtype, sizes=sizes)
    rows = []
    for data, model in meshes:
        if weights / model > t.chip.usable_hbm_bytes:  # sharding can only spread it over model
            rows.append(
                ServingRow(
                    data=data,
                    model=model,
                    batch=None,
                    note=f"weights alone {_gib(weights / model)} per chip (parameters / tp "
                    f"degree) of {_gib(t.chip.usable_hbm_bytes)} usable: not compiled",
                )
            )
            continue
        rows.append(search.row(data, model, max_batch, prompt or min(context, 2048)))
    plan = ServingPlan(
        target=target,
        context=context,
        prompt=prompt or min(context, 2048),
        dtype=str(dtype).removeprefix("torch."),
        rows=rows,
    )
    if print_table:
        print(plan)
    return plan


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _sizes(model: torch.nn.Module) -> dict:
    config = getattr(model, "config", None)
    if config is None or not hasattr(config, "num_attention_heads"):
        raise TypeError(
            f"serving_plan: {type(model).__name__} is not a transformers causal LM (no "
            "config.num_attention_heads); build one with transformers' from_config"
        )
    heads = config.num_attention_heads
    kv = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    # K and V of one position of one sequence, every layer (before the dtype's itemsize)
    per_position = config.num_hidden_layers * 2 * kv * head_dim
    return {"kv_heads": kv, "head_dim": head_dim, "kv_bytes": per_position}


@dataclasses.dataclass(kw_only=True)
class _Serving:
    model_fn: Callable
    target: Any
    context: int
    dtype: torch.dtype
    sizes: dict

    def row(self, data: int, model: int, max_batch: int, prompt: int) -> ServingRow:
        hbm = self.target.chip.usable_hbm_bytes
        probes: dict[int, ServingProbe] = {}

        def ask(b: int) -> ServingProbe:
            if b not in probes:
                probes[b] = self.decode(data, model, b)
            return probes[b]

        unit = data
        best = None
        if ask(unit).fits:
            best = unit
            # the first guess from the cache's own growth (a unit of batch: one sequence per
            # data shard, its kv heads split over model), then lines through measured probes
            per_unit = self.sizes["kv_bytes"] * self.context // model
            # 90% of the headroom: a probe that fits gives the line a second point (one the
            # compiler refuses has no peak to fit)
            guess = unit + int(0.9 * (hbm - probes[unit].peak_bytes) // per_unit) * unit
            for _ in range(4):
                guess = max(unit, min(guess, max_batch))
                if guess in probes and probes[guess].fits and guess + unit in probes:
                    break
                if ask(guess).fits:
                    best = max(best, guess)
                    if guess + unit > max_batch or not ask(guess + unit).fits:
                        break
                    best = guess + unit
                guess = _guess(probes, unit, hbm, max_batch)
                if guess is None:
                    break
            fails = [b for b, p in probes.items() if not p.fits and b > best]
            while fails and min(fails) - best > unit:  # bisect what the lines left open
                mid = best + (min(fails) - best) // (2 * unit) * unit
                if ask(mid).fits:
                    best = mid
                fails = [b for b, p in probes.items() if not p.fits and b > best]
        found = list(probes.values())
        if best is None:
            first = probes[unit]
            note = first.error or (
                f"one sequence per data shard needs {_gib(first.peak_bytes)} per chip of "
                f"{_gib(hbm)} usable"
            )
            return ServingRow(data=data, model=model, batch=None, note=note, probes=found)
        p = probes[best]
        prefill, seconds = self.prefill(data, model, prompt)
        return ServingRow(
            data=data,
            model=model,
            batch=best,
            peak_bytes=p.peak_bytes,
            kv_bytes=p.kv_bytes,
            hbm_bytes=hbm,
            x_minimum=p.x_minimum,
            decode=p.rates,
            prefill=prefill,
            probes=found,
            prefill_seconds=seconds,
        )

    def _options(self, data: int, model: int) -> dict:
        options: dict[str, Any] = {"target": self.target.name}
        if self.target.num_devices > 1:
            mesh = self.target.mesh({"data": data, "model": model})
            options |= {"mesh": mesh, "shardings": "tp" if model > 1 else "dp"}
        return options

    def _compile(self, data: int, model: int, batch: int, length: int):
        """Compile one forward of ``length`` new tokens per sequence over a cache of
        ``context`` positions; returns the report's inference step and its error."""
        import transformers

        from tpu_inductor.dynamo.backend import reset
        from tpu_inductor.tpu.tpu_report import tpu_report

        reset()
        torch._dynamo.reset()
        with torch.device("meta"):
            lm = self.model_fn()
        lm = lm.to(self.dtype).eval()
        cache = transformers.StaticCache(config=lm.config, max_cache_len=self.context)
        kv, head_dim = self.sizes["kv_heads"], self.sizes["head_dim"]
        cache.early_initialization(batch, kv, head_dim, self.dtype, "meta")
        ids = torch.zeros(batch, length, dtype=torch.long, device="meta")
        compiled = torch.compile(lm, backend="tpu", options=self._options(data, model))
        with torch.no_grad():
            compiled(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
        report = tpu_report(print_table=False)
        errors = [p.error for p in report.programs if not p.compiled]
        steps = [s for s in report.steps if s.name == "inference"]
        return (steps[0] if steps else None), (errors[0].splitlines()[0] if errors else None)

    def decode(self, data: int, model: int, batch: int) -> ServingProbe:
        start = time.perf_counter()
        step, error = self._compile(data, model, batch, 1)
        seconds = time.perf_counter() - start
        label = ServingRow(data=data, model=model, batch=batch).plan
        if step is None:
            log.warning(
                "tpu-inductor serving plan: %s, batch %d: the TPU compiler refused the decode "
                "step (%s), so it does not fit (%.0f s)",
                label,
                batch,
                error,
                seconds,
            )
            return ServingProbe(size=batch, fits=False, peak_bytes=0, seconds=seconds, error=error)
        program = next((p for p in step.programs if p.tokens), None)
        if program is None:
            raise TypeError(
                "serving_plan: the decode step wrote no row of a cache in place (a "
                "transformers StaticCache, [batch, kv_heads, positions, head_dim]); programs: "
                f"{[(p.name, p.role) for p in step.programs]}"
            )
        peak = step.peak[0]
        fits = error is None and step.fits
        log.warning(
            "tpu-inductor serving plan: %s, batch %d: decode step peak %s per chip of %s, %s "
            "(%.0f s)",
            label,
            batch,
            _gib(peak),
            _gib(step.usable_bytes),
            "fits" if fits else "does not fit",
            seconds,
        )
        return ServingProbe(
            size=batch,
            fits=fits,
            peak_bytes=peak,
            kv_bytes=step.resident_bytes("state"),
            x_minimum=program.hbm_traffic / program.minimum_traffic,
            rates=program.tokens_per_s_per_chip,
            seconds=seconds,
            error=error,
        )

    def prefill(self, data: int, model: int, prompt: int) -> tuple[dict, float]:
        start = time.perf_counter()
        step, _ = self._compile(data, model, data, prompt)
        seconds = time.perf_counter() - start
        if step is None:
            return {}, seconds
        program = next((p for p in step.programs if p.tokens), None)
        return (program.tokens_per_s_per_chip if program else {}), seconds


def _guess(probes: dict, unit: int, hbm: int, top: int) -> int | None:
    """The batch the line through the probes nearest the limit predicts to be the last that
    fits (``planning._predict``, the training planner's line), within ``[unit, top]``; ``None``
    before two probes have a peak."""
    if sum(1 for p in probes.values() if p.peak_bytes) < 2:
        return None
    fits = {b: p for b, p in probes.items() if p.fits}
    fails = {b: p for b, p in probes.items() if not p.fits}
    return max(unit, min(_predict(fits, fails, unit, hbm), top))


__all__ = ["ServingPlan", "ServingProbe", "ServingRow", "serving_plan"]

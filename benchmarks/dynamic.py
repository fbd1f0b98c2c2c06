"""Dynamic shapes on real models: one compiled region, no eager islands.

``python -m benchmarks.dynamic`` compiles every model of the suite (``tests/models/``:
transformers, timm, diffusers) with ``torch.compile(model, backend="tpu", dynamic=True)`` and
calls it at several sizes, in inference (``eval``, ``no_grad``): three sequence lengths x two
batch sizes for text models; two batch sizes x two resolutions (2x and 3x the suite's) for vision
models, one where the model's code fixes the resolution. Every size is called twice: the second
round must build nothing. For each model it records the ops that fell back to eager
(``FallbackWarning``), the Dynamo graphs and graph breaks (with their cause), the XLA
executables each new size built and the time of its first call, executables rebuilt for a size
seen before, and whether every output matched eager. The table is written as JSON and markdown
(``dynamic.json``, ``dynamic.md``) to ``--results`` after each model, so a partial run leaves a
partial table: by default the git-ignored ``benchmarks/results/local``; ``--results
benchmarks/results --md docs/dynamic.md`` updates the committed figures and the page.

Options: ``--models a,b`` (only those), ``--skip a,b``, ``--slow`` (also the suite's slow
models), ``--resume`` (keep the rows already in the JSON and run the others; with ``--models``,
run those again and keep the rest), ``--render`` (only rewrite the markdown from the JSON),
``--json``/``--md`` (the files themselves).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
import traceback
import warnings
from typing import Any

import torch

from benchmarks import paths

SEQS = (5, 9, 17)
BATCHES = (2, 3)
# text kwargs with a (batch, sequence) layout
_TOKENS = ("input_ids", "decoder_input_ids", "labels", "token_type_ids")


@dataclasses.dataclass
class Row:
    """One model's sweep result (one line of the table)."""

    model: str
    library: str
    sizes: list[str] = dataclasses.field(default_factory=list)
    fallback_ops: list[str] = dataclasses.field(default_factory=list)
    dynamo_graphs: int = 0
    graph_breaks: dict[str, int] = dataclasses.field(default_factory=dict)
    recompile_reasons: list[str] = dataclasses.field(default_factory=list)
    executables_per_size: list[int] = dataclasses.field(default_factory=list)
    first_call_s: list[float] = dataclasses.field(default_factory=list)
    rebuilt: int = 0
    match: bool = False
    max_abs_err: float = 0.0
    note: str = ""
    error: str = ""
    seconds: float = 0.0

    @property
    def clean(self) -> bool:
        """Zero islands, one Dynamo graph, nothing rebuilt, values match."""
        return (
            not self.error
            and not self.fallback_ops
            and self.dynamo_graphs == 1
            and not self.graph_breaks
            and self.rebuilt == 0
            and self.match
        )


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def resize(kwargs: dict, batch: int, seq: int | None, res: int | None, seed: int = 0) -> dict:
    """The suite's forward kwargs rebuilt at ``batch`` and sequence length ``seq`` (text) or
    resolution ``res`` (images, latents); sizes a model fixes (audio frames) stay."""
    out: dict[str, Any] = {}
    for i, (name, v) in enumerate(kwargs.items()):
        g = _gen(seed * 100 + i)
        if not isinstance(v, torch.Tensor) or v.dim() == 0:
            out[name] = v
            continue
        if name in _TOKENS and v.dim() == 2:
            length = seq if seq is not None else v.shape[1]
            lo = 3 if int(v.min()) >= 3 else 0
            out[name] = torch.randint(
                lo, max(int(v.max()) + 1, lo + 1), (batch, length), generator=g
            )
        elif name == "attention_mask" and v.dim() == 2:
            length = seq if seq is not None else v.shape[1]
            mask = torch.ones(batch, length, dtype=v.dtype)
            mask[-1, -2:] = 0  # right padding on the last row, as the suite does
            out[name] = mask
        elif name in ("pixel_values", "sample", "latents") and v.dim() == 4:
            size = res if res is not None else v.shape[-1]
            out[name] = torch.randn(batch, v.shape[1], size, size, generator=g, dtype=v.dtype)
        elif name == "encoder_hidden_states" and v.dim() == 3:
            length = seq if seq is not None else v.shape[1]
            out[name] = torch.randn(batch, length, v.shape[2], generator=g, dtype=v.dtype)
        elif name == "input_values" and v.dim() == 2:
            length = 50 * seq if seq is not None else v.shape[1]
            out[name] = torch.randn(batch, length, generator=g, dtype=v.dtype)
        elif name == "timestep" and v.dim() == 1:
            out[name] = torch.randint(1, 1000, (batch,), generator=g)
        else:  # batch only
            shape = (batch, *v.shape[1:])
            if v.is_floating_point():
                out[name] = torch.randn(shape, generator=g, dtype=v.dtype)
            else:
                out[name] = v[:1].expand(shape).clone()
    return out


def _axis(kwargs: dict) -> str:
    """``"seq"`` for token inputs, ``"res"`` for images/latents, ``"batch"`` otherwise."""
    if any(k in kwargs for k in ("input_ids", "decoder_input_ids", "input_values")):
        return "seq"
    if any(k in kwargs for k in ("pixel_values", "latents", "sample")):
        return "res"
    return "batch"


def sizes_for(case, model, kwargs: dict) -> tuple[list[tuple[int, int | None, int | None]], str]:
    """The ``(batch, seq, res)`` sizes to sweep for a model, keeping those eager accepts.

    Returns the sizes and a note naming what the model's code fixes.
    """
    axis = _axis(kwargs)
    note = ""
    if axis == "seq":
        sizes = [(b, s, None) for b in BATCHES for s in SEQS]
        if "input_features" in kwargs:
            note = "audio frames fixed by the model (2 x max_source_positions); decoder seq varies"
    elif axis == "res":
        key = next(k for k in ("pixel_values", "latents", "sample") if k in kwargs)
        base = int(kwargs[key].shape[-1])
        # 2x and 3x the suite's size: at its 32 px a stride-32 network's last feature map is
        # 1 x 1, and Dynamo specializes every size-1 dimension (a second graph at 64 px).
        # A size equal to another input's (UNet: 32 px and cross_attention_dim 32) shares its
        # symbol (Dynamo's duck sizing) and gets specialized with it: skipped.
        others = {
            int(d)
            for k, v in kwargs.items()
            if k != key and torch.is_tensor(v)
            for d in v.shape[1:]
        }
        res = [r for r in (2 * base, 3 * base, 4 * base) if r not in others][:2]
        sizes = [(b, None, r) for b in BATCHES for r in res]
    else:
        sizes = [(b, None, None) for b in BATCHES]
    kept = []
    rejected = set()
    with torch.no_grad():
        for b, s, r in sizes:
            try:
                model(**resize(kwargs, b, s, r))
                kept.append((b, s, r))
            except Exception as e:  # the model's own code refuses that size
                rejected.add((s, r, type(e).__name__))
    if rejected and axis == "res":
        note = "resolution fixed by the model's code (eager rejects another)"
        kept = kept or [(b, None, None) for b in BATCHES]
    elif rejected:
        note = (note + "; " if note else "") + f"eager rejects {sorted(rejected)}"
    return kept, note


def _label(b: int, s: int | None, r: int | None) -> str:
    return f"{b}x{s}" if s is not None else f"{b}@{r}px" if r is not None else f"b{b}"


def _builds() -> int:
    import tpu_inductor

    return sum(len(g.builds) for g in tpu_inductor.report(print_table=False).graphs)


def _outputs(out, names):
    from tests.models.harness import select_outputs

    return select_outputs(out, names)


def sweep_case(case) -> Row:
    """Run one model over its sizes, twice each; see the module docstring."""
    import tpu_inductor
    from tests.models.harness import fallback_ops, max_abs_err
    from tpu_inductor.core.errors import FallbackWarning

    row = Row(model=case.name, library=case.library)
    start = time.perf_counter()
    torch.manual_seed(0)
    model, kwargs = case.build(False)
    model.eval()
    sizes, row.note = sizes_for(case, model, kwargs)
    row.sizes = [_label(*s) for s in sizes]
    inputs = [resize(kwargs, *s, seed=j) for j, s in enumerate(sizes)]
    with torch.no_grad():
        expected = [_outputs(model(**kw), case.outputs) for kw in inputs]
    torch._dynamo.reset()
    tpu_inductor.reset()
    counters = torch._dynamo.utils.counters
    counters.clear()
    compiled = torch.compile(model, backend="tpu", dynamic=True)
    match = True
    err = 0.0
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", FallbackWarning)
        for round_ in range(2):
            for kw, exp in zip(inputs, expected, strict=True):
                before = _builds()
                t0 = time.perf_counter()
                got = _outputs(compiled(**kw), case.outputs)
                dt = time.perf_counter() - t0
                built = _builds() - before
                if round_ == 0:
                    row.executables_per_size.append(built)
                    row.first_call_s.append(round(dt, 3))
                else:
                    row.rebuilt += built
                for key, e in exp.items():
                    a = got[key]
                    ok = a.shape == e.shape and a.dtype == e.dtype
                    ok = ok and torch.allclose(
                        a.double(), e.double(), atol=case.atol, rtol=case.rtol
                    )
                    match = match and ok
                if all(got[k].shape == e.shape for k, e in exp.items()):
                    err = max(err, max_abs_err(got, exp))
    row.match = match
    row.max_abs_err = err
    row.fallback_ops = sorted(fallback_ops(caught))
    row.dynamo_graphs = int(counters["stats"]["unique_graphs"])
    row.graph_breaks = {str(k)[:200]: int(v) for k, v in counters["graph_break"].items()}
    failures = getattr(torch._dynamo.utils, "guard_failures", {})
    row.recompile_reasons = sorted({str(r)[:200] for rs in failures.values() for r in rs})
    row.seconds = round(time.perf_counter() - start, 1)
    return row


def all_cases(slow: bool = False) -> list:
    """The suite's models: transformers and timm, then diffusers (those installed)."""
    from tests.models import test_transformers

    cases = list(test_transformers.MODELS)
    try:
        import diffusers  # noqa: F401

        from tests.models import test_diffusers

        cases += list(test_diffusers.MODELS)
    except ImportError:
        pass
    if os.environ.get("TPU_INDUCTOR_SLOW") != "1" and not slow:
        cases = [c for c in cases if not c.slow]
    return cases


def _installed(case) -> bool:
    if case.library == "timm":
        from tests.models import timm_compat

        return timm_compat.import_timm(skip=True) is not None
    try:
        __import__(case.library)
    except ImportError:
        return False
    return True


def markdown(rows: list[Row]) -> str:
    """The table as markdown (docs/dynamic.md)."""
    clean = sum(r.clean for r in rows)
    lines = [
        "# Dynamic shapes on real models",
        "",
        "Generated by `python -m benchmarks.dynamic --results benchmarks/results --md "
        "docs/dynamic.md` (CPU, tiny random configs, inference):",
        '`torch.compile(model, backend="tpu", dynamic=True)` called at every size twice.',
        "Text models: batch 2, 3 x sequence 5, 9, 17; vision models: batch 2, 3 x two",
        "resolutions where the model's code allows (`2@64px`: batch 2 at 64 x 64; 2x and 3x the",
        "suite's size, so that no stride-32 feature map is 1 x 1, which Dynamo specializes).",
        "*islands*: ops that ran in torch eager",
        "(`FallbackWarning`); *graphs*: Dynamo graphs captured over all sizes; *exes/size*: XLA",
        "executables the first call of each new size built; *rebuilt*: executables built in the",
        "second round (sizes seen before; should be 0); *first call*: seconds of each new size's",
        "first call (compile included).",
        "",
        f"{clean} of {len(rows)} models: zero islands, one Dynamo graph, nothing rebuilt, "
        "values match eager.",
        "",
        "What earlier sweeps found: `aten.true_divide.Tensor` on 0-d float64 tensors (a Python",
        "float that Dynamo keeps symbolic, e.g. `math.sqrt(2.0 / math.pi)` in GPT-2's",
        "`gelu_new`) fell back to eager in albert, gpt2, gpt_neo, phi and both diffusers models",
        "(now lowered). At the suite's 32 px, timm's EfficientNet, MobileNetV3 and ConvNeXt end",
        "in a 1 x 1 feature map, and Dynamo specializes size-1 dimensions, so a second",
        "resolution made a second graph (Dynamo's doing, not the backend's); Swin at 32 px",
        "(one 4 x 4 window after patch merging) recompiled at 64 px on a guard over its window",
        "arithmetic. The UNet at 32 px shares a symbol with its `cross_attention_dim` of 32",
        "(Dynamo's duck sizing), which a linear layer then specializes: a second graph at",
        "48 px. The sweep uses 2x and 3x the suite's size, skipping sizes equal to another",
        "input's.",
        "",
        "| model | sizes | islands (fallback ops) | graphs | exes/size | first call (s) "
        "| rebuilt | match | notes |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        notes = [r.note] if r.note else []
        if r.graph_breaks:
            notes.append("graph breaks: " + "; ".join(r.graph_breaks))
        if r.recompile_reasons and r.dynamo_graphs > 1:
            notes.append("recompiled: " + "; ".join(r.recompile_reasons[:2]))
        if r.error:
            notes.append("error: " + r.error)
        cell = lambda s: s.replace("|", "\\|").replace("\n", " ")
        lines.append(
            f"| {r.model} | {' '.join(r.sizes)} | {', '.join(r.fallback_ops) or '-'} "
            f"| {r.dynamo_graphs} | {' '.join(map(str, r.executables_per_size))} "
            f"| {' '.join(f'{t:.1f}' for t in r.first_call_s)} | {r.rebuilt} "
            f"| {'yes' if r.match else 'NO'} | {cell('; '.join(notes))} |"
        )
    lines += [
        "",
        "## What a symbolic scalar becomes",
        "",
        "Sizes are concrete while each executable is traced (one per size), so what Dynamo keeps",
        "symbolic is computed at trace time or in the program, never in eager:",
        "",
        "- `sym_size`, `sym_float`, `sym_int`, `sym_max`, `sym_sum`, `math.sqrt(n)` and the",
        "  other arithmetic on sizes: Python numbers while tracing.",
        "- A Python float or symbolic float made a 0-d tensor (RMSNorm's eps, attention scaling):",
        "  `prims.convert_element_type` and arithmetic on 0-d float64, computed in float64 as",
        "  torch does.",
        "- `_assert_scalar` (Dynamo's guards on sizes): checked while tracing.",
        "- `torch._assert_async(cond, msg)`: on sizes, checked while tracing; on values, by a",
        "  host callback once the program has computed `cond` (1 byte per call, device to",
        "  host), raising torch's `RuntimeError(msg)` with the source line at the call. NOTE:",
        "  torch's dead-code pass drops `_assert_async(cond)` without a message from the graph",
        "  (torch 2.13: only `.msg` is in `torch.fx.node._side_effectful_functions`), for every",
        "  backend.",
        "- `.item()` under `capture_scalar_outputs` of a value built from sizes only",
        "  (`torch.tensor(x.shape[0]).item()`): read while tracing, so it may become a tensor",
        "  size; `pad_to` is off for such a graph (the item must read the real size, not the",
        "  bucket). `.item()` of a tensor's values that becomes a size runs in eager, named with",
        "  its line: XLA needs sizes before the program runs.",
        "",
        "Tests: `tests/test_dynamic_models.py` (`test_symbolic_scalar_arithmetic_is_lowered`,",
        "`test_item_of_a_size_becomes_a_size`,",
        "`test_assert_async_is_checked_not_reported_missing`).",
    ]
    return "\n".join(lines) + "\n"


def _write(rows: list[Row], json_path: str, md_path: str) -> None:
    os.makedirs(os.path.dirname(json_path), exist_ok=True)
    with open(json_path, "w") as f:
        json.dump([dataclasses.asdict(r) for r in rows], f, indent=1)
    with open(md_path, "w") as f:
        f.write(markdown(rows))


def main(argv: list[str] | None = None) -> list[Row]:
    """Run the sweep and write the table; returns the rows."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="")
    p.add_argument("--skip", default="")
    p.add_argument("--slow", action="store_true")
    p.add_argument("--resume", action="store_true")
    paths.add_results_option(p)
    p.add_argument("--json", default=None, help="default: RESULTS/dynamic.json")
    p.add_argument("--md", default=None, help="default: RESULTS/dynamic.md")
    p.add_argument("--render", action="store_true", help="only rewrite the markdown from the JSON")
    args = p.parse_args(argv)
    args.json = args.json or str(args.results / "dynamic.json")
    args.md = args.md or str(args.results / "dynamic.md")
    if args.render:
        with open(args.json) as f:
            rows = [Row(**r) for r in json.load(f)]
        _write(rows, args.json, args.md)
        return rows
    cases = all_cases(args.slow)
    if args.models:
        wanted = args.models.split(",")
        cases = [c for c in cases if c.name in wanted]
    skip = set(filter(None, args.skip.split(",")))
    rows: list[Row] = []
    if args.resume and os.path.exists(args.json):
        # keep the rows already there; with --models, those models run again
        with open(args.json) as f:
            rows = [Row(**r) for r in json.load(f)]
        rows = [r for r in rows if r.model not in {c.name for c in cases} or not args.models]
        skip |= {r.model for r in rows}
    order = {c.name: i for i, c in enumerate(all_cases(True))}
    for case in cases:
        if case.name in skip or not _installed(case):
            continue
        try:
            row = sweep_case(case)
        except Exception as e:
            row = Row(model=case.name, library=case.library)
            row.error = f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
            traceback.print_exc()
        rows.append(row)
        rows.sort(key=lambda r: order.get(r.model, len(order)))
        print(
            f"{row.model:<24} clean={row.clean} islands={row.fallback_ops} "
            f"graphs={row.dynamo_graphs} exes={row.executables_per_size} "
            f"rebuilt={row.rebuilt} match={row.match} {row.seconds}s {row.error}",
            flush=True,
        )
        _write(rows, args.json, args.md)
    return rows


if __name__ == "__main__":
    sys.exit(0 if all(r.clean for r in main()) else 1)

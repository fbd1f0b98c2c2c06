"""Every python code block of README.md and docs/*.md is a test.

Each block is found by its page, its section heading and its position under it
(``"Train #1"`` in the README, ``"docs/training.md: Training loop #1"`` in a docs page) and
either runs here, on a tiny config, with what its prose claims asserted (eager's numbers:
the same block run with ``torch.compile``/``compile_step`` as the identity; the number of
programs; no graph break; bytes crossing), has a skip reason in :data:`SKIPS`, or is a copy of a
README block (:data:`SAME_AS`, checked to be the same text). A block with none of these fails
:func:`test_every_block_is_run_or_skipped_for_a_reason`, so a new block can't be silently
untested. The notebooks' cells run in tests/examples/test_notebooks.py.

The demo's sample output in the README is written by ``scripts/update_readme_demo.py``;
:func:`test_readme_demo_sample_has_the_lines_the_demo_prints` fails when the demo's lines and the
sample's drift apart.
"""

from __future__ import annotations

import contextlib
import logging
import pathlib
import re

import pytest
import torch

import tpu_inductor
from tests.helpers import assert_same, tiny_llama

ROOT = pathlib.Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"


def python_blocks(text: str) -> dict[str, str]:
    """``{"<heading> #<k>": code}`` for every fenced python block (indented ones too)."""
    lines = text.split("\n")
    blocks, heading, counts, i = {}, "", {}, 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("#"):
            heading = line.lstrip("#").strip()
        m = re.match(r"^( *)```(\w*)\s*$", line)
        if m:
            indent, lang = m.groups()
            j = i + 1
            while not re.match(rf"^{indent}```\s*$", lines[j]):
                j += 1
            if lang == "python":
                counts[heading] = counts.get(heading, 0) + 1
                body = [x[len(indent) :] for x in lines[i + 1 : j]]
                blocks[f"{heading} #{counts[heading]}"] = "\n".join(body)
            i = j
        i += 1
    return blocks


BLOCKS = python_blocks(README.read_text())
for _page in sorted(DOCS.glob("*.md")):
    for _key, _code in python_blocks(_page.read_text()).items():
        BLOCKS[f"docs/{_page.name}: {_key}"] = _code

# Blocks that don't run here, and why (data, not silence).
SKIPS = {
    "docs/training.md: Training loop #2": "transformers' Trainer for 1000 steps over a dataset "
    "`ds`: the same setup runs for a few steps on a tiny Llama in "
    "tests/training/test_training_loops.py",
    "Scale out: a device mesh #1": "needs several devices before JAX starts "
    "(XLA_FLAGS=--xla_force_host_platform_device_count): tests/runtime/sharding_cases.py runs this "
    "plan on 8 CPU devices in a subprocess (tests/runtime/test_sharding.py)",
    "docs/scaling.md: Scaling out: a device mesh #2": "jax.distributed.initialize() across the "
    "hosts of a TPU pod (tests/runtime/test_multihost.py runs two processes on one machine)",
    "Compile for a TPU you don't have, and plan a fit #1": "compiles with libtpu for a TPU "
    "topology and bisects over step compiles (minutes on 2 cores): tests/tpu/ (marker "
    "tpu_compile) runs the same calls on a tiny Llama; test_skipped_blocks_define_their_names "
    "checks it reads no undefined name",
    "docs/planning.md: Planning what fits: `largest_batch` #1": "bisects over libtpu compiles "
    "of a training step for a TPU target: tests/tpu/test_planning.py runs it on a tiny Llama",
    "docs/planning.md: `serving_plan`: how many sequences a slice serves #1": "probes Llama-3.1-"
    "8B decode steps compiled for a v5e-8 slice (a minute each on 2 cores): "
    "tests/tpu/test_decode.py runs serving_plan on a small Llama over a 2x2 slice",
}

# Docs blocks that repeat a README block word for word (run under the README's key).
SAME_AS = {
    "docs/training.md: One program per training step (recommended on TPUs) #1": "Train #1",
    "docs/training.md: Generating text with transformers #1": (
        "Generate text with transformers #1"
    ),
    "docs/scaling.md: Scaling out: a device mesh #1": "Scale out: a device mesh #1",
    "docs/troubleshooting.md: Checking numerics against CPU (for CI) #1": (
        "Check numerics against CPU in CI #1"
    ),
}

# Names a skipped block reads without defining them: the reader's own objects, said in its prose.
GIVEN = {
    "docs/training.md: Training loop #2": {"model", "transformers", "ds"},
    "Scale out: a device mesh #1": {"model", "optimizer", "ids"},
    "docs/scaling.md: Scaling out: a device mesh #2": {"build_model", "optimizer", "batches"},
}


class MLP(torch.nn.Module):
    """``MyModel`` of the README's short examples."""

    def __init__(self, out: int = 4):
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(
            torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, out)
        )

    def forward(self, x):
        return self.net(x)


def _identity_compile(fn=None, *args, **kwargs):
    if fn is None:
        return lambda f: f
    return fn


@contextlib.contextmanager
def _eager():
    """``torch.compile``, ``compile_step`` and ``keep_on_device`` as no-ops: the block in eager."""
    with (
        pytest.MonkeyPatch.context() as mp,
    ):
        mp.setattr(torch, "compile", _identity_compile)
        mp.setattr(tpu_inductor, "compile_step", lambda fn, *a, **k: fn)
        mp.setattr(tpu_inductor, "keep_on_device", lambda model, *a, **k: model)
        yield


def _run(key: str, env: dict, eager: bool = False) -> dict:
    torch._dynamo.reset()
    tpu_inductor.reset()
    ns = {"torch": torch, "tpu_inductor": tpu_inductor, **env}
    with torch._dynamo.config.patch(), _eager() if eager else contextlib.nullcontext():
        exec(compile(BLOCKS[key], f"[{key}]", "exec"), ns)
    return ns


def _both(key: str, make_env) -> tuple[dict, dict]:
    """The block compiled, then in eager, each on a fresh ``make_env()``."""
    return _run(key, make_env()), _run(key, make_env(), eager=True)


def _params(model):
    return [p.detach().clone() for p in model.parameters()]


def _breaks() -> int:
    return sum(torch._dynamo.utils.counters["graph_break"].values())


@pytest.fixture(autouse=True)
def _clean():
    yield
    torch._dynamo.reset()
    tpu_inductor.reset()


def test_every_block_is_run_or_skipped_for_a_reason():
    tested = {k for k in globals() if k.startswith("test_block_")}
    missing = [
        k for k in BLOCKS if _test_name(k) not in tested and k not in SKIPS and k not in SAME_AS
    ]
    assert not missing, f"python blocks with no test, skip reason or SAME_AS entry: {missing}"
    stale = [k for k in {**SKIPS, **SAME_AS} if k not in BLOCKS]
    assert not stale, f"SKIPS or SAME_AS name blocks the pages no longer have: {stale}"


@pytest.mark.parametrize("key", sorted(SAME_AS))
def test_docs_copy_is_the_readme_block(key):
    """A docs block that repeats a README block is its text exactly, so the README's test
    covers both."""
    assert BLOCKS[key] == BLOCKS[SAME_AS[key]], f"{key} drifted from README {SAME_AS[key]}"


def _undefined(code: str) -> set[str]:
    """Names ``code`` reads that it never binds (imports, assignments, defs, arguments,
    ``with ... as``, loop targets) and that are not builtins."""
    import ast
    import builtins

    tree = ast.parse(code)
    bound, read = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (read if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, ast.alias):
            bound.add((node.asname or node.name).split(".")[0])
        elif isinstance(node, ast.FunctionDef | ast.ClassDef):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
    return read - bound - set(dir(builtins))


@pytest.mark.parametrize("key", sorted(SKIPS))
def test_skipped_blocks_define_their_names(key):
    """A block that doesn't run here still reads only names it defines or imports (or that
    :data:`GIVEN` or its prose names), so a reader can paste it."""
    given = GIVEN.get(key, set()) | {"torch", "tpu_inductor"}
    assert not _undefined(BLOCKS[key]) - given, _undefined(BLOCKS[key]) - given


def _test_name(key: str) -> str:
    return "test_block_" + re.sub(r"\W+", "_", key.lower()).strip("_")


@pytest.mark.parametrize("key", sorted(SKIPS))
def test_skipped_block(key):
    pytest.skip(SKIPS[key])


def test_block_tpu_inductor_1():
    x = torch.randn(4, 8)
    ns = _run("tpu-inductor #1", {"model": MLP()})
    assert isinstance(ns["model"], torch._dynamo.eval_frame.OptimizedModule)
    assert_same(ns["model"](x), MLP()(x))


def test_block_compile_a_model_1():
    """Forward, backward and a compiled AdamW step: eager's parameters after the step."""

    def env():
        return {"MyModel": MLP, "x": torch.randn(4, 8, generator=torch.Generator().manual_seed(0))}

    comp, eager = _both("Compile a model #1", env)
    assert_same(_params(comp["model"]), _params(eager["model"]), what="params after the step")
    assert len(tpu_inductor.report(False).graphs) == 0  # the eager run compiled nothing


def test_block_docs_training_md_what_a_compiled_call_does_1():
    """keep_on_device: the loss read every 100 steps; eager's parameters."""

    def env():
        g = torch.Generator().manual_seed(0)
        batches = [(torch.randn(4, 8, generator=g), torch.randint(0, 4, (4,), generator=g))] * 3
        return {"MyModel": MLP, "batches": batches, "F": torch.nn.functional}

    comp, eager = _both("docs/training.md: What a compiled call does #1", env)
    assert_same(_params(comp["model"]), _params(eager["model"]), what="params")


def _llama_config():
    return tiny_llama().config


def test_block_docs_training_md_training_loop_1(caplog):
    """The recommended loop as printed: no graph break after the first step, nothing compiled
    after the second, no warning on the progress logger, eager's losses, and the bytes per step
    (the batch, the lr and the loss gradient in; nothing out between loss reads)."""
    pytest.importorskip("transformers")
    seen = {"breaks": [], "graphs": [], "h2d": [], "d2h": []}

    def loader(steps=5):
        g = torch.Generator().manual_seed(0)
        for _ in range(steps):
            t = tpu_inductor.report(False).transfers
            seen["breaks"].append(_breaks())
            seen["graphs"].append(len(tpu_inductor.report(False).graphs))
            seen["h2d"].append(t.host_to_device_bytes)
            seen["d2h"].append(t.device_to_host_bytes)
            yield [torch.randint(0, 128, (2, 16), generator=g)]

    import transformers

    def env():
        return {"transformers": transformers, "config": _llama_config(), "loader": loader()}

    with caplog.at_level(logging.WARNING, logger="tpu_inductor.progress"):
        comp = _run("docs/training.md: Training loop #1", env())
    warned = [
        r.getMessage()
        for r in caplog.records
        if r.name == "tpu_inductor.progress"
        and not re.match(r"tpu-inductor: (still compiling|compiled) graph", r.getMessage())
    ]  # any warning but the long-compile notices ("still compiling", "compiled")
    assert not warned, warned
    breaks, graphs = seen["breaks"], seen["graphs"]
    assert breaks[2:] == [breaks[2]] * len(breaks[2:]), breaks  # none after the first step
    # step 1: the forward, the backward and update() as one program (clipping and the scheduled
    # opt.step joined at the first call, its state made before the retrace); then nothing
    assert graphs[1:3] == [3, 3], graphs
    assert graphs[3:] == [graphs[2]] * len(graphs[3:]), graphs  # nothing compiled after step 2
    h2d = [b - a for a, b in zip(seen["h2d"][2:], seen["h2d"][3:], strict=False)]
    d2h = [b - a for a, b in zip(seen["d2h"][2:], seen["d2h"][3:], strict=False)]
    # the batch (2 x 16 int64) to the forward, the lr, the loss gradient: the printed loop
    # (checkpointing, bf16) sends the batch once; the table's float32 `loop` twice (1,032 B)
    assert h2d == [2 * 16 * 8 + 4 + 4] * len(h2d), h2d
    assert d2h == [0] * len(d2h), d2h  # the loss is read only at step 0
    eager = _run("docs/training.md: Training loop #1", env(), eager=True)
    assert_same(comp["loss"].detach(), eager["loss"].detach(), atol=2e-2, rtol=2e-2)


def test_block_train_1():
    """compile_step: one compile (the optimizer state exists before the trace), then none;
    eager's numbers."""

    def env():
        g = torch.Generator().manual_seed(0)
        return {
            "model": tiny_llama(),
            "batches": [torch.randint(0, 128, (2, 16), generator=g) for _ in range(3)],
        }

    comp = _run("Train #1", env())
    assert len(tpu_inductor.report(False).graphs) == 1, tpu_inductor.report(False).graphs
    eager = _run("Train #1", env(), eager=True)
    assert_same(comp["loss"], eager["loss"])
    assert_same(_params(comp["model"]), _params(eager["model"]), what="params")


def _generate_env():
    import transformers

    model = tiny_llama().eval()
    ids = torch.randint(0, 128, (1, 6), generator=torch.Generator().manual_seed(0))
    return {"model": model, "ids": ids, "transformers": transformers}


def test_block_generate_text_with_transformers_1():
    code = BLOCKS["Generate text with transformers #1"]
    BLOCKS["Generate text with transformers #1"] = code.replace("20", "4")
    try:
        comp, eager = _both("Generate text with transformers #1", _generate_env)
    finally:
        BLOCKS["Generate text with transformers #1"] = code
    assert torch.equal(comp["out"], eager["out"])


def test_block_docs_training_md_generating_text_with_transformers_2():
    key = "docs/training.md: Generating text with transformers #2"
    code = BLOCKS[key]
    BLOCKS[key] = code.replace("max_new_tokens=20", "max_new_tokens=4")
    try:
        comp = _run(key, _generate_env())
        eager = _generate_env()
        ref = eager["model"].generate(eager["ids"], max_new_tokens=4, do_sample=False)
    finally:
        BLOCKS[key] = code
    assert torch.equal(comp["out"], ref)
    assert tpu_inductor.report(False).graphs  # it compiled


def test_block_docs_training_md_changing_shapes_1():
    """One Dynamo graph, 20 executables."""
    ns = _run("docs/training.md: Changing shapes #1", {"model": torch.nn.Linear(8, 3)})
    # one Dynamo graph: its forward (20 executables) and a backward never called (no executable)
    graphs = [g for g in tpu_inductor.report(False).graphs if g.executables]
    assert len(graphs) == 1 and graphs[0].executables == 20, graphs
    x = torch.randn(5, 8)
    assert_same(ns["cm"](x), ns["model"](x))


def test_block_docs_training_md_changing_shapes_2():
    cm = torch.compile(lambda t: t * 2, backend="tpu", dynamic=True)
    ns = _run("docs/training.md: Changing shapes #2", {"cm": cm})
    ns["future"].result(timeout=300)
    assert len(tpu_inductor.report(False).graphs) >= 1


def test_block_check_numerics_against_cpu_in_ci_1():
    _run("Check numerics against CPU in CI #1", {"model": MLP(), "x": torch.randn(4, 8)})


def test_block_docs_options_md_options_1():
    """config.patch around a compile; the knob's default again outside it."""
    x = torch.randn(4, 8)
    ns = _run("docs/options.md: Options #1", {"model": MLP(), "x": x})
    assert_same(ns["y"], MLP()(x))
    assert tpu_inductor.config.get("splash_attention") == "auto"
    (graph,) = tpu_inductor.report(False).graphs
    assert graph.nodes > 0


def test_block_docs_training_md_custom_ops_and_kernels_1():
    ns = _run("docs/training.md: Custom ops and kernels #1", {})
    x = torch.randn(16)
    f = torch.compile(
        lambda t: ns["scaled_sin"](t, scale=2.0) + ns["add"](t, t),
        backend="tpu",
        options={"fallback": "error"},
    )
    assert_same(f(x), torch.sin(x) * 2.0 + 2 * x)


def test_readme_demo_sample_has_the_lines_the_demo_prints():
    """The sample is written by scripts/update_readme_demo.py; its lines' labels are the
    demo's (numbers vary with the machine; the labels and their order may not)."""
    import importlib.util

    from tpu_inductor import demo

    path = ROOT / "scripts" / "update_readme_demo.py"
    spec = importlib.util.spec_from_file_location("update_readme_demo", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    sample = script.readme_sample(README.read_text())
    assert script.labels(sample) == list(demo.LABELS), (
        "README demo sample is stale: python scripts/update_readme_demo.py"
    )


def test_readme_demo_sample_drops_a_verdict_the_demo_calls_unreliable():
    """On a loaded machine the sample keeps the times and leaves out "Nx faster", which a
    reader could not reproduce; on a quiet one it keeps the demo's line as printed."""
    import importlib.util

    path = ROOT / "scripts" / "update_readme_demo.py"
    spec = importlib.util.spec_from_file_location("update_readme_demo", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    steady = "  steady state        : 8.55 ms/call compiled, 174.54 ms/call torch eager -> "
    loaded = (
        f"tpu-inductor demo: x\n{steady}compiled is 20.41x faster\n  timing : UNRELIABLE (load 9)\n"
    )
    quiet = f"tpu-inductor demo: x\n{steady}compiled is 1.20x slower\n  timing : steady\n"
    assert "20.41x" not in script.sample_of(loaded) and "no verdict" in script.sample_of(loaded)
    assert script.sample_of(quiet) == quiet

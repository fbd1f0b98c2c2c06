"""A first run says only what matters, in our words: the plain training loop prints no torch
internals and compiles no step twice, and a backend error's message is in its first lines."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import textwrap

import pytest
import torch

import tpu_inductor
from tests.helpers import compiled

ROOT = pathlib.Path(__file__).resolve().parent.parent
ALARMING = ("Please file an issue", "Recompiling", "recompil", "compiled again", "Profiler")


def run_script(tmp_path: pathlib.Path, code: str) -> subprocess.CompletedProcess:
    """Run ``code`` as a user's script would run: its own file, this checkout's package, default
    warnings and no TORCH_LOGS."""
    script = tmp_path / "user_script.py"
    script.write_text(textwrap.dedent(code))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCH_LOGS", "TORCHDYNAMO"))}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    env.setdefault("JAX_PLATFORMS", "cpu")
    return subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=600
    )


LOOP = """
    import copy, torch
    from torch._dynamo.utils import counters

    def loop(compile_model, compile_step):
        torch.manual_seed(0)
        model = torch.nn.Sequential(
            torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)
        )
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        run = torch.compile(model, backend="tpu") if compile_model else model
        step = torch.compile(opt.step, backend="tpu") if compile_step else opt.step
        graphs = []
        for i in range(3):
            x = torch.randn(4, 8)
            loss = run(x).sum()
            loss.backward()
            step()
            opt.zero_grad()
            graphs.append(counters["stats"]["unique_graphs"])
        return [p.detach().clone() for p in model.parameters()], graphs

    eager, _ = loop(False, False)
    for compile_step in (False, True):
        counters.clear()
        params, graphs = loop(True, compile_step)
        diff = max((a - b).abs().max().item() for a, b in zip(params, eager))
        print(f"compile_step={compile_step} graphs={graphs} diff={diff:.2e}")
        print(f"breaks={compile_step} {sorted(counters['graph_break'])!r}")
"""


def test_the_plain_training_loop_prints_no_torch_internals_and_matches_eager(tmp_path):
    run = run_script(tmp_path, LOOP)
    assert run.returncode == 0, run.stderr[-3000:]
    out = run.stdout + run.stderr
    for text in ALARMING:
        assert text not in out, out[-3000:]
    lines = [ln for ln in run.stdout.splitlines() if ln.startswith("compile_step=")]
    assert len(lines) == 2, run.stdout
    for line in lines:
        graphs = eval(line.split("graphs=")[1].split(" diff=")[0])
        assert graphs[0] == graphs[-1] > 0, line  # steps 2 and 3 compile nothing new
        assert float(line.split("diff=")[1]) < 1e-5, line  # eager's parameters after 3 steps
    assert "breaks=False []" in run.stdout, run.stdout  # the compiled model: one graph
    # a compiled opt.step: only torch's own graph_break() in Optimizer.step, said by no one
    breaks = eval(run.stdout.split("breaks=True ")[1].splitlines()[0])
    assert all("User-inserted graph break" in b for b in breaks), breaks


TYPO = """
    import torch
    m = torch.nn.Linear(4, 4)
    torch.compile(m, backend="tpu", options={"devcie": "cpu"})(torch.randn(2, 4))
"""

UNSUPPORTED = """
    import torch

    @torch.library.custom_op("quiet_first_run::mystery", mutates_args=())
    def mystery(x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    @mystery.register_fake
    def _(x):
        return torch.empty_like(x)

    class M(torch.nn.Module):
        def forward(self, x):
            return torch.ops.quiet_first_run.mystery(x) + 1

    torch.compile(M(), backend="tpu", options={"fallback": "error"})(torch.randn(2, 3))
"""


@pytest.mark.parametrize(
    "code, says",
    [
        (TYPO, "unknown option 'devcie' (did you mean 'device'?)"),
        (UNSUPPORTED, "quiet_first_run.mystery.default(float32[2, 3])"),
    ],
    ids=["option-typo", "unsupported-op"],
)
def test_an_uncaught_backend_error_says_our_message_in_its_first_lines(tmp_path, code, says):
    run = run_script(tmp_path, code)
    assert run.returncode != 0
    head = run.stderr.splitlines()[:15]
    assert any(says in line for line in head), run.stderr[:3000]
    assert any("user_script.py" in line for line in head)  # the user's line, with it
    # the traceback below Dynamo is the raising frame alone, not Dynamo's ~90 lines
    assert len(run.stderr.splitlines()) < 40, run.stderr


def test_our_errors_can_still_be_caught_by_their_documented_class():
    with pytest.raises(tpu_inductor.InvalidOptionError, match="did you mean 'device'"):
        torch.compile(torch.nn.Linear(2, 2), backend="tpu", options={"devcie": "cpu"})(
            torch.randn(1, 2)
        )

    def fn(x):
        return torch.ops.tpu_inductor_quiet.enigma(x) + 1

    with pytest.raises(tpu_inductor.UnsupportedOpError) as e:
        compiled(fn, fallback="error")(torch.randn(2, 3))
    assert len(e.value.missing) == 1


@torch.library.custom_op("tpu_inductor_quiet::enigma", mutates_args=())
def _enigma(x: torch.Tensor) -> torch.Tensor:
    return x.clone()


@_enigma.register_fake
def _(x):
    return torch.empty_like(x)

"""docs/planning.md's sample TPU report is what ``examples/compile_for_tpu.py --readme-sample``
prints: the same lines, the same words, every figure within 2% (compile seconds and the libtpu
version aside). When it drifts, regenerate it:
``JAX_PLATFORMS=cpu python examples/compile_for_tpu.py --readme-sample`` and paste the report
into docs/planning.md's block under "Compiling for a TPU you don't have"."""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def readme_sample() -> str:
    """The docs/planning.md block that starts with the report's header line."""
    text = (ROOT / "docs" / "planning.md").read_text()
    blocks = re.findall(r"```\n(tpu-inductor TPU report:.*?)```", text, re.S)
    assert len(blocks) == 1, "docs/planning.md must hold exactly one sample TPU report"
    return blocks[0]


def _normal(line: str) -> tuple[str, list[float]]:
    line = re.sub(r"graph\d+-", "graph-", line)
    line = re.sub(r"libtpu \S+", "libtpu", line)
    if re.match(r"\s+graph-\S+#\d+ ", line):  # a program row: drop its compile seconds
        line = line.rsplit(" ", 1)[0]
    numbers = [float(n.replace(",", "")) for n in _NUMBER.findall(line)]
    return _NUMBER.sub("#", line).split(), numbers


def differences(expected: str, actual: str, rel: float = 0.02) -> list[str]:
    """Lines of ``actual`` whose words or figures differ from ``expected``'s."""
    want = [line for line in expected.strip().splitlines() if line.strip()]
    got = [line for line in actual.strip().splitlines() if line.strip()]
    if len(want) != len(got):
        return [f"{len(got)} lines, docs/planning.md has {len(want)}"]
    bad = []
    for w, g in zip(want, got, strict=True):
        (w_words, w_nums), (g_words, g_nums) = _normal(w), _normal(g)
        close = len(w_nums) == len(g_nums) and all(
            abs(a - b) <= rel * max(abs(a), abs(b)) + 0.051
            for a, b in zip(w_nums, g_nums, strict=True)
        )
        if w_words != g_words or not close:
            bad.append(f"docs: {w.strip()}\n   now: {g.strip()}")
    return bad


def test_readme_sample_matches_what_the_example_prints():
    """In a process of its own, as a user runs it. (In this test process, after other tests'
    compiles, the step's resident bytes once came out 17.6 instead of 25.6 MiB: the report named
    tensors by ``id``, which CPython reuses; now ``programs.tensor_key``, tests/test_targets.py.)"""
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples/compile_for_tpu.py"), "--readme-sample"],
        cwd=ROOT, env=env, capture_output=True, text=True, check=True, timeout=600,
    )  # fmt: skip
    bad = differences(readme_sample(), out.stdout)
    assert not bad, "docs/planning.md sample drifted (see the module docstring):\n" + "\n".join(bad)


def test_the_drift_check_can_fail():
    sample = readme_sample()
    changed = sample.replace("MFU ceiling", "MFU ceiling 1", 1)
    assert differences(sample, sample) == []
    assert differences(sample, changed)
    row = next(line for line in sample.splitlines() if "-backward#0 " in line)
    bumped = re.sub(  # a figure 10x off
        r"([\d.]+) MiB", lambda m: f"{float(m.group(1)) * 10:.1f} MiB", row, count=1
    )
    assert bumped != row
    assert differences(sample, sample.replace(row, bumped))
    assert differences(sample, sample + "\nextra line")

"""The README's demo command runs, matches eager, and prints the comparison it measured."""

from __future__ import annotations

import re
import subprocess
import sys


def test_demo_prints_its_measured_comparison():
    cmd = [sys.executable, "-m", "tpu_inductor.demo", "--batch", "2", "--seq", "16"]
    run = subprocess.run(cmd + ["--iters", "5"], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    out = run.stdout
    assert "MATCH" in out and "MISMATCH" not in out
    line = next(line for line in out.splitlines() if "steady state" in line)
    compiled, eager, ratio, verdict = re.search(
        r"([\d.]+) ms/call compiled, ([\d.]+) ms/call torch eager .* compiled is ([\d.]+)x "
        r"(faster|slower)",
        line,
    ).groups()
    measured = float(eager) / float(compiled)
    shown = float(ratio) if verdict == "faster" else 1 / float(ratio)
    assert abs(shown - measured) / measured < 0.02, line  # the ratio is of the printed times
    assert "eager in a process of its own" in out
    from tpu_inductor.demo import LABELS

    printed = [m.group(1).strip() for m in re.finditer(r"^  ([^:\n]+?)\s*:", out, re.M)]
    assert printed == list(LABELS), printed
    timing = next(line for line in out.splitlines() if line.strip().startswith("timing"))
    assert "UNRELIABLE" in timing or "steady" in timing, timing


def test_verdict_says_when_load_makes_it_unreliable():
    from tpu_inductor.demo import reliability

    assert reliability(0.5, 2, [0.05, 0.1]) is None
    busy = reliability(3.7, 2, [0.05, 0.1])  # the load at which the verdict flipped (issue 29)
    assert busy.startswith("UNRELIABLE") and "load 3.7 on 2 CPUs" in busy
    noisy = reliability(0.5, 8, [0.4, 0.0])
    assert "UNRELIABLE" in noisy and "40% slower" in noisy
    assert reliability(float("nan"), 2, [0.0]) is None  # no load average (Windows)

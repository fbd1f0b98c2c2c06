"""Rewrite the README's demo sample from a fresh run of ``python -m tpu_inductor.demo``:
``python scripts/update_readme_demo.py``.

The sample sits between ``<!-- demo:start -->`` and ``<!-- demo:end -->`` and names the command,
the machine's CPUs and load, and the date. When the demo itself calls its timing unreliable (a
loaded machine), the sample leaves out the faster/slower verdict, which a reader could not
reproduce. tests/test_readme.py fails when the sample's lines and the demo's drift apart (the
numbers are the machine's, the lines are the demo's).
"""

from __future__ import annotations

import datetime
import os
import pathlib
import re
import subprocess
import sys

README = pathlib.Path(__file__).resolve().parent.parent / "README.md"
START, END = "<!-- demo:start -->", "<!-- demo:end -->"
_SAMPLE = re.compile(r"```\n(tpu-inductor demo:.*?)```\n", re.S)
_VERDICT = re.compile(r" -> compiled is [\d.]+x (faster|slower)")


def readme_sample(text: str) -> str:
    """The demo output printed in the README's demo block."""
    if START not in text or END not in text:
        raise ValueError(f"README.md: no {START} ... {END} block")
    m = _SAMPLE.search(text.split(START, 1)[1].split(END, 1)[0])
    if m is None:
        raise ValueError("README.md: the demo block has no ``` block starting 'tpu-inductor demo:'")
    return m.group(1)


def labels(sample: str) -> list[str]:
    """The label of each ``  label : value`` line of a demo output, in order."""
    return [m.group(1).strip() for m in re.finditer(r"^  ([^:\n]+?)\s*:", sample, re.M)]


def sample_of(out: str) -> str:
    """The demo's output as the README shows it: without the verdict when the demo says its
    timing is unreliable."""
    out = out[out.index("tpu-inductor demo:") :]
    if re.search(r"^  timing\s*: UNRELIABLE", out, re.M):
        out = _VERDICT.sub(" -> no verdict (see timing)", out)
    return out


def block(out: str, when: str, load: float, cpus: int) -> str:
    """The README's demo block for one run's output."""
    return (
        f"{START}\n"
        f"`python -m tpu_inductor.demo` on {cpus} CPUs at load {load:.1f}, {when} (written by\n"
        f"`python scripts/update_readme_demo.py`):\n\n```\n{sample_of(out)}```\n{END}"
    )


def main() -> int:
    """Run the demo and rewrite the README's block."""
    run = subprocess.run(
        [sys.executable, "-m", "tpu_inductor.demo"], capture_output=True, text=True, check=True
    )
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    new = block(run.stdout, when, os.getloadavg()[0], os.cpu_count() or 1)
    text = README.read_text()
    head, rest = text.split(START, 1)
    README.write_text(head + new + rest.split(END, 1)[1])
    print(new)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

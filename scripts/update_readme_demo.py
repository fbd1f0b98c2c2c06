"""Rewrite the README's demo sample output from a fresh run of ``python -m tpu_inductor.demo``:
``python scripts/update_readme_demo.py``. tests/docs/test_readme.py fails when the sample's lines
and the demo's drift apart (the numbers are the machine's, the lines are the demo's)."""

from __future__ import annotations

import datetime
import os
import pathlib
import re
import subprocess
import sys

README = pathlib.Path(__file__).resolve().parent.parent / "README.md"
_SAMPLE = re.compile(r"(## Demo\n.*?\n```\n)(tpu-inductor demo:.*?)(```\n)", re.S)
_WHEN = re.compile(r"\(`python -m tpu_inductor\.demo`,\n?\s*[^)]*?\):")


def readme_sample(text: str) -> str:
    """The demo output printed in the README's Demo section."""
    m = _SAMPLE.search(text)
    if m is None:
        raise ValueError("README.md: no demo sample (a ``` block starting 'tpu-inductor demo:')")
    return m.group(2)


def labels(sample: str) -> list[str]:
    """The label of each ``  label : value`` line of a demo output, in order."""
    return [m.group(1).strip() for m in re.finditer(r"^  ([^:\n]+?)\s*:", sample, re.M)]


def main() -> int:
    run = subprocess.run(
        [sys.executable, "-m", "tpu_inductor.demo"], capture_output=True, text=True, check=True
    )
    out = run.stdout[run.stdout.index("tpu-inductor demo:") :]
    text = README.read_text()
    text = _SAMPLE.sub(lambda m: m.group(1) + out + m.group(3), text, count=1)
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    load = os.getloadavg()[0]
    text = _WHEN.sub(f"(`python -m tpu_inductor.demo`,\n{when}, load {load:.1f}):", text, count=1)
    README.write_text(text)
    print(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

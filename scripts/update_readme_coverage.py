"""Rewrite README.md's coverage figures from the generated docs, so they can't disagree.

The block between ``<!-- coverage:start -->`` and ``<!-- coverage:end -->`` is the headline of
docs/ops.md (``scripts/gen_ops_doc.py``), the headline of docs/models.md
(``scripts/gen_models_doc.py``) and the summary of ``benchmarks/results/tpu_models.json``
(``python -m benchmarks.tpu_models``), copied as they are. ``tests/docs/test_docs.py`` fails when
the README's block differs from what this would write.

Usage: ``python scripts/update_readme_coverage.py`` (``--check`` only compares).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
START, END = "<!-- coverage:start -->", "<!-- coverage:end -->"


def _headline(path: Path, start: str) -> list[str]:
    """The bullet lines of ``path`` from the first line starting with ``start`` on."""
    lines = path.read_text().splitlines()
    out, inside = [], False
    for line in lines:
        if line.startswith(start):
            inside = True
        if inside:
            if line.startswith("- "):
                out.append(line)
            elif out and not line.strip():
                break
    return out


def tpu_summary(path: Path = ROOT / "benchmarks" / "results" / "tpu_models.json") -> str | None:
    """One line: how many suite models compiled for each target, from the sweep's results."""
    if not path.exists():
        return None
    data = json.loads(path.read_text())
    parts = []
    for target in dict.fromkeys(r["target"] for r in data["rows"]):
        rows = [
            r for r in data["rows"] if r["target"] == target and "skipped" not in r.get("error", "")
        ]
        ok = [
            r
            for r in rows
            if not r.get("error")
            and r.get("shapes_match")
            and all(p["compiled"] and p["fits"] for p in r["programs"])
        ]
        trained = [r for r in ok if r["train"]]
        parts.append(
            f"{target}: {len(ok)}/{len(rows)} models compile (training step for {len(trained)})"
        )
    meta = data["meta"]
    return (
        f"- **TPU compile** (no TPU; `{meta['command']}`, {meta['versions']}, {meta['date']}): "
        + "; ".join(parts)
        + "."
    )


def render() -> str:
    """The coverage block as it should read now."""
    lines = [START, "<!-- Written by scripts/update_readme_coverage.py; do not edit by hand. -->"]
    lines += [
        "From [docs/ops.md](docs/ops.md) (`scripts/gen_ops_doc.py`):",
        "",
        *_headline(ROOT / "docs" / "ops.md", "## Headline"),
        "",
        "From [docs/models.md](docs/models.md) (`scripts/gen_models_doc.py`):",
        "",
        *[ln for ln in _headline(ROOT / "docs" / "models.md", "- Environment") if "**" in ln],
    ]
    tpu = tpu_summary()
    if tpu:
        lines.append(tpu)
    lines.append(END)
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    text = README.read_text()
    block = re.compile(re.escape(START) + r".*?" + re.escape(END), re.DOTALL)
    if not block.search(text):
        print(f"README.md has no {START} ... {END} block", file=sys.stderr)
        return 1
    new = block.sub(lambda _: render(), text)
    if "--check" in argv:
        return 0 if new == text else 1
    README.write_text(new)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

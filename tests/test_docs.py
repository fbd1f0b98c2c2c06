"""The README's figures come from the generated docs, never copied by hand."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_readme_coverage_block_is_the_generated_docs_headlines():
    """README.md's coverage block is what scripts/update_readme_coverage.py writes from
    docs/ops.md, docs/models.md and benchmarks/results/tpu_models.json; after regenerating a
    doc, run that script."""
    script = _script("update_readme_coverage")
    readme = (ROOT / "README.md").read_text()
    block = script.render()
    assert block in readme, "README coverage is stale: python scripts/update_readme_coverage.py"
    for line in block.splitlines():
        if line.startswith("- ") and "TPU compile" not in line:
            source = "ops.md" if "OpInfo" in line or "ATen" in line else "models.md"
            assert line in (ROOT / "docs" / source).read_text()


def test_readme_real_size_plan_table_is_the_generated_one():
    """README.md's real-size planning table is benchmarks/results/plan_real_sizes.md as
    ``python -m benchmarks.plan_real_sizes`` last wrote it; after a run, paste that file in."""
    table = (ROOT / "benchmarks" / "results" / "plan_real_sizes.md").read_text().strip()
    readme = (ROOT / "README.md").read_text()
    assert table in readme, "README's real-size table is stale: paste plan_real_sizes.md in"


def test_compile_time_doc_table_is_the_generated_one():
    """docs/compile-time.md's figures are benchmarks/results/first_step.md as
    ``python -m benchmarks.first_step --docs`` last wrote them."""
    table = (ROOT / "benchmarks" / "results" / "first_step.md").read_text()
    docs = (ROOT / "docs" / "compile-time.md").read_text()
    assert f"<!-- first_step:start -->\n{table}<!-- first_step:end -->" in docs, (
        "docs/compile-time.md is stale: python -m benchmarks.first_step --docs"
    )

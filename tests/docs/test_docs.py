"""The README's figures come from the generated docs, never copied by hand."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


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


def test_planning_doc_tables_are_the_generated_ones():
    """docs/planning.md's real-size table is benchmarks/results/plan_real_sizes.md as
    ``python -m benchmarks.plan_real_sizes --results benchmarks/results --docs`` last wrote
    it, and its published-runs block is that run's comparison."""
    from benchmarks import plan_real_sizes as prs

    table = (ROOT / "benchmarks" / "results" / "plan_real_sizes.md").read_text()
    docs = (ROOT / "docs" / "planning.md").read_text()
    stale = "docs/planning.md is stale: python -m benchmarks.plan_real_sizes ... --docs"
    assert f"<!-- plan_real_sizes:start -->\n{table}<!-- plan_real_sizes:end -->" in docs, stale
    records = json.loads((ROOT / "benchmarks" / "results" / "plan_real_sizes.json").read_text())
    published = prs.published_table(records["results"])
    assert f"<!-- published:start -->\n{published}\n<!-- published:end -->" in docs, stale
    assert published.count("\n") >= 2, "no row has a published measured run beside it"


def test_compile_time_doc_table_is_the_generated_one():
    """docs/compile-time.md's figures are benchmarks/results/first_step.md as
    ``python -m benchmarks.first_step --docs`` last wrote them."""
    table = (ROOT / "benchmarks" / "results" / "first_step.md").read_text()
    docs = (ROOT / "docs" / "compile-time.md").read_text()
    assert f"<!-- first_step:start -->\n{table}<!-- first_step:end -->" in docs, (
        "docs/compile-time.md is stale: python -m benchmarks.first_step --docs"
    )

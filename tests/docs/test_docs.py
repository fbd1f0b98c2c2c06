"""The README's figures come from the generated docs, never copied by hand."""

from __future__ import annotations

import importlib.util
import json
import pathlib
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


def test_performance_doc_blocks_are_the_generated_ones():
    """docs/performance.md's figures and docs/training.md's bytes per step are what
    ``python -m benchmarks.docs`` writes from the committed results in benchmarks/results/*.json;
    after updating a results file, run it."""
    from benchmarks import docs

    page = docs.PAGE.read_text()
    for block in docs.blocks():
        name = block.split("\n", 1)[0]
        assert block in page, f"docs/performance.md's {name} is stale: python -m benchmarks.docs"
    training = docs.TRAINING.read_text()
    stale = "docs/training.md's bytes per step are stale: python -m benchmarks.docs"
    assert docs.training_loop_block() in training, stale
    planning = docs.PLANNING.read_text()
    blocks = docs.planning_blocks()
    assert len(blocks) == 2, "benchmarks/results/serving.json lacks its decode table or plans"
    for block in blocks:
        name = block.split("\n", 1)[0]
        assert block in planning, f"docs/planning.md's {name} is stale: python -m benchmarks.docs"


def test_planning_doc_lists_every_real_size_row():
    """docs/planning.md names every ``plan_real_sizes --rows`` ID, and only those."""
    import re

    from benchmarks import plan_real_sizes as prs

    docs = (ROOT / "docs" / "planning.md").read_text()
    section = docs.split("## The rows of the real-size table", 1)[1].split("\n## ", 1)[0]
    listed = re.findall(r"^\| `([\w.-]+)` \|", section, re.M)
    assert listed == list(prs.ROWS), listed


_PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# Outputs a command writes, by argparse destination; a default of None is derived from --results.
_OUTPUT_DESTS = {"results", "out_dir", "out", "json", "md"}
# Regenerates the docs from the committed results: on a clean checkout it changes nothing
# (test_performance_doc_blocks_are_the_generated_ones).
_WRITES_DOCS = {"docs"}


class _Parsed(Exception):
    def __init__(self, parser):
        self.parser = parser


def _documented_benchmarks() -> list[str]:
    import re

    names = set()
    for page in _PAGES:
        names |= set(re.findall(r"python -m benchmarks\.(\w+)", page.read_text()))
    return sorted(names - _WRITES_DOCS)


def test_documented_benchmarks_write_under_results_local(monkeypatch):
    """Every ``python -m benchmarks.X`` a page names writes, by default, only under the
    git-ignored benchmarks/results/local/ (``--results benchmarks/results`` updates the
    committed figures), so trying a documented command never rewrites a tracked file. Read from
    each command's argparse defaults; nothing runs."""
    import argparse
    import importlib
    import inspect
    import re

    from benchmarks import paths

    def stop(self, *args, **kwargs):
        raise _Parsed(self)

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", stop)
    monkeypatch.setattr(argparse.ArgumentParser, "parse_known_args", stop)
    writes = re.compile(r"write_text\(|write_record\(|savefig\(|open\([^)]*[\"']w")
    bad = []
    for name in _documented_benchmarks():
        module = importlib.import_module(f"benchmarks.{name}")
        source = inspect.getsource(module)
        if "ArgumentParser" not in source:
            if writes.search(source):
                bad.append(f"benchmarks.{name} writes files but takes no --results")
            continue
        params = inspect.signature(module.main).parameters
        try:
            module.main([]) if params else module.main()
        except _Parsed as parsed:
            outputs = [a for a in parsed.parser._actions if a.dest in _OUTPUT_DESTS]
        else:
            raise AssertionError(f"benchmarks.{name}.main() returned before parsing arguments")
        if not outputs and writes.search(source):
            bad.append(f"benchmarks.{name} writes files but has no --results option")
        for action in outputs:
            if action.default is None:
                continue
            where = pathlib.Path(action.default).resolve()
            if not where.is_relative_to(paths.LOCAL):
                bad.append(f"benchmarks.{name} --{action.dest}: {action.default}")
    assert not bad, "documented commands that write outside benchmarks/results/local:\n" + (
        "\n".join(bad)
    )


def test_prose_has_no_commit_hashes_dates_or_machine_paths():
    """History belongs in commit messages: README.md and docs/*.md prose names no commit, no
    date and no path of the machine it was written on. A generated block
    (``<!-- NAME:start -->`` ... ``<!-- NAME:end -->``) names its command and date."""
    import re

    generated = re.compile(r"<!-- ([\w-]+):start -->.*?<!-- \1:end -->", re.S)
    checks = {
        "a date": re.compile(r"\b20\d\d-\d\d-\d\d"),
        "a machine path": re.compile(r"/work/|/home/\w"),
        "a commit hash": re.compile(r"\b(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\b"),
    }
    bad = []
    for page in _PAGES:
        if page.name in {"ops.md", "models.md", "dynamic.md"}:  # generated whole by scripts
            continue
        text = generated.sub("", page.read_text())
        for what, pattern in checks.items():
            for m in pattern.finditer(text):
                line = text[: m.start()].count("\n") + 1
                bad.append(f"{page.name}:{line}: {what} ({m.group(0)})")
    assert not bad, "\n".join(bad)


def _anchors(text: str) -> set[str]:
    """GitHub's anchors for a page's headings."""
    import re

    found = set()
    for m in re.finditer(r"^#+ (.*)$", text, re.M):
        found.add(re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-"))
    return found


def test_links_between_pages_resolve():
    """Every relative link of README.md and docs/*.md names a file that exists and, with
    ``#anchor``, a heading of that page, so moving a section can't leave a dead link."""
    import re

    bad = []
    for page in _PAGES:
        text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
        for link in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"\w+://", link):
                continue
            path, _, anchor = link.partition("#")
            target = (page.parent / path).resolve() if path else page
            if not target.exists():
                bad.append(f"{page.name}: {link} (no such file)")
                continue
            if anchor and target.suffix == ".md" and anchor not in _anchors(target.read_text()):
                bad.append(f"{page.name}: {link} (no such heading)")
    assert not bad, "\n".join(bad)

"""The repository's import graph: ``python scripts/import_graph.py [--edges]``.

Reads every ``.py`` file under tpu_inductor/, benchmarks/, tests/, scripts/ and examples/ as text
(nothing is imported), collects each ``import`` of a module of the repository, at the top of a file
or inside a function alike (a lazy import is still a dependency), and prints the import circles
(strongly connected components of more than one module), the imports that run uphill between
tpu_inductor's stages (``STAGES``) and the source files over 800 lines. tests/package/test_layout.py
asserts all three lists are empty.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = ("tpu_inductor", "benchmarks", "tests", "scripts", "examples")
MAX_LINES = 800
# tpu_inductor's stages, bottom to top: a module imports only its own stage and those below.
# Modules at the package's root (the public API, demo, testing, debug, transformers) are on top.
STAGES = ("core", "lowering", "capture", "runtime", "tpu", "dynamo", "training")


def modules() -> dict[str, Path]:
    """Dotted module name -> file, for every Python file of the repository's folders."""
    found = {}
    for folder in FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = path
    return found


def _resolve(name: str, mods: dict[str, Path]) -> str | None:
    """The longest prefix of ``name`` that is a module of the repository."""
    while name:
        if name in mods:
            return name
        name = name.rpartition(".")[0]
    return None


def edges() -> dict[str, set[str]]:
    """Module -> the repository modules it imports (anywhere in the file)."""
    mods = modules()
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")
                    up = up[: len(up) - node.level + 1]
                    base = ".".join(up + ([base] if base else []))
                # `from pkg import name`: the submodule pkg.name where it is one, else pkg itself
                names = [
                    f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names
                ]
            for name in names:
                target = _resolve(name, mods)
                if target and target != mod:
                    graph[mod].add(target)
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    sys.setrecursionlimit(10_000)

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def stage(mod: str) -> int:
    """The stage's height (0 = core); the package's root modules are above every stage."""
    parts = mod.split(".")
    if len(parts) > 1 and parts[1] in STAGES:
        return STAGES.index(parts[1])
    return len(STAGES)


def uphill(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """Imports from a tpu_inductor stage to a stage above it."""
    return sorted(
        (a, b)
        for a, deps in graph.items()
        if a.startswith("tpu_inductor.")
        for b in deps
        if b.startswith("tpu_inductor") and stage(b) > stage(a)
    )


def long_files() -> list[tuple[str, int]]:
    """Source files over MAX_LINES lines."""
    rows = []
    for path in modules().values():
        n = len(path.read_text().splitlines())
        if n > MAX_LINES:
            rows.append((str(path.relative_to(ROOT)), n))
    return sorted(rows)


def main() -> None:
    graph = edges()
    if "--edges" in sys.argv:
        for mod in sorted(graph):
            if mod.startswith("tpu_inductor"):
                print(mod, "->", ", ".join(sorted(graph[mod])))
    found = circles(graph)
    print(f"{len(found)} import circle(s)")
    for comp in found:
        print("  " + " <-> ".join(comp))
    up = uphill(graph)
    print(f"{len(up)} import(s) uphill")
    for a, b in up:
        print(f"  {a} -> {b}")
    files = long_files()
    print(f"{len(files)} file(s) over {MAX_LINES} lines")
    for name, n in files:
        print(f"  {name}: {n}")


if __name__ == "__main__":
    main()

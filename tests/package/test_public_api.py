"""The public API: ``tpu_inductor.__all__`` is a declared list of what users call, and every
error or warning class the package defines is importable from ``tpu_inductor.errors``."""

from __future__ import annotations

import ast
import pathlib

import tpu_inductor
import tpu_inductor.errors

PACKAGE = pathlib.Path(tpu_inductor.__file__).parent

# Change this list only together with the docs that show the names.
PUBLIC = set(
    """
    compile_step keep_on_device DeviceTensor warmup reset report
    config list_options
    register_lowering registered_lowering unregister_lowering pallas_interpret
    Target tpu_target tpu_report largest_batch serving_plan
    debug errors testing
    """.split()
)

# Exceptions that never leave the package: each is caught where it is raised.
INTERNAL = {
    "BadEntry",  # runtime/program_store.load: a saved entry it skips, saying why
    "StepSplit",  # compile_step: run the step as several programs
}


def _defined_exception_classes() -> dict[str, str]:
    """Every class in the package whose bases make it an exception or a warning (by name,
    following subclasses across files), with where it is defined."""
    classes: dict[str, tuple[list[str], str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                bases = [ast.unparse(b).rpartition(".")[2] for b in node.bases]
                classes[node.name] = (bases, f"{path.relative_to(PACKAGE)}:{node.lineno}")
    found: dict[str, str] = {}
    changed = True
    while changed:
        changed = False
        for name, (bases, where) in classes.items():
            if name in found:
                continue
            if any(b.endswith(("Error", "Exception", "Warning")) or b in found for b in bases):
                found[name] = where
                changed = True
    return found


def test_all_is_the_declared_list():
    errors = set(tpu_inductor.errors.__all__)
    assert set(tpu_inductor.__all__) == PUBLIC | errors
    assert len(tpu_inductor.__all__) == len(set(tpu_inductor.__all__))
    for name in tpu_inductor.__all__:
        assert getattr(tpu_inductor, name) is not None, name


def test_every_error_class_is_in_the_errors_namespace():
    defined = _defined_exception_classes()
    assert "TransferError" in defined and "PaddingWarning" in defined  # the scan sees them
    public = {n for n in defined if not n.startswith("_")} - INTERNAL
    missing = {n: defined[n] for n in public if n not in tpu_inductor.errors.__all__}
    assert not missing, f"define these in core/errors.py and export them: {missing}"
    for name in tpu_inductor.errors.__all__:
        cls = getattr(tpu_inductor.errors, name)
        assert issubclass(cls, Exception), name
        assert getattr(tpu_inductor, name) is cls, name


def test_backend_functions_stay_importable_outside_all():
    # torch's entry point names tpu_inductor:tpu_backend; tests read tpu_inductor.cache.STATS
    for name in ("tpu_backend", "tpu_inductor_backend", "cache", "transformers"):
        assert hasattr(tpu_inductor, name) and name not in tpu_inductor.__all__, name

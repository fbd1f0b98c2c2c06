"""``cache_dir`` across processes (runtime/program_store.py): a restart reuses the programs a
previous process compiled, without AOTAutograd, lowering or XLA (its persistent cache answers),
with the same losses to the bit; saved files that can't be trusted are set aside with one
warning and compiled again; two processes can share the folder; nothing loaded from it is a
pickle. Each run is a new process (tests/runtime/warm_start_case.py)."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

pytest.importorskip("transformers")

ROOT = pathlib.Path(__file__).resolve().parents[2]
CASE = pathlib.Path(__file__).parent / "warm_start_case.py"
WARNING = "tpu-inductor: ignoring the saved program "


def _start(path: str, cache_dir, *flags: str, pythonpath=ROOT) -> subprocess.Popen:
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(pythonpath)}
    return subprocess.Popen(
        [sys.executable, str(CASE), path, str(cache_dir), *flags],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _result(proc: subprocess.Popen) -> tuple[dict, str]:
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-4000:] + "\nSTDOUT: " + out[-300:]
    line = next(x for x in out.splitlines() if x.startswith("RESULT "))
    return json.loads(line.removeprefix("RESULT ")), err


def _run(path: str, cache_dir, *flags: str, pythonpath=ROOT) -> tuple[dict, str]:
    return _result(_start(path, cache_dir, *flags, pythonpath=pythonpath))


def _manifests(cache_dir) -> list[pathlib.Path]:
    return sorted((pathlib.Path(cache_dir) / "tpu_inductor" / "programs").glob("*.json"))


@pytest.mark.parametrize(
    "path, flags, graphs",
    [("step", ("--scan",), 1), ("split", (), 2), ("infer", (), 1)],
    ids=["compile_step-scan_layers", "compiled-model-and-step", "inference"],
)
def test_a_restart_skips_aot_lowering_and_xla_with_the_same_losses(tmp_path, path, flags, graphs):
    cold, _ = _run(path, tmp_path, *flags)
    warm, err = _run(path, tmp_path, *flags)
    assert cold["loaded"] == 0 and warm["loaded"] == graphs, (cold, warm)
    assert warm["losses"] == cold["losses"]  # the same programs: the same bits
    assert warm["stages"]["aot"] == 0 and cold["stages"]["aot"] > 0
    assert warm["cache_hits"] >= graphs > cold["cache_hits"] == 0  # XLA's persistent cache
    assert WARNING not in err
    # what the warm process read of the folder: JSON manifests, exports, XLA's cache; no pickle
    assert warm["unpickled"] == [], warm["unpickled"]
    ours = [f for f in warm["opened"] if f.startswith("tpu_inductor")]
    assert ours and all(f.endswith((".json", ".jaxexport")) for f in ours), warm["opened"]


def _tamper_manifest(cache_dir, change) -> None:
    (path,) = _manifests(cache_dir)
    manifest = json.loads(path.read_text())
    change(manifest)
    path.write_text(json.dumps(manifest))


def _truncate_blob(cache_dir) -> None:
    blob = next((pathlib.Path(cache_dir) / "tpu_inductor" / "programs" / "blobs").iterdir())
    blob.write_bytes(blob.read_bytes()[:100])


def _set(part: str, **values):
    return lambda d: _tamper_manifest(d, lambda m: m["fingerprint"][part].update(values))


SPOILED = [  # (what is done to the saved files, what the warning says)
    (lambda d: _manifests(d)[0].write_text('{"format": 1, "key"'), "not readable JSON"),
    (_truncate_blob, "is truncated or changed (size or hash differs)"),
    (_set("versions", torch="1.0"), "it was saved with other versions (torch)"),
    (_set("options", scan_layers="True"), "it was saved with other options (scan_layers)"),
    (lambda d: _tamper_manifest(d, lambda m: m.update(format=0)), "of another format"),
]


def test_untrustworthy_saved_programs_are_rebuilt_with_one_warning(tmp_path):
    """Corrupt, truncated, other-version, other-option and other-format files, in turn: each
    is set aside with one warning naming why and compiled again (same losses), and the next
    process loads the program saved anew."""
    cold, _ = _run("mlp", tmp_path)
    for spoil, said in SPOILED:
        spoil(tmp_path)
        rebuilt, err = _run("mlp", tmp_path)
        warnings = [line for line in err.splitlines() if WARNING in line]
        assert len(warnings) == 1 and said in warnings[0], (said, err[-3000:])
        assert warnings[0].endswith("; compiling it again")
        assert rebuilt["loaded"] == 0 and rebuilt["losses"] == cold["losses"]
    again, err = _run("mlp", tmp_path)
    assert again["loaded"] == 1 and WARNING not in err


def test_two_processes_share_a_cache_folder(tmp_path):
    both = [_start("mlp", tmp_path), _start("mlp", tmp_path)]
    results = [_result(p)[0] for p in both]
    assert results[0]["losses"] == results[1]["losses"]
    warm, err = _run("mlp", tmp_path)
    assert warm["loaded"] == 1 and warm["losses"] == results[0]["losses"]
    assert WARNING not in err


def test_a_changed_lowering_invalidates_saved_programs(tmp_path):
    """The key holds a hash of the package's sources: a lowering edited (here, a comment added
    to the pointwise table) compiles anew instead of reusing programs built by the old one."""
    cold, _ = _run("mlp", tmp_path / "cache")
    copy = tmp_path / "src"
    shutil.copytree(ROOT / "tpu_inductor", copy / "tpu_inductor")
    shutil.copytree(ROOT / "tests", copy / "tests")
    table = copy / "tpu_inductor" / "lowering" / "lowerings" / "pointwise.py"
    table.write_text(table.read_text() + "\n# edited\n")
    edited, err = _run("mlp", tmp_path / "cache", pythonpath=copy)
    assert edited["loaded"] == 0 and edited["losses"] == cold["losses"]
    assert WARNING not in err  # another key, not a bad entry
    assert len(_manifests(tmp_path / "cache")) == 2
    original, _ = _run("mlp", tmp_path / "cache")
    assert original["loaded"] == 1


def test_the_fingerprint_names_what_differs():
    from tpu_inductor.runtime.program_store import _difference

    now = {"package": "a", "versions": {"torch": "2.13", "jax": "0.10"}, "options": {"x": "1"}}
    assert _difference({**now, "package": "b"}, now) == "by other tpu-inductor sources"
    assert (
        _difference({**now, "versions": {"torch": "2.12", "jax": "0.10"}}, now)
        == "with other versions (torch)"
    )
    assert _difference(None, now) == "without a fingerprint"

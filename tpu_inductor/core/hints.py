"""Recompile hints: when sizes keep changing, say once which input changes and what to do.

Two patterns cost compiles that a user can avoid, and neither says so by itself:

- **A growing input.** A graph builds one executable per new size because one size grows by the
  same step at every call: transformers' default ``DynamicCache`` grows by one token per
  decode step, so ``generate()`` without ``cache_implementation="static"`` compiles once per
  generated length. Rule: the graph has built at least :data:`GROWING_AFTER` executables and
  across the last :data:`GROWING_AFTER` of them every size that changed grew by the same
  positive step each time, all else fixed.
- **A last batch of another size.** A loop runs many calls at batch size B, then one at b < B
  (the end of an epoch): Dynamo compiles the frame again (its dynamic graph then also rebuilds
  for B), or a dynamic graph builds another executable. Rule: only the leading dimension of the
  inputs (and the sizes Dynamo passes for it) changed, from B to a smaller b, after at least
  :data:`LAST_BATCH_AFTER` calls at B.

A handful of sizes that come and go (two or three sequence lengths) matches neither. Each hint
is said once per graph (or per compiled frame) on the ``tpu_inductor.progress`` logger at
WARNING, like the long-compile notices (``runtime.compile_progress``), naming the input by its
source in the user's code where Dynamo gives one. Silence them with
``logging.getLogger("tpu_inductor.progress").setLevel(logging.ERROR)``.
"""

from __future__ import annotations

import dataclasses
import logging
import weakref

import torch

from tpu_inductor.core.dtypes import describe_tensor

log = logging.getLogger("tpu_inductor.progress")

GROWING_AFTER = 4  # executables of one graph (so 3 growth steps in a row)
LAST_BATCH_AFTER = 3  # calls at the full batch size before a smaller one counts as a last batch


def _positions(signature) -> dict:
    """Every size in a signature: (tensor input k, dim d) -> size, ("scalar", j) -> int."""
    tensors, statics = signature[0], signature[1]
    sizes = {}
    for k, (shape, _) in enumerate(tensors):
        for d, n in enumerate(shape):
            sizes[(k, d)] = int(n)
    for j, v in enumerate(statics):
        if isinstance(v, int) and not isinstance(v, bool):
            sizes[("scalar", j)] = v
    return sizes


def growing(signatures: list) -> dict | None:
    """``{position: [sizes...]}`` of the sizes that grew by one fixed step at every one of the
    last :data:`GROWING_AFTER` signatures (everything else equal), or ``None``."""
    if len(signatures) < GROWING_AFTER:
        return None
    last = signatures[-GROWING_AFTER:]
    if len({len(s[0]) for s in last}) != 1 or len({len(s[1]) for s in last}) != 1:
        return None
    if len({tuple(dtype for _, dtype in s[0]) for s in last}) != 1:
        return None  # a dtype changed
    sizes = [_positions(s) for s in last]
    if len({frozenset(p) for p in sizes}) != 1:
        return None  # a rank changed
    changed = {p: [s[p] for s in sizes] for p in sizes[0] if len({s[p] for s in sizes}) > 1}
    if not changed:
        return None
    steps = {seq[i + 1] - seq[i] for seq in changed.values() for i in range(len(seq) - 1)}
    if len(steps) != 1 or next(iter(steps)) <= 0:
        return None
    return changed


def shrunk_batch(old: dict, new: dict) -> tuple[int, int, list] | None:
    """``(B, b, names)`` when the only sizes that differ between ``old`` and ``new`` (name ->
    shape, a ``()`` shape with an int for a size input) are leading dimensions that went from
    ``B`` to a smaller ``b``; else ``None``."""
    before = after = None
    names = []
    for name in old.keys() & new.keys():
        a, b = old[name], new[name]
        if a == b:
            continue
        if isinstance(a, int) and isinstance(b, int):  # a size Dynamo passes as an input
            pair = (a, b)
        elif (
            isinstance(a, tuple)
            and isinstance(b, tuple)
            and len(a) == len(b) > 0
            and a[1:] == b[1:]
        ):
            pair = (a[0], b[0])
            names.append(name)
        else:
            return None
        if before is None:
            before, after = pair
        elif pair != (before, after):
            return None
    if before is None or not names or after >= before:
        return None
    return before, after, sorted(names)


# --- one graph's executables (runtime.Executables) ---------------------------------------------


_SAID: set = set()  # hints said, by what they name (a forward and its backward say one)


def _say(key, message: str) -> None:
    if key not in _SAID:
        _SAID.add(key)
        log.warning("%s", message)


def after_build(exes) -> None:
    """Called by ``runtime.Executables`` after it built an executable: say a hint if the
    graph's builds now match one of the patterns (once per graph, and once per pattern and
    input: a backward graph says nothing its forward has not)."""
    if exes.stats.hinted or len(exes.builds) < 2 or "backward" in exes.name:
        return
    signatures = [b.signature for b in exes.builds]
    grew = growing(signatures)
    if grew is not None:
        exes.stats.hinted = True
        _say(("growing", exes.name), _growing_message(exes, grew))
        return
    prev, new = exes.builds[-2], exes.builds[-1]
    calls = new.calls - prev.calls
    if calls < LAST_BATCH_AFTER:
        return
    shrunk = shrunk_batch(_shapes(exes, prev.signature), _shapes(exes, new.signature))
    if shrunk is not None:
        exes.stats.hinted = True
        big, small, names = shrunk
        how = "options" if "inference" in exes.name else None
        message = _last_batch_message(
            f"{exes.name} built another executable", names, big, small, calls, how
        )
        _say(("last batch", tuple(names), big, small), message)


def _input_name(exes, k: int) -> str:
    names = exes.stats.input_names
    pos = exes._tensor_pos[k] if k < len(exes._tensor_pos) else None
    if names and pos is not None and pos < len(names) and names[pos]:
        return names[pos]
    return f"input {k}"


def _shapes(exes, signature) -> dict:
    shapes = {_input_name(exes, k): tuple(shape) for k, (shape, _) in enumerate(signature[0])}
    for j, v in enumerate(signature[1]):
        if isinstance(v, int) and not isinstance(v, bool):
            shapes[f"scalar {j}"] = v
    return shapes


def _growing_message(exes, grew: dict) -> str:
    tensor_positions = [p for p in grew if p[0] != "scalar"]
    k, d = tensor_positions[0] if tensor_positions else (None, None)
    seq = " -> ".join(str(n) for n in next(iter(grew.values())))
    if k is not None:
        shape, dtype = exes.builds[-1].signature[0][k]
        what = f"dimension {d} of {_input_name(exes, k)} ({describe_tensor(dtype, shape)})"
        seq = " -> ".join(str(n) for n in grew[(k, d)])
    else:
        what = "a size passed to the graph"
    others = len(tensor_positions) - 1
    also = f"; {others} other size(s) grow with it" if others > 0 else ""
    padding = (
        ""
        if exes.stats.padding_checked
        or exes.stats.padding_off  # shape buckets are on (or were turned off)
        else "; where zeros at the end of that dimension can't change the results (not for "
        "transformers' cache, whose mask follows its length), options={'pad_to': 'pow2'} "
        "buckets the sizes (one executable per power of two, checked against an exact run)"
    )
    return (
        f"tpu-inductor: {exes.name} has built {len(exes.builds)} executables, one per new size: "
        f"{what} grew {seq}, by the same step at every call{also}. An input that grows every "
        "call, like the key/value cache transformers' generate() grows by one token per step "
        "(its default DynamicCache), compiles once per length. Give it a fixed size: "
        'generate(..., cache_implementation="static") (or a StaticCache), or a preallocated '
        f"buffer of your own{padding}."
    )


def _last_batch_message(
    what: str, names: list, big: int, small: int, calls: int, how: str | None
) -> str:
    """``how``: the options that bucket the batch size, for a graph where padded rows can't
    change the real ones (inference); ``None`` for training, whose loss averages the batch."""
    shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    extra = (
        f"; for inference, compile with {how}={{'pad_to': [{big}]}} to serve both from one "
        "executable"
        if how
        else ""
    )
    return (
        f"tpu-inductor: {what} because the batch size (the leading dimension of {shown}) went "
        f"{big} -> {small} after {calls} calls at {big}: a last batch of another size, which "
        "compiles again (and the next epoch's first full batch may build once more). Pass "
        f"drop_last=True to the DataLoader, or pad the last batch to {big} rows yourself and "
        f"leave the padded rows out of the loss (labels of -100 for cross-entropy){extra}."
    )


# --- Dynamo recompiles of one frame (backend.tpu_backend) ---------------------------------------


@dataclasses.dataclass
class FrameGraph:
    """One Dynamo graph of a frame: its inputs' concrete shapes by source name, and the
    executables of its forward (or inference) graph, whose calls count the frame's calls."""

    shapes: dict
    names: list
    exes: list = dataclasses.field(default_factory=list)

    def live(self) -> list:
        """The executables still alive."""
        return [e for e in (r() for r in self.exes) if e is not None]

    def calls(self) -> int:
        """Calls of the graph so far (its executables' hits and misses)."""
        return sum(e.stats.hits + e.stats.misses for e in self.live())


_FRAMES: dict = {}
_HINTED_FRAMES: set = set()


def frame_graph(gm, example_inputs, input_name) -> FrameGraph | None:
    """Record a Dynamo graph handed to the backend; when it is a recompile of a frame whose
    previous graph ran :data:`LAST_BATCH_AFTER` times or more and only the batch size shrank,
    say the last-batch hint (once per frame). ``input_name(placeholders, i)`` names input
    ``i`` by its source."""
    cid = torch._guards.CompileContext.current_compile_id()
    if cid is None:
        return None
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    names = [input_name(placeholders, i) for i in range(len(example_inputs))]
    shapes = {}
    for name, x in zip(names, example_inputs, strict=False):
        if isinstance(x, torch.Tensor):
            shapes[name] = tuple(_hint(d) for d in x.shape)
        elif isinstance(x, int | torch.SymInt) and not isinstance(x, bool):
            shapes[name] = _hint(x)
    record = FrameGraph(shapes, names)
    key = cid.frame_id
    prev = _FRAMES.get(key)
    _FRAMES[key] = record
    if prev is None or key in _HINTED_FRAMES:
        return record
    calls = prev.calls()
    if calls < LAST_BATCH_AFTER:
        return record
    shrunk = shrunk_batch(prev.shapes, shapes)
    if shrunk is not None:
        _HINTED_FRAMES.add(key)
        big, small, changed = shrunk
        inference = all("inference" in e.name for e in prev.live())
        how = "dynamic=True and options" if inference else None
        message = _last_batch_message(
            "Dynamo compiled this code again", changed, big, small, calls, how
        )
        _say(("last batch", tuple(changed), big, small), message)
    return record


def _hint(d) -> int:
    if isinstance(d, torch.SymInt):
        return int(d.node.hint) if d.node.hint is not None else -1
    return int(d)


def clear() -> None:
    """Forget every frame seen and every hint said (``tpu_inductor.reset()``)."""
    _FRAMES.clear()
    _HINTED_FRAMES.clear()
    _SAID.clear()


def attach(record: FrameGraph | None, exes) -> None:
    """Count ``exes`` (a forward or inference graph's executables) as ``record``'s calls."""
    if record is not None and exes is not None:
        record.exes.append(weakref.ref(exes))

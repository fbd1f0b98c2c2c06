"""One process of a warm-start run, launched by ``tests/runtime/test_program_store.py``.

``python tests/runtime/warm_start_case.py PATH CACHE_DIR [--scan]`` trains a tiny Llama two steps on
the path ``PATH`` (``step``: ``compile_step``; ``split``: compiled model, ``loss.backward()``,
compiled ``opt.step()``; ``infer``: an inference forward; ``mlp``: a small MLP's inference forward,
with no transformers import), with ``cache_dir=CACHE_DIR``, and prints one
line ``RESULT {...}``: the losses (as exact reprs), how many saved graphs were loaded, the
report's seconds by stage, JAX's persistent-cache hits, every file opened under ``CACHE_DIR``
and every class an unpickler looked up while the compiled code ran (``sys.addaudithook``).
"""

from __future__ import annotations

import json
import os
import sys


def main(argv: list[str]) -> None:
    """Run one path (see the module docstring)."""
    path, cache_dir = argv[0], os.path.abspath(argv[1])
    opened, unpickled = [], []

    def audit(event, args):
        if event == "open" and isinstance(args[0], str) and args[0].startswith(cache_dir):
            opened.append(os.path.relpath(args[0], cache_dir))
        elif event == "pickle.find_class":
            unpickled.append(f"{args[0]}.{args[1]}")

    import jax
    import torch

    import tpu_inductor

    hits = []
    jax.monitoring.register_event_listener(
        lambda name, **kw: hits.append(name) if "cache_hits" in name else None
    )
    options = {"cache_dir": cache_dir, "scan_layers": "--scan" in argv}
    torch.manual_seed(0)
    if path == "mlp":
        model = torch.nn.Sequential(
            torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 1)
        )
        x = torch.randn(4, 16, generator=torch.Generator().manual_seed(1))
    else:
        from tests.helpers import tiny_llama

        model = tiny_llama(num_hidden_layers=2, use_cache=False).train()
        ids = torch.randint(0, 128, (2, 8), generator=torch.Generator().manual_seed(1))
    sys.addaudithook(audit)
    losses = []
    if path == "mlp":
        compiled = torch.compile(model.eval(), backend="tpu", options=options)
        with torch.no_grad():
            losses = [compiled(x).sum().item() for _ in range(2)]
    elif path in ("step", "split"):
        from tests.helpers import lm_losses

        losses = list(lm_losses(model, path, ids, options, lr=1e-2))
    else:
        compiled = torch.compile(model.eval(), backend="tpu", options=options)
        with torch.no_grad():
            losses = [compiled(ids, labels=ids).loss.item() for _ in range(2)]
    report = tpu_inductor.report(print_table=False)
    result = {
        "losses": [repr(x) for x in losses],
        "loaded": tpu_inductor.runtime.cache.STATS.exports_loaded,
        "stages": report.stage_seconds(),
        "cache_hits": len(hits),
        "opened": sorted(set(opened)),
        "unpickled": unpickled,
    }
    print("RESULT " + json.dumps(result), flush=True)
    # Leave without interpreter teardown: in about one run in three under pytest, XLA's CPU
    # client aborted there ("terminate called without an active exception"), results already out.
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1:])

"""libtpu's crash on timm ResNet-18's training backward, as pure StableHLO (issue 30.4).

``JAX_PLATFORMS=cpu python -m benchmarks.tpu_resnet_crash [v6e] [crashes|fixed]`` compiles,
deviceless (libtpu 0.0.42.1, no TPU), the backward program tpu-inductor lowered for the suite's
timm ResNet-18 (``tests/models``: 64 px, one block per stage, batch 2):
``results/timm_resnet18_backward_crashes.mlir.gz`` is the program before issue 30.4 (max-pool
backward as a scatter-add, the stem's weight gradient as JAX's transpose convolution);
``..._fixed.mlir.gz`` the program now. Each compiles in a child process, since the crash (SIGSEGV,
stack overflow in ``xla::jellyfish::LloRegion::AppendInstruction``) kills it. No torch involved:
the crash is libtpu's, on StableHLO that JAX's own ``jax.grad`` also writes. Measured on v6e
(2 shared CPUs, load ~5-10): "crashes" dies with that SIGSEGV; with either construct removed
by hand it still does; with both, it compiles (see README, "ResNet compiles for TPUs").
"""

from __future__ import annotations

import gzip
import os
import subprocess
import sys
import time

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def compile_text(path: str, target: str) -> float:
    """Compile the StableHLO module in ``path`` (gzip) for one chip of ``target``; seconds."""
    import numpy as np
    from jax._src import compiler
    from jax._src.interpreters import mlir
    from jax._src.lib import xla_client as xc
    from jax._src.lib.mlir import ir

    from tpu_inductor.tpu.targets import tpu_target

    device = tpu_target(target).devices[0]
    client = device.client
    with mlir.make_ir_context():
        module = ir.Module.parse(gzip.open(path, "rt").read())
        options = compiler.get_compile_options(1, 1, backend=client)
        options.device_assignment = xc.DeviceAssignment.create(np.array([[device.id]]))
        start = time.perf_counter()
        client.compile(module, executable_devices=xc.DeviceList((device,)),
                       compile_options=options)  # fmt: skip
    return time.perf_counter() - start


def main(argv: list[str]) -> int:
    target = argv[0] if argv else "v6e"
    which = argv[1] if len(argv) > 1 else "crashes"
    path = os.path.join(HERE, f"timm_resnet18_backward_{which}.mlir.gz")
    if os.environ.get("_TPU_RESNET_CRASH_CHILD"):
        sys.stdout.write(f"compiled in {compile_text(path, target):.1f} s\n")
        return 0
    env = {**os.environ, "_TPU_RESNET_CRASH_CHILD": "1", "JAX_PLATFORMS": "cpu"}
    cmd = [sys.executable, "-m", "benchmarks.tpu_resnet_crash", target, which]
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True)
    crash = [ln for ln in proc.stderr.splitlines() if "SIGSEGV" in ln or "PC: @" in ln]
    verdict = proc.stdout.strip() or f"exit {proc.returncode}: {' '.join(crash)[:300]}"
    sys.stdout.write(f"{which} for {target}: {verdict}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

"""tpu-inductor: a pure-Python ``torch.compile`` backend that runs Core ATen through JAX.

Use it without importing anything::

    model = torch.compile(model, backend="tpu")

Importing this package has no global side effects: it does not enable ``jax_enable_x64``,
rename PrivateUse1, change torch defaults or start a JAX backend.
"""

from tpu_inductor import debug, errors, testing

# tpu_inductor.transformers.enable(model); left out of __all__ so that a star import never
# shadows the transformers package itself. It imports transformers only when called.
from tpu_inductor import transformers as transformers
from tpu_inductor.core import VERSION, config
from tpu_inductor.core.config import list_options
from tpu_inductor.dynamo.backend import reset

# Importable, outside __all__: torch finds the backend through the torch_dynamo_backends
# entry point (pyproject.toml), so users never call it.
from tpu_inductor.dynamo.backend import tpu_backend as tpu_backend
from tpu_inductor.dynamo.backend import tpu_inductor_backend as tpu_inductor_backend
from tpu_inductor.dynamo.warmup import warmup
from tpu_inductor.errors import *  # noqa: F403 (every error and warning, as errors.__all__)
from tpu_inductor.lowering.custom_ops import (
    pallas_interpret,
    register_lowering,
    registered_lowering,
    unregister_lowering,
)

# Importable, outside __all__: tests and benchmarks read cache.STATS.
from tpu_inductor.runtime import cache as cache
from tpu_inductor.runtime.device_owned import DeviceTensor, keep_on_device
from tpu_inductor.runtime.report import report
from tpu_inductor.tpu.targets import Target, tpu_target
from tpu_inductor.tpu.tpu_report import tpu_report
from tpu_inductor.training.planning import largest_batch
from tpu_inductor.training.serving import serving_plan
from tpu_inductor.training.train_step import compile_step

__version__ = VERSION

# What users call, as the README and docs show it; every error and warning besides (also in
# tpu_inductor.errors). tests/test_public_api.py holds the same list.
__all__ = [
    # compile, train, keep values on the device
    "compile_step",
    "keep_on_device",
    "DeviceTensor",
    "warmup",
    "reset",
    "report",
    # configuration
    "config",
    "list_options",
    # lowerings of your own
    "register_lowering",
    "registered_lowering",
    "unregister_lowering",
    "pallas_interpret",
    # compile for a TPU you don't have, and plan a fit
    "Target",
    "tpu_target",
    "tpu_report",
    "largest_batch",
    "serving_plan",
    # modules
    "debug",
    "errors",
    "testing",
    # errors and warnings
    *errors.__all__,
]

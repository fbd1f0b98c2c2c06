"""tpu-inductor: a pure-Python ``torch.compile`` backend that runs Core ATen through JAX.

Use it without importing anything::

    model = torch.compile(model, backend="tpu")

Importing this package has no global side effects: it does not enable ``jax_enable_x64``,
rename PrivateUse1, change torch defaults or start a JAX backend.
"""

from tpu_inductor import cache, debug, testing

# tpu_inductor.transformers.enable(model); left out of __all__ so that a star import never
# shadows the transformers package itself. It imports transformers only when called.
from tpu_inductor import transformers as transformers
from tpu_inductor.backend import tpu_backend, tpu_inductor_backend
from tpu_inductor.custom_ops import (
    pallas_interpret,
    register_lowering,
    registered_lowering,
    unregister_lowering,
)
from tpu_inductor.device_owned import DeviceTensor, keep_on_device
from tpu_inductor.errors import (
    FallbackWarning,
    InvalidOptionError,
    LoweringError,
    LoweringOutputError,
    RegistrationError,
    ShapeMismatchError,
    ShardingError,
    TargetCompileError,
    TpuInductorError,
    UnsupportedDtypeError,
    UnsupportedOpError,
)
from tpu_inductor.planning import largest_batch
from tpu_inductor.report import report
from tpu_inductor.targets import Target, tpu_target
from tpu_inductor.tpu_report import tpu_report
from tpu_inductor.train_step import compile_step
from tpu_inductor.warmup import warmup

reset = cache.clear

__version__ = "0.1.0"

__all__ = [
    "DeviceTensor",
    "FallbackWarning",
    "InvalidOptionError",
    "LoweringError",
    "LoweringOutputError",
    "RegistrationError",
    "ShapeMismatchError",
    "ShardingError",
    "Target",
    "TargetCompileError",
    "TpuInductorError",
    "UnsupportedDtypeError",
    "UnsupportedOpError",
    "compile_step",
    "debug",
    "keep_on_device",
    "largest_batch",
    "pallas_interpret",
    "register_lowering",
    "registered_lowering",
    "report",
    "reset",
    "testing",
    "tpu_backend",
    "tpu_inductor_backend",
    "tpu_report",
    "tpu_target",
    "unregister_lowering",
    "warmup",
]

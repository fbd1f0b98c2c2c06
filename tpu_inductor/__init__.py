"""tpu-inductor: a pure-Python ``torch.compile`` backend that runs Core ATen through JAX.

Use it without importing anything::

    model = torch.compile(model, backend="tpu")

Importing this package has no global side effects: it does not enable ``jax_enable_x64``,
rename PrivateUse1, change torch defaults or start a JAX backend.
"""

from tpu_inductor import debug, testing

# tpu_inductor.transformers.enable(model); left out of __all__ so that a star import never
# shadows the transformers package itself. It imports transformers only when called.
from tpu_inductor import transformers as transformers
from tpu_inductor.core import VERSION, config
from tpu_inductor.core.config import list_options
from tpu_inductor.core.errors import (
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
from tpu_inductor.dynamo.backend import reset, tpu_backend, tpu_inductor_backend
from tpu_inductor.dynamo.warmup import warmup
from tpu_inductor.lowering.custom_ops import (
    pallas_interpret,
    register_lowering,
    registered_lowering,
    unregister_lowering,
)
from tpu_inductor.runtime import cache as cache
from tpu_inductor.runtime.device_owned import DeviceTensor, keep_on_device
from tpu_inductor.runtime.report import report
from tpu_inductor.tpu.targets import Target, tpu_target
from tpu_inductor.tpu.tpu_report import tpu_report
from tpu_inductor.training.planning import largest_batch
from tpu_inductor.training.train_step import compile_step

__version__ = VERSION

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
    "config",
    "debug",
    "keep_on_device",
    "largest_batch",
    "list_options",
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

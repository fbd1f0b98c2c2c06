"""The ATen -> JAX lowering table, one module per op family.

Import it as ``tpu_inductor.lowering.lowerings`` (never as a top-level ``lowerings``).
"""

from tpu_inductor.lowering.lowerings import (  # noqa: F401  (each module registers its family)
    attention,
    convolution,
    creation,
    factorizations,
    fft,
    flex_attention,
    grouped,
    indexing,
    linalg,
    nn,
    pointwise,
    random,
    reductions,
    sampling,
    sorting,
    special,
    subgraphs,
    views,
    wrappers,
)
from tpu_inductor.lowering.lowerings.registry import LOWERINGS, LoweringContext, lowers

__all__ = ["LOWERINGS", "LoweringContext", "lowers"]

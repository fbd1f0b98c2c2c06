"""Shape buckets (``options={"pad_to": ...}``): pad dynamic sizes up, slice outputs back.

With ``pad_to="pow2"`` (or a list of sizes), every symbolic size of a dynamic graph is rounded
up to its bucket, the inputs are zero-padded at the end of those dimensions, the executable for
the bucket runs, and each output is sliced back to the size torch would give for the real
inputs. A range of sequence lengths then shares a few executables.

Padding is only valid when padded positions cannot change the real ones, e.g. the end of the
sequence of a causal decoder (nothing attends forward) or the batch dimension of a model without
cross-batch ops. It is invalid for reductions over a padded dimension (a mean over the sequence,
BatchNorm in training, a loss averaged over the batch), for non-causal attention without a
mask, and so on. So the first use of each bucket is checked: the padded result is compared with
the same graph run at the exact shape in torch on the CPU; on a mismatch the graph warns once
and uses exact shapes from then on.
"""

from __future__ import annotations

import bisect
import warnings
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import torch

from tpu_inductor.core.dtypes import tolerance
from tpu_inductor.core.errors import PaddingWarning, raise_failed_assert
from tpu_inductor.core.shapes import bind, concrete, concrete_shape
from tpu_inductor.runtime.call import draw_seed
from tpu_inductor.runtime.signatures import python_scalar


def bucket(n: int, spec) -> int:
    """The bucket for size ``n``: the next power of two, or the smallest listed size >= n
    (``n`` itself when it is larger than every listed size)."""
    if spec == "pow2":
        return 1 if n <= 1 else 1 << (n - 1).bit_length()
    i = bisect.bisect_left(spec, n)
    return spec[i] if i < len(spec) else n


def padded_bindings(bindings: dict, spec) -> dict:
    """Each size symbol's value rounded up to its bucket."""
    return {s: bucket(v, spec) if isinstance(v, int) else v for s, v in bindings.items()}


def pad_array(x, meta, bindings: dict):
    """Zero-pad ``x`` at the end of each dimension to the shape ``meta`` has under
    ``bindings``."""
    target = concrete_shape(meta.shape, bindings)
    if tuple(x.shape) == target:
        return x
    return jnp.pad(x, [(0, t - n) for n, t in zip(x.shape, target, strict=True)])


def slice_output(y, meta, bindings: dict):
    """Slice a padded output back to the shape ``meta`` has under the real ``bindings``."""
    if not isinstance(meta, torch.Tensor):
        return concrete(meta, bindings)
    target = concrete_shape(meta.shape, bindings)
    if tuple(y.shape) == target:
        return y
    return y[tuple(slice(0, t) for t in target)]


def results_match(padded: Sequence, exact: Sequence) -> bool:
    """Whether the padded run's outputs equal the exact run's within dtype tolerance."""
    for a, e in zip(padded, exact, strict=True):
        if not isinstance(e, torch.Tensor):
            if a != e:
                return False
            continue
        if a.shape != e.shape or a.dtype != e.dtype:
            return False
        atol, rtol = tolerance(e.dtype)
        if not torch.allclose(a, e, atol=max(atol, 1e-5), rtol=max(rtol, 1e-4), equal_nan=True):
            return False
    return True


def warn_padding_changed_results(name: str, signature) -> None:
    """Warn once per graph that padding is off for it from now on."""
    warnings.warn(
        PaddingWarning(
            f"{name}: padding to shape buckets changed this graph's results (at {signature}); "
            "it runs at exact shapes from now on. Padding is only safe where padded positions "
            "can't affect real ones (e.g. the sequence end of a causal decoder)."
        ),
        stacklevel=3,
    )


def can_pad(compiled) -> bool:
    """Whether shape buckets apply to a compiled graph: dynamic, not a backward, with no saved
    activations, no inputs updated in place (their shapes must stay the real ones) and no scalar
    read from the sizes (``torch.tensor(x.shape[0]).item()`` must read the real size, not the
    bucket). A backward reads the forward's saved activations, which live on the device: the
    exact-shape check, run in torch, would read their host placeholders and hand back wrong
    gradients (tests/runtime/test_dynamic.py)."""
    low = compiled.lowered
    return (
        low.dynamic
        and not compiled._backward
        and not compiled._saved
        and not low.mutations
        and not low.host_sizes
        and not low.view_outputs
    )


class PaddedGraph:
    """A :class:`~tpu_inductor.runtime.call.CompiledGraph` called at its inputs' shape buckets.

    Each call pads the inputs up to their buckets, runs the bucket's executable, and slices the
    outputs back; the first call of each bucket is compared with the exact graph run in torch
    (see the module docstring). The runtime knows nothing of it: the backend wraps the graphs
    ``pad_to`` applies to.
    """

    def __init__(self, compiled, pad_to, gm: torch.fx.GraphModule):
        self._boxed_call = True  # an instance attribute, like CompiledGraph's
        self.compiled = compiled
        self.lowered = compiled.lowered
        self.pad_to = pad_to
        self.gm = gm

    def __call__(self, args: list) -> list:
        c, low = self.compiled, self.lowered
        exes = c.exes
        if exes.stats.padding_off:
            return c(args)
        seed = draw_seed() if low.has_rng else None
        originals = list(args)
        tensor_inputs = c._tensor_inputs
        with jax.enable_x64(True):
            values = [
                c._input(i, a) if i in tensor_inputs else python_scalar(a)
                for i, a in enumerate(args)
            ]
            args.clear()
            real = bind(low.input_metas, values)
            padded = padded_bindings(real, self.pad_to)
            values = [
                pad_array(v, m, padded) if isinstance(m, torch.Tensor) else concrete(m, padded)
                for v, m in zip(values, low.input_metas, strict=True)
            ]
            arrays = [v for i, v in enumerate(values) if i in tensor_inputs]
            statics = [v for i, v in enumerate(values) if i not in tensor_inputs]
            signature = (tuple((x.shape, x.dtype) for x in arrays), tuple(statics))
            exe = exes.get(signature, seed, arrays, statics)
            try:
                with jax.default_device(c.device):
                    outs = list(exe(seed, *arrays))
            except jax.errors.JaxRuntimeError as e:
                raise_failed_assert(e)
                raise
            for j, (kind, k) in enumerate(low.output_plan):
                if kind not in ("input", "dup", "detach"):
                    outs[k] = slice_output(outs[k], low.output_metas[j], real)
            result = c._assemble(outs, originals)
        c.transfers.steady = True
        if signature not in exes.stats.padding_checked and not low.has_rng:
            exes.stats.padding_checked.add(signature)
            exact = list(self.gm(*originals))
            if not results_match(result, exact):
                exes.stats.padding_off = True
                warn_padding_changed_results(exes.name, signature)
                return exact
        return result

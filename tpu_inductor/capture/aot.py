"""Graph capture: the AOTAutograd configuration and the decomposition table.

Dynamo hands the backend a torch-level FX graph; AOTAutograd functionalizes it, decomposes it
to Core ATen with the table below, splits forward and backward, and calls our compilers with
functional ATen graphs.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
import torch._decomp
from torch._decomp import core_aten_decompositions

from tpu_inductor.capture import foreach, saved
from tpu_inductor.core import config
from tpu_inductor.lowering import custom_ops, leading_dims


def decomposition_table() -> dict:
    """Every decomposition torch ships, minus every op we lower directly.

    The Core ATen decompositions, plus torch's other registered ones (``torch._decomp``:
    ``polar``, ``frexp``, ``grid_sampler_2d``, ``adaptive_max_pool2d``, ... which are not core
    but still reach backends) and ``foreach.decompositions()`` (``_foreach_*`` ops, which torch
    leaves to Inductor), so an op without a lowering is broken into ops that have one
    before it could fall back to eager. An op with its own lowering (convolution, pooling
    windows, attention, ...) becomes one XLA op instead of a chain of small ones, so its
    decomposition is dropped, and so is that of an op with a lowering a user registered
    (``tpu_inductor.register_lowering``), for as long as it is registered.
    """
    table = _builtin_decomposition_table()
    user = custom_ops.user_registered_ops()
    if any(op in table for op in user):
        table = {op: d for op, d in table.items() if op not in user}
    return table


aten = torch.ops.aten

# Decompositions whose result dtype is not the one torch's own kernel gives, found by
# tests/test_decompositions.py (every decomposition against eager on OpInfo samples and their
# mixed-dtype variants). Output k is cast to the dtype of the first tensor argument among the
# positions RESULT_DTYPES[op][k]: a bfloat16 input with a float32 target keeps huber_loss in
# bfloat16, where the decomposition promotes. An op whose dtype rule is not "one input's" is
# lowered instead (select_scatter, ldexp).
RESULT_DTYPES: dict = {
    aten.huber_loss.default: ((0,),),
    aten.soft_margin_loss.default: ((0,),),
}


def _with_result_dtypes(decomposition: Callable, spec: tuple) -> Callable:
    def dtype_of(args, positions):
        for i in positions:
            if i < len(args) and isinstance(args[i], torch.Tensor):
                return args[i].dtype
        return None

    @functools.wraps(decomposition)
    def decompose(*args, **kwargs):
        out = decomposition(*args, **kwargs)
        outs = out if isinstance(out, tuple | list) else (out,)
        fixed = [
            o
            if k >= len(spec) or dtype_of(args, spec[k]) is None
            else o.to(dtype_of(args, spec[k]))
            for k, o in enumerate(outs)
        ]
        return type(out)(fixed) if isinstance(out, tuple | list) else fixed[0]

    return decompose


@functools.cache
def _builtin_decomposition_table() -> dict:
    table = dict(torch._decomp.decomposition_table)
    table.update(core_aten_decompositions())
    table.update(foreach.decompositions())  # _foreach_* ops (compiled foreach optimizers)
    for op in list(table):
        if custom_ops.builtin_lowering(op) is not None:
            del table[op]
    for op, spec in RESULT_DTYPES.items():
        if op in table:
            table[op] = _with_result_dtypes(table[op], spec)
    return table


def partition_fn(platform: str | None = None) -> Callable:
    """The partition function AOTAutograd uses (the knob ``partitioner``) for graphs that run on
    ``platform``. On a TPU the joint graph's products first read their activations unflattened
    (``lowering/leading_dims.py``), so the forward saves the ``[..., K]`` activation the weight
    gradient contracts rather than a flattened copy of it; then ``capture/saved.py`` lets the
    backward recompute log-softmax and autocast's parameter casts instead of the forward saving
    them."""
    from torch._functorch.partitioners import (
        default_partition,
        min_cut_rematerialization_partition,
    )

    rewrite = platform in config.get("leading_dims_platforms")

    if config.get("partitioner") == "default":
        if not rewrite:
            return default_partition

        def default(joint_module, joint_inputs, **kwargs):
            leading_dims.keep_leading_dims(joint_module)
            return default_partition(joint_module, joint_inputs, **kwargs)

        return default

    def min_cut(joint_module, joint_inputs, *, num_fwd_outputs, **kwargs):
        if rewrite:
            leading_dims.keep_leading_dims(joint_module)
        _save_user_outputs(joint_module, num_fwd_outputs)
        if config.get("split_log_softmax"):
            saved.split_log_softmax(joint_module)
        if config.get("recast_parameters") and platform in config.get("recast_platforms"):
            saved.recast_parameters(joint_module, kwargs.get("static_lifetime_input_indices") or ())
        return min_cut_rematerialization_partition(
            joint_module, joint_inputs, "inductor", num_fwd_outputs=num_fwd_outputs, **kwargs
        )

    return min_cut


def _save_user_outputs(joint_module, num_fwd_outputs: int) -> None:
    """Mark the forward's outputs MUST_SAVE, so the backward reads one it needs instead of
    recomputing it.

    Saving an output costs nothing (it is written anyway), and it keeps eager's semantics: the
    backward then holds the user's output (AOTAutograd saves its ``detach``, which shares its
    version counter), so changing it in place before ``backward()`` raises as in eager instead
    of silently giving the gradient of the unchanged value.
    """
    from torch.utils.checkpoint import CheckpointPolicy

    output = next(n for n in reversed(joint_module.graph.nodes) if n.op == "output")
    for node in output.args[0][:num_fwd_outputs]:  # the joint's outputs: forward's, then grads
        if isinstance(node, torch.fx.Node) and node.op == "call_function":
            node.meta["recompute"] = CheckpointPolicy.MUST_SAVE


def aot_backend(
    fw_compiler: Callable,
    bw_compiler: Callable,
    inference_compiler: Callable,
    platform: str | None = None,
):
    """A Dynamo backend running AOTAutograd with our compilers and decompositions, for graphs
    that run on ``platform``."""
    from torch._dynamo.backends.common import aot_autograd

    return aot_autograd(
        fw_compiler=fw_compiler,
        bw_compiler=bw_compiler,
        inference_compiler=inference_compiler,
        partition_fn=partition_fn(platform),
        decompositions=decomposition_table(),
        # In-graph input mutations arrive as copy_(input, new) nodes, so the new value can stay
        # on the device as the input's current value (residency.py) instead of AOTAutograd
        # copying it back through the host outside the graph.
        keep_inference_input_mutations=True,
    )


def _fw_metadata():
    ctx = torch._guards.TracingContext.try_get()
    return getattr(ctx, "fw_metadata", None) if ctx is not None else None


def saved_output_positions(num_outputs: int) -> tuple[int, ...]:
    """Positions among the forward graph being compiled's outputs that AOTAutograd saves for
    backward (tensors only), or ``()`` when it is not a training forward."""
    meta = _fw_metadata()
    if meta is None or getattr(meta, "num_symints_saved_for_bw", None) is None:
        return ()
    return tuple(range(*meta.tensors_saved_for_backwards_slice.indices(num_outputs)))


def bumped_mutation_inputs(num_inputs: int) -> frozenset[int]:
    """Graph inputs whose version AOTAutograd raises by one right before each call (inputs
    mutated in the graph, where autograd sees the mutation), as graph input positions."""
    meta = _fw_metadata()
    if meta is None:
        return frozenset()
    seen = getattr(meta, "mutated_graph_handled_indices_seen_by_autograd", None) or ()
    offset = num_inputs - len(meta.input_info)  # effect tokens come first
    return frozenset(i + offset for i in seen) if offset >= 0 else frozenset()


def never_donate_backward_buffers() -> None:
    """We never donate a saved tensor to the backward, so tell AOTAutograd; otherwise it
    refuses ``backward(retain_graph=True)`` after a first backward (it assumes, as for
    Inductor, that saved buffers were reused)."""
    meta = _fw_metadata()
    if meta is not None and getattr(meta, "bw_donated_idxs", None):
        meta.bw_donated_idxs = []


def static_input_positions() -> tuple[int, ...]:
    """Positions of parameters and buffers among the current forward graph's inputs."""
    return tuple(getattr(_fw_metadata(), "static_input_indices", None) or ())


def passes_through(lowered, n_inputs: int) -> bool:
    """Whether AOTAutograd's runtime wrapper has nothing to do for the inference graph being
    compiled: its inputs and outputs are exactly the Dynamo graph's (no input mutations to copy
    back, no outputs aliasing inputs or each other, no effect tokens, no tensor subclasses, no
    grad-mode change, no shape symbols). Such a graph can be called straight from Dynamo.
    """
    from torch._functorch._aot_autograd.schemas import OutputType

    meta = _fw_metadata()
    if meta is None or lowered.scalar_outputs or lowered.dynamic or not lowered.plain_outputs:
        return False
    return (
        len(lowered.input_metas) == n_inputs == len(lowered.tensor_inputs)
        and not any(i.mutates_data or i.mutates_metadata for i in meta.input_info)
        and all(o.output_type == OutputType.non_alias for o in meta.output_info)
        and not getattr(meta, "tokens", None)
        and meta.num_intermediate_bases == 0
        and getattr(meta, "grad_enabled_mutation", None) is None
        and not getattr(meta, "num_graphsafe_rng_states", 0)
        and all(
            isinstance(m, int) or type(m).__name__ == "PlainTensorMeta"
            for m in getattr(meta, "subclass_inp_meta", None) or ()
        )
    )


def runtime_convention(kind: str, lowered, n_inputs: int) -> dict | str:
    # n_inputs: the Dynamo graph's inputs and the module parameters AOTAutograd lifts
    """How the graph being compiled is called without AOTAutograd's runtime wrapper (a program
    saved in ``cache_dir``, runtime/program_store.py), or why it cannot be.

    An inference graph needs only its updated inputs' versions raised; a training forward, an
    ``autograd.Function`` saving what the backward reads. Anything more the wrapper would do
    (outputs aliasing inputs, effect tokens, tensor subclasses, updates outside the program,
    saved sizes, views to regenerate, random state) keeps the graph out of the store.
    """
    from torch._functorch._aot_autograd.schemas import OutputType

    meta = _fw_metadata()
    if meta is None:
        return "AOTAutograd gave no metadata"
    if lowered.dynamic or lowered.scalar_outputs:
        return "it has symbolic sizes or scalar outputs"
    if not (len(lowered.input_metas) == n_inputs == len(lowered.tensor_inputs)):
        return (
            "AOTAutograd changed its inputs (deduplicated, tokens or sizes: "
            f"{len(lowered.input_metas)} inputs, {len(lowered.tensor_inputs)} tensors, "
            f"{n_inputs} from Dynamo)"
        )
    if any(o.output_type != OutputType.non_alias for o in meta.output_info):
        return "an output aliases an input or another output"
    if (
        getattr(meta, "tokens", None)
        or meta.num_intermediate_bases
        or getattr(meta, "grad_enabled_mutation", None) is not None
        or getattr(meta, "num_graphsafe_rng_states", 0)
        or getattr(meta, "is_rng_op_functionalized", False)
        or getattr(meta, "num_unsafe_view_outputs", 0)
        or any(
            not (isinstance(m, int) or type(m).__name__ == "PlainTensorMeta")
            for m in getattr(meta, "subclass_inp_meta", None) or ()
        )
    ):
        return "AOTAutograd's wrapper has work to do (tokens, views, subclasses or RNG state)"
    if kind == "inference":
        if meta.num_mutated_inp_runtime_indices:
            return "it updates inputs outside the program"
        return {"kind": "inference", "bumped": sorted(bumped_mutation_inputs(n_inputs))}
    if any(i.mutates_data or i.mutates_metadata for i in meta.input_info):
        return "a training graph that updates its inputs"
    if meta.num_symints_saved_for_bw:
        return "it saves sizes for the backward"
    returns = meta.num_forward_returns
    if returns != len(meta.output_info):
        return "its forward returns more than its outputs"

    def size(s: slice) -> int:
        return len(range(*s.indices(lowered.num_outputs)))

    return {
        "kind": "training",
        "num_forward_returns": returns,
        "saved_with_version_check": size(meta.tensors_saved_for_backwards_with_vc_check_slice),
        "saved_without_version_check": size(meta.tensors_saved_for_backwards_no_vc_check_slice),
        "output_requires_grad": [bool(o.requires_grad) for o in meta.output_info],
    }

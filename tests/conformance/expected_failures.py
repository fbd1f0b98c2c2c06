"""Expected failures of the OpInfo conformance test (tests/conformance/test_opinfo.py).

EXPECTED_FAILURES maps an op_db entry (``name`` or ``name.variant``) to {dtype: reason}. An
entry listed here that passes fails the test, so the table cannot go stale. Reasons starting
with ``capture:`` fail with ``backend="aot_eager"`` too (Dynamo/AOTAutograd cannot capture
them) and do not count against tpu-inductor. SKIPPED lists entries with no sample that runs in
eager.

Regenerate from the current results (rows of entries that do not run are kept):

    TPU_INDUCTOR_REGEN_XFAIL=1 pytest tests/conformance/test_opinfo.py
"""

# ruff: noqa: E501

EXPECTED_FAILURES: dict[str, dict[str, str]] = {
    "_batch_norm_with_update": {
        "float32": "unsupported op: aten._batch_norm_with_update_functional.default",
        "bfloat16": "unsupported op: aten._batch_norm_with_update_functional.default",
    },
    "_native_batch_norm_legit": {
        "bfloat16": "meta mismatch: aten._native_batch_norm_legit_functional.default(bfloat16[5, 5, 5], bfloat16[5], bfloat16[5], bfloat16[5], bfloat16[5], True, 0.5, 0.6) produced float32[5], torch says bfloat16[5]",
    },
    "_unsafe_masked_index_put_accumulate": {
        "bool": "lowering failed: aten._unsafe_index_put.default(bool[5, 5], [int64[10, 1], int64[1, 10]], bool[10, 10], True) failed: TypeError: add does not accept dtype bool at position 0. Accepted dtypes at pos...",
    },
    "_upsample_bilinear2d_aa": {
        "float32": "unsupported op: aten._upsample_bilinear2d_aa.default",
    },
    "allclose": {
        "float32": "capture: dynamo can't capture: Unsupported: Data dependent operator",
        "bfloat16": "capture: dynamo can't capture: Unsupported: Data dependent operator",
    },
    "argsort": {
        "bfloat16": "mismatch: output 7113/8000 elements, max abs diff 7.97e+03",
        "bool": "mismatch: output 7999/8000 elements, max abs diff 7.98e+03",
    },
    "argwhere": {
        "float32": "unsupported op: aten._assert_scalar.default, aten.nonzero.default",
        "bfloat16": "unsupported op: aten._assert_scalar.default, aten.nonzero.default",
        "int64": "unsupported op: aten._assert_scalar.default, aten.nonzero.default",
        "bool": "unsupported op: aten._assert_scalar.default, aten.nonzero.default",
    },
    "as_strided_scatter": {
        "float32": "unsupported op: aten.as_strided_scatter.default",
        "bfloat16": "unsupported op: aten.as_strided_scatter.default",
        "int64": "unsupported op: aten.as_strided_scatter.default",
        "bool": "unsupported op: aten.as_strided_scatter.default",
    },
    "bincount": {
        "int64": "unsupported op: aten._assert_scalar.default, aten.bincount.default",
    },
    "cauchy": {
        "float32": "unsupported op: aten.cauchy.default",
        "bfloat16": "unsupported op: aten.cauchy.default",
    },
    "chalf": {
        "float32": "unsupported dtype: torch dtype torch.complex32 has no JAX equivalent; convert the tensor (e.g. .float()) before the compiled region",
        "bfloat16": "unsupported dtype: torch dtype torch.complex32 has no JAX equivalent; convert the tensor (e.g. .float()) before the compiled region",
        "int64": "unsupported dtype: torch dtype torch.complex32 has no JAX equivalent; convert the tensor (e.g. .float()) before the compiled region",
        "bool": "unsupported dtype: torch dtype torch.complex32 has no JAX equivalent; convert the tensor (e.g. .float()) before the compiled region",
    },
    "combinations": {
        "float32": "unsupported op: aten._assert_scalar.default, aten.masked_select.default",
        "bfloat16": "unsupported op: aten._assert_scalar.default, aten.masked_select.default",
        "int64": "unsupported op: aten._assert_scalar.default, aten.masked_select.default",
        "bool": "unsupported op: aten._assert_scalar.default, aten.masked_select.default",
    },
    "corrcoef": {
        "float32": "capture: dynamo can't capture: Unsupported: Data dependent operator",
        "bfloat16": "capture: dynamo can't capture: Unsupported: Data dependent operator",
        "int64": "capture: dynamo can't capture: Unsupported: Data dependent operator",
    },
    "cov": {
        "float32": "capture: dynamo can't capture: Unsupported: Data dependent operator",
        "bfloat16": "capture: dynamo can't capture: Unsupported: Data dependent operator",
        "int64": "capture: dynamo can't capture: Unsupported: Data dependent operator",
    },
    "diagonal_scatter": {
        "float32": "unsupported op: aten.diagonal_scatter.default",
        "bfloat16": "unsupported op: aten.diagonal_scatter.default",
        "int64": "unsupported op: aten.diagonal_scatter.default",
        "bool": "unsupported op: aten.diagonal_scatter.default",
    },
    "equal": {
        "float32": "capture: dynamo can't capture: Unsupported: Data dependent operator",
        "bfloat16": "capture: dynamo can't capture: Unsupported: Data dependent operator",
        "int64": "capture: dynamo can't capture: Unsupported: Data dependent operator",
        "bool": "capture: dynamo can't capture: Unsupported: Data dependent operator",
    },
    "gcd": {
        "int64": "unsupported op: aten.gcd.default",
    },
    "geometric": {
        "float32": "unsupported op: aten.geometric.default",
        "bfloat16": "unsupported op: aten.geometric.default",
        "int64": "unsupported op: aten.geometric.default",
    },
    "grid_sampler_2d": {
        "float32": "unsupported op: aten.grid_sampler_2d.default",
        "bfloat16": "unsupported op: aten.grid_sampler_2d.default",
    },
    "grid_sampler_3d": {
        "float32": "unsupported op: aten.grid_sampler_3d.default",
        "bfloat16": "unsupported op: aten.grid_sampler_3d.default",
    },
    "index_add": {
        "float32": "lowering failed: aten.index_add.default(float32[], 0, int64[1], float32[], alpha=-1) failed: ValueError: axis 0 is out of bounds for array of dimension 0",
        "bfloat16": "lowering failed: aten.index_add.default(bfloat16[], 0, int64[1], bfloat16[], alpha=-1) failed: ValueError: axis 0 is out of bounds for array of dimension 0",
        "int64": "lowering failed: aten.index_add.default(int64[], 0, int64[1], int64[], alpha=-1) failed: ValueError: axis 0 is out of bounds for array of dimension 0",
        "bool": "lowering failed: aten.index_add.default(bool[], 0, int64[1], bool[], alpha=True) failed: ValueError: axis 0 is out of bounds for array of dimension 0",
    },
    "index_copy": {
        "float32": "lowering failed: aten.index_copy.default(float32[], 0, int64[1], float32[]) failed: ValueError: axis 0 is out of bounds for array of dimension 0",
        "bfloat16": "lowering failed: aten.index_copy.default(bfloat16[], 0, int64[1], bfloat16[]) failed: ValueError: axis 0 is out of bounds for array of dimension 0",
        "int64": "lowering failed: aten.index_copy.default(int64[], 0, int64[1], int64[]) failed: ValueError: axis 0 is out of bounds for array of dimension 0",
        "bool": "lowering failed: aten.index_copy.default(bool[], 0, int64[1], bool[]) failed: ValueError: axis 0 is out of bounds for array of dimension 0",
    },
    "index_fill": {
        "float32": "lowering failed: aten.index_fill.int_Scalar(float32[], 0, int64[1], -8.478373527526855) failed: ValueError: axis 0 is out of bounds for array of dimension 0",
        "bfloat16": "lowering failed: aten.index_fill.int_Scalar(bfloat16[], 0, int64[1], -8.5) failed: ValueError: axis 0 is out of bounds for array of dimension 0",
        "int64": "lowering failed: aten.index_fill.int_Scalar(int64[], 0, int64[1], -8) failed: ValueError: axis 0 is out of bounds for array of dimension 0",
        "bool": "lowering failed: aten.index_fill.int_Scalar(bool[], 0, int64[1], True) failed: ValueError: axis 0 is out of bounds for array of dimension 0",
    },
    "index_reduce.amax": {
        "float32": "unsupported op: aten.index_reduce.default",
        "bfloat16": "unsupported op: aten.index_reduce.default",
        "int64": "unsupported op: aten.index_reduce.default",
    },
    "index_reduce.amin": {
        "float32": "unsupported op: aten.index_reduce.default",
        "bfloat16": "unsupported op: aten.index_reduce.default",
        "int64": "unsupported op: aten.index_reduce.default",
    },
    "index_reduce.mean": {
        "float32": "unsupported op: aten.index_reduce.default",
        "bfloat16": "unsupported op: aten.index_reduce.default",
        "int64": "unsupported op: aten.index_reduce.default",
    },
    "index_reduce.prod": {
        "float32": "unsupported op: aten.index_reduce.default",
        "bfloat16": "unsupported op: aten.index_reduce.default",
        "int64": "unsupported op: aten.index_reduce.default",
    },
    "index_select": {
        "float32": "meta mismatch: aten.index_select.default(float32[], 0, int64[1]) produced float32[1], torch says float32[]",
        "bfloat16": "meta mismatch: aten.index_select.default(bfloat16[], 0, int64[1]) produced bfloat16[1], torch says bfloat16[]",
        "int64": "meta mismatch: aten.index_select.default(int64[], 0, int64[1]) produced int64[1], torch says int64[]",
        "bool": "meta mismatch: aten.index_select.default(bool[], 0, int64[1]) produced bool[1], torch says bool[]",
    },
    "item": {
        "float32": "unsupported op: aten._local_scalar_dense.default",
        "bfloat16": "unsupported op: aten._local_scalar_dense.default",
        "int64": "unsupported op: aten._local_scalar_dense.default",
        "bool": "unsupported op: sym_ite, aten._assert_scalar.default, aten._local_scalar_dense.default",
    },
    "kthvalue": {
        "int64": "mismatch: output[1] 6/25 elements, max abs diff 3",
    },
    "lcm": {
        "int64": "unsupported op: aten.lcm.default",
    },
    "linalg.cholesky": {
        "float32": "unsupported op: with_effects",
    },
    "linalg.eigh": {
        "float32": "mismatch: output[1] 10/25 elements, max abs diff 1.52",
    },
    "linalg.inv": {
        "float32": "unsupported op: with_effects",
    },
    "linalg.ldl_factor": {
        "float32": "unsupported op: with_effects",
    },
    "linalg.lstsq": {
        "float32": "capture: dynamo can't capture: Unsupported: Dynamic shape operator",
    },
    "linalg.lstsq.grad_oriented": {
        "float32": "capture: dynamo can't capture: Unsupported: Dynamic shape operator",
    },
    "linalg.lu_factor": {
        "float32": "unsupported op: with_effects",
    },
    "linalg.solve": {
        "float32": "unsupported op: with_effects",
    },
    "linalg.tensorinv": {
        "float32": "unsupported op: with_effects",
    },
    "linalg.tensorsolve": {
        "float32": "unsupported op: with_effects",
    },
    "log_normal": {
        "float32": "unsupported op: aten.log_normal.default",
        "bfloat16": "unsupported op: aten.log_normal.default",
    },
    "masked_scatter": {
        "float32": "unsupported op: aten.masked_scatter.default",
        "bfloat16": "unsupported op: aten.masked_scatter.default",
        "int64": "unsupported op: aten.masked_scatter.default",
        "bool": "unsupported op: aten.masked_scatter.default",
    },
    "masked_select": {
        "float32": "unsupported op: aten._assert_scalar.default, aten.masked_select.default",
        "bfloat16": "unsupported op: aten._assert_scalar.default, aten.masked_select.default",
        "int64": "unsupported op: aten._assert_scalar.default, aten.masked_select.default",
        "bool": "unsupported op: aten._assert_scalar.default, aten.masked_select.default",
    },
    "matrix_exp": {
        "bfloat16": "mismatch: output 25/25 elements, max abs diff inf, 25 NaN(s) differ",
    },
    "multinomial": {
        "float32": "unsupported op: aten.multinomial.default",
        "bfloat16": "unsupported op: aten.multinomial.default",
    },
    "narrow_copy": {
        "float32": "unsupported op: aten.narrow_copy.default",
        "bfloat16": "unsupported op: aten.narrow_copy.default",
        "int64": "unsupported op: aten.narrow_copy.default",
        "bool": "unsupported op: aten.narrow_copy.default",
    },
    "native_batch_norm": {
        "bfloat16": "meta mismatch: aten._native_batch_norm_legit_functional.default(bfloat16[5, 5, 5], bfloat16[5], bfloat16[5], bfloat16[5], bfloat16[5], True, 0.5, 0.6) produced float32[5], torch says bfloat16[5]",
    },
    "native_dropout_backward": {
        "int64": "meta mismatch: aten.native_dropout_backward.default(int64[5, 5, 5, 5], bool[5, 5, 5, 5], 0.0) produced int64[5, 5, 5, 5], torch says float32[5, 5, 5, 5]",
        "bool": "meta mismatch: aten.native_dropout_backward.default(bool[5, 5, 5, 5], bool[5, 5, 5, 5], 0.0) produced bool[5, 5, 5, 5], torch says float32[5, 5, 5, 5]",
    },
    "nn.functional.adaptive_max_pool1d": {
        "float32": "unsupported op: aten.adaptive_max_pool2d.default",
        "bfloat16": "unsupported op: aten.adaptive_max_pool2d.default",
    },
    "nn.functional.adaptive_max_pool2d": {
        "float32": "unsupported op: aten.adaptive_max_pool2d.default",
        "bfloat16": "unsupported op: aten.adaptive_max_pool2d.default",
    },
    "nn.functional.adaptive_max_pool3d": {
        "float32": "unsupported op: aten.adaptive_max_pool3d.default",
        "bfloat16": "unsupported op: aten.adaptive_max_pool3d.default",
    },
    "nn.functional.batch_norm": {
        "bfloat16": "meta mismatch: aten._native_batch_norm_legit_functional.default(bfloat16[5, 5, 5], bfloat16[5], bfloat16[5], bfloat16[5], bfloat16[5], True, 0.5, 0.6) produced float32[5], torch says bfloat16[5]",
    },
    "nn.functional.bilinear": {
        "float32": "unsupported op: aten._trilinear.default",
        "bfloat16": "unsupported op: aten._trilinear.default",
        "int64": "unsupported op: aten._trilinear.default",
    },
    "nn.functional.conv_transpose3d": {
        "bfloat16": "mismatch: output 1/648 elements, max abs diff 1",
    },
    "nn.functional.ctc_loss": {
        "float32": "capture: dynamo can't capture: Unsupported: Dynamic shape operator",
    },
    "nn.functional.embedding_bag": {
        "float32": "unsupported op: aten._embedding_bag_forward_only.default",
        "bfloat16": "unsupported op: aten._embedding_bag_forward_only.default",
    },
    "nn.functional.fractional_max_pool2d": {
        "float32": "unsupported op: aten.fractional_max_pool2d.default",
        "bfloat16": "unsupported op: aten.fractional_max_pool2d.default",
    },
    "nn.functional.fractional_max_pool3d": {
        "float32": "unsupported op: aten.fractional_max_pool3d.default",
        "bfloat16": "unsupported op: aten.fractional_max_pool3d.default",
    },
    "nn.functional.gaussian_nll_loss": {
        "float32": "capture: dynamo can't capture: UserError: Could not guard on data-dependent expression Eq(u0, 1) (unhinted: Eq(u0, 1)). (Size-like symbols: none)",
        "bfloat16": "capture: dynamo can't capture: UserError: Could not guard on data-dependent expression Eq(u0, 1) (unhinted: Eq(u0, 1)). (Size-like symbols: none)",
    },
    "nn.functional.grid_sample": {
        "float32": "unsupported op: aten.grid_sampler_2d.default",
        "bfloat16": "unsupported op: aten.grid_sampler_2d.default",
    },
    "nn.functional.instance_norm": {
        "bfloat16": "meta mismatch: aten._native_batch_norm_legit_functional.default(bfloat16[1, 25, 5], bfloat16[25], bfloat16[25], bfloat16[25], bfloat16[25], True, 0.5, 0.6) produced float32[25], torch says bfloat16...",
    },
    "nn.functional.linear_cross_entropy.chunked": {
        "float32": "unsupported op: torch_nn._linear_cross_entropy_batch_chunked.default",
        "bfloat16": "unsupported op: torch_nn._linear_cross_entropy_batch_chunked.default",
    },
    "nn.functional.linear_cross_entropy.chunked_none": {
        "float32": "unsupported op: torch_nn._linear_cross_entropy_batch_chunked_no_reduction.default",
        "bfloat16": "unsupported op: torch_nn._linear_cross_entropy_batch_chunked_no_reduction.default",
    },
    "nn.functional.one_hot": {
        "int64": "capture: dynamo can't capture: UserError: Could not extract specialized integer from data-dependent expression u0 (unhinted: u0). (Size-like symbols: none)",
    },
    "nn.functional.rrelu": {
        "float32": "unsupported op: aten.rrelu_with_noise_functional.default",
        "bfloat16": "unsupported op: aten.rrelu_with_noise_functional.default",
    },
    "nonzero": {
        "float32": "unsupported op: aten._assert_scalar.default, aten.nonzero.default",
        "bfloat16": "unsupported op: aten._assert_scalar.default, aten.nonzero.default",
        "int64": "unsupported op: aten._assert_scalar.default, aten.nonzero.default",
        "bool": "unsupported op: aten._assert_scalar.default, aten.nonzero.default",
    },
    "nonzero_static": {
        "float32": "unsupported op: aten.nonzero_static.default",
        "bfloat16": "unsupported op: aten.nonzero_static.default",
        "int64": "unsupported op: aten.nonzero_static.default",
        "bool": "unsupported op: aten.nonzero_static.default",
    },
    "normal": {
        "float32": "unsupported op: aten.normal.Tensor_Tensor",
        "bfloat16": "unsupported op: aten.normal.Tensor_Tensor",
    },
    "normal.number_mean": {
        "float32": "unsupported op: aten.normal.float_float",
        "bfloat16": "unsupported op: aten.normal.float_float",
    },
    "permute_copy": {
        "float32": "unsupported op: aten.permute_copy.default",
        "bfloat16": "unsupported op: aten.permute_copy.default",
        "int64": "unsupported op: aten.permute_copy.default",
        "bool": "unsupported op: aten.permute_copy.default",
    },
    "put": {
        "float32": "unsupported op: aten.put.default",
        "bfloat16": "unsupported op: aten.put.default",
        "int64": "unsupported op: aten.put.default",
        "bool": "unsupported op: aten.put.default",
    },
    "renorm": {
        "bfloat16": "unsupported op: prims.convert_element_type.default",
    },
    "resize_": {
        "float32": "capture: dynamo can't capture: Unsupported: Unsupported Tensor.resize_() call",
        "bfloat16": "capture: dynamo can't capture: Unsupported: Unsupported Tensor.resize_() call",
        "int64": "capture: dynamo can't capture: Unsupported: Unsupported Tensor.resize_() call",
        "bool": "capture: dynamo can't capture: Unsupported: Unsupported Tensor.resize_() call",
    },
    "resize_as_": {
        "float32": "capture: dynamo can't capture: Unsupported: Attempted to call function marked as skipped",
        "bfloat16": "capture: dynamo can't capture: Unsupported: Attempted to call function marked as skipped",
        "int64": "capture: dynamo can't capture: Unsupported: Attempted to call function marked as skipped",
        "bool": "capture: dynamo can't capture: Unsupported: Attempted to call function marked as skipped",
    },
    "scatter_add": {
        "bool": "lowering failed: aten.scatter_add.default(bool[10, 5], 0, int64[5, 5], bool[5, 5]) failed: TypeError: add does not accept dtype bool at position 0. Accepted dtypes at position 0 are subtypes of int...",
    },
    "scatter_reduce.amax": {
        "bool": "lowering failed: aten.scatter_reduce.two(bool[10, 5], 0, int64[5, 5], bool[5, 5], 'amax', include_self=False) failed: ValueError: Invalid integer data type 'b'.",
    },
    "scatter_reduce.amin": {
        "bool": "lowering failed: aten.scatter_reduce.two(bool[10, 5], 0, int64[5, 5], bool[5, 5], 'amin', include_self=False) failed: ValueError: Invalid integer data type 'b'.",
    },
    "scatter_reduce.prod": {
        "bool": "lowering failed: aten.scatter_reduce.two(bool[10, 5], 0, int64[5, 5], bool[5, 5], 'prod', include_self=False) failed: TypeError: mul does not accept dtype bool at position 0. Accepted dtypes at pos...",
    },
    "scatter_reduce.sum": {
        "bool": "lowering failed: aten.scatter_reduce.two(bool[10, 5], 0, int64[5, 5], bool[5, 5], 'sum', include_self=False) failed: TypeError: add does not accept dtype bool at position 0. Accepted dtypes at posi...",
    },
    "sort": {
        "bfloat16": "mismatch: output[1] 7113/8000 elements, max abs diff 7.97e+03",
        "bool": "mismatch: output[1] 7999/8000 elements, max abs diff 7.98e+03",
    },
    "sparse.mm.reduce": {
        "float32": "capture: dynamo can't capture: Unsupported: Attempted to wrap sparse Tensor",
        "bfloat16": "capture: dynamo can't capture: Unsupported: Attempted to wrap sparse Tensor",
    },
    "sparse.sampled_addmm": {
        "float32": "capture: dynamo can't capture: Unsupported: Attempted to wrap sparse Tensor",
    },
    "tensor_split": {
        "float32": "unsupported op: aten._assert_scalar.default, aten._local_scalar_dense.default",
        "bfloat16": "unsupported op: aten._assert_scalar.default, aten._local_scalar_dense.default",
        "int64": "unsupported op: aten._assert_scalar.default, aten._local_scalar_dense.default",
        "bool": "unsupported op: aten._assert_scalar.default, aten._local_scalar_dense.default",
    },
    "to_sparse": {
        "float32": "capture: dynamo can't capture: Unsupported: Attempted to wrap sparse Tensor with VariableTracker",
        "bfloat16": "capture: dynamo can't capture: Unsupported: Attempted to wrap sparse Tensor with VariableTracker",
        "int64": "capture: dynamo can't capture: Unsupported: Attempted to wrap sparse Tensor with VariableTracker",
        "bool": "capture: dynamo can't capture: Unsupported: Attempted to wrap sparse Tensor with VariableTracker",
    },
    "topk": {
        "int64": "mismatch: output[1] 16/150 elements, max abs diff 4",
    },
    "tril_indices": {
        "int64": "unsupported op: aten.tril_indices.default",
    },
    "triu_indices": {
        "int64": "unsupported op: aten.triu_indices.default",
    },
    "unique": {
        "float32": "unsupported op: aten._assert_scalar.default, aten._unique2.default",
        "bfloat16": "unsupported op: aten._assert_scalar.default, aten._unique2.default",
        "int64": "unsupported op: aten._assert_scalar.default, aten._unique2.default",
        "bool": "unsupported op: aten._assert_scalar.default, aten._unique2.default",
    },
    "unique_consecutive": {
        "float32": "unsupported op: aten._assert_scalar.default, aten.unique_consecutive.default",
        "bfloat16": "unsupported op: aten._assert_scalar.default, aten.unique_consecutive.default",
        "int64": "unsupported op: aten._assert_scalar.default, aten.unique_consecutive.default",
        "bool": "unsupported op: aten._assert_scalar.default, aten.unique_consecutive.default",
    },
}

SKIPPED: dict[str, dict[str, str]] = {
    "jiterator_2inputs_2outputs": {
        "float32": "no sample runs in eager",
        "bfloat16": "no sample runs in eager",
        "int64": "no sample runs in eager",
        "bool": "no sample runs in eager",
    },
    "jiterator_4inputs_with_extra_args": {
        "float32": "no sample runs in eager",
        "bfloat16": "no sample runs in eager",
        "int64": "no sample runs in eager",
        "bool": "no sample runs in eager",
    },
    "jiterator_binary": {
        "float32": "no sample runs in eager",
        "bfloat16": "no sample runs in eager",
        "int64": "no sample runs in eager",
        "bool": "no sample runs in eager",
    },
    "jiterator_binary_return_by_ref": {
        "float32": "no sample runs in eager",
        "bfloat16": "no sample runs in eager",
        "int64": "no sample runs in eager",
        "bool": "no sample runs in eager",
    },
    "jiterator_unary": {
        "float32": "no sample runs in eager",
        "bfloat16": "no sample runs in eager",
        "int64": "no sample runs in eager",
        "bool": "no sample runs in eager",
    },
}

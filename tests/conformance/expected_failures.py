"""Expected failures of the OpInfo conformance test (tests/conformance/test_opinfo.py).

``EXPECTED_FAILURES[entry] = (kind, dtypes, cause)``, one row per op_db entry (``name`` or
``name.variant``), written by hand: the cause, once, not the error text. The test holds each row
to what it claims: every listed dtype must fail (a row that passes fails the test, so the table
cannot go stale), no other dtype may fail, and the failure must be of the row's kind:

- ``capture``: Dynamo/AOTAutograd cannot capture it with ``fullgraph=True`` (``aot_eager`` fails
  the same way), so it does not count against tpu-inductor; the error is "dynamo can't capture".
- ``by design``: an op ``tpu_inductor/lowering/lowerings/unsupported.py`` refuses with the reason and the
  fix (data-dependent output shapes); outside ``fallback="error"`` it runs in eager.
- ``dtype``: a dtype JAX has no equivalent of.
- ``gap``: could be lowered and is not yet; the cause says what it would take.

``SKIPPED[entry] = (dtypes, reason)``: no sample runs in eager. To find new failures, run
``TPU_INDUCTOR_REGEN_XFAIL=1 pytest tests/conformance/test_opinfo.py``: it keeps these rows'
causes, updates their dtypes, and adds new failures with the observed error as a placeholder
cause that a person then replaces with the real one.
"""

# ruff: noqa: E501
# One row per entry, so the table reads as a table:
# fmt: off

ALL = ("float32", "bfloat16", "int64", "bool")

_VALUE_BOOL = "returns a Python bool computed from tensor values (a data-dependent non-tensor output), which Dynamo cannot keep inside one graph"

EXPECTED_FAILURES: dict[str, tuple[str, tuple[str, ...], str]] = {
    "allclose": ("capture", ("float32", "bfloat16"), _VALUE_BOOL),
    "argwhere": ("by design", ALL, "aten.nonzero: the output's length is the number of non-zero values"),
    "bincount": ("by design", ("int64",), "the output's length is max(input) + 1, a value"),
    "chalf": ("dtype", ALL, "torch.complex32 has no JAX dtype"),
    "combinations": ("gap", ALL, "torch.combinations decomposes into masked_select over an index mask; the output size (n choose r) is static, but lowering it needs combinations caught before that decomposition"),
    "corrcoef": ("capture", ("float32", "bfloat16", "int64"), "calls torch.cov, whose C++ implementation checks its weights with aten.equal (a Python bool read from values)"),
    "cov": ("capture", ("float32", "bfloat16", "int64"), "its C++ implementation checks its weights with aten.equal (a Python bool read from values)"),
    "equal": ("capture", ALL, _VALUE_BOOL),
    "linalg.lstsq": ("capture", ("float32",), "aten.linalg_lstsq's residuals are empty or not depending on the computed rank, a data-dependent shape"),
    "linalg.lstsq.grad_oriented": ("capture", ("float32",), "aten.linalg_lstsq's residuals are empty or not depending on the computed rank, a data-dependent shape"),
    "masked_select": ("by design", ALL, "the output's length is the number of True mask elements"),
    "nn.functional.ctc_loss": ("capture", ("float32",), "aten._ctc_loss's output shape depends on the target lengths' values"),
    "nn.functional.gaussian_nll_loss": ("capture", ("float32", "bfloat16"), "F.gaussian_nll_loss raises if torch.any(var < 0), a branch on a tensor value"),
    "nn.functional.one_hot": ("capture", ("int64",), "num_classes=-1 makes the output width max(input) + 1, a value"),
    "nonzero": ("by design", ALL, "the output's length is the number of non-zero values"),
    "resize_": ("capture", ALL, "Dynamo does not trace Tensor.resize_"),
    "resize_as_": ("capture", ALL, "Dynamo skips Tensor.resize_as_ (marked as skipped)"),
    "sparse.mm.reduce": ("capture", ("float32", "bfloat16"), "Dynamo does not trace sparse tensors"),
    "sparse.sampled_addmm": ("capture", ("float32",), "Dynamo does not trace sparse tensors"),
    "tensor_split": ("by design", ALL, "split indices given as a tensor: their values are the pieces' sizes, a data-dependent shape"),
    "to_sparse": ("capture", ALL, "Dynamo does not trace sparse tensors"),
    "unique": ("by design", ALL, "aten._unique2: the output's length is the number of distinct values"),
    "unique_consecutive": ("by design", ALL, "the output's length is the number of runs"),
}
# fmt: on

# The all-samples sweep (test_opinfo_all_samples.py, scripts/opinfo_all_samples.py): entries
# whose later samples fail while their first passes. SAMPLE_FAILURES: clear errors (the cause,
# as above); SILENT_MISMATCHES: wrong numbers without an error, each with its cause and why it
# cannot be fixed. The goal for SILENT_MISMATCHES is an empty table.
SAMPLE_FAILURES: dict[str, tuple[tuple[str, ...], str]] = {
    "narrow": (
        ("float32", "bfloat16", "int64", "bool"),
        "gap: a 0-d tensor `start` is read with .item() (aten._local_scalar_dense) before the "
        "backend sees the graph; the output shape is static (`length`), so a dynamic_slice "
        "could lower it if Dynamo kept the tensor",
    ),
    "repeat_interleave": (
        ("float32", "bfloat16", "int64", "bool"),
        "by design: with a tensor of repeats the output's length is their sum, a value",
    ),
}

SILENT_MISMATCHES: dict[str, tuple[tuple[str, ...], str]] = {}

_NO_SAMPLE = "jiterator entries are CUDA-only: no sample runs in CPU eager"

SKIPPED: dict[str, tuple[tuple[str, ...], str]] = {
    "jiterator_2inputs_2outputs": (ALL, _NO_SAMPLE),
    "jiterator_4inputs_with_extra_args": (ALL, _NO_SAMPLE),
    "jiterator_binary": (ALL, _NO_SAMPLE),
    "jiterator_binary_return_by_ref": (ALL, _NO_SAMPLE),
    "jiterator_unary": (ALL, _NO_SAMPLE),
}

"""Index ops against CPU eager over a generated matrix of index shapes and dtypes (issue 23).

gather, scatter / scatter_add / scatter_reduce, index_select, take_along_dim, index_put /
index_copy / index_add / index_fill, select_scatter, slice_scatter, diagonal_scatter and
embedding (+ its backward), with: index shapes smaller than the input in the other
dimensions, negative and out-of-order indices, duplicates (only where torch defines the result:
accumulating reductions, or every duplicate writing the same value), empty indices, int32 and
int64 indices, and sources of another dtype than the input (the result keeps the input's dtype).
Cases eager rejects (gather and scatter take only int64 indices, negative indices out of
range, ...) are dropped. Each op compiles once per input dtype (``operand_matrix.run_cases``).
"""

from __future__ import annotations

import pytest
import torch

from tests.helpers import compiled
from tests.lowering.operand_matrix import Case, run_cases

DTYPES = (torch.float32, torch.bfloat16, torch.int32, torch.int64, torch.bool)
OTHER = {  # a source dtype different from the input's
    torch.float32: torch.int64,
    torch.bfloat16: torch.float32,
    torch.int32: torch.int64,
    torch.int64: torch.int32,
    torch.bool: torch.float32,
}
INDEX_DTYPES = (torch.int64, torch.int32)

# 1-D indices into a dimension of size 5 (index_select, index_*, embedding, index_put).
INDEX_1D = {
    "ordered": [0, 2, 4],
    "unordered": [4, 0, 3],
    "negative": [-1, 0, -5, 2],
    "duplicates": [1, 3, 1, 1],
    "empty": [],
    "one": [2],
}
# 2-D indices along dim 1 of a [5, 4] input (gather, scatter, take_along_dim).
INDEX_2D = {
    "smaller": [[1, 3], [0, 2]],  # [2, 2]: smaller than the input in dim 0 too
    "unordered": [[3, 0, 2, 1], [2, 3, 1, 0], [1, 0, 3, 2]],
    "duplicates": [[1, 1, 3, 1], [0, 0, 0, 2]],
    "negative": [[-1, 0], [2, -4]],
    "longer": [[0, 1, 2, 3, 3, 2, 1]],  # longer than the input along dim
    "empty": torch.zeros(0, 2, dtype=torch.int64),
}
# Patterns that write one place twice: only reductions (or one value for all) define a result.
DUPLICATED = {"duplicates", "longer"}


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def values(shape, dtype: torch.dtype, offset: int = 0) -> torch.Tensor:
    """Small distinct integer values (exact in every dtype, so sums do not depend on order)."""
    n = 1
    for s in shape:
        n *= s
    base = (torch.arange(n, dtype=torch.float64) * 3 + offset) % 17 - 8
    return base.reshape(shape).to(dtype) if dtype != torch.bool else (base > 0).reshape(shape)


def pool_of(dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Inputs: ``x`` [5, 4] (also the embedding weight), ``x3`` [3, 5, 4], sources ``src``,
    ``src3``, ``row`` [4], ``col`` [5], ``diag`` [4] (and ``*_other`` of another dtype), and
    every index pattern in both index dtypes (``i1_<pattern>_<dtype>``, ``i2_<...>``)."""
    other = OTHER[dtype]
    pool = {
        "x": values((5, 4), dtype),
        "x3": values((3, 5, 4), dtype),
        "src": values((5, 4), dtype, 5),
        "src_other": values((5, 4), other, 7),
        "src3": values((3, 5, 4), dtype, 2),
        "row": values((4,), dtype, 1),
        "row_other": values((4,), other, 2),
        "col": values((5,), dtype, 3),
        "col_other": values((5,), other, 3),
        "diag": values((4,), dtype, 9),
        "diag_other": values((4,), other, 9),
    }
    for it in INDEX_DTYPES:
        for k, v in INDEX_1D.items():
            pool[f"i1_{k}_{_name(it)}"] = torch.tensor(v, dtype=it)
        for k, v in INDEX_2D.items():
            pool[f"i2_{k}_{_name(it)}"] = torch.as_tensor(v).to(it)
    return pool


def gather_scatter_cases() -> list[Case]:
    """gather, take_along_dim, scatter (src, value, reduce), scatter_add, scatter_reduce."""
    cases = []
    for it in INDEX_DTYPES:
        for pat in INDEX_2D:
            i = f"i2_{pat}_{_name(it)}"
            tag = f"{pat} {_name(it)}"
            cases += [
                Case(f"gather(x, 1, {tag})", lambda p, i=i: torch.gather(p["x"], 1, p[i])),
                Case(f"gather(x, 0, {tag}.T)", lambda p, i=i: torch.gather(p["x"], 0, p[i].T)),
                Case(f"gather(x, -1, {tag})", lambda p, i=i: torch.gather(p["x"], -1, p[i])),
                Case(
                    f"take_along_dim(x, {tag}, 1)",
                    lambda p, i=i: torch.take_along_dim(p["x"], p[i], 1),
                ),
                Case(
                    f"take_along_dim(x, {tag}.abs())",
                    lambda p, i=i: torch.take_along_dim(p["x"], p[i].abs()),
                ),
                Case(
                    f"scatter(x, 1, {tag}, 5)",  # one value: defined with duplicates
                    lambda p, i=i: torch.scatter(p["x"], 1, p[i], 5),
                ),
                Case(
                    f"scatter_add(x, 1, {tag}, src)",
                    lambda p, i=i: torch.scatter_add(p["x"], 1, p[i], p["src"]),
                ),
                Case(
                    f"scatter_add(x, 0, {tag}.T, src)",
                    lambda p, i=i: torch.scatter_add(p["x"], 0, p[i].T, p["src"]),
                ),
                Case(
                    f"scatter(x, 1, {tag}, src, reduce='add')",
                    lambda p, i=i: torch.scatter(p["x"], 1, p[i], p["src"], reduce="add"),
                ),
                Case(
                    f"scatter(x, 1, {tag}, src, reduce='multiply')",
                    lambda p, i=i: torch.scatter(p["x"], 1, p[i], p["src"], reduce="multiply"),
                ),
            ]
            if pat not in DUPLICATED:
                cases.append(
                    Case(
                        f"scatter(x, 1, {tag}, src)",
                        lambda p, i=i: torch.scatter(p["x"], 1, p[i], p["src"]),
                    )
                )
            for reduce in ("sum", "prod", "mean", "amax", "amin"):
                for include_self in (True, False):
                    cases.append(
                        Case(
                            f"scatter_reduce(x, 1, {tag}, src, {reduce}, {include_self})",
                            lambda p, i=i, r=reduce, s=include_self: torch.scatter_reduce(
                                p["x"], 1, p[i], p["src"], r, include_self=s
                            ),
                        )
                    )
    return cases


# Forms along one dimension: ``{i}`` is a 1-D index pattern (n entries), ``p`` the pool.
F = torch.nn.functional
ALONG_DIM = {
    "index_select(x, 0, {i})": lambda p, i, n: torch.index_select(p["x"], 0, i),
    "index_select(x3, 1, {i})": lambda p, i, n: torch.index_select(p["x3"], 1, i),
    "x[{i}]": lambda p, i, n: p["x"][i],
    "x3[:, {i}]": lambda p, i, n: p["x3"][:, i],
    "x[{i}, {i}.flip % 4]": lambda p, i, n: p["x"][i, i.flip(0) % 4],
    "index_add(x, 0, {i}, src[:n])": lambda p, i, n: torch.index_add(p["x"], 0, i, p["src"][:n]),
    "index_add(x, 0, {i}, src[:n], alpha=2)": lambda p, i, n: torch.index_add(
        p["x"], 0, i, p["src"][:n], alpha=2
    ),
    "index_add(x3, 1, {i}, src3[:, :n])": lambda p, i, n: torch.index_add(
        p["x3"], 1, i, p["src3"][:, :n]
    ),
    "index_fill(x, 0, {i}, -2)": lambda p, i, n: torch.index_fill(p["x"], 0, i, -2),
    "index_put(x, ({i},), src[:n], accumulate=True)": lambda p, i, n: torch.index_put(
        p["x"], (i,), p["src"][:n], accumulate=True
    ),
    "index_put(x, ({i},), row, accumulate=True)": lambda p, i, n: torch.index_put(
        p["x"], (i,), p["row"], accumulate=True
    ),
    "index_put(x, ({i},), row)": lambda p, i, n: torch.index_put(p["x"], (i,), p["row"]),
    "index_put(x, (None, {i} % 4), col[:, None])": lambda p, i, n: torch.index_put(
        p["x"], (None, i % 4), p["col"][:, None]
    ),
    "x[{i}] = row_other (setitem casts)": lambda p, i, n: _setitem(p["x"], i, p["row_other"]),
    "x[{i}] += row (index_put_ accumulate)": lambda p, i, n: _iadd(p["x"], i, p["row"]),
    "embedding(x, {i})": lambda p, i, n: F.embedding(i, p["x"]),
    "embedding(x, {i}, padding_idx=1)": lambda p, i, n: F.embedding(i, p["x"], padding_idx=1),
    "embedding(x, [{i}, {i}.flip])": lambda p, i, n: F.embedding(
        torch.stack([i, i.flip(0)]), p["x"]
    ),
    "embedding_dense_backward(src[:n], {i})": lambda p, i, n: _embedding_bw(p, i, n, -1, False),
    "embedding_dense_backward(src[:n], {i}, padding_idx=1)": lambda p, i, n: _embedding_bw(
        p, i, n, 1, False
    ),
    "embedding_dense_backward(src[:n], {i}, scale_grad_by_freq)": lambda p, i, n: _embedding_bw(
        p, i, n, -1, True
    ),
}
# Forms that write each index once: torch leaves the winner among duplicates open.
ALONG_DIM_UNIQUE = {
    "index_copy(x, 0, {i}, src[:n])": lambda p, i, n: torch.index_copy(p["x"], 0, i, p["src"][:n]),
    "index_copy(x3, 1, {i}, src3[:, :n])": lambda p, i, n: torch.index_copy(
        p["x3"], 1, i, p["src3"][:, :n]
    ),
    "index_put(x, ({i},), src[:n])": lambda p, i, n: torch.index_put(p["x"], (i,), p["src"][:n]),
    "x[{i}] = src_other[:n] (setitem casts)": lambda p, i, n: _setitem(
        p["x"], i, p["src_other"][:n]
    ),
}


def along_dim_cases() -> list[Case]:
    """index_select, index_copy, index_add, index_fill, index_put / setitem, embedding
    (:data:`ALONG_DIM`, and :data:`ALONG_DIM_UNIQUE` for the patterns without duplicates)."""
    cases = []
    for it in INDEX_DTYPES:
        for pat, idx in INDEX_1D.items():
            i = f"i1_{pat}_{_name(it)}"
            tag = f"{pat} {_name(it)}"
            forms = dict(ALONG_DIM)
            if pat != "duplicates":
                forms.update(ALONG_DIM_UNIQUE)
            n = len(idx)
            for form, f in forms.items():
                cases.append(Case(form.format(i=tag), lambda p, f=f, i=i, n=n: f(p, p[i], n)))
    return cases


def _embedding_bw(p, i, n, padding_idx, scale_grad_by_freq):
    # i % 5: eager's kernel does not check its indices (a negative one corrupts the heap); the
    # forward, which does, never hands it one.
    return torch.ops.aten.embedding_dense_backward(
        p["src"][:n], i % 5, 5, padding_idx, scale_grad_by_freq
    )


def _setitem(x, i, v):
    y = x.clone()
    y[i] = v
    return y


def _iadd(x, i, v):
    y = x.clone()
    y.index_put_((i,), v, accumulate=True)
    return y


def scatter_view_cases() -> list[Case]:
    """select_scatter, slice_scatter, diagonal_scatter: every dim and sign, same-dtype and
    other-dtype sources (the result keeps the input's dtype)."""
    cases = []
    for kind in ("", "_other"):
        row, col, diag, src = f"row{kind}", f"col{kind}", f"diag{kind}", f"src{kind}"
        tag = "other dtype" if kind else "same dtype"
        for index in (0, 2, -1, -5):
            cases.append(
                Case(
                    f"select_scatter(x, {tag} row, 0, {index})",
                    lambda p, r=row, k=index: torch.select_scatter(p["x"], p[r], 0, k),
                )
            )
        for index in (1, -4):
            cases.append(
                Case(
                    f"select_scatter(x, {tag} col, 1, {index})",
                    lambda p, c=col, k=index: torch.select_scatter(p["x"], p[c], 1, k),
                )
            )
        for start, end, step in ((0, 2, 1), (1, 5, 2), (-3, None, 1), (None, None, 3)):
            cases.append(
                Case(
                    f"slice_scatter(x, {tag}, 0, {start}, {end}, {step})",
                    lambda p, s=src, a=start, b=end, c=step: torch.slice_scatter(
                        p["x"], p[s][slice(a, b, c)], 0, a, b, c
                    ),
                )
            )
            cases.append(
                Case(
                    f"slice_scatter(x, {tag}, 1, {start}, {end}, {step})",
                    lambda p, s=src, a=start, b=end, c=step: torch.slice_scatter(
                        p["x"], p[s][:, slice(a, b, c)], 1, a, b, c
                    ),
                )
            )
        for offset in (0, 1, -1, -2):
            cases.append(
                Case(
                    f"diagonal_scatter(x, {tag}, {offset})",
                    lambda p, d=diag, o=offset: torch.diagonal_scatter(
                        p["x"], p[d][: torch.diagonal(p["x"], o).shape[0]], o
                    ),
                )
            )
            cases.append(
                Case(
                    f"diagonal_scatter(x.T, {tag}, {offset}, 1, 0)",
                    lambda p, d=diag, o=offset: torch.diagonal_scatter(
                        p["x"].T, p[d][: torch.diagonal(p["x"].T, o, 1, 0).shape[0]], o, 1, 0
                    ),
                )
            )
    return cases


def _check(cases, pool):
    n, problems = run_cases(cases, pool)
    assert n > 0, "eager accepted none of the cases: the matrix tests nothing"
    assert not problems, f"{len(problems)} of {n} cases differ from eager:\n" + "\n".join(
        problems[:40]
    )


FAMILIES = {
    "gather_scatter": gather_scatter_cases,
    "along_dim": along_dim_cases,
    "scatter_views": scatter_view_cases,
}


DEFAULT_DTYPES = (torch.float32, torch.int32, torch.bool)


@pytest.mark.parametrize("dtype", DEFAULT_DTYPES, ids=_name)
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_index_ops(family, dtype):
    """One family of index ops on one input dtype, every index pattern and index dtype."""
    _check(FAMILIES[family](), pool_of(dtype))


@pytest.mark.slow
@pytest.mark.parametrize("dtype", sorted(set(DTYPES) - set(DEFAULT_DTYPES), key=str), ids=_name)
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_index_ops_other_dtypes(family, dtype):
    """The same for the input dtypes the default run leaves out (bfloat16, int64)."""
    _check(FAMILIES[family](), pool_of(dtype))


def test_issue_23_instances_through_dynamo():
    """The three instances issue 23 found, through ``torch.compile`` (Dynamo) as users run them:
    a smaller gather index, an int64 source selected into an int32 input, ``2 ** x``."""
    x = torch.randn(10, 10)
    idx = torch.tensor([[1, 9], [0, 3]])
    a = torch.zeros(3, 4, dtype=torch.int32)
    s = torch.arange(4)
    e = torch.tensor([0.849, -1.5, 2.0])
    cases = [
        Case("gather(x[10, 10], 1, idx[2, 2])", lambda p: torch.gather(p["x"], 1, p["idx"])),
        Case("select_scatter(int32, int64)", lambda p: torch.select_scatter(p["a"], p["s"], 0, 1)),
        Case("pow(10000, x)", lambda p: torch.pow(10000, p["e"])),
        Case("2 ** x", lambda p: 2 ** p["e"]),
    ]
    n, problems = run_cases(cases, {"x": x, "idx": idx, "a": a, "s": s, "e": e}, dynamo=True)
    assert n == 4 and not problems, problems


def test_embedding_backward_with_duplicates_through_autograd():
    """Embedding forward + backward compiled (duplicate and padding indices sum / drop)."""
    weight = torch.randn(6, 3, requires_grad=True)
    ids = torch.tensor([[1, 3, 1], [5, 1, 0]], dtype=torch.int32)

    def f(w, i):
        return torch.nn.functional.embedding(i, w, padding_idx=0).mul(torch.arange(3.0)).sum()

    w2 = weight.detach().clone().requires_grad_(True)
    f(weight, ids).backward()
    compiled(f)(w2, ids).backward()
    torch.testing.assert_close(w2.grad, weight.grad)
    assert w2.grad[1].abs().sum() > 0 and w2.grad[0].abs().sum() == 0

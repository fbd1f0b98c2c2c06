"""What eager refuses, the compiled program refuses (issue 29.3; tpu_inductor/lowering/refusals.py).

Each refused case runs in CPU eager (must raise) and compiled (must raise EagerRefusalError whose
message holds eager's key phrase and this file's line of the case). Each control case is one
eager accepts: compiled must accept it too, with eager's dtype, shape and values (and in-place
changes of the arguments).

Count (programs eager refuses, per family, that the compiled program refuses), printed by
``PYTHONPATH=$PWD python -m pytest -q tests/lowering/test_refusals.py -k count -s``: before
(the check switched off; what is refused then is torch's own fake-tensor check, TORCH_REFUSES)
-> after: dtype agreement 6/15 -> 15/15, index writes 2/7 -> 7/7, in-place castability
4/8 -> 8/8, dtype support 3/22 -> 22/22.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tests.helpers import check_fn, compiled
from tpu_inductor.core.errors import EagerRefusalError
from tpu_inductor.lowering import refusals


def f32(*s):
    return torch.randn(*s)


def f64(*s):
    return torch.randn(*s, dtype=torch.float64)


def i64(*s):
    return torch.arange(1, 1 + torch.Size(s).numel()).reshape(s)


def b(*s):
    return i64(*s) % 2 == 0


IDX = torch.tensor([0, 2])
MASK = torch.tensor([True, False, True, False])
LIN = torch.nn.Linear(4, 3)
CONV = torch.nn.Conv1d(2, 3, 2)

I2 = torch.tensor([[0, 1]])

# family -> [(name, fn, args, eager's key phrase)]: programs torch's fake tensors let through
# (Dynamo traces them), which eager refuses.
REFUSED = {
    "dtype agreement": [
        ("linear", lambda x: LIN(x), (f64(2, 4),), "same dtype"),
        ("F.linear weight", lambda x, w: F.linear(x, w), (f32(2, 4), f64(3, 4)), "same dtype"),
        ("mm", lambda a, c: a @ c, (f32(2, 4), f64(4, 3)), "same dtype"),
        ("addmm", torch.addmm, (f32(2, 3), f32(2, 4), f64(4, 3)), "same dtype"),
        ("matmul", torch.matmul, (f64(2, 4), f32(4)), "same dtype"),
        ("mv", torch.mv, (f64(2, 4), f32(4)), "same dtype"),
        ("cross_entropy int32", F.cross_entropy, (f32(2, 3), IDX.int()), "target dtype"),
        ("nll_loss int32", F.nll_loss, (f32(2, 3), IDX.int()), "target dtype"),
        ("index_select int16", lambda x: x.index_select(0, IDX.short()), (f32(4),), "int64"),
    ],
    "index writes": [
        ("index_put_", lambda x, v: x.index_put_((IDX,), v), (f32(4), f64(2)), "dtypes match"),
        (
            "index_put_ accumulate",
            lambda x, v: x.index_put_((IDX,), v, accumulate=True),
            (f32(4), f64(2)),
            "dtypes match",
        ),
        ("x[i] = v", lambda x, v: x.__setitem__(IDX, v), (f32(4), f64(2)), "dtypes match"),
        ("index_copy_", lambda x, v: x.index_copy_(0, IDX, v), (f32(4), f64(2)), "same dtype"),
        ("index_add_", lambda x, v: x.index_add_(0, IDX, v), (f32(4), f64(2)), "same scalar"),
    ],
    "in-place castability": [
        ("mul_ tensor", lambda x, y: x.mul_(y), (i64(4), f32(4)), "can't be cast"),
        ("*=", lambda x, y: x.__imul__(y), (i64(4), f32(4)), "can't be cast"),
        ("mul_ 0-d", lambda x, y: x.mul_(y), (i64(4), torch.tensor(2.5)), "can't be cast"),
        ("addcmul_", lambda x, y: x.addcmul_(y, y), (i64(4), f32(4)), "can't be cast"),
    ],
    "dtype support": [
        ("gelu int", F.gelu, (i64(4),), "not implemented for 'Long'"),
        ("gelu bool", F.gelu, (b(4),), "not implemented for 'Bool'"),
        ("silu int", F.silu, (i64(4),), "not implemented for 'Long'"),
        ("softmax int", lambda x: torch.softmax(x, -1), (i64(2, 3),), "not implemented"),
        ("log_softmax int", lambda x: F.log_softmax(x, -1), (i64(2, 3),), "not implemented"),
        ("var int", torch.var, (i64(4),), "floating point and complex"),
        ("std bool", torch.std, (b(4),), "floating point and complex"),
        ("abs bool", torch.abs, (b(4),), "not implemented for 'Bool'"),
        ("floor bool", torch.floor, (b(4),), "not implemented for 'Bool'"),
        ("relu bool", F.relu, (b(4),), "Boolean inputs not supported"),
        ("frac int", torch.frac, (i64(4),), "not implemented"),
        ("softplus int", F.softplus, (i64(4),), "not implemented"),
        ("hardswish int", F.hardswish, (i64(4),), "not implemented"),
        ("lerp int", lambda x: torch.lerp(x, x, 0.5), (i64(4),), "not implemented"),
        ("max_pool1d int", lambda x: F.max_pool1d(x, 2), (i64(1, 4),), "not implemented"),
        ("int ** -1", lambda x: x**-1, (i64(4),), "negative integer powers"),
        ("topk bool", lambda x: torch.topk(x, 2).values, (b(4),), "bool"),
        ("argmax bool", torch.argmax, (b(4),), "bool"),
        ("matmul bool", lambda x: x @ x, (b(2, 2),), "not implemented for 'Bool'"),
    ],
}

# The same families where torch's fake tensors refuse already (Dynamo raises its
# TorchRuntimeError before any backend runs): kept so the matrix shows the whole family.
TORCH_REFUSES = {
    "dtype agreement": [
        ("bmm", torch.bmm, (f32(2, 2, 4), f64(2, 4, 3))),
        ("baddbmm", torch.baddbmm, (f32(2, 2, 3), f32(2, 2, 4), f64(2, 4, 3))),
        ("addmv", torch.addmv, (f32(2), f64(2, 4), f32(4))),
        ("dot", torch.dot, (f64(4), f32(4))),
        ("conv1d", lambda x: CONV(x), (f64(1, 2, 5),)),
        ("einsum", lambda a, c: torch.einsum("ij,jk->ik", a, c), (f32(2, 4), f64(4, 3))),
    ],
    "index writes": [
        ("scatter_", lambda x, v: x.scatter_(1, I2, v), (f32(2, 4), f64(2, 4))),
        ("masked_scatter_", lambda x, v: x.masked_scatter_(MASK, v), (f32(4), f64(4))),
    ],
    "in-place castability": [
        ("add_ number", lambda x: x.add_(0.5), (i64(4),)),
        ("bool add_ int", lambda x, y: x.add_(y), (b(4), i64(4))),
        ("int div_", lambda x, y: x.div_(y), (i64(4), i64(4))),
        ("int sigmoid_", lambda x: x.sigmoid_(), (i64(4),)),
    ],
    "dtype support": [
        ("layer_norm int", lambda x: F.layer_norm(x, (4,)), (i64(2, 4),)),
        ("mean int", torch.mean, (i64(4),)),
        ("elu int", F.elu, (i64(4),)),
    ],
}

# Eager accepts these: so must we, with eager's numbers.
ACCEPTED = [
    ("sigmoid int", torch.sigmoid, (i64(4),)),
    ("erf int", torch.erf, (i64(4),)),
    ("exp bool", torch.exp, (b(4),)),
    ("abs int", torch.abs, (i64(4),)),
    ("floor int", torch.floor, (i64(4),)),
    ("int * float", lambda x, y: x * y, (i64(4), f32(4))),
    ("float mul_ int", lambda x, y: x.mul_(y), (f32(4), i64(4))),
    ("int add_ int", lambda x, y: x.add_(y), (i64(4), i64(4))),
    ("float add_ float64", lambda x, y: x.add_(y), (f32(4), f64(4))),
    ("f32 + f64", lambda x, y: x + y, (f32(4), f64(4))),
    ("where mixed", lambda m, x, y: torch.where(m, x, y), (b(4), f32(4), f64(4))),
    ("linear", lambda x: LIN(x), (f32(2, 4),)),
    ("index_put_ number", lambda x: x.index_put_((IDX,), torch.tensor(2.5)), (f32(4),)),
    ("setitem int by number", lambda x: x.__setitem__(IDX, 2.5), (i64(4),)),
    ("setitem slice f64", lambda x, v: x.__setitem__(slice(0, 2), v), (f32(4), f64(2))),
    ("masked_fill", lambda x: x.masked_fill(MASK, 1.5), (i64(4),)),
    ("embedding", lambda i, w: F.embedding(i, w), (IDX, f32(4, 3))),
    ("index_select", lambda x: x.index_select(0, IDX), (f32(4, 2),)),
    ("int ** 2", lambda x: x**2, (i64(4),)),
    ("int // int", lambda x, y: x // y, (i64(4), i64(4))),
    ("bool & bool", lambda x, y: x & y, (b(4), b(4))),
    ("copy_ f64 into f32", lambda x, y: x.copy_(y), (f32(4), f64(4))),
]

CASES = [(fam, *case) for fam, cases in REFUSED.items() for case in cases]


def _clone(args):
    return tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in args)


def _line(fn) -> str:
    return f'test_refusals.py", line {fn.__code__.co_firstlineno}'


@pytest.mark.parametrize("family,name,fn,args,phrase", CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_refused(family, name, fn, args, phrase):
    with pytest.raises(Exception, match=None) as eager:
        fn(*_clone(args))
    assert phrase in str(eager.value), f"eager's message changed: {eager.value}"
    with pytest.raises(EagerRefusalError) as ours:
        compiled(fn)(*_clone(args))
    message = str(ours.value)
    assert phrase in message, message
    if fn.__name__ == "<lambda>":  # a torch function itself is called from Dynamo's frame
        assert _line(fn) in message, message
    else:
        assert "test_refusals.py" in message or "refuses" in message
    assert [phrase in msg for _, msg, _ in ours.value.refused] == [True]


@pytest.mark.parametrize("name,fn,args", ACCEPTED, ids=[c[0] for c in ACCEPTED])
def test_accepted(name, fn, args):
    check_fn(fn, *_clone(args))


TORCH_CASES = [(fam, *case) for fam, cases in TORCH_REFUSES.items() for case in cases]


@pytest.mark.parametrize(
    "family,name,fn,args", TORCH_CASES, ids=[f"{c[0]}-{c[1]}" for c in TORCH_CASES]
)
def test_refused_by_torch(family, name, fn, args):
    with pytest.raises(RuntimeError):
        fn(*_clone(args))
    with pytest.raises(torch._dynamo.exc.TorchRuntimeError):
        compiled(fn)(*_clone(args))


def _refused(fn, args) -> bool:
    torch._dynamo.reset()
    try:
        compiled(fn)(*_clone(args))
    except (EagerRefusalError, torch._dynamo.exc.TorchRuntimeError):
        return True
    except Exception:  # another error (a lowering failing mid-trace): not refused as eager
        return False
    return False


def test_count(monkeypatch, capsys):
    """Families x cases the compiled program refuses as eager does, with the check off
    (before) and on (after)."""
    counts = {}
    for on in (False, True):
        if on:
            monkeypatch.undo()
        else:
            monkeypatch.setattr(refusals, "check_graph", lambda gm: None)
        for family, _name, fn, args, *_ in CASES + TORCH_CASES:
            done, total = counts.get((family, on), (0, 0))
            counts[family, on] = (done + _refused(fn, args), total + 1)
    with capsys.disabled():
        for family in REFUSED:
            before, after = counts[family, False], counts[family, True]
            print(f"\n{family}: {before[0]}/{before[1]} -> {after[0]}/{after[1]} refused")
    for family in REFUSED:
        assert counts[family, True][0] == counts[family, True][1], family
        assert counts[family, False][0] == len(TORCH_REFUSES[family]), family


def test_stand_in_failures_refuse_nothing():
    """A try that fails whatever the dtypes (here: windows longer than the size-1 stand-ins of
    a large integer input) refuses nothing."""
    check_fn(lambda x: x.unfold(0, 3, 1).sum(-1), i64(1 << 15))


def test_autocast_regions_are_tried_under_autocast():
    """Mixed dtypes eager's autocast reconciles (inside the compiled region, or around the
    call) are accepted, with eager's numbers."""

    def inside(x, w):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return x.bfloat16() @ w

    check_fn(inside, f32(2, 4), f32(4, 3), atol=1e-2, rtol=1e-2)

    def around(x, w):
        return x.bfloat16() @ w

    with torch.autocast("cpu", dtype=torch.bfloat16):
        check_fn(around, f32(2, 4), f32(4, 3), atol=1e-2, rtol=1e-2)
    with pytest.raises(EagerRefusalError, match="same dtype"):  # outside autocast: refused
        compiled(around)(f32(2, 4), f32(4, 3))

"""Graph breaks are said once per site (tpu_inductor/dynamo/breaks.py), and a clipped, scheduled
``opt.step()`` inside one compiled function is one program from its first call."""

from __future__ import annotations

import logging
import warnings

import pytest
import torch

import tpu_inductor
from tests.helpers import assert_same
from tpu_inductor.dynamo import breaks


@pytest.fixture(autouse=True)
def _fresh():
    torch._dynamo.reset()
    tpu_inductor.reset()
    breaks._SAID.clear()
    yield
    torch._dynamo.reset()


def _said(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "graph break" in r.getMessage()]


def test_graph_break_is_said_once_with_line_cost_and_fix(caplog):
    def f(x):
        y = x * 2
        print("not traceable")  # the break
        return y + 1

    cf = torch.compile(f, backend="tpu")
    x = torch.randn(100)
    with caplog.at_level(logging.WARNING, logger="tpu_inductor.progress"):
        for _ in range(3):
            assert_same(cf(x), f(x))
    said = _said(caplog)
    assert len(said) == 1, said
    line = f.__code__.co_firstlineno + 2
    assert f"test_breaks.py:{line}" in said[0], said[0]
    assert "print" in said[0]
    assert "400 B leave the program" in said[0]  # y: 100 float32
    assert "Fix:" in said[0]


def test_a_break_without_fix_in_the_table_gives_dynamos_hint():
    assert breaks._fix("Something\n  Hint: do X.\n  Hint: do Y") == "do X"
    assert "skip_fwd_side_effects" in breaks._fix(
        "HOP: Unsafe side effect\n Explanation: Mutating a variable from outside the scope of "
        "this HOP is not supported."
    )


def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))


class _Trainer:
    """Steps ``self.opt``: the optimizer is an attribute of a value the compiled frame reads."""

    def __init__(self, model, opt):
        self.model, self.opt = model, opt

    def update(self):
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 0.5)
        self.opt.step()


def _step_elsewhere(params, opts):
    torch.nn.utils.clip_grad_norm_(params, 0.5)
    opts[0].step()  # the optimizer is in this helper's locals only: found at its own frame


def _train(compiled: bool, steps: int = 4, opt_cls=torch.optim.AdamW, where="closure"):
    transformers = pytest.importorskip("transformers")
    model = _mlp()
    opt = opt_cls(model.parameters(), lr=torch.tensor(1e-2))
    sched = transformers.get_linear_schedule_with_warmup(opt, 2, 10)

    def update():
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        opt.step()

    if where == "attribute":
        update = _Trainer(model, opt).update
    elif where == "helper":
        params, opts = list(model.parameters()), [opt]

        def update():
            _step_elsewhere(params, opts)

    if compiled:
        update = torch.compile(update, backend="tpu")
    g = torch.Generator().manual_seed(1)
    programs, broke = [], []
    counters = torch._dynamo.utils.counters["graph_break"]
    for _ in range(steps):
        x = torch.randn(4, 8, generator=g)
        model(x).pow(2).sum().backward()
        before, breaks_before = (
            len(tpu_inductor.report(False).graphs),
            sum(counters.values()),
        )
        update()
        programs.append(len(tpu_inductor.report(False).graphs) - before)
        broke.append(sum(counters.values()) - breaks_before)
        sched.step()
        opt.zero_grad()
    return model, opt, programs, broke


@pytest.mark.parametrize("where", ["closure", "attribute", "helper"])
def test_clip_and_scheduled_step_are_one_program(caplog, where):
    ref, ref_opt, _, _ = _train(compiled=False)
    torch._dynamo.reset()
    tpu_inductor.reset()
    with (
        caplog.at_level(logging.WARNING, logger="tpu_inductor.progress"),
        warnings.catch_warnings(),
    ):
        warnings.filterwarnings("error", message=".*lr_scheduler.step.*before.*optimizer.step")
        model, opt, programs, broke = _train(compiled=True, where=where)
        _train_more = model(torch.randn(4, 8)).sum()  # the model still works eagerly
        del _train_more
    if where == "helper":
        # the optimizer is found only when Dynamo compiles its step as a frame: call 1 is
        # clipping and the step apart (2 programs); call 2 compiles the joined step once
        assert programs == [2, 1, 0, 0], programs
    else:
        # call 1: the break at opt.step() restarts the trace with the step joined and the
        # optimizer state made (1 program, the steady one); then nothing new
        assert programs == [1, 0, 0, 0], programs
    assert not _said(caplog), _said(caplog)  # the joinable break is not a warning
    assert broke[1:] == [0, 0, 0], broke  # Dynamo breaks on the first call at most
    for p, q in zip(model.parameters(), ref.parameters(), strict=True):
        assert_same(p.detach(), q.detach())
    assert opt.state_dict()["state"].keys() == ref_opt.state_dict()["state"].keys()
    assert getattr(opt.step, "_wrapped_by_lr_sched", False)  # a second scheduler won't rewrap


def test_an_optimizer_step_that_cant_join_says_so_once(caplog):
    with caplog.at_level(logging.WARNING, logger="tpu_inductor.progress"):
        _train(compiled=True, steps=3, opt_cls=torch.optim.RMSprop)
    said = [r.getMessage() for r in caplog.records if "RMSprop.step()" in r.getMessage()]
    assert len(said) == 1, [r.getMessage() for r in caplog.records]


def _nested(x):
    print("not traceable", end="")  # the break: inside a call with no op before it
    return torch.sin(x) * 2


def test_a_break_that_hands_the_backend_no_graph_is_said(caplog, capsys):
    """The break is in a nested call that is the frame's first op: the frame's graph before it is
    empty and so is the nested frame's, so no graph reaching the backend ends at it (silent
    before Dynamo's record of breaks was read; transformers' checkpointed layers under the
    kernels package break this way)."""

    def f(x):
        return _nested(x).sum() + 1

    cf = torch.compile(f, backend="tpu")
    x = torch.randn(8)
    with caplog.at_level(logging.WARNING, logger="tpu_inductor.progress"):
        for _ in range(2):
            out = cf(x)
    said = _said(caplog)
    assert len(said) == 1, said
    assert f"test_breaks.py:{f.__code__.co_firstlineno + 1}" in said[0], said[0]
    assert "print" in said[0] and "runs in Python" in said[0], said[0]
    assert_same(out, f(x))

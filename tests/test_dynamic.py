"""Changing shapes: dynamic graphs specialized per shape, shape buckets, warm-up, threads."""

from __future__ import annotations

import threading
import warnings

import pytest
import torch
import torch.nn as nn
from torch._dynamo.utils import counters

import tpu_inductor
from tests.helpers import assert_same
from tpu_inductor.runtime import cache
from tpu_inductor.runtime.buckets import PaddingWarning, bucket


def _graphs(kind="inference"):
    return [g for g in tpu_inductor.report(print_table=False).graphs if g.name.endswith(kind)]


def test_twenty_batch_sizes_one_dynamo_graph_twenty_executables():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4)).eval()
    cm = torch.compile(model, backend="tpu", dynamic=True)
    counters.clear()
    with torch.no_grad():
        for batch in range(2, 22):
            x = torch.randn(batch, 8)
            assert_same(cm(x), model(x))
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])
    graphs = _graphs()
    assert len(graphs) == 1 and graphs[0].executables == 20
    assert "input" in graphs[0].builds[1][0] and "[2, 8] -> " in graphs[0].builds[1][0]


def test_mark_dynamic_training_with_symint_inputs_and_shape_arithmetic():
    torch.manual_seed(0)
    lin = nn.Linear(6, 6)

    def fn(x):
        n = x.shape[0]
        y = lin(x).view(n * 2, 3).sum(0) / n
        return y, torch.arange(n).float() * x.shape[1]

    cf = torch.compile(fn, backend="tpu")
    for n in (3, 5, 9):
        x = torch.randn(n, 6, requires_grad=True)
        torch._dynamo.mark_dynamic(x, 0)
        y, r = cf(x)
        ye, re_ = fn(x)
        assert_same(y, ye)
        assert_same(r, re_)
        (g,) = torch.autograd.grad(y.sum(), x)
        (ge,) = torch.autograd.grad(ye.sum(), x)
        assert_same(g, ge)


def test_lru_bound_on_executables():
    f = torch.compile(lambda x: x * 2, backend="tpu", dynamic=True, options={"max_executables": 3})
    for n in range(2, 8):
        assert_same(f(torch.ones(n)), torch.full((n,), 2.0))
    g = _graphs()[0]
    assert g.executables == 3 and g.evictions == 3 and len(g.builds) == 6


def test_pad_to_buckets_causal_decoder_lengths_1_to_64():
    torch.manual_seed(0)

    class Decoder(nn.Module):
        def __init__(self, d=32):
            super().__init__()
            self.emb = nn.Embedding(50, d)
            self.qkv = nn.Linear(d, 3 * d)
            self.norm = nn.LayerNorm(d)
            self.out = nn.Linear(d, 50)

        def forward(self, ids):
            x = self.emb(ids)
            q, k, v = self.qkv(self.norm(x)).chunk(3, -1)
            a = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.out(x + a)

    model = Decoder().eval()
    cm = torch.compile(model, backend="tpu", dynamic=True, options={"pad_to": "pow2"})
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error", PaddingWarning)
        for length in range(1, 65):
            ids = torch.randint(0, 50, (2, length))
            assert_same(cm(ids), model(ids))
    total = sum(g.executables for g in _graphs())
    assert total <= 7, [(g.name, g.executables) for g in _graphs()]


def test_pad_to_detects_unsafe_padding_and_falls_back_to_exact_shapes():
    f = torch.compile(lambda x: x.mean(1), backend="tpu", dynamic=True, options={"pad_to": [8, 16]})
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        for n in (3, 5, 6, 7, 9):
            x = torch.randn(2, n)
            assert_same(f(x), x.mean(1))
    assert sum(issubclass(w.category, PaddingWarning) for w in rec) == 1


def test_pad_to_leaves_training_graphs_exact():
    """A training step under ``pad_to``: eager's gradients at every size, no padding warning
    (the backward is not padded: its exact-shape check would read the forward's saved
    activations' host placeholders, and gave wrong gradients before)."""
    torch.manual_seed(0)
    lin = nn.Linear(16, 50)

    def step(x, y):
        logits = lin(x)
        return nn.functional.cross_entropy(logits, y), logits

    f = torch.compile(step, backend="tpu", dynamic=True, options={"pad_to": "pow2"})
    with warnings.catch_warnings():
        warnings.simplefilter("error", PaddingWarning)
        for n in (8, 13, 21, 8):
            x, y = torch.randn(n, 16), torch.randint(0, 50, (n,))
            grads = []
            for fn in (f, step):
                lin.zero_grad()
                fn(x, y)[0].backward()
                grads.append([p.grad.clone() for p in lin.parameters()])
            assert_same(grads[0], grads[1], what=f"grads at {n}")


def test_bucket_sizes():
    assert [bucket(n, "pow2") for n in (1, 2, 3, 5, 64, 65)] == [1, 2, 4, 8, 64, 128]
    assert [bucket(n, (8, 32)) for n in (1, 8, 9, 33)] == [8, 8, 32, 33]


def test_warmup_builds_executables_ahead_and_in_background():
    model = nn.Linear(4, 3).eval()
    cm = torch.compile(model, backend="tpu", dynamic=True)
    tpu_inductor.warmup(cm, [(2, 4), (3, 4), (5, 4)])
    builds = sum(len(g.builds) for g in _graphs())
    with torch.no_grad():
        for n in (2, 3, 5):
            x = torch.randn(n, 4)
            assert_same(cm(x), model(x))
    assert sum(len(g.builds) for g in _graphs()) == builds, "a warmed-up shape was rebuilt"
    future = tpu_inductor.warmup(cm, [(7, 4)], background=True)
    assert future.result(timeout=300) == 1


def test_threads_share_one_compile_per_executable():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 16)).eval()
    cm = torch.compile(model, backend="tpu")
    inputs = [torch.randn(4, 16) for _ in range(8)]
    results, errors = {}, []

    def worker(i):
        try:
            with torch.no_grad():
                for _ in range(5):
                    results[i] = cm(inputs[i])
        except Exception as e:  # surfaced below
            errors.append(e)

    traces = cache.STATS.traces
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    with torch.no_grad():
        for i, x in enumerate(inputs):
            assert_same(results[i], model(x))
    assert cache.STATS.traces - traces == 1, "the executable was compiled more than once"


@pytest.mark.parametrize("bad", [{"pad_to": "pow3"}, {"max_executables": 0}])
def test_bad_shape_options(bad):
    from tpu_inductor.core.errors import InvalidOptionError
    from tpu_inductor.dynamo.options import parse_options

    with pytest.raises(InvalidOptionError):
        parse_options(bad)

"""Linear layers over ``[..., K]`` activations without flattening (lowering/leading_dims.py).

The rewrite runs for TPUs only; here it is switched on for the CPU so its numbers are compared
with eager's (forward, every gradient), and the graph is checked to be rewritten. What it does
to the TPU program is checked in tests/tpu/test_levers.py.
"""

from __future__ import annotations

import pytest
import torch

import tpu_inductor
from tpu_inductor.lowering import leading_dims
from tpu_inductor.lowering.lowerings import linalg

NEW = (linalg.matmul_leading, linalg.addmm_leading, linalg.mm_leading)


class _Block(torch.nn.Module):
    """Linear -> GELU -> Linear (no bias) over [B, T, K], and a read of the flattened input by
    something other than a product (its view must stay)."""

    def __init__(self, k: int = 16, n: int = 24):
        super().__init__()
        self.fc1 = torch.nn.Linear(k, n)
        self.fc2 = torch.nn.Linear(n, k, bias=False)

    def forward(self, x):
        y = self.fc2(torch.nn.functional.gelu(self.fc1(x)))
        return y + x.reshape(-1, x.shape[-1]).sum(0)


@pytest.fixture
def on_cpu(monkeypatch):
    """The rewrite on for the CPU too; yields the rewritten nodes' targets, graph by graph."""
    seen: list[list] = []
    rewrite = leading_dims.keep_leading_dims

    def spy(gm):
        n = rewrite(gm)
        seen.append([node.target for node in gm.graph.nodes if node.target in NEW])
        return n

    monkeypatch.setattr(leading_dims, "keep_leading_dims", spy)
    torch._dynamo.reset()
    tpu_inductor.reset()
    with tpu_inductor.config.patch(leading_dims_platforms=("tpu", "cpu")):
        yield seen
    torch._dynamo.reset()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(2, 5, 16), (3, 2, 7, 16)])
def test_training_matches_eager(on_cpu, dtype, shape):
    torch.manual_seed(0)
    block = _Block().to(dtype)
    x = torch.randn(*shape, dtype=dtype, requires_grad=True)
    ref = block(x).square().mean()
    ref.backward()
    want = [p.grad.clone() for p in block.parameters()] + [x.grad.clone()]
    block.zero_grad(set_to_none=True)
    x.grad = None
    out = torch.compile(lambda x: block(x).square().mean(), backend="tpu")(x)
    out.backward()
    got = [p.grad for p in block.parameters()] + [x.grad]
    tol = dict(rtol=2e-2, atol=2e-2) if dtype == torch.bfloat16 else dict(rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out, ref, **tol)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape
        torch.testing.assert_close(g, w, **tol)
    joint, forward, backward = on_cpu  # rewritten before AOTAutograd splits it, then each part
    assert linalg.addmm_leading in forward and linalg.matmul_leading in forward
    # input gradients, and weight gradients from the unflattened activations the forward saved
    assert backward.count(linalg.matmul_leading) == 2
    assert backward.count(linalg.mm_leading) == 2


def test_one_program_step_rewrites_weight_gradients(on_cpu):
    """In one program (compile_step) the weight gradient contracts the unflattened
    activation and gradient (``mm_leading``), and the step matches eager's."""
    torch.manual_seed(0)
    block, ref_block = _Block(), _Block()
    ref_block.load_state_dict(block.state_dict())
    x = torch.randn(2, 5, 16)
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (block, ref_block)]

    def step(model, opt, x):
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    compiled = tpu_inductor.compile_step(lambda x: step(block, opts[0], x), opts[0])
    for _ in range(2):
        got, want = compiled(x), step(ref_block, opts[1], x)
        torch.testing.assert_close(got, want.detach(), rtol=1e-5, atol=1e-5)
    for p, q in zip(block.parameters(), ref_block.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-5)
    (graph,) = on_cpu
    assert graph.count(linalg.mm_leading) == 2  # fc1's and fc2's weight gradients


def test_off_the_tpu_nothing_is_rewritten():
    torch._dynamo.reset()
    tpu_inductor.reset()
    assert "cpu" not in tpu_inductor.config.get("leading_dims_platforms")
    block = _Block()
    x = torch.randn(2, 5, 16)
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(block, backend="tpu")(x), block(x))


def test_logits_widened_for_a_float32_loss_stay_flattened(on_cpu):
    """A head whose logits are converted to float32 and log-softmaxed keeps its 2-D products,
    forward and backward (``_widened_layers``); the layer before it is rewritten. Numbers as
    eager's."""
    torch.manual_seed(0)
    body = torch.nn.Linear(16, 16).to(torch.bfloat16)
    head = torch.nn.Linear(16, 32, bias=False).to(torch.bfloat16)
    x = torch.randn(2, 5, 16, dtype=torch.bfloat16)
    labels = torch.randint(0, 32, (10,))

    def loss_of(x):
        logits = head(body(x)).float()
        return torch.nn.functional.cross_entropy(logits.view(-1, 32), labels)

    ref = loss_of(x)
    ref.backward()
    want = [p.grad.clone() for p in (*body.parameters(), *head.parameters())]
    for p in (*body.parameters(), *head.parameters()):
        p.grad = None
    out = torch.compile(loss_of, backend="tpu")(x)
    out.backward()
    torch.testing.assert_close(out, ref, rtol=2e-2, atol=2e-2)
    for p, w in zip((*body.parameters(), *head.parameters()), want, strict=True):
        torch.testing.assert_close(p.grad, w, rtol=2e-2, atol=2e-2)
    joint, forward, backward = on_cpu
    assert forward == [linalg.addmm_leading]  # the body's; the head's product stays 2-D
    assert linalg.mm_leading in backward  # the body's weight gradient
    assert backward.count(linalg.matmul_leading) == 0  # the head's input gradient stays 2-D

"""Backward passes and random ops the OpInfo suite does not reach (it runs forward only):
grid sampling, max pooling with and without indices, adaptive/fractional max pooling,
EmbeddingBag, the bilinear layer, the fused linear cross-entropy, and randperm/multinomial/rrelu
statistics."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tests.helpers import assert_same, compiled, set_knobs


def _grads(fn, *args):
    """fn's output and the gradients of a fixed random projection of it w.r.t. float args."""
    args = [a.detach().clone().requires_grad_(a.is_floating_point()) for a in args]
    out = fn(*args)
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(1), dtype=out.dtype)
    wrt = [a for a in args if a.requires_grad]
    return out, torch.autograd.grad(out, wrt, g)


def _check_grads(fn, *args, atol=1e-5, rtol=1e-4):
    torch._dynamo.reset()
    out, grads = _grads(torch.compile(fn, backend="tpu"), *args)
    ref, ref_grads = _grads(fn, *args)
    assert_same(out, ref, atol, rtol)
    assert_same(grads, ref_grads, atol, rtol, what="grads")


@pytest.mark.parametrize("dims", [2, 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.int32])
@pytest.mark.parametrize("return_indices", [False, True])
def test_max_pool_values_with_and_without_indices(dims, dtype, return_indices):
    """Without indices (inference) the values come from a plain max window: same values as
    eager, NaN still wins, padding never does; with indices, torch's first-max indices."""
    torch.manual_seed(0)
    shape = (2, 3) + (9, 8, 7)[:dims]
    x = torch.randint(-3, 3, shape).to(dtype)  # many ties
    if dtype.is_floating_point:
        x[0, 0, 1, 1] = float("nan")
        x = x - 10.0  # every value negative: a zero-padded window would be wrong
    pool = F.max_pool2d if dims == 2 else F.max_pool3d
    fn = lambda x: pool(x, 3, 2, 1, ceil_mode=True, return_indices=return_indices)  # noqa: E731
    assert_same(compiled(fn)(x), fn(x))
    if dtype.is_floating_point and not return_indices:
        _check_grads(lambda x: pool(x.nan_to_num(), 3, 2, 1), x)  # training keeps the indices


@pytest.mark.parametrize(
    "dims, kernel, stride, padding, dilation, ceil_mode",
    [
        (2, 3, 2, 1, 1, False),  # ResNet's stem pool
        (2, (3, 2), (2, 1), (1, 0), (1, 2), True),  # overlapping, dilated, a partial last window
        (2, 2, None, 0, 1, False),  # stride = kernel: no overlap
        (3, 3, 2, 1, 1, True),
        (2, 9, 1, 0, 1, False),  # 81 offsets: the scatter-add path
    ],
)
def test_max_pool_backward_sums_each_inputs_gradients(
    dims, kernel, stride, padding, dilation, ceil_mode
):
    """max_pool*_with_indices_backward: each input gets the summed gradients of every output
    whose saved index it is (many ties: one input is the max of several windows), per window
    offset (pad + select) or, past 64 offsets, by a scatter-add."""
    torch.manual_seed(0)
    x = torch.randint(0, 3, (2, 3) + (10, 9, 8)[:dims]).float()
    pool = F.max_pool2d if dims == 2 else F.max_pool3d

    def fn(x):
        return pool(x, kernel, stride, padding, dilation, ceil_mode)

    _check_grads(fn, x)
    # bf16: summed in float32 and rounded once; torch's kernel rounds after each add
    _check_grads(fn, x.bfloat16(), atol=1e-2, rtol=2e-2)


@pytest.mark.parametrize(
    "dims, stride, padding, dilation",
    [(2, 2, 3, 1), (2, (2, 3), (1, 0), (1, 2)), (1, 3, 2, 1), (3, 2, 1, 1)],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_strided_stem_conv_weight_grad_by_patches(
    dims, stride, padding, dilation, dtype, monkeypatch
):
    """A strided convolution over 3 channels (a CNN stem) takes its weight gradient as patches
    x output gradient (one dot; on TPUs only, forced here): the input, weight and bias
    gradients equal eager's."""
    set_knobs(monkeypatch, conv_patches_platforms=("tpu", "cpu"))
    torch.manual_seed(0)
    conv = (torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d)[dims - 1]
    layer = conv(3, 8, (5, 4, 3)[:dims], stride, padding, dilation).to(dtype)
    x = torch.randn((2, 3) + (17, 14, 9)[:dims], dtype=dtype)
    tol = {"atol": 1e-4, "rtol": 1e-4} if dtype == torch.float32 else {"atol": 0.1, "rtol": 2e-2}
    _check_grads(lambda x, w, b: layer._conv_forward(x, w, b), x, layer.weight, layer.bias, **tol)


@pytest.mark.parametrize("mode", ["bilinear", "nearest", "bicubic"])
@pytest.mark.parametrize("padding_mode", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align_corners", [False, True])
def test_grid_sample_2d_backward(mode, padding_mode, align_corners):
    torch.manual_seed(0)
    x = torch.randn(2, 3, 7, 9)
    grid = torch.rand(2, 5, 6, 2) * 2.4 - 1.2  # some points fall outside [-1, 1]

    def fn(x, grid):
        return F.grid_sample(
            x, grid, mode=mode, padding_mode=padding_mode, align_corners=align_corners
        )

    _check_grads(fn, x, grid, atol=1e-4)


def test_grid_sample_3d_backward():
    torch.manual_seed(0)
    x = torch.randn(2, 3, 4, 5, 6)
    grid = torch.rand(2, 3, 4, 2, 3) * 2.4 - 1.2
    _check_grads(lambda x, g: F.grid_sample(x, g, align_corners=False), x, grid, atol=1e-4)


def test_grid_sample_bfloat16_matches_eager_exactly():
    # torch's CPU kernel rounds every bfloat16 operation; the lowering replays that.
    torch.manual_seed(0)
    x = torch.randn(2, 3, 5, 20).bfloat16()
    grid = (torch.rand(2, 13, 10, 2) * 2.2 - 1.1).bfloat16()
    for mode in ("bilinear", "nearest", "bicubic"):
        for padding_mode in ("zeros", "border", "reflection"):

            def fn(x, g, mode=mode, padding_mode=padding_mode):
                return F.grid_sample(
                    x, g, mode=mode, padding_mode=padding_mode, align_corners=False
                )

            torch._dynamo.reset()
            assert_same(compiled(fn)(x, grid), fn(x, grid), atol=0, rtol=0, what=mode)


def test_antialiased_resize_backward():
    torch.manual_seed(0)
    x = torch.randn(2, 3, 10, 20)
    _check_grads(lambda x: F.interpolate(x, size=(4, 13), mode="bilinear", antialias=True), x)


@pytest.mark.parametrize("output_size", [(4, 5), (1, 1), (15, 17)])
def test_adaptive_max_pool2d_indices_and_backward(output_size):
    torch.manual_seed(0)
    x = torch.randn(2, 3, 11, 13)
    x[1, 1] = x[1, 1].round()  # ties: torch keeps the first maximum
    fn = lambda x: F.adaptive_max_pool2d(x, output_size, return_indices=True)  # noqa: E731
    assert_same(compiled(fn)(x), fn(x), atol=0, rtol=0)
    _check_grads(lambda x: F.adaptive_max_pool2d(x, output_size), x)


def test_fractional_max_pool_given_samples_matches_eager():
    torch.manual_seed(0)
    x = torch.randn(2, 3, 11, 13)
    samples = torch.rand(2, 3, 2)

    def fn(x, s):
        return F.fractional_max_pool2d(
            x, (2, 3), output_size=(5, 6), return_indices=True, _random_samples=s
        )

    assert_same(compiled(fn)(x, samples), fn(x, samples), atol=0, rtol=0)
    x3, samples3 = torch.randn(2, 2, 5, 7, 6), torch.rand(2, 2, 3)

    def fn3(x, s):
        return F.fractional_max_pool3d(
            x, (2, 2, 3), output_size=(3, 4, 2), return_indices=True, _random_samples=s
        )

    assert_same(compiled(fn3)(x3, samples3), fn3(x3, samples3), atol=0, rtol=0)
    _check_grads(lambda x: fn(x, samples)[0], x)


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
@pytest.mark.parametrize("padding_idx", [None, 2])
def test_embedding_bag_training(mode, padding_idx):
    torch.manual_seed(0)
    bag = torch.nn.EmbeddingBag(10, 3, mode=mode, padding_idx=padding_idx)
    indices = torch.tensor([1, 2, 4, 5, 4, 3, 2, 9])
    offsets = torch.tensor([0, 4, 4, 6])  # bag 1 is empty
    psw = torch.rand(8) if mode == "sum" else None

    def fn(weight, *rest):
        p = rest[0] if rest else None
        return F.embedding_bag(
            indices, weight, offsets, mode=mode, per_sample_weights=p, padding_idx=padding_idx
        )

    args = (bag.weight.detach(),) + ((psw,) if psw is not None else ())
    _check_grads(fn, *args)


def test_bilinear_layer_training():
    torch.manual_seed(0)
    x1, x2 = torch.randn(4, 5), torch.randn(4, 6)
    w, b = torch.randn(3, 5, 6), torch.randn(3)
    _check_grads(F.bilinear, x1, x2, w, b)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_linear_cross_entropy_chunked_training(reduction):
    if not hasattr(F, "linear_cross_entropy"):
        pytest.skip("this torch has no F.linear_cross_entropy")
    from torch.nn.modules.linear_cross_entropy_options import LinearCrossEntropyOptions

    torch.manual_seed(0)
    x, w = torch.randn(8, 5), torch.randn(7, 5)
    target = torch.randint(0, 7, (8,))
    target[3] = -100  # ignored
    opts = LinearCrossEntropyOptions(batch_chunk_size=2, allow_retain_graph=True)

    def fn(x, w):
        return F.linear_cross_entropy(x, w, target, reduction=reduction, options=opts)

    _check_grads(fn, x, w)


def test_randperm_is_a_permutation_and_changes_per_call():
    fn = compiled(lambda: torch.randperm(50))
    a, b = fn(), fn()
    assert a.dtype == torch.int64
    assert sorted(a.tolist()) == list(range(50))
    assert not torch.equal(a, b)


def test_multinomial_frequencies():
    torch.manual_seed(0)
    p = torch.tensor([[1.0, 2.0, 0.0, 7.0], [0.0, 0.0, 1.0, 1.0]])
    out = compiled(lambda p: torch.multinomial(p, 20000, replacement=True))(p)
    freq = torch.stack([torch.bincount(row, minlength=4) for row in out]).float() / 20000
    torch.testing.assert_close(freq, p / p.sum(1, keepdim=True), atol=0.02, rtol=0)
    draws = compiled(lambda p: torch.multinomial(p, 3))(p[0])
    assert sorted(draws.tolist()) == [0, 1, 3]  # without replacement: the 3 nonzero classes


def test_rrelu_training_slopes_and_gradient():
    x = -torch.ones(10000, requires_grad=True)
    out = compiled(lambda x: F.rrelu(x, 0.1, 0.3, training=True))(x)
    assert 0.1 <= -out.detach().max() and -out.detach().min() <= 0.3
    assert abs(float(-out.detach().mean()) - 0.2) < 0.01
    (grad,) = torch.autograd.grad(out.sum(), x)
    assert torch.equal(grad, -out.detach())


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("shape", ["batch", "no-batch", "spatial"])
def test_nll_loss_backward(reduction, weighted, shape):
    """nll_loss's backward is lowered as a one-hot comparison (no scatter into a zeroed
    [N, classes] buffer): eager's gradient for every reduction, class weights, ignored targets,
    an input without a batch dimension and nll_loss2d's spatial targets."""
    g = torch.Generator().manual_seed(0)
    if shape == "batch":
        logits, target = torch.randn(7, 5, generator=g), torch.randint(0, 5, (7,), generator=g)
        target[2] = -100
    elif shape == "no-batch":
        logits, target = torch.randn(5, generator=g), torch.tensor(3)
    else:
        logits = torch.randn(2, 5, 3, 4, generator=g)
        target = torch.randint(0, 5, (2, 3, 4), generator=g)
        target[0, 1, 2] = -100
    weight = torch.rand(5, generator=g) + 0.5 if weighted else None

    def fn(x):
        return F.cross_entropy(x, target, weight=weight, reduction=reduction)

    _check_grads(fn, logits)


def test_nll_loss_backward_bfloat16_and_ignore_index():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 9, generator=g).to(torch.bfloat16)
    target = torch.tensor([1, 4, 4, 0, 8, 2])

    def fn(x):
        return F.nll_loss(F.log_softmax(x, dim=-1), target, ignore_index=4)

    _check_grads(fn, logits, atol=1e-2, rtol=1e-2)

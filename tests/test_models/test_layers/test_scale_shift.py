"""The scale & shift folded into a linear layer against autograd's
``(x W^T + c) * scale + shift``: values, every gradient, gradcheck, autocast,
scales at and near zero, and the cases that take the plain path."""
import copy

import pytest
import torch
import torch.nn as nn

from moppa_mm.models.layers.scale_shift import (Conv2dScaleShift, LinearScaleShift,
                                                _LinearScaleShift)


def fused_and_reference(out_features=12, offset=0, bias=True, seed=0, dtype=torch.float32):
    """A frozen linear layer converted to run a scale & shift of its output
    channels from ``offset`` on, its :class:`ScaleShift`, and the reference
    computation."""
    torch.manual_seed(seed)
    linear = nn.Linear(8, out_features, bias=bias).to(dtype).requires_grad_(False)
    linear = LinearScaleShift.convert(linear, offset)
    ssf = linear.ssf_out.to(dtype)
    with torch.no_grad():
        ssf.scale.uniform_(0.5, 1.5)
        ssf.shift.normal_()

    def reference(x):  # the scaled channels of the output, computed apart
        out = nn.functional.linear(x, linear.weight, linear.bias)
        end = offset + ssf.dims
        return torch.cat([out[..., :offset], out[..., offset:end] * ssf.scale + ssf.shift,
                          out[..., end:]], dim=-1)

    return linear, ssf, reference


def grads(fn, x, ssf, upstream):
    x = x.detach().requires_grad_(True)
    ssf.zero_grad()
    out = fn(x)
    out.backward(upstream)
    return out.detach(), x.grad, ssf.scale.grad.clone(), ssf.shift.grad.clone()


@pytest.mark.parametrize('offset,out_features,bias', [(0, 12, True), (8, 12, True),
                                                      (4, 8, False)])
def test_fused_equals_autograd(offset, out_features, bias):
    linear, ssf, reference = fused_and_reference(out_features, offset=offset, bias=bias)
    x = torch.randn(3, 5, 8)
    upstream = torch.randn(3, 5, out_features)
    fused = grads(linear, x, ssf, upstream)
    expected = grads(reference, x, ssf, upstream)
    for got, want in zip(fused, expected):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_fused_gradcheck():
    linear, ssf, _ = fused_and_reference(offset=8, dtype=torch.float64)
    x = torch.randn(6, 8, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda a, s, b: _LinearScaleShift.apply(a, linear.weight, linear.bias, s, b, 8),
        (x, ssf.scale, ssf.shift))


def test_fused_path_is_taken_and_keeps_only_the_output():
    """The fused path runs (one saved activation, the output as the matmul
    made it (N, out), which the next operation keeps too): the raw output is
    not kept."""
    linear, ssf, _ = fused_and_reference(out_features=12)
    x = torch.randn(3, 5, 8, requires_grad=True)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(
            lambda t: saved.append(t) or t, lambda t: t):
        out = linear(x)
    assert type(out.grad_fn).__name__ == '_LinearScaleShiftBackward'
    activations = [t for t in saved if t.numel() == out.numel()]
    assert len(activations) == 1 and activations[0].data_ptr() == out.data_ptr()
    # in the layer's dtype the folded weight is rebuilt in backward, not kept
    weights = [t for t in saved if t.shape == linear.weight.shape]
    assert [t.data_ptr() for t in weights] == [linear.weight.data_ptr()]


def test_scales_at_and_near_zero_keep_exact_gradients():
    """The raw output is recovered from the scaled one by dividing by the
    scale: with no floor on it, a scale of 1e-9 still gives autograd's
    gradients, and a scale of exactly 0 finite ones (float64)."""
    linear, ssf, reference = fused_and_reference(dtype=torch.float64)
    x, upstream = torch.randn(4, 8, dtype=torch.float64), torch.randn(4, 12, dtype=torch.float64)
    with torch.no_grad():
        ssf.scale[3], ssf.scale[5] = 1e-9, 0.0
    out = linear(x.requires_grad_(True))
    assert type(out.grad_fn).__name__ == '_LinearScaleShiftBackward'
    x = x.detach()
    fused, expected = grads(linear, x, ssf, upstream), grads(reference, x, ssf, upstream)
    assert fused[2].isfinite().all()
    fused[2][5] = expected[2][5]  # at exactly 0 the raw output is lost: 0, not NaN
    for got, want in zip(fused, expected):
        torch.testing.assert_close(got, want)


def test_small_scale_under_autocast_errs_less_than_its_matmul_part():
    """bfloat16 keeps the scaled output to 8 bits: as the scale nears 0 it
    holds less of the raw output, and the scale's gradient loses the
    matmul's part of it (``sum g (x - c)``), never more than that part (the
    shift-relative recovery ``(sum g y - shift sum g) / scale`` would grow as
    1 / scale instead)."""
    linear, ssf, reference = fused_and_reference()
    x, upstream = torch.randn(64, 8), torch.randn(64, 12)
    with torch.no_grad():
        ssf.shift.fill_(3.0)
        ssf.scale.copy_(torch.logspace(0, -11, 12))
    with torch.autocast('cpu', dtype=torch.bfloat16):
        fused = grads(linear, x, ssf, upstream)[2]
    x64, upstream64 = x.double(), upstream.double()
    raw = nn.functional.linear(x64, linear.weight.double())  # x - c
    exact = (upstream64 * (raw + linear.bias.double())).sum(0)
    matmul_part = (upstream64 * raw).abs().sum(0)
    error = (fused.double() - exact).abs()
    assert (error <= 0.02 * exact.abs() + 1.05 * matmul_part).all(), (error, matmul_part)
    assert (error[:2] <= 0.05 * matmul_part[:2]).all()  # scales 1 and 0.1: accurate


def test_trainable_linear_and_disabled_take_the_plain_path():
    linear, ssf, reference = fused_and_reference()
    x, upstream = torch.randn(4, 8), torch.randn(4, 12)
    linear.weight.requires_grad_(True)  # autograd differentiates the fold
    assert type(linear(x).grad_fn).__name__ == 'AddmmBackward0'
    linear.zero_grad()
    linear(x).backward(upstream)
    weight_grad = linear.weight.grad.clone()
    linear.zero_grad()
    reference(x).backward(upstream)
    torch.testing.assert_close(weight_grad, linear.weight.grad)
    ssf.enabled = False
    torch.testing.assert_close(linear(x), nn.functional.linear(x, linear.weight, linear.bias))


def test_no_grad_folds_into_the_weights():
    """Without gradients the scale & shift act on the weight and bias: one
    matmul, no pass over the output."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Ops(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            ops.append(func.overloadpacket.__name__)
            return func(*args, **(kwargs or {}))

    linear, ssf, reference = fused_and_reference(offset=8)
    x, ops = torch.randn(16, 8), []
    with torch.no_grad():
        with Ops():
            out = linear(x)
        torch.testing.assert_close(out, reference(x))
    assert [op for op in ops if op in ('addmm', 'mm', 'addcmul', 'mul')] == \
        ['mul', 'addcmul', 'addmm']  # the weight's, the bias's, the layer's


def test_autocast_bfloat16():
    """Under autocast the matmul runs in bfloat16 like the plain layer's; the
    gradients come back in the parameters' and input's dtypes, close to
    float32 autograd's."""
    linear, ssf, reference = fused_and_reference()
    x, upstream = torch.randn(16, 8), torch.randn(16, 12)
    with torch.autocast('cpu', dtype=torch.bfloat16):
        fused = grads(linear, x, ssf, upstream)
    assert fused[0].dtype == torch.bfloat16
    assert fused[1].dtype == fused[2].dtype == fused[3].dtype == torch.float32
    expected = grads(reference, x, ssf, upstream)
    for got, want in zip(fused, expected):
        torch.testing.assert_close(got.float(), want, rtol=0.05, atol=0.05)


@pytest.mark.parametrize('dtype', [torch.bfloat16, torch.float16])
def test_autocast_low_precision_gradients_in_one_pass(dtype):
    """Under bfloat16 and float16 autocast the scale & shift gradients come
    from one reduction over the gradient and the output (batch norm's), with
    float32 sums: close to float32 autograd's, in the parameters' dtype."""
    linear, ssf, reference = fused_and_reference(out_features=24, offset=8)
    x, upstream = torch.randn(64, 8), torch.randn(64, 24)
    with torch.autocast('cpu', dtype=dtype):
        out = linear(x.requires_grad_(True))
    assert out.dtype == dtype
    ops = []

    class Ops(torch.utils._python_dispatch.TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            ops.append(func.overloadpacket.__name__)
            return func(*args, **(kwargs or {}))

    with Ops():
        out.backward(upstream.to(dtype))
    assert ops.count('native_batch_norm_backward') == 1 and 'sum' not in ops, ops
    fused = (ssf.scale.grad.clone(), ssf.shift.grad.clone())
    ssf.zero_grad()
    reference(x.detach()).backward(upstream)
    for got, want in zip(fused, (ssf.scale.grad, ssf.shift.grad)):
        assert got.dtype == torch.float32
        torch.testing.assert_close(got, want, rtol=0.02, atol=0.05)


def test_deepcopy_copies_the_scale_shift():
    linear, ssf, _ = fused_and_reference()
    twin = copy.deepcopy(linear)
    with torch.no_grad():
        twin.ssf_out.shift.add_(1.0)
    x = torch.randn(2, 8)
    with torch.no_grad():
        torch.testing.assert_close(twin(x), linear(x) + 1.0)
    assert set(dict(twin.named_parameters())) == {
        'weight', 'bias', 'ssf_out.scale', 'ssf_out.shift'}


def test_converted_layers_keep_their_parameters_and_show_their_scale_shift():
    """The converted layer is the same object with the same weight and bias
    (names and Parameters: checkpoints and optimizers see no change), plus its
    scale & shift, which ``repr`` shows; mmcv's ``Linear`` wrapper converts
    too, anything else is refused."""
    from mmcv.cnn.bricks.wrappers import Linear as MMCVLinear
    linear = MMCVLinear(8, 12)
    weight = linear.weight
    converted = LinearScaleShift.convert(linear, offset=8)
    assert converted is linear and converted.weight is weight
    assert list(dict(converted.named_parameters())) == [
        'weight', 'bias', 'ssf_out.scale', 'ssf_out.shift']
    assert '(ssf_out): ScaleShift(dims=4, offset=8)' in repr(converted)
    conv = nn.Conv2d(3, 4, 2, stride=2)
    x = torch.randn(1, 3, 4, 4)
    with torch.no_grad():
        plain = conv(x)
        projection = Conv2dScaleShift.convert(conv)
        projection.ssf_out.scale.fill_(2.0)
        torch.testing.assert_close(projection(x), plain * 2.0)
        projection.ssf_out.enabled = False
        torch.testing.assert_close(projection(x), plain)
    with pytest.raises(TypeError, match='LinearScaleShift converts a Linear layer, got Conv2d'):
        LinearScaleShift.convert(nn.Conv2d(3, 4, 1))


def test_the_patch_embedding_keeps_the_images_not_a_copy_under_autocast():
    """The scaled convolution computes in its weight's dtype under autocast:
    float32 output, and its backward keeps the images themselves (no
    low-precision copy of the input); eager float32's gradients."""
    torch.manual_seed(0)
    conv = Conv2dScaleShift.convert(nn.Conv2d(3, 8, 4, stride=4).requires_grad_(False))
    with torch.no_grad():
        conv.ssf_out.scale.uniform_(0.5, 1.5)
    images = torch.randn(2, 3, 16, 16)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        with torch.autocast('cpu', dtype=torch.bfloat16):
            out = conv(images)
    assert out.dtype == torch.float32
    kept = [t for t in saved if t.shape == images.shape]
    assert len(kept) == 1 and kept[0] is images
    out.square().sum().backward()
    grad = conv.ssf_out.scale.grad.clone()
    conv.ssf_out.scale.grad = None
    conv(images).square().sum().backward()
    torch.testing.assert_close(grad, conv.ssf_out.scale.grad)

"""The scale & shift fused into a frozen linear layer against autograd's
``(x W^T + c) * scale + shift``: values, every gradient, gradcheck, autocast,
and the cases that must take the plain path."""
import copy

import pytest
import torch
import torch.nn as nn

from moppa_mm.models.layers import ScaleShift
from moppa_mm.models.layers.scale_shift import (SCALE_FLOOR, Conv2dScaleShift,
                                                LinearScaleShift, _LinearScaleShift)


def fused_and_reference(out_features=12, dims=None, offset=0, bias=True, seed=0,
                        dtype=torch.float32):
    """A frozen linear layer running a scale & shift (:class:`LinearScaleShift`
    adopting its parameters), and the reference computation."""
    torch.manual_seed(seed)
    linear = nn.Linear(8, out_features, bias=bias).to(dtype).requires_grad_(False)
    ssf = ScaleShift(dims or out_features, offset=offset).to(dtype)
    with torch.no_grad():
        ssf.scale.uniform_(0.5, 1.5)
        ssf.shift.normal_()
    linear = LinearScaleShift(linear, ssf, 'ssf')

    def reference(x):
        return ssf(nn.functional.linear(x, linear.weight, linear.bias))

    return linear, ssf, reference


def grads(fn, x, ssf, upstream):
    x = x.detach().requires_grad_(True)
    ssf.zero_grad()
    out = fn(x)
    out.backward(upstream)
    return out.detach(), x.grad, ssf.scale.grad.clone(), ssf.shift.grad.clone()


@pytest.mark.parametrize('offset,dims,bias', [(0, None, True), (8, 4, True),
                                              (4, 4, False)])
def test_fused_equals_autograd(offset, dims, bias):
    linear, ssf, reference = fused_and_reference(dims=dims, offset=offset, bias=bias)
    x = torch.randn(3, 5, 8)
    upstream = torch.randn(3, 5, 12)
    fused = grads(linear, x, ssf, upstream)
    expected = grads(reference, x, ssf, upstream)
    for got, want in zip(fused, expected):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_fused_gradcheck():
    linear, ssf, _ = fused_and_reference(dims=4, offset=8, dtype=torch.float64)
    x = torch.randn(6, 8, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda a, s, b: _LinearScaleShift.apply(a, linear.weight, linear.bias, s, b, 8),
        (x, ssf.scale, ssf.shift))


def test_fused_path_is_taken_and_keeps_only_the_output():
    """The fused path runs (one saved activation, the output, which the next
    operation keeps too): the 3-channel-wide raw output is not kept."""
    linear, ssf, _ = fused_and_reference(out_features=12)
    x = torch.randn(4, 8, requires_grad=True)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(
            lambda t: saved.append(t) or t, lambda t: t):
        out = linear(x)
    assert type(out.grad_fn).__name__ == '_LinearScaleShiftBackward'
    activations = [t for t in saved if t.shape == out.shape]
    assert len(activations) == 1 and activations[0].data_ptr() == out.data_ptr()


def test_scale_near_zero_takes_the_plain_path():
    """``x = (y - shift) / scale`` would lose digits: such a layer keeps ``x``
    (autograd's path) and its gradients stay exact; the check follows the
    parameter's updates."""
    linear, ssf, reference = fused_and_reference()
    x, upstream = torch.randn(4, 8), torch.randn(4, 12)
    with torch.no_grad():
        ssf.scale[3] = SCALE_FLOOR / 10
    out = linear(x.requires_grad_(True))
    assert type(out.grad_fn).__name__ == 'AddcmulBackward0'
    x = x.detach()
    for got, want in zip(grads(linear, x, ssf, upstream), grads(reference, x, ssf, upstream)):
        torch.testing.assert_close(got, want)
    with torch.no_grad():
        ssf.scale[3] = 1.0
    assert type(linear(x.requires_grad_(True)).grad_fn).__name__ == \
        '_LinearScaleShiftBackward'


def test_trainable_linear_and_disabled_take_the_plain_path():
    linear, ssf, reference = fused_and_reference()
    x, upstream = torch.randn(4, 8), torch.randn(4, 12)
    linear.weight.requires_grad_(True)
    assert type(linear(x).grad_fn).__name__ == 'AddcmulBackward0'
    linear.zero_grad()
    linear(x).backward(upstream)
    weight_grad = linear.weight.grad.clone()
    linear.zero_grad()
    reference(x).backward(upstream)
    torch.testing.assert_close(weight_grad, linear.weight.grad)
    ssf.enabled = False
    torch.testing.assert_close(linear(x), nn.functional.linear(x, linear.weight, linear.bias))


def test_no_grad_takes_the_plain_path():
    linear, ssf, reference = fused_and_reference(dims=4, offset=8)
    x = torch.randn(16, 8)
    with torch.no_grad():  # the same operations as the reference: bit for bit
        torch.testing.assert_close(linear(x), reference(x), atol=0, rtol=0)


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


def test_deepcopy_rebinds_the_scale_shift():
    linear, ssf, _ = fused_and_reference()
    holder = nn.Module()
    holder.linear, holder.ssf = linear, ssf
    twin = copy.deepcopy(holder)
    with torch.no_grad():
        twin.ssf.shift.add_(1.0)
    x = torch.randn(2, 8)
    with torch.no_grad():
        torch.testing.assert_close(twin.linear(x), holder.linear(x) + 1.0)
    assert twin.linear.scale_shift is twin.ssf
    assert set(dict(twin.named_parameters())) == {
        'linear.weight', 'linear.bias', 'ssf.scale', 'ssf.shift'}


def test_adopted_layers_keep_their_parameters_and_show_their_scale_shift():
    """The layer that runs a scale & shift holds the original layer's weight
    and bias (the same Parameters), registers nothing else, and names the
    scale & shift it runs in ``repr``."""
    linear = nn.Linear(8, 12)
    ssf = ScaleShift(4, offset=8)
    adopted = LinearScaleShift(linear, ssf, 'ssf_value')
    assert adopted.weight is linear.weight and adopted.bias is linear.bias
    assert dict(adopted.named_parameters()).keys() == {'weight', 'bias'}
    assert 'scale_shift=ssf_value' in repr(adopted)
    conv = nn.Conv2d(3, 4, 2, stride=2)
    conv_ssf = ScaleShift(4, channel_dim=1)
    with torch.no_grad():
        conv_ssf.scale.fill_(2.0)
    projection = Conv2dScaleShift(conv, conv_ssf, 'ssf_proj')
    assert projection.weight is conv.weight and 'scale_shift=ssf_proj' in repr(projection)
    x = torch.randn(1, 3, 4, 4)
    with torch.no_grad():
        torch.testing.assert_close(projection(x), conv(x) * 2.0)
        conv_ssf.enabled = False
        torch.testing.assert_close(projection(x), conv(x))


def test_backbone_checks_every_scale_once_before_its_forward():
    """The MoPPA ViT checks all its scale & shift layers' scales in one go
    before a forward with gradients (one read-back from the device per step);
    an update to one scale is seen at the next forward."""
    from moppa_mm.models import MoPPAVisionTransformer
    model = MoPPAVisionTransformer(arch=dict(embed_dims=16, num_layers=2, num_heads=2,
                                             feedforward_channels=32),
                                   img_size=16, patch_size=8, random_base=True)
    layers = [m for m in model.modules() if isinstance(m, ScaleShift)]
    checks = []
    model.register_forward_pre_hook(  # after the backbone's own pre-hook
        lambda module, args: checks.append([m._floor_check for m in layers]))
    model(torch.randn(1, 3, 16, 16))
    assert all(check[0] == m._scale_state() and check[1] for m, check in zip(layers, checks[0]))
    fc1 = model.layers[1].ffn.ssf_fc1
    with torch.no_grad():
        fc1.scale[0] = SCALE_FLOOR / 2
    model(torch.randn(1, 3, 16, 16))
    assert checks[1][layers.index(fc1)] == (fc1._scale_state(), False)

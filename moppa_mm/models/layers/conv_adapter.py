"""The 3x3 convolution adapter that MoPPA puts before each Swin FFN (paper supp.)."""
from typing import Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from moppa_mm.operators.moppa_unit import _promoted, recompute_norm
from moppa_mm.operators.tracing import is_capturing


class ConvAdapter(nn.Module):
    """Residual bottleneck with a 3x3 convolution, on channel-last tokens.

    ``x + up(act(conv3x3(down(x))))``, ``down`` and ``up`` 1x1 convolutions, on
    a channels-last view of the tokens (no copy); ``up`` starts at zero (the
    identity at init). It computes in its input's and parameters' dtype,
    autocast or not: float32 there (a LayerNorm's output), no activation or
    weight cast, its convolutions a seventh of the block's width.

    Args:
        embed_dims (int): Channels ``C``.
        hidden_dims (int): Bottleneck channels.
    """

    def __init__(self, embed_dims: int, hidden_dims: int) -> None:
        super().__init__()
        if hidden_dims < 1:
            raise ValueError(f'hidden_dims must be >= 1, got {hidden_dims}')
        self.embed_dims = embed_dims
        self.hidden_dims = hidden_dims
        self.down = nn.Conv2d(embed_dims, hidden_dims, 1)
        # channels last, as its gradient comes: no copy into its layout per step
        self.conv = nn.Conv2d(hidden_dims, hidden_dims, 3, padding=1).to(
            memory_format=torch.channels_last)
        self.act = nn.GELU()
        self.up = nn.Conv2d(hidden_dims, embed_dims, 1)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for layer in (self.down, self.conv, self.up):  # kaiming weights, zero biases
            layer.reset_parameters()
            nn.init.zeros_(layer.bias)
        nn.init.zeros_(self.up.weight)

    def forward(self, x: torch.Tensor, grid: Optional[Tuple[int, int]] = None) -> torch.Tensor:
        """``x``: (B, H, W, C), or tokens (B, H*W, C) on the (H, W) ``grid``.
        Returns the same shape."""
        with torch.autocast(x.device.type, enabled=False):
            x = x.to(_promoted(x.dtype, self.down.weight.dtype))
            hidden = self.act(self.conv(self.down(_as_map(x, grid))))  # (B, r, H, W)
            return x + _as_layout_of(self.up(hidden), x)

    def forward_after_norm(self, x: torch.Tensor, norm_input: torch.Tensor, norm: nn.LayerNorm,
                           grid: Optional[Tuple[int, int]] = None) -> torch.Tensor:
        """:meth:`forward` for ``x = norm(norm_input)`` (``norm_input``: any shape
        of as many elements), saving only two bottleneck tensors for backward."""
        if not torch.is_grad_enabled() or is_capturing() or not isinstance(norm, nn.LayerNorm) or \
                type(norm).forward is not nn.LayerNorm.forward or type(self.act) is not nn.GELU \
                or self.act.approximate != 'none':  # only a plain LayerNorm can be recomputed
            return self.forward(x, grid)
        return _ConvAdapterFunction.apply(x, grid, norm_input, norm, self.down.weight,
                                          self.down.bias, self.conv.weight, self.conv.bias,
                                          self.up.weight, self.up.bias)


def _as_map(x: torch.Tensor, grid: Optional[Tuple[int, int]]) -> torch.Tensor:
    """(B, H, W, C), or (B, H*W, C) tokens on ``grid``, as the channels-last
    (B, C, H, W) map: a view, one call."""
    if grid is None:
        return x.permute(0, 3, 1, 2)
    if is_capturing():  # an exporter's sizes may be symbolic
        return x.view(x.shape[0], *grid, x.shape[-1]).permute(0, 3, 1, 2)
    batch, tokens, channels = x.shape
    height, width = grid
    return x.as_strided((batch, channels, height, width),
                        (x.stride(0), x.stride(2), width * x.stride(1), x.stride(1)))


def _as_layout_of(feature_map: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A (B, C, H, W) convolution output as ``like``'s (B, H, W, C) or (B, H*W,
    C): a view of a channels-last output."""
    if like.dim() == 4:
        return feature_map.permute(0, 2, 3, 1)
    if is_capturing() or not feature_map.is_contiguous(memory_format=torch.channels_last):
        return feature_map.flatten(2).transpose(1, 2)
    batch, channels = feature_map.shape[:2]
    return feature_map.as_strided((batch, like.shape[1], channels), (
        feature_map.stride(0), feature_map.stride(3), feature_map.stride(1)))


def _conv_backward(grad, inputs, weight, padding, needs):
    """A stride-1 ``conv2d``'s input, weight and bias gradients ``needs`` asks for."""
    return torch.ops.aten.convolution_backward(
        grad, inputs, weight, [weight.shape[0]], [1, 1], [padding] * 2, [1, 1], False, [0, 0],
        1, list(needs))


class _ConvAdapterFunction(torch.autograd.Function):
    """``x + up(gelu(conv(down(x))))`` with ``x = norm(norm_input)``, saving the
    convolution's input and output (``2r`` channels per token; autograd: ``C +
    3r``) and recomputing ``x`` from ``norm_input`` (the LayerNorm keeps it anyway)."""

    @staticmethod
    def forward(ctx, x, grid, norm_input, norm, down_w, down_b, conv_w, conv_b, up_w, up_b):
        ctx.norm, ctx.grid, ctx.input_dtype = norm, grid, x.dtype
        with torch.autocast(x.device.type, enabled=False):
            x = x.to(_promoted(x.dtype, down_w.dtype))
            hidden = F.conv2d(_as_map(x, grid), down_w, down_b)  # (B, r, H, W)
            pre_act = F.conv2d(hidden, conv_w, conv_b, padding=1)
            up = _as_layout_of(F.conv2d(F.gelu(pre_act), up_w, up_b), x)  # x's shape
        ctx.save_for_backward(norm_input, hidden, pre_act, down_w, conv_w, up_w)
        return up.add_(x)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):
        norm_input, hidden, pre_act, down_w, conv_w, up_w = ctx.saved_tensors
        needs = ctx.needs_input_grad[:1] + ctx.needs_input_grad[2:]  # without the grid
        grad = _as_map(grad_out.to(pre_act.dtype), ctx.grid)  # (B, C, H, W)
        grad_act, grad_up_w, grad_up_b = _conv_backward(
            grad, F.gelu(pre_act), up_w, 0, (True, needs[7], needs[8]))
        grad_pre = torch.ops.aten.gelu_backward(grad_act, pre_act)
        grad_hidden, grad_conv_w, grad_conv_b = _conv_backward(
            grad_pre, hidden, conv_w, 1, (True, needs[5], needs[6]))
        if needs[3]:  # the down weight's gradient reads x: recomputed
            x = recompute_norm(ctx.norm, norm_input)
            x = _as_map(x if x.shape == grad_out.shape else x.view(grad_out.shape), ctx.grid)
        else:
            x = grad  # only its shape is read
        grad_x, grad_down_w, grad_down_b = _conv_backward(
            grad_hidden, x.to(grad.dtype), down_w, 0, (needs[0], needs[3], needs[4]))
        if grad_x is not None:  # the residual's gradient plus the branch's
            grad_x = _as_layout_of(grad_x.add_(grad), grad_out).to(ctx.input_dtype)
        return (grad_x, None, None, None, grad_down_w, grad_down_b, grad_conv_w,
                grad_conv_b, grad_up_w, grad_up_b)

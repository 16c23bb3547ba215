"""The 3x3 convolution adapter that MoPPA puts before each Swin FFN (paper supp.)."""
import functools

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from moppa_mm.operators.tracing import is_capturing


class ConvAdapter(nn.Module):
    """Residual bottleneck with a 3x3 convolution, on channel-last tokens.

    ``x + up(act(conv3x3(down(x))))``: ``down`` and ``up`` are 1x1 projections
    (done as Linear layers on (B, H, W, C), no permute), the 3x3 convolution
    runs on the ``hidden_dims`` bottleneck. ``up`` starts at zero, so the adapter
    starts as the identity and the pre-trained block's output is unchanged.
    :meth:`forward_after_norm`: the same, leaner on memory, after a LayerNorm.

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
        self.down = nn.Linear(embed_dims, hidden_dims)
        self.conv = nn.Conv2d(hidden_dims, hidden_dims, 3, padding=1)
        self.act = nn.GELU()
        self.up = nn.Linear(hidden_dims, embed_dims)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.kaiming_uniform_(self.down.weight, a=5**0.5)
        nn.init.zeros_(self.down.bias)
        nn.init.kaiming_uniform_(self.conv.weight, a=5**0.5)
        nn.init.zeros_(self.conv.bias)
        nn.init.zeros_(self.up.weight)
        nn.init.zeros_(self.up.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x``: (B, H, W, C). Returns the same shape."""
        hidden = self.down(x)  # (B, H, W, r)
        hidden = self.conv(hidden.permute(0, 3, 1, 2))  # (B, r, H, W)
        hidden = self.act(hidden).permute(0, 2, 3, 1)  # (B, H, W, r)
        return x + self.up(hidden)  # (B, H, W, C)

    def forward_after_norm(self, x: torch.Tensor, norm_input: torch.Tensor,
                           norm: nn.LayerNorm) -> torch.Tensor:
        """:meth:`forward` for ``x = norm(norm_input)``, with the same result
        and gradients, saving only the two bottleneck tensors for backward
        (:class:`_ConvAdapterFunction`). ``x``: (B, H, W, C); ``norm_input``
        any shape with as many elements."""
        if not torch.is_grad_enabled() or is_capturing() or not isinstance(norm, nn.LayerNorm) or \
                type(norm).forward is not nn.LayerNorm.forward:
            return self.forward(x)  # only a plain LayerNorm can be recomputed
        if type(self.act) is not nn.GELU or self.act.approximate != 'none':
            return self.forward(x)
        return _ConvAdapterFunction.apply(x, norm_input, norm, self.down.weight,
                                          self.down.bias, self.conv.weight,
                                          self.conv.bias, self.up.weight,
                                          self.up.bias)


# The bottleneck's matmuls and 3x3 convolution run markedly slower at an odd
# width (71 at Swin-B's stage 3) than at a multiple of 8, so the fused path pads
# the bottleneck with zero channels up to the next multiple of 8 when that adds
# at most ``PAD_MAX_GROWTH`` of its width. The padded channels are zero all the
# way through (zero weights, zero bias, GELU(0) = 0) and get no gradient.
PAD_MULTIPLE = 8
PAD_MAX_GROWTH = 0.05


def padded_width(hidden_dims: int) -> int:
    """The width the fused path computes a ``hidden_dims`` bottleneck at."""
    padded = -(-hidden_dims // PAD_MULTIPLE) * PAD_MULTIPLE
    return padded if padded <= hidden_dims * (1 + PAD_MAX_GROWTH) else hidden_dims


def _pad_bottleneck(width, down_w, down_b, conv_w, conv_b, up_w):
    """Zero-pad the bottleneck's weights from ``r`` to ``width`` channels."""
    extra = width - down_w.shape[0]
    if extra == 0:
        return down_w, down_b, conv_w, conv_b, up_w
    return (F.pad(down_w, (0, 0, 0, extra)), F.pad(down_b, (0, extra)),
            F.pad(conv_w, (0, 0, 0, 0, 0, extra, 0, extra)), F.pad(conv_b, (0, extra)),
            F.pad(up_w, (0, extra)))


def _recompute_norm(norm: nn.LayerNorm, norm_input: torch.Tensor) -> torch.Tensor:
    """``norm(norm_input)`` again in backward, where autocast is off: in the
    widest dtype of the input and the norm's parameters, every tensor cast to
    it, as autocast computes a norm (float32 on CUDA, whose kernels refuse a
    bfloat16 input with float32 weights; CPU's accept the mix)."""
    params = (norm.weight, norm.bias)
    dtype = functools.reduce(torch.promote_types,
                             [p.dtype for p in params if p is not None], norm_input.dtype)
    weight, bias = (None if p is None else p.to(dtype) for p in params)
    return F.layer_norm(norm_input.to(dtype), norm.normalized_shape, weight, bias, norm.eps)


class _ConvAdapterFunction(torch.autograd.Function):
    """``x + up(gelu(conv(down(x))))`` with ``x = norm(norm_input)``.

    Autograd would save ``x`` for the ``down`` weight's gradient and both the
    convolution's output and the activation: ``C + 3r`` channels per token.
    Here only the convolution's input and output are saved (``2r``); ``x`` is
    recomputed from ``norm_input`` (already saved by the LayerNorm, so sharing
    it costs nothing) and the activation from the convolution's output.
    """

    @staticmethod
    def forward(ctx, x, norm_input, norm, down_w, down_b, conv_w, conv_b,
                up_w, up_b):
        ctx.hidden_dims = down_w.shape[0]  # r; the bottleneck runs at padded_width(r)
        down_w, down_b, conv_w, conv_b, up_w = _pad_bottleneck(
            padded_width(ctx.hidden_dims), down_w, down_b, conv_w, conv_b, up_w)
        hidden = F.linear(x, down_w, down_b).permute(0, 3, 1, 2)  # (B, r, H, W)
        pre_act = F.conv2d(hidden, conv_w, conv_b, padding=1)  # (B, r, H, W)
        act = F.gelu(pre_act).permute(0, 2, 3, 1)  # (B, H, W, r)
        up = torch.addmm(up_b, act.reshape(-1, act.shape[-1]), up_w.t()).view(x.shape)
        # in place where no promotion is needed; under autocast the low-precision
        # branch is added to the float32 input out of place, as autograd would
        out = up.add_(x) if up.dtype == torch.promote_types(up.dtype, x.dtype) else x + up
        ctx.norm = norm
        ctx.save_for_backward(norm_input, hidden, pre_act, down_w, conv_w, up_w)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):
        norm_input, hidden, pre_act, down_w, conv_w, up_w = ctx.saved_tensors
        needs = ctx.needs_input_grad
        embed_dims, hidden_dims = up_w.shape  # the padded width
        r = ctx.hidden_dims
        # the forward's compute dtype (lower under autocast, which is off here)
        dtype = pre_act.dtype
        down_w, conv_w, up_w = (w.to(dtype) for w in (down_w, conv_w, up_w))
        grad_flat = grad_out.reshape(-1, embed_dims)  # (BHW, C)
        grad_low = grad_flat.to(dtype)
        act = F.gelu(pre_act).permute(0, 2, 3, 1).reshape(-1, hidden_dims)
        grad_up_w = grad_low.t().mm(act) if needs[7] else None
        grad_up_b = grad_flat.sum(0) if needs[8] else None
        grad_act = grad_low.mm(up_w).view(act.shape)  # (BHW, r)
        b, _, h, w = pre_act.shape
        grad_act = grad_act.view(b, h, w, hidden_dims).permute(0, 3, 1, 2)
        grad_pre = torch.ops.aten.gelu_backward(grad_act, pre_act)
        grad_hidden, grad_conv_w, grad_conv_b = torch.ops.aten.convolution_backward(
            grad_pre, hidden, conv_w, [hidden_dims], [1, 1], [1, 1], [1, 1],
            False, [0, 0], 1, [True, needs[5], needs[6]])
        grad_hidden = grad_hidden.permute(0, 2, 3, 1).reshape(-1, hidden_dims)
        grad_x = None
        if needs[0]:  # the residual's gradient plus the branch's
            if grad_flat.dtype == dtype:
                grad_x = torch.addmm(grad_flat, grad_hidden, down_w)
            else:
                grad_x = grad_flat + grad_hidden.mm(down_w)
            grad_x = grad_x.view(grad_out.shape)
        grad_down_w = grad_down_b = None
        if needs[3]:
            with torch.no_grad():
                x = _recompute_norm(ctx.norm, norm_input).reshape(-1, embed_dims)
            grad_down_w = grad_hidden.t().mm(x.to(dtype))
        if needs[4]:
            grad_down_b = grad_hidden.sum(0)
        if hidden_dims != r:  # the padded channels' gradients are dropped
            grad_down_w = grad_down_w[:r] if grad_down_w is not None else None
            grad_down_b = grad_down_b[:r] if grad_down_b is not None else None
            grad_conv_w = grad_conv_w[:r, :r] if grad_conv_w is not None else None
            grad_conv_b = grad_conv_b[:r] if grad_conv_b is not None else None
            grad_up_w = grad_up_w[:, :r] if grad_up_w is not None else None
        return (grad_x, None, None, grad_down_w, grad_down_b, grad_conv_w,
                grad_conv_b, grad_up_w, grad_up_b)


__all__ = ['ConvAdapter']

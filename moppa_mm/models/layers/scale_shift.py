"""Learnable per-channel scale & shift (SSF / RLRR style) on a frozen layer's output,
run by the layer itself as mmpretrain's ``LoRALinear`` runs its branch: folded into
the weight and bias, one multiply of a small tensor, no pass over the activations."""
from typing import Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from moppa_mm.operators.tracing import is_capturing


def _full_width(scale: torch.Tensor, shift: torch.Tensor, offset: int,
                out_features: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """``scale`` and ``shift`` over all output channels: 1 and 0 elsewhere."""
    if (offset, scale.numel()) == (0, out_features):
        return scale, shift
    pad = (offset, out_features - offset - scale.numel())
    return F.pad(scale, pad, value=1.0), F.pad(shift, pad)


class _LinearScaleShift(torch.autograd.Function):
    """``y = (a W^T + c) * scale + shift`` on output channels ``[offset,
    offset + d)`` of a frozen linear layer: one matmul, folded weight and bias.

    Backward: ``grad a = g W'`` (``W'`` kept where it is a cast, as autocast's
    plain layer keeps its own, else rebuilt); ``grad shift = sum g``, ``grad
    scale = sum g (y - r) / scale`` with ``r = c' - c scale``: ONE pass over
    ``g`` and ``y`` (batch norm's backward reduction, ``mean = r``, ``invstd =
    1 / scale``, float32 sums), no weight-gradient matmul, no activation the
    next operation does not keep. No floor on the scale: ``y - r`` is exact
    where the two are close (Sterbenz); at exactly 0 the gradient is 0, not NaN.
    """

    @staticmethod
    def forward(ctx, inputs, weight, bias, scale, shift, offset):
        device = inputs.device.type
        dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(
            device) else torch.promote_types(inputs.dtype, weight.dtype)
        full_scale, full_shift = _full_width(scale, shift, offset, weight.shape[0])
        folded_weight_t = weight.t() * full_scale  # (in, out): W'^T, W's layout
        folded_bias = full_shift if bias is None else torch.addcmul(full_shift, bias, full_scale)
        folded_weight_t, folded_bias = folded_weight_t.to(dtype), folded_bias.to(dtype)
        with torch.autocast(device, enabled=False):
            out = torch.addmm(folded_bias, inputs.reshape(-1, inputs.shape[-1]).to(dtype),
                              folded_weight_t)  # (N, out)
        ctx.offset, ctx.dims, ctx.input_dtype = offset, scale.numel(), inputs.dtype
        ctx.rebuild = folded_weight_t.dtype == weight.dtype  # not a cast: keep W alone
        ctx.save_for_backward(out, weight if ctx.rebuild else folded_weight_t, folded_bias,
                              bias, full_scale)
        return out.view(*inputs.shape[:-1], out.shape[-1])

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        out, weight_t, folded_bias, bias, scale = ctx.saved_tensors
        needs = ctx.needs_input_grad
        grad_flat = grad.reshape(out.shape)  # (N, out)
        grad_inputs = grad_scale = grad_shift = None
        if needs[3] or needs[4]:
            stats = torch.float64 if out.dtype == torch.float64 else torch.float32
            recovery = folded_bias.to(stats) if bias is None else \
                torch.addcmul(folded_bias, bias, scale, value=-1).to(stats)  # r
            inv_scale = scale.reciprocal().to(stats)
            grad_scale, grad_shift = torch.ops.aten.native_batch_norm_backward(
                grad_flat, out, inv_scale, None, None, recovery, inv_scale, True, 0.0,
                [False, True, True])[1:]
            grad_scale = grad_scale.nan_to_num_(nan=0.0)  # 0 / 0 at scale 0
            if (ctx.offset, ctx.dims) != (0, out.shape[-1]):
                part = slice(ctx.offset, ctx.offset + ctx.dims)
                grad_scale, grad_shift = grad_scale[part], grad_shift[part]
        if needs[0]:
            if ctx.rebuild:  # the layer's weight (out, in), saved instead of a copy
                weight_t = weight_t.t() * scale
            grad_inputs = grad_flat.mm(weight_t.t()).view(*grad.shape[:-1], -1).to(
                ctx.input_dtype)
        return grad_inputs, None, None, grad_scale, grad_shift, None


class ScaleShift(nn.Module):
    """``y = x * scale + shift`` over ``dims`` output channels of its layer (held
    as ``ssf_out``) from ``offset`` on (``2 * C``: a fused qkv's value)."""

    enabled = True

    def __init__(self, dims: int, offset: int = 0) -> None:
        super().__init__()
        self.dims = dims
        self.offset = offset
        self.scale = nn.Parameter(torch.ones(dims))
        self.shift = nn.Parameter(torch.zeros(dims))

    def reset_parameters(self) -> None:
        nn.init.ones_(self.scale)
        nn.init.zeros_(self.shift)

    def extra_repr(self) -> str:
        return f'dims={self.dims}, offset={self.offset}'


class ScaleShiftLayer:
    """A layer that folds the :class:`ScaleShift` it holds (``ssf_out``) into
    its weight and bias. :meth:`convert` makes one of a backbone's own layers,
    in place: its class is swapped, not the layer wrapped, because its weight
    and bias keep their state-dict keys (the official checkpoints')."""

    ssf_out: ScaleShift
    BASE: type  # the layer class converted

    @classmethod
    def convert(cls, layer: nn.Module, offset: int = 0) -> nn.Module:
        """Make ``layer`` (this class's base, or a subclass such as mmcv's
        wrappers) scale & shift its output channels from ``offset`` on."""
        if not isinstance(layer, cls.BASE):
            raise TypeError(f'{cls.__name__} converts a {cls.BASE.__name__} layer, got '
                            f'{type(layer).__name__}')
        layer.__class__ = cls
        layer.ssf_out = ScaleShift(layer.weight.shape[0] - offset, offset).to(layer.weight.device)
        return layer

    def folded(self) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        """``W'``, ``c'`` with ``x W'^T + c' = (x W^T + c) * scale + shift``, where enabled."""
        ssf = self.ssf_out
        if not ssf.enabled:
            return self.weight, self.bias
        scale, shift = _full_width(ssf.scale, ssf.shift, ssf.offset, self.weight.shape[0])
        weight = self.weight * scale.view(-1, *[1] * (self.weight.dim() - 1))  # (out, in, ...)
        return weight, shift if self.bias is None else torch.addcmul(shift, self.bias, scale)

    def merged_layer(self) -> nn.Module:
        """A plain ``nn.Linear`` / ``nn.Conv2d`` with the folded weights as new
        frozen tensors (a base shared with other models stays intact)."""
        plain = self._plain_layer()
        with torch.no_grad():
            weight, bias = self.folded()
            plain.weight = nn.Parameter(weight.detach().clone(), requires_grad=False)
            plain.bias = None if bias is None else \
                nn.Parameter(bias.detach().clone().to(weight.dtype), requires_grad=False)
        return plain.train(self.training)


class LinearScaleShift(ScaleShiftLayer, nn.Linear):
    """``nn.Linear`` with a :class:`ScaleShift` (``ssf_out``) on its output, folded
    into its weight and bias (frozen and training: :class:`_LinearScaleShift`)."""

    BASE = nn.Linear

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        ssf = self.ssf_out
        if ssf.enabled and self._fused(inputs):
            return _LinearScaleShift.apply(inputs, self.weight, self.bias, ssf.scale, ssf.shift,
                                           ssf.offset)
        return F.linear(inputs, *self.folded())

    def _fused(self, inputs: torch.Tensor) -> bool:
        """A backward will come, the layer is frozen, and no exporter records
        the forward (one gets the plain form; a compiler traces the function)."""
        ssf = self.ssf_out
        if not torch.is_grad_enabled() or is_capturing(compilers=False) or not (
                inputs.requires_grad or ssf.scale.requires_grad or ssf.shift.requires_grad):
            return False
        return not self.weight.requires_grad and (
            self.bias is None or not self.bias.requires_grad)

    def _plain_layer(self) -> nn.Linear:
        return torch.nn.utils.skip_init(nn.Linear, self.in_features, self.out_features,
                                        device=self.weight.device)


class Conv2dScaleShift(ScaleShiftLayer, nn.Conv2d):
    """``nn.Conv2d`` with a :class:`ScaleShift` (``ssf_out``) on its output
    channels (the patch embedding's), folded into its weight and bias. It
    computes in its weight's dtype, autocast or not: its backward then keeps
    the images as they come, not a low-precision copy."""

    BASE = nn.Conv2d

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast(x.device.type, enabled=False):
            return self._conv_forward(x.to(self.weight.dtype), *self.folded())  # (B, C, H, W)

    def _plain_layer(self) -> nn.Conv2d:
        return torch.nn.utils.skip_init(
            nn.Conv2d, self.in_channels, self.out_channels, self.kernel_size, self.stride,
            self.padding, self.dilation, self.groups, True, self.padding_mode,
            device=self.weight.device)


def attach_scale_shift(attn: nn.Module, ffn: nn.Module, dims: int) -> None:
    """Scale & shift the value part of ``attn.qkv`` (q, k, v of ``dims`` each),
    ``attn.proj`` and both layers of ``ffn`` (mmcv's ``FFN``)."""
    LinearScaleShift.convert(attn.qkv, offset=2 * dims)  # v of the fused qkv
    LinearScaleShift.convert(attn.proj)
    attach_ffn_scale_shift(ffn)


def attach_ffn_scale_shift(ffn: nn.Module) -> None:
    LinearScaleShift.convert(ffn.layers[0][0])
    LinearScaleShift.convert(ffn.layers[1])

"""Learnable per-channel scale & shift (SSF / RLRR style) on a layer's output.

Two ways in, both keep the layer's parameter names (checkpoints load as they
are):

- :meth:`ScaleShift.output_hook`, a forward hook for any layer (the patch
  embedding's convolution);
- :func:`fuse_into_linear` for a frozen ``nn.Linear`` (the attention's qkv and
  output projections, both MLP layers), where the scale & shift run inside the
  layer's matmul (:class:`_LinearScaleShift`).
"""
import functools
from typing import Optional, Sequence, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

# The fused linear path recovers the layer's raw output from its scaled one,
# ``x = (y - shift) / scale``; a scale this close to 0 would lose digits there,
# so such a layer takes the plain path (which keeps ``x`` itself).
SCALE_FLOOR = 1e-3


def _scale_rows(rows: torch.Tensor, scale: torch.Tensor, offset: int,
                shift: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``rows[offset:offset + len(scale)] * scale (+ shift)`` along dim 0, the
    other rows unchanged: one copy (a weight (out, in) or a bias (out,))."""
    end = offset + scale.numel()
    factor = scale.view(-1, *([1] * (rows.dim() - 1)))
    part = rows[offset:end] * factor if shift is None else \
        torch.addcmul(shift, rows[offset:end], factor)
    if (offset, end) == (0, rows.shape[0]):
        return part
    return torch.cat([rows[:offset], part, rows[end:]])


def _scaled_weight(weight: torch.Tensor, bias: Optional[torch.Tensor],
                   scale: torch.Tensor, shift: torch.Tensor,
                   offset: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """``W'`` and ``c'`` with ``x W'^T + c' = (x W^T + c) * scale + shift`` on
    output channels ``[offset, offset + len(scale))``, the others unchanged."""
    if bias is None:
        bias = weight.new_zeros(weight.shape[0])
    return _scale_rows(weight, scale, offset), _scale_rows(bias, scale, offset, shift)


class _LinearScaleShift(torch.autograd.Function):
    """``y = (a W^T + c) * scale + shift`` on output channels ``[offset,
    offset + d)`` of a linear layer whose ``W`` and ``c`` are frozen.

    Forward: one matmul with the slice's weight rows scaled (no pass over the
    activation). Backward: ``grad a = g W'``, the matmul the layer's backward
    does anyway; ``grad shift`` and ``grad scale`` are column reductions of
    ``g``, the latter against the raw output ``x = (y - shift) / scale``
    recovered from ``y``. Keeping ``y`` costs no memory where the next
    operation keeps it too (the GELU after the first MLP layer, attention's
    q, k, v views of the qkv output), where autograd's ``y = x * s + b`` keeps
    ``x``, another tensor as large. Under autocast the matmul runs in
    autocast's dtype, the reductions in float32.
    """

    @staticmethod
    def forward(ctx, inputs, weight, bias, scale, shift, offset):
        device = inputs.device.type
        dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(
            device) else torch.promote_types(inputs.dtype, weight.dtype)
        scaled_weight, scaled_bias = _scaled_weight(weight, bias, scale, shift, offset)
        with torch.autocast(device, enabled=False):
            out = F.linear(inputs.to(dtype), scaled_weight.to(dtype),
                           scaled_bias.to(dtype))
        ctx.offset, ctx.input_dtype = offset, inputs.dtype
        # the scaled weight is rebuilt in backward (a pass over the weight)
        # rather than kept: kept, it would cost the layer's weight in memory
        ctx.save_for_backward(out, weight, scale, shift)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        out, weight, scale, shift = ctx.saved_tensors
        grad_inputs = grad_scale = grad_shift = None
        if ctx.needs_input_grad[0]:
            scaled_weight = _scale_rows(weight, scale, ctx.offset)
            grad_inputs = grad.matmul(scaled_weight.to(grad.dtype)).to(ctx.input_dtype)
        if ctx.needs_input_grad[3] or ctx.needs_input_grad[4]:
            end = ctx.offset + scale.numel()
            flat = grad.reshape(-1, grad.shape[-1])[:, ctx.offset:end]  # (N, d)
            dtype = torch.promote_types(scale.dtype, torch.float32)
            grad_shift = flat.to(dtype).sum(0)
            if ctx.needs_input_grad[3]:
                kept = out.reshape(flat.shape[0], -1)[:, ctx.offset:end]  # (N, d)
                grad_scale = (torch.linalg.vecdot(flat.to(dtype), kept.to(dtype), dim=0)
                              - shift * grad_shift) / scale
            grad_scale = grad_scale.to(scale.dtype) if grad_scale is not None else None
            grad_shift = grad_shift.to(shift.dtype)
        return grad_inputs, None, None, grad_scale, grad_shift, None


class ScaleShift(nn.Module):
    """``y = x * scale + shift`` over ``dims`` channels; identity at init.

    Args:
        dims (int): Channels scaled and shifted.
        channel_dim (int): The channel axis of the hooked output: -1 for
            token tensors (B, N, C), 1 for feature maps (B, C, H, W).
        offset (int): First channel of the hooked output that is affected
            (e.g. ``2 * C`` for the value part of a fused qkv projection).
    """

    enabled = True

    def __init__(self, dims: int, channel_dim: int = -1, offset: int = 0) -> None:
        super().__init__()
        self.dims = dims
        self.channel_dim = channel_dim
        self.offset = offset
        self.scale = nn.Parameter(torch.ones(dims))
        self.shift = nn.Parameter(torch.zeros(dims))
        self._floor_check = (None, False)  # ((data_ptr, _version), scale >= floor)

    def reset_parameters(self) -> None:
        nn.init.ones_(self.scale)
        nn.init.zeros_(self.shift)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Scale & shift channels ``[offset, offset + dims)`` of ``x``; the
        others pass unchanged. One fused pass (``addcmul``): outside the slice
        the scale is 1 and the shift 0, so nothing is split or concatenated."""
        channels = x.shape[self.channel_dim]
        scale, shift = self.scale, self.shift
        if (self.offset, self.dims) != (0, channels):
            pad = (self.offset, channels - self.offset - self.dims)
            scale = F.pad(scale, pad, value=1.0)
            shift = F.pad(shift, pad)
        shape = [1] * x.dim()
        shape[self.channel_dim] = channels
        return torch.addcmul(shift.view(shape), x, scale.view(shape))

    def output_hook(self, module: nn.Module, args: tuple, output: torch.Tensor):
        """Forward hook: scale & shift the hooked module's output."""
        return self(output) if self.enabled else None

    def _scale_state(self) -> tuple:
        return self.scale.data_ptr(), self.scale._version

    def _scale_clear_of_zero(self) -> bool:
        """``|scale| >= SCALE_FLOOR`` everywhere; checked once per value of the
        parameter (an optimizer step bumps its version). The backbones check
        all their scale & shift layers at once before each forward
        (:func:`check_scale_floors`: one read-back from the device per step)."""
        if self._floor_check[0] != self._scale_state():
            check_scale_floors([self])
        return self._floor_check[1]

    def linear_forward(self, linear: nn.Linear, inputs: torch.Tensor) -> torch.Tensor:
        """``linear``'s forward with this scale & shift on its output (see
        :func:`fuse_into_linear`): the fused :class:`_LinearScaleShift` where
        the layer is frozen, else the layer then :meth:`forward`."""
        weight, bias = linear.weight, linear.bias
        if not self.enabled:
            return F.linear(inputs, weight, bias)
        if not torch.is_grad_enabled() or not (
                inputs.requires_grad or self.scale.requires_grad
                or self.shift.requires_grad):
            # no backward: fold into the weights when the activation is larger
            rows = inputs.numel() // max(inputs.shape[-1], 1)
            if rows >= linear.in_features:
                scaled_weight, scaled_bias = _scaled_weight(
                    weight, bias, self.scale, self.shift, self.offset)
                return F.linear(inputs, scaled_weight, scaled_bias)
            return self(F.linear(inputs, weight, bias))
        frozen = not weight.requires_grad and (bias is None or not bias.requires_grad)
        if frozen and self.channel_dim in (-1, inputs.dim() - 1) and \
                self._scale_clear_of_zero():
            return _LinearScaleShift.apply(inputs, weight, bias, self.scale,
                                           self.shift, self.offset)
        return self(F.linear(inputs, weight, bias))

    def extra_repr(self) -> str:
        return f'dims={self.dims}, channel_dim={self.channel_dim}, offset={self.offset}'


def check_scale_floors(layers: Sequence[ScaleShift]) -> None:
    """Check ``|scale| >= SCALE_FLOOR`` for every layer whose scale changed
    since its last check, reading the results back from the device once."""
    stale = [layer for layer in layers if layer._floor_check[0] != layer._scale_state()]
    if not stale:
        return
    with torch.no_grad():
        minima = [layer.scale.detach().abs().min() for layer in stale]
        devices = {m.device for m in minima}
        minima = torch.stack(minima).tolist() if len(devices) == 1 else \
            [m.item() for m in minima]
    for layer, minimum in zip(stale, minima):
        layer._floor_check = (layer._scale_state(), minimum >= SCALE_FLOOR)


def fuse_into_linear(linear: nn.Linear, scale_shift: ScaleShift) -> None:
    """Run ``scale_shift`` inside ``linear``'s forward (an instance-level
    ``forward``: the layer keeps its class, parameters and their names, and
    ``copy.deepcopy`` rebinds both objects). The scale & shift's parameters
    stay registered where the caller put them."""
    if not isinstance(linear, nn.Linear):
        raise TypeError(f'fuse_into_linear needs an nn.Linear, got {type(linear).__name__}')
    linear.forward = functools.partial(scale_shift.linear_forward, linear)


def attach_scale_shift(attn: nn.Module, ffn: nn.Module, dims: int) -> None:
    """Scale & shift the value part of ``attn.qkv`` (a fused q, k, v
    projection), ``attn.proj`` and both layers of ``ffn`` (mmcv's ``FFN``), as
    ``attn.ssf_value``, ``attn.ssf_proj``, ``ffn.ssf_fc1`` and ``ffn.ssf_fc2``
    (fused into the layers' forward: they keep their parameter names)."""
    attn.ssf_value = ScaleShift(dims, offset=2 * dims)  # v of the fused qkv
    fuse_into_linear(attn.qkv, attn.ssf_value)
    attn.ssf_proj = ScaleShift(dims)
    fuse_into_linear(attn.proj, attn.ssf_proj)
    fc1, fc2 = ffn.layers[0][0], ffn.layers[1]
    ffn.ssf_fc1 = ScaleShift(fc1.out_features)
    fuse_into_linear(fc1, ffn.ssf_fc1)
    ffn.ssf_fc2 = ScaleShift(fc2.out_features)
    fuse_into_linear(fc2, ffn.ssf_fc2)

"""Learnable per-channel scale & shift (SSF / RLRR style) on a layer's output.

The :class:`ScaleShift` (the parameters) stays registered where the
checkpoints have always had it (``attn.ssf_value``, ``ffn.ssf_fc1``,
``patch_embed.ssf_proj``...); the layer whose output it scales becomes a
subclass whose ``forward`` runs it (:class:`LinearScaleShift`,
:class:`Conv2dScaleShift`), adopting the layer's own parameters (names
unchanged), as mmpretrain's ``LoRALinear`` wraps a linear layer. Both fold the
scale & shift into the layer's weight and bias (:func:`_folded`): one multiply
of a small tensor, no pass over the activations.
"""
from typing import Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from moppa_mm.operators.tracing import is_capturing


def _folded(weight: torch.Tensor, bias: Optional[torch.Tensor], scale: torch.Tensor,
            shift: torch.Tensor, offset: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """``W'`` and ``c'`` with ``x W'^T + c' = (x W^T + c) * scale + shift`` on
    output channels ``[offset, offset + len(scale))``, the others unchanged
    (a linear layer's weight (out, in), or a convolution's (out, in, kh, kw))."""
    out_features = weight.shape[0]
    if (offset, scale.numel()) != (0, out_features):  # 1 and 0 outside the slice
        pad = (offset, out_features - offset - scale.numel())
        scale, shift = F.pad(scale, pad, value=1.0), F.pad(shift, pad)
    folded_weight = weight * scale.view(-1, *[1] * (weight.dim() - 1))  # (out, in, ...)
    return folded_weight, shift if bias is None else torch.addcmul(shift, bias, scale)


class _LinearScaleShift(torch.autograd.Function):
    """``y = (a W^T + c) * scale + shift`` on output channels ``[offset,
    offset + d)`` of a frozen linear layer: one matmul with the folded weight
    and bias. Backward: ``grad a = g W'`` (``W'`` kept where it is a cast, as
    autocast's plain layer keeps its own, else rebuilt), ``grad shift = sum
    g``, ``grad scale = sum g x`` with the raw output recovered, ``x = (y - c'
    + scale c) / scale`` (``c'`` the folded bias as the matmul added it). No
    weight-gradient matmul (autograd's fold needs one), no second activation:
    the next operation keeps ``y`` anyway (fc1's GELU, attention's q, k, v).
    No floor on the scale: ``y - c'`` is exact where the two are close
    (Sterbenz), so each term errs by at most its matmul part ``g (x - c)``:
    near 0 the gradient can lose that part, never grow past it (at exactly 0
    it is lost: 0, not NaN)."""

    @staticmethod
    def forward(ctx, inputs, weight, bias, scale, shift, offset):
        device = inputs.device.type
        dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(
            device) else torch.promote_types(inputs.dtype, weight.dtype)
        folded_weight, folded_bias = _folded(weight, bias, scale, shift, offset)
        folded_weight, folded_bias = folded_weight.to(dtype), folded_bias.to(dtype)
        with torch.autocast(device, enabled=False):
            out = F.linear(inputs.to(dtype), folded_weight, folded_bias)
        part = slice(offset, offset + scale.numel())
        if (offset, scale.numel()) != (0, out.shape[-1]):
            folded_bias, bias = folded_bias[part], None if bias is None else bias[part]
        # y - recovery = (x - c) scale + c scale = x scale, on the scaled channels
        recovery = folded_bias if bias is None else \
            torch.addcmul(folded_bias, bias, scale, value=-1)
        ctx.part, ctx.input_dtype = part, inputs.dtype
        ctx.rebuild = folded_weight.dtype == weight.dtype  # not a cast: keep W alone
        ctx.save_for_backward(out, weight if ctx.rebuild else folded_weight, recovery,
                              scale, shift)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        out, weight, recovery, scale, shift = ctx.saved_tensors
        grad_inputs = grad_scale = grad_shift = None
        if ctx.needs_input_grad[0]:
            if ctx.rebuild:
                weight = _folded(weight, None, scale, shift, ctx.part.start)[0]
            flat = grad.reshape(-1, grad.shape[-1])  # (N, out)
            grad_inputs = flat.mm(weight).view(*grad.shape[:-1], -1).to(ctx.input_dtype)
        if ctx.needs_input_grad[3] or ctx.needs_input_grad[4]:
            if (ctx.part.start, ctx.part.stop) != (0, out.shape[-1]):
                grad, out = grad[..., ctx.part], out[..., ctx.part]
            tokens = tuple(range(grad.dim() - 1))
            grad_shift = grad.sum(tokens, dtype=scale.dtype)  # (d,)
            if ctx.needs_input_grad[3]:  # sum g x = sum g (y - recovery) / scale
                raw = (out - recovery).mul_(grad).sum(tokens, dtype=scale.dtype)
                grad_scale = raw.div_(scale).nan_to_num_(nan=0.0)  # 0 / 0 at scale 0
        return grad_inputs, None, None, grad_scale, grad_shift, None


class ScaleShift(nn.Module):
    """``y = x * scale + shift`` over ``dims`` channels of a layer's output;
    identity at init. The layer that runs it folds it into its weight and
    bias (:class:`LinearScaleShift`, :class:`Conv2dScaleShift`).

    Args:
        dims (int): Channels scaled and shifted.
        channel_dim (int): The channel axis of the scaled output: -1 for
            token tensors (B, N, C), 1 for feature maps (B, C, H, W).
        offset (int): First channel of the scaled output that is affected
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

    def reset_parameters(self) -> None:
        nn.init.ones_(self.scale)
        nn.init.zeros_(self.shift)

    def extra_repr(self) -> str:
        return f'dims={self.dims}, channel_dim={self.channel_dim}, offset={self.offset}'


def refer_to(module: nn.Module, name: str, target: nn.Module) -> None:
    """Give ``module`` an attribute ``name`` for ``target`` without registering
    it as a child: ``target`` stays registered (and named in state dicts)
    where it is. ``copy.deepcopy`` of a model holding both maps the reference
    to the copied ``target``."""
    object.__setattr__(module, name, target)


class _RunsScaleShift:
    """A layer whose ``forward`` runs a :class:`ScaleShift` registered
    elsewhere (in the layer's parent); ``print(model)`` names it."""

    scale_shift: ScaleShift
    scale_shift_name: str

    def _adopt(self, layer: nn.Module, scale_shift: ScaleShift, name: str) -> None:
        """Take ``layer``'s own parameters (the same objects: optimizers and
        checkpoints see no change) and its train / eval mode."""
        self.weight, self.bias = layer.weight, layer.bias
        self.train(layer.training)
        refer_to(self, 'scale_shift', scale_shift)
        self.scale_shift_name = name

    def extra_repr(self) -> str:
        return f'{super().extra_repr()}, scale_shift={self.scale_shift_name}'

    def folded(self) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        """The weight and bias with the scale & shift folded in (the layer's
        own where the adapters are switched off)."""
        scale_shift = self.scale_shift
        if not scale_shift.enabled:
            return self.weight, self.bias
        return _folded(self.weight, self.bias, scale_shift.scale, scale_shift.shift,
                       scale_shift.offset)

    def merged_layer(self) -> nn.Module:
        """The plain layer (``nn.Linear`` / ``nn.Conv2d``) computing the same
        output with the scale & shift folded into new frozen weights:
        ``W' = W * scale``, ``c' = c * scale + shift`` on the scaled output
        channels. This layer's own tensors are left as they are (a base shared
        with other models stays intact)."""
        plain = self._plain_layer()
        with torch.no_grad():
            weight, bias = self.folded()
            plain.weight = nn.Parameter(weight.detach().clone(), requires_grad=False)
            plain.bias = None if bias is None else \
                nn.Parameter(bias.detach().clone().to(weight.dtype), requires_grad=False)
        return plain.train(self.training)


class LinearScaleShift(_RunsScaleShift, nn.Linear):
    """``nn.Linear`` with a :class:`ScaleShift` on its output, folded into the
    weight and bias: one matmul, no pass over the activations. Frozen, with a
    backward to come, it runs :class:`_LinearScaleShift` (no weight-gradient
    matmul, no second activation kept); otherwise autograd differentiates it.

    Args:
        linear (nn.Linear): The layer; its ``weight`` and ``bias`` are adopted.
        scale_shift (ScaleShift): Scales channels ``[offset, offset + dims)``
            of the output; registered by the caller (in the layer's parent).
        name (str): ``scale_shift``'s name in the layer's parent, for ``repr``.
    """

    def __init__(self, linear: nn.Linear, scale_shift: ScaleShift, name: str) -> None:
        super().__init__(linear.in_features, linear.out_features,
                         bias=linear.bias is not None, device='meta')
        self._adopt(linear, scale_shift, name)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        scale_shift = self.scale_shift
        if scale_shift.enabled and self._fused(inputs):
            return _LinearScaleShift.apply(inputs, self.weight, self.bias, scale_shift.scale,
                                           scale_shift.shift, scale_shift.offset)
        return F.linear(inputs, *self.folded())

    def _fused(self, inputs: torch.Tensor) -> bool:
        """Whether :class:`_LinearScaleShift` runs: a backward will come, the
        layer is frozen, and the forward is run, not captured (a graph
        compiler or exporter gets the plain form)."""
        scale_shift = self.scale_shift
        if not torch.is_grad_enabled() or is_capturing() or not (
                inputs.requires_grad or scale_shift.scale.requires_grad
                or scale_shift.shift.requires_grad):
            return False
        return not self.weight.requires_grad and (
            self.bias is None or not self.bias.requires_grad)

    def _plain_layer(self) -> nn.Linear:
        return nn.Linear(self.in_features, self.out_features, device='meta')


class Conv2dScaleShift(_RunsScaleShift, nn.Conv2d):
    """``nn.Conv2d`` with a :class:`ScaleShift` (``channel_dim=1``) on its
    output (the patch embedding's projection); arguments as
    :class:`LinearScaleShift`'s, ``conv`` the layer."""

    def __init__(self, conv: nn.Conv2d, scale_shift: ScaleShift, name: str) -> None:
        super().__init__(conv.in_channels, conv.out_channels, conv.kernel_size, conv.stride,
                         conv.padding, conv.dilation, conv.groups, conv.bias is not None,
                         conv.padding_mode, device='meta')
        self._adopt(conv, scale_shift, name)

    def _plain_layer(self) -> nn.Conv2d:
        return nn.Conv2d(self.in_channels, self.out_channels, self.kernel_size, self.stride,
                         self.padding, self.dilation, self.groups, True,
                         self.padding_mode, device='meta')

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._conv_forward(x, *self.folded())  # (B, C, H, W)


def scale_shift_projection(patch_embed: nn.Module, dims: int) -> None:
    """Scale & shift the output of ``patch_embed.projection`` (registered as
    ``patch_embed.ssf_proj``)."""
    patch_embed.ssf_proj = ScaleShift(dims, channel_dim=1)  # (B, C, H, W) output
    patch_embed.projection = Conv2dScaleShift(patch_embed.projection,
                                              patch_embed.ssf_proj, 'ssf_proj')


def attach_scale_shift(attn: nn.Module, ffn: nn.Module, dims: int) -> None:
    """Scale & shift the value part of ``attn.qkv`` (a fused q, k, v
    projection), ``attn.proj`` and both layers of ``ffn`` (mmcv's ``FFN``), as
    ``attn.ssf_value``, ``attn.ssf_proj``, ``ffn.ssf_fc1`` and ``ffn.ssf_fc2``;
    the four linear layers become :class:`LinearScaleShift` that run them."""
    attn.ssf_value = ScaleShift(dims, offset=2 * dims)  # v of the fused qkv
    attn.qkv = LinearScaleShift(attn.qkv, attn.ssf_value, 'ssf_value')
    attn.ssf_proj = ScaleShift(dims)
    attn.proj = LinearScaleShift(attn.proj, attn.ssf_proj, 'ssf_proj')
    attach_ffn_scale_shift(ffn)


def attach_ffn_scale_shift(ffn: nn.Module) -> None:
    """Scale & shift both layers of ``ffn`` (mmcv's ``FFN``) as ``ffn.ssf_fc1``
    and ``ffn.ssf_fc2``; its two linear layers become :class:`LinearScaleShift`."""
    fc1, fc2 = ffn.layers[0][0], ffn.layers[1]
    ffn.ssf_fc1 = ScaleShift(fc1.out_features)
    ffn.layers[0][0] = LinearScaleShift(fc1, ffn.ssf_fc1, 'ssf_fc1')
    ffn.ssf_fc2 = ScaleShift(fc2.out_features)
    ffn.layers[1] = LinearScaleShift(fc2, ffn.ssf_fc2, 'ssf_fc2')

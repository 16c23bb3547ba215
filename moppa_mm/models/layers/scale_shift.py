"""Learnable per-channel scale & shift (SSF / RLRR style), applied to a
module's output through a forward hook so the module keeps its parameter names."""
import torch
import torch.nn as nn
import torch.nn.functional as F


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

    def extra_repr(self) -> str:
        return f'dims={self.dims}, channel_dim={self.channel_dim}, offset={self.offset}'


def attach_scale_shift(attn: nn.Module, ffn: nn.Module, dims: int) -> None:
    """Scale & shift the value part of ``attn.qkv`` (a fused q, k, v
    projection), ``attn.proj`` and both layers of ``ffn`` (mmcv's ``FFN``), as
    ``attn.ssf_value``, ``attn.ssf_proj``, ``ffn.ssf_fc1`` and ``ffn.ssf_fc2``
    (forward hooks: the hooked layers keep their parameter names)."""
    attn.ssf_value = ScaleShift(dims, offset=2 * dims)  # v of the fused qkv
    attn.qkv.register_forward_hook(attn.ssf_value.output_hook)
    attn.ssf_proj = ScaleShift(dims)
    attn.proj.register_forward_hook(attn.ssf_proj.output_hook)
    fc1, fc2 = ffn.layers[0][0], ffn.layers[1]
    ffn.ssf_fc1 = ScaleShift(fc1.out_features)
    fc1.register_forward_hook(ffn.ssf_fc1.output_hook)
    ffn.ssf_fc2 = ScaleShift(fc2.out_features)
    fc2.register_forward_hook(ffn.ssf_fc2.output_hook)

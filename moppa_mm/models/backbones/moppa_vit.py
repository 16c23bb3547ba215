"""MoPPA Vision Transformer for MMPretrain (paper Sec. 4, Tables 2-4).

A subclass of mmpretrain's ``VisionTransformer``: after ``super().__init__()``
every layer gets a MoPPA unit before self-attention, on the patch-token grid
(extra tokens such as the class token pass unchanged), plus learnable scale &
shift (RLRR/SSF style, paper supplementary) on the patch embedding, the attention
value and output projections and both MLP layers. Everything is wired with
forward hooks, so the base parameter names are unchanged and mmpretrain / timm /
JAX checkpoints (through :mod:`moppa_mm.models.converters`) load as they are.
"""
import math
from typing import Optional, Tuple

import torch
import torch.nn as nn
from mmpretrain.models.backbones import VisionTransformer
from mmpretrain.registry import MODELS

from moppa_mm.operators import MoPPAUnit
from moppa_mm.operators.dct import dct2d_of_suffix, idct2d_after_prefix
from ..layers import ScaleShift
from ..layers.scale_shift import attach_scale_shift
from .adapter_mixin import AdapterMixin


class ViTMoPPAUnit(MoPPAUnit):
    """A :class:`MoPPAUnit` with the pre-hook that puts it before a ViT layer's
    attention (a bound method: ``copy.deepcopy`` rewires it)."""

    enabled = True
    num_extra_tokens = 1
    # the patch grid of the backbone forward in progress (set from the patch
    # embedding's output, cleared when the backbone's forward returns)
    forward_grid: Optional[Tuple[int, int]] = None

    def patch_grid(self, num_patches: int) -> Tuple[int, int]:
        """The (H, W) grid of ``num_patches`` patch tokens: that of the backbone
        forward in progress, else the reference grid, else a square one."""
        for grid in (self.forward_grid, self.grid_size):
            if grid is not None and grid[0] * grid[1] == num_patches:
                return tuple(grid)
        side = math.isqrt(num_patches)
        if side * side == num_patches:
            return side, side
        raise ValueError(
            f'cannot tell the patch grid of {num_patches} patch tokens (after '
            f'{self.num_extra_tokens} extra tokens): not the reference grid '
            f'{self.grid_size} and not square. Call the layer through the '
            'backbone, whose patch embedding gives the grid')

    def attn_hook(self, attn: nn.Module, args: tuple):
        if not self.enabled:
            return None
        x, *rest = args  # (B, extra + H*W, C), after ln1
        batch, tokens, channels = x.shape
        grid = self.patch_grid(tokens - self.num_extra_tokens)
        # the patch tokens' DCT reads them in place, and the inverse writes
        # behind the extra tokens: no split or concatenation pass either way
        extra, spectrum = dct2d_of_suffix(x, self.num_extra_tokens, grid)
        spectrum = self.filter_spectrum(spectrum)
        if spectrum.dtype == x.dtype and not torch.is_autocast_enabled(x.device.type):
            return (idct2d_after_prefix(spectrum, extra), *rest)
        patches = self.inverse(spectrum, x.dtype)  # (B, H, W, C)
        x = torch.cat([extra, patches.reshape(batch, -1, channels)], dim=1)
        return (x, *rest)


@MODELS.register_module()
class MoPPAVisionTransformer(AdapterMixin, VisionTransformer):
    """Vision Transformer with MoPPA units and scale & shift adapters.

    All arguments of mmpretrain's ``VisionTransformer`` are accepted, plus
    those below. ``frozen_stages`` freezes the adapters inside the frozen parts
    too (the patch embedding's scale & shift, the frozen layers' adapters), as
    in the MoPPA Swin. The units take the patch grid of the backbone forward in
    progress; a layer called on its own infers it from its token count
    (mmpretrain's ViT layers have no gradient checkpointing, whose recompute
    would run after the forward).

    Args:
        moppa_cfg (dict | MoPPAConfig, optional): The units' options
            (:class:`~moppa_mm.models.MoPPAConfig`: ``eta``, ``init_mode``,
            ``heat_param``, ``experts``, ...); unset ones take the shipped
            recipe's defaults.
        moppa_heads (int, optional): MoPPA heads; defaults to the attention's.
        use_moppa (bool): Add the MoPPA units (False: the paper's "w/o MoPPA"
            ablation; the scale & shift adapters stay). Defaults to True.
        use_scale_shift (bool): Add the scale & shift adapters. Defaults to True.
        freeze_pretrained (bool): Freeze everything except the adapters when
            built (the head lives outside the backbone and stays trainable).
            Defaults to True.
        route_loss_weight (float): ``w`` of the route regularisation (paper
            Eq. 13), added to the model's loss dict as ``loss_route``; 0 turns
            it off. Defaults to 1.0.
        route_schedule (str): ``T`` of Eq. 13: ``'epoch'``, ``'iter'`` or
            ``'auto'`` (epochs when the run has more than one). Defaults to
            ``'auto'``.
        strict_adapter_record (bool): Stop when a checkpoint's adapter record
            disagrees with this model (default); False warns instead.
    """

    RESIZES_FREQUENCY_MAPS = True  # the patch grid follows img_size
    RECORD_MAY_DIFFER = ('arch.img_grid', 'adapters.grid')
    FINGERPRINT_SKIPS = ('pos_embed', )  # resized to img_size on load
    ADAPTER_TYPES = (ViTMoPPAUnit, ScaleShift)
    PRETRAINED_LABEL = 'pre-trained ViT'

    def __init__(self,
                 *args,
                 moppa_cfg: Optional[dict] = None,
                 moppa_heads: Optional[int] = None,
                 use_moppa: bool = True,
                 use_scale_shift: bool = True,
                 freeze_pretrained: bool = True,
                 route_loss_weight: float = 1.0,
                 route_schedule: str = 'auto',
                 strict_adapter_record: bool = True,
                 **kwargs) -> None:
        self.moppa_config = moppa_config = self._pop_adapter_args(moppa_cfg, kwargs)
        super().__init__(*args, **kwargs)
        self.moppa_config = moppa_config
        self.use_moppa = use_moppa
        self.use_scale_shift = use_scale_shift
        grid = tuple(self.patch_embed.init_out_size)  # (H, W) at img_size
        for layer in self.layers:
            if use_moppa:
                heads = moppa_heads or layer.attn.num_heads
                layer.moppa = ViTMoPPAUnit(self.embed_dims, heads, grid,
                                           **moppa_config.unit_kwargs())
                layer.moppa.num_extra_tokens = self.num_extra_tokens
                layer.attn.register_forward_pre_hook(layer.moppa.attn_hook)
            if use_scale_shift:
                attach_scale_shift(layer.attn, layer.ffn, self.embed_dims)
        if use_scale_shift:
            self.patch_embed.ssf_proj = ScaleShift(self.embed_dims, channel_dim=1)
            self.patch_embed.projection.register_forward_hook(
                self.patch_embed.ssf_proj.output_hook)
        if use_moppa:
            self.patch_embed.register_forward_hook(self._record_patch_grid)
            self.register_forward_hook(self._clear_patch_grid)
        self._finish_build(freeze_pretrained, route_loss_weight, route_schedule,
                           strict_adapter_record)
        if self.frozen_stages > 0:  # the adapters of frozen parts freeze too
            self._freeze_stages()

    def arch_record(self) -> dict:
        return dict(embed_dims=self.embed_dims, num_layers=self.num_layers,
                    num_heads=self.layers[0].attn.num_heads,
                    feedforward_channels=self.layers[0].ffn.feedforward_channels,
                    patch_size=list(self.patch_embed.projection.kernel_size),
                    img_grid=list(self.patch_embed.init_out_size),
                    num_extra_tokens=self.num_extra_tokens)

    def adapter_options(self) -> dict:
        units = [layer.moppa for layer in self.layers if hasattr(layer, 'moppa')]
        return dict(use_moppa=self.use_moppa, use_scale_shift=self.use_scale_shift,
                    moppa_heads=[unit.num_heads for unit in units],
                    grid=list(units[0].grid_size) if units else None)

    def _record_patch_grid(self, patch_embed, args, output):
        _, patch_resolution = output  # PatchEmbed returns (tokens, (H, W))
        for layer in self.layers:
            layer.moppa.forward_grid = tuple(patch_resolution)

    def _clear_patch_grid(self, module, args, output):
        """After the backbone's forward: a layer called on its own (or
        recomputed later) infers its grid from its tokens."""
        for layer in self.layers:
            layer.moppa.forward_grid = None

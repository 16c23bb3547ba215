"""MoPPA Vision Transformer for MMSegmentation (its ViT-UperNet configs).

A subclass of MMSegmentation's ``VisionTransformer`` with the adapters of the
MMPretrain MoPPA ViT (:mod:`.moppa_vit`): every layer gets a MoPPA unit before
self-attention, on the patch-token grid (the class token passes unchanged),
and scale & shift on the patch embedding and both MLP layers. MMSegmentation's
layers run torch's ``nn.MultiheadAttention``, which reads its fused input
projection and its output projection as weights, not as layers: they have no
scale & shift here (the MMPretrain ViT scales the value and output
projections too). The base parameter names are unchanged, so MMSegmentation's
ViT bases (its ``vit2mmseg.py`` conversion) load through its own
``init_weights``; ``out_indices``, ``with_cls_token``, ``final_norm`` and the
rest keep their meaning. Registered in MMSegmentation's ``MODELS`` as
``MoPPAVisionTransformer``.
"""
from typing import Optional, Tuple

import torch
import torch.utils.checkpoint as cp
from mmseg.models.backbones import VisionTransformer
from mmseg.models.backbones.vit import TransformerEncoderLayer
from mmseg.registry import MODELS

from moppa_mm.operators import unit_terms
from ..layers import ScaleShift
from ..layers.scale_shift import attach_ffn_scale_shift, scale_shift_projection
from .adapter_mixin import AdapterMixin
from .class_swap import swap_class
from .moppa_vit import ViTMoPPAUnit


class MoPPAEncoderLayerSeg(TransformerEncoderLayer):
    """mmseg's ``TransformerEncoderLayer`` with the layer's MoPPA unit
    (``moppa``, when it has one) between ``ln1`` and the attention."""

    def forward(self, x: torch.Tensor, patch_grid: Optional[Tuple[int, int]] = None,
                unit_terms: Optional[Tuple[torch.Tensor, torch.Tensor]] = None) -> torch.Tensor:
        """``x``: (B, extra + H*W, C); ``patch_grid``: (H, W), None for the
        unit's guess from the token count (:meth:`ViTMoPPAUnit.patch_grid`);
        ``unit_terms``: the unit's filter and field, from the backbone (None:
        the unit's own). ``with_cp`` checkpoints it as the base class does."""
        if self.with_cp and x.requires_grad:
            return cp.checkpoint(self.forward_inner, x, patch_grid, *(unit_terms or ()),
                                 use_reentrant=True)
        return self.forward_inner(x, patch_grid, *(unit_terms or ()))

    def forward_inner(self, x: torch.Tensor, patch_grid: Optional[Tuple[int, int]] = None,
                      *unit_terms: torch.Tensor) -> torch.Tensor:
        attn_input = self.norm1(x)
        unit = self._modules.get('moppa')
        if unit is not None:
            attn_input = unit.forward_tokens(attn_input, patch_grid, unit_terms or None)
        x = self.attn(attn_input, identity=x)
        return self.ffn(self.norm2(x), identity=x)


@MODELS.register_module(name='MoPPAVisionTransformer')
class MoPPAVisionTransformerSeg(AdapterMixin, VisionTransformer):
    """MMSegmentation's Vision Transformer with MoPPA units and scale & shift.

    All arguments of mmseg's ``VisionTransformer`` are accepted (``img_size``,
    ``out_indices``, ``with_cls_token``, ``pretrained``, ...), plus
    ``moppa_cfg``, ``moppa_heads``, ``use_moppa``, ``use_scale_shift``,
    ``freeze_pretrained``, ``route_loss_weight``, ``route_schedule``,
    ``strict_adapter_record``, ``merged`` and ``random_base``, with the
    meaning and defaults they have in the MMPretrain
    :class:`~.moppa_vit.MoPPAVisionTransformer`. The units'
    reference grid is the patch grid at ``img_size`` (32 x 32 for 512 px and
    16 px patches); other grids (sliding-window or whole-image tests) resize
    the frequency maps.
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
                 merged: bool = False,
                 random_base: bool = False,
                 **kwargs) -> None:
        moppa_config = self._pop_adapter_args(moppa_cfg, kwargs)
        super().__init__(*args, **kwargs)
        self.moppa_config = moppa_config
        self.use_moppa = use_moppa
        self.use_scale_shift = use_scale_shift
        self.embed_dims = self.cls_token.shape[-1]
        grid = (self.img_size[0] // self.patch_size,
                self.img_size[1] // self.patch_size)  # (H, W) at img_size
        for layer in self.layers:
            swap_class(layer, {TransformerEncoderLayer: MoPPAEncoderLayerSeg})
            if use_moppa:
                heads = moppa_heads or layer.attn.num_heads
                layer.moppa = ViTMoPPAUnit(self.embed_dims, heads, grid,
                                           **moppa_config.unit_kwargs())
                layer.moppa.num_extra_tokens = int(self.with_cls_token)
            if use_scale_shift:
                attach_ffn_scale_shift(layer.ffn)
        if use_scale_shift:
            scale_shift_projection(self.patch_embed, self.embed_dims)
        self._finish_build(freeze_pretrained, route_loss_weight, route_schedule,
                           strict_adapter_record, random_base)
        self._build_base(merged)

    def arch_record(self) -> dict:
        return dict(embed_dims=self.embed_dims, num_layers=len(self.layers),
                    num_heads=self.layers[0].attn.num_heads,
                    feedforward_channels=self.layers[0].ffn.feedforward_channels,
                    patch_size=list(self.patch_embed.projection.kernel_size),
                    img_grid=[s // self.patch_size for s in self.img_size],
                    num_extra_tokens=int(self.with_cls_token))

    def adapter_options(self) -> dict:
        units = [layer.moppa for layer in self.layers if hasattr(layer, 'moppa')]
        return dict(use_moppa=self.use_moppa, use_scale_shift=self.use_scale_shift,
                    moppa_heads=[unit.num_heads for unit in units],
                    grid=list(units[0].grid_size) if units else None)

    def forward(self, inputs: torch.Tensor) -> tuple:
        """mmseg's ``VisionTransformer.forward`` with one change: every layer
        is called with the patch grid of this forward, which the patch
        embedding returns, and its unit's filter and field, made for all units
        at once (:func:`~moppa_mm.operators.unit_terms`)."""
        batch = inputs.shape[0]
        x, hw_shape = self.patch_embed(inputs)  # (B, H*W, C), (H, W)
        x = torch.cat((self.cls_token.expand(batch, -1, -1), x), dim=1)
        x = self._pos_embeding(x, hw_shape, self.pos_embed)  # (B, 1 + H*W, C)
        if not self.with_cls_token:
            x = x[:, 1:]  # (B, H*W, C)
        if self.pre_norm:
            x = self.pre_ln(x)
        terms = unit_terms([layer._modules.get('moppa') for layer in self.layers], hw_shape,
                           int(self.with_cls_token), x)
        outs = []
        if self.out_origin:
            outs.append(self._format_output(x, hw_shape))
        for i, layer in enumerate(self.layers):
            x = layer(x, hw_shape, terms[i])
            if i == len(self.layers) - 1 and self.final_norm:
                x = self.norm1(x)
            if i in self.out_indices:
                outs.append(self._format_output(x, hw_shape))
        return tuple(outs)

    def _format_output(self, x: torch.Tensor, hw_shape: Tuple[int, int]):
        """(B, extra + H*W, C) tokens -> the (B, C, H, W) map (with the class
        token, as ``[map, cls]``, when ``output_cls_token``)."""
        out = x[:, 1:] if self.with_cls_token else x  # (B, H*W, C)
        batch, _, channels = out.shape
        out = out.reshape(batch, *hw_shape, channels).permute(0, 3, 1, 2).contiguous()
        return [out, x[:, 0]] if self.output_cls_token else out  # (B, C, H, W)

"""MoPPA Vision Transformer for MMSegmentation (its ViT-UperNet configs)."""
from typing import Optional, Tuple

import torch
import torch.nn as nn
import torch.utils.checkpoint as cp
from mmseg.models.backbones import VisionTransformer
from mmseg.models.backbones.vit import TransformerEncoderLayer
from mmseg.registry import MODELS

from moppa_mm.operators import unit_terms
from moppa_mm.utils.errors import InputValueError
from ..layers.scale_shift import attach_ffn_scale_shift
from .moppa_vit import ViTAdapterMixin


class MoPPAEncoderLayerSeg(TransformerEncoderLayer):
    """mmseg's ``TransformerEncoderLayer`` with the layer's MoPPA unit
    (``moppa``, when it has one) between ``norm1`` and the attention."""

    def forward(self, x: torch.Tensor, patch_grid: Optional[Tuple[int, int]] = None,
                unit_terms: Optional[Tuple[torch.Tensor, torch.Tensor]] = None) -> torch.Tensor:
        """As :meth:`.moppa_vit.MoPPAEncoderLayer.forward`; ``with_cp``
        checkpoints it as the base class does."""
        if self.with_cp and x.requires_grad:
            return cp.checkpoint(self.forward_inner, x, patch_grid, *(unit_terms or ()),
                                 use_reentrant=True)
        return self.forward_inner(x, patch_grid, *(unit_terms or ()))

    def forward_inner(self, x: torch.Tensor, patch_grid: Optional[Tuple[int, int]] = None,
                      *unit_terms: torch.Tensor) -> torch.Tensor:
        attn_input = self.norm1(x)
        unit = self._modules.get('moppa')
        if unit is not None:
            attn_input = unit.forward_tokens(attn_input, patch_grid, unit_terms or None, x,
                                             self.norm1)
        x = self.attn(attn_input, identity=x)
        return self.ffn(self.norm2(x), identity=x)


@MODELS.register_module(name='MoPPAVisionTransformer')
class MoPPAVisionTransformerSeg(ViTAdapterMixin, VisionTransformer):
    """mmseg's ``VisionTransformer`` (all its arguments: ``img_size``,
    ``out_indices``, ``with_cls_token``, ``pretrained``...) with the adapters,
    arguments and defaults of :class:`~.moppa_vit.ViTAdapterMixin`, registered in
    mmseg's ``MODELS`` as ``MoPPAVisionTransformer``. Its layers run torch's
    ``nn.MultiheadAttention``, which reads its input and output projections as
    weights, not layers: only the patch embedding and the MLPs have scale &
    shift. mmseg's bases (``vit2mmseg.py``) load through its ``init_weights``.
    """

    LAYER_CLASSES = {TransformerEncoderLayer: MoPPAEncoderLayerSeg}

    def _refuse_uncovered(self, kwargs: dict) -> None:
        if kwargs.get('num_fcs', 2) != 2:  # the scale & shift runs in two-layer FFNs
            raise InputValueError(f"MoPPAVisionTransformerSeg: model.backbone.num_fcs = "
                                  f"{kwargs['num_fcs']}: MoPPA's scale & shift runs in the two-"
                                  "layer FFN: keep type='VisionTransformer' for another FFN")

    @property
    def num_extra_tokens(self) -> int:
        return int(self.with_cls_token)

    @property
    def patch_resolution(self) -> Tuple[int, int]:
        return self.img_size[0] // self.patch_size, self.img_size[1] // self.patch_size

    def _attach_scale_shift(self, layer: nn.Module) -> None:
        """Scale & shift the layer's MLP (its attention has no linear layers)."""
        attach_ffn_scale_shift(layer.ffn)

    def forward(self, inputs: torch.Tensor) -> tuple:
        """mmseg's ``VisionTransformer.forward``, each layer given the patch grid
        and its unit's terms, built for all units at once (:func:`unit_terms`)."""
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

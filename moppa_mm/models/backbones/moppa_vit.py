"""The MoPPA Vision Transformer, written once (:class:`ViTAdapterMixin`), and its
MMPretrain registration (paper Sec. 4, Tables 2-4); MMSegmentation's: :mod:`.moppa_vit_seg`."""
import math
from typing import Dict, Optional, Tuple

import torch
import torch.nn as nn
from mmcv.cnn.bricks.drop import DropPath
from mmpretrain.models.backbones import VisionTransformer
from mmpretrain.models.backbones.vision_transformer import TransformerEncoderLayer
from mmpretrain.models.utils import resize_pos_embed
from mmpretrain.registry import MODELS

from moppa_mm.operators import MoPPAUnit, unit_terms
from moppa_mm.utils.errors import InputValueError
from moppa_mm.utils.params import short_repr
from ..layers import ScaleShift
from ..layers.scale_shift import Conv2dScaleShift, attach_scale_shift
from .adapter_mixin import AdapterMixin


class ViTMoPPAUnit(MoPPAUnit):
    """A :class:`MoPPAUnit` on a ViT layer's tokens, before its attention: the
    patch tokens on their grid, the extra tokens (the class token) unchanged."""

    enabled = True
    num_extra_tokens = 1

    def patch_grid(self, num_patches: int) -> Tuple[int, int]:
        """The grid of ``num_patches`` patches for a layer called without one:
        the reference grid, else a square one."""
        if self.grid_size[0] * self.grid_size[1] == num_patches:
            return tuple(self.grid_size)
        side = math.isqrt(num_patches)
        if side * side == num_patches:
            return side, side
        raise ValueError(
            f'cannot tell the patch grid of {num_patches} patch tokens (after '
            f'{self.num_extra_tokens} extra tokens): not the reference grid '
            f'{self.grid_size} and not square. Call the layer through the '
            'backbone, whose patch embedding gives the grid')

    def forward_tokens(self, x: torch.Tensor, grid: Optional[Tuple[int, int]] = None,
                       terms: Optional[Tuple[torch.Tensor, torch.Tensor]] = None,
                       norm_input: Optional[torch.Tensor] = None,
                       norm: Optional[nn.Module] = None) -> torch.Tensor:
        """The unit on ``x`` (B, extra + H*W, C), the patches on ``grid`` (None:
        :meth:`patch_grid`); the rest as :meth:`MoPPAUnit.forward`'s."""
        if not self.enabled:
            return x
        grid = tuple(grid) if grid is not None else \
            self.patch_grid(x.shape[1] - self.num_extra_tokens)
        return self(x, grid, self.num_extra_tokens, terms, norm_input, norm)


class MoPPAEncoderLayer(TransformerEncoderLayer):
    """mmpretrain's ``TransformerEncoderLayer`` with the layer's MoPPA unit
    (``moppa``, when it has one) between ``ln1`` and the attention."""

    def forward(self, x: torch.Tensor, patch_grid: Optional[Tuple[int, int]] = None,
                unit_terms: Optional[Tuple[torch.Tensor, torch.Tensor]] = None) -> torch.Tensor:
        """``x``: (B, extra + H*W, C); ``patch_grid``: (H, W) (None: the unit's
        guess); ``unit_terms``: the unit's filter and field (None: its own)."""
        attn_input = self.ln1(x)
        unit = self._modules.get('moppa')
        if unit is not None:
            attn_input = unit.forward_tokens(attn_input, patch_grid, unit_terms, x, self.ln1)
        x = x + self.attn(attn_input)
        return self.ffn(self.ln2(x), identity=x)


class ViTAdapterMixin(AdapterMixin):
    """The MoPPA ViT, mixed into a package's ``VisionTransformer`` (before
    it). After its ``__init__`` every layer's class is swapped in place for its
    MoPPA subclass (``LAYER_CLASSES``): base parameter names stay the
    checkpoints' keys. Each layer gets a MoPPA unit before self-attention, on
    the patch-token grid at ``img_size``, plus scale & shift (RLRR/SSF style,
    paper supplementary) on the patch embedding, the attention and both MLP
    layers. The units need the patch grid, which only the patch embedding knows
    (63 tokens may be 7 x 9 or 9 x 7): the package's ``forward`` is written out.

    Args:
        moppa_cfg (dict | MoPPAConfig, optional): The units' options
            (:class:`~moppa_mm.models.MoPPAConfig`); unset ones take the shipped
            recipe's.
        moppa_heads (int, optional): MoPPA heads; defaults to the attention's.
        use_moppa (bool): Add the MoPPA units (False: the paper's "w/o MoPPA"
            ablation, the scale & shift adapters stay). Defaults to True.
        use_scale_shift (bool): Add the scale & shift adapters. Defaults to True.
        freeze_pretrained, route_loss_weight, route_schedule, strict_adapter_record,
            merged, random_base: The build options of every MoPPA backbone
            (:class:`~.adapter_mixin.AdapterMixin`).
    """

    RESIZES_FREQUENCY_MAPS = True  # the patch grid follows img_size
    RECORD_MAY_DIFFER = ('arch.img_grid', 'adapters.grid')
    FINGERPRINT_SKIPS = ('pos_embed', )  # resized to img_size on load
    ADAPTER_TYPES = (ViTMoPPAUnit, ScaleShift)
    PRETRAINED_LABEL = 'pre-trained ViT'
    LAYER_CLASSES: Dict[type, type] = {}

    def __init__(self, *args, moppa_cfg: Optional[dict] = None, moppa_heads: Optional[int] = None,
                 use_moppa: bool = True, use_scale_shift: bool = True,
                 freeze_pretrained: bool = True, route_loss_weight: float = 1.0,
                 route_schedule: str = 'auto', strict_adapter_record: bool = True,
                 merged: bool = False, random_base: bool = False, **kwargs) -> None:
        moppa_config = self._pop_adapter_args(kwargs, locals())
        super().__init__(*args, **kwargs)
        self.moppa_config, self.use_moppa, self.use_scale_shift = \
            moppa_config, use_moppa, use_scale_shift
        self.embed_dims = self.patch_embed.projection.out_channels  # mmseg's ViT has none
        for layer in self.layers:
            layer.__class__ = self.LAYER_CLASSES[type(layer)]  # in place: see the class doc
            if use_moppa:
                heads = moppa_heads or layer.attn.num_heads
                layer.moppa = ViTMoPPAUnit(self.embed_dims, heads, tuple(self.patch_resolution),
                                           **moppa_config.unit_kwargs())
                layer.moppa.num_extra_tokens = self.num_extra_tokens
            if use_scale_shift:
                self._attach_scale_shift(layer)
        if use_scale_shift:
            Conv2dScaleShift.convert(self.patch_embed.projection)
        for module in self.modules():  # numpy rates (np.linspace) break dynamo's
            if isinstance(module, DropPath):  # graph at `drop_prob == 0.`
                module.drop_prob = float(module.drop_prob)
        self._finish_build(freeze_pretrained, route_loss_weight, route_schedule,
                           strict_adapter_record, random_base)
        if getattr(self, 'frozen_stages', 0) > 0:  # mmpretrain's: the frozen
            self._freeze_stages()  # parts' adapters freeze too
        self._build_base(merged)

    def _attach_scale_shift(self, layer: nn.Module) -> None:
        attach_scale_shift(layer.attn, layer.ffn, self.embed_dims)

    def arch_record(self) -> dict:
        return dict(embed_dims=self.embed_dims, num_layers=len(self.layers),
                    num_heads=self.layers[0].attn.num_heads,
                    feedforward_channels=self.layers[0].ffn.feedforward_channels,
                    patch_size=list(self.patch_embed.projection.kernel_size),
                    img_grid=list(self.patch_resolution),
                    num_extra_tokens=self.num_extra_tokens)

    def adapter_options(self) -> dict:
        units = [layer.moppa for layer in self.layers if hasattr(layer, 'moppa')]
        return dict(use_moppa=self.use_moppa, use_scale_shift=self.use_scale_shift,
                    moppa_heads=[unit.num_heads for unit in units],
                    grid=list(units[0].grid_size) if units else None)


@MODELS.register_module()
class MoPPAVisionTransformer(ViTAdapterMixin, VisionTransformer):
    """mmpretrain's ``VisionTransformer`` (all its arguments) with the adapters,
    arguments and defaults of :class:`ViTAdapterMixin`. ``frozen_stages``
    freezes the adapters inside the frozen parts too. With
    ``out_type='avg_featmap'`` (MAE's fine-tuning) mmpretrain adds a norm of the
    pooled patch tokens, ``ln2``, which no pre-trained base has: it trains with
    the adapters (``params_not_in_base``), and a base without it loads.
    """

    LAYER_CLASSES = {TransformerEncoderLayer: MoPPAEncoderLayer}

    def _refuse_uncovered(self, kwargs: dict) -> None:
        """DeiT-3's and EVA-02's arch names (their ``'s'`` is 384-d, this class's
        768-d) and FFNs other than the two-layer one the scale & shift runs in."""
        arch = kwargs.get('arch', 'base')
        if isinstance(arch, str) and arch.lower() in ('s', 'small', 'm', 'medium'):
            raise InputValueError(
                f'MoPPAVisionTransformer: model.backbone.arch = {arch!r} is a DeiT3 / ViTEVA02 '
                "arch (a 384-d or 512-d ViT), which MoPPA does not stand in for: keep "
                "type='DeiT3' (or 'ViTEVA02') "
                "(mmpretrain VisionTransformer's 768-d, 8-layer 's' is given as an arch dict; "
                "DeiT's small ViT is arch='deit-s')")
        layer_cfgs = kwargs.get('layer_cfgs') or {}
        for cfg in [layer_cfgs] if isinstance(layer_cfgs, dict) else layer_cfgs:
            if (cfg.get('ffn_type', 'origin'), cfg.get('num_fcs', 2)) != ('origin', 2):
                raise InputValueError(
                    'MoPPAVisionTransformer: model.backbone.layer_cfgs = '
                    f"{short_repr(layer_cfgs)}: MoPPA's scale & shift runs in the two-layer "
                    "FFN (ffn_type='origin', num_fcs=2): keep type='VisionTransformer' for "
                    'another FFN')

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        """Stop at the base of a ViT this class does not stand in for, before
        mmpretrain's ``pos_embed`` resize misreads it: distilled DeiT's (a
        ``dist_token``), DeiT-3's (no class-token slot in ``pos_embed``)."""
        pos_embed = state_dict.get(prefix + 'pos_embed')
        tokens = pos_embed.shape[1] if isinstance(pos_embed, torch.Tensor) \
            and pos_embed.dim() == 3 else 0  # (1, extra + H*W, C)
        if prefix + 'dist_token' in state_dict:
            held, keep = "a dist_token: the base of mmpretrain's " \
                'DistilledVisionTransformer', 'DistilledVisionTransformer'
        elif self.cls_token is not None and tokens and math.isqrt(tokens) ** 2 == tokens:
            held, keep = (f'a pos_embed of {tokens} patches without a class-token slot: the '
                          "base of another ViT (mmpretrain's DeiT3 saves it so)"), 'DeiT3'
        else:
            return super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
        raise InputValueError(f'{type(self).__name__}: the checkpoint holds {held}, which '
                              f'MoPPA does not stand in for: keep type={keep!r}')

    @property
    def params_not_in_base(self) -> Tuple[str, ...]:
        """The pooled tokens' norm (MAE's fc_norm), new in fine-tuning."""
        return ('ln2.*', ) if self.out_type == 'avg_featmap' else ()

    def forward(self, x: torch.Tensor) -> tuple:
        """mmpretrain's ``VisionTransformer.forward``, each layer given the patch
        grid and its unit's terms, built for all units at once (:func:`unit_terms`)."""
        batch = x.shape[0]
        x, patch_resolution = self.patch_embed(x)  # (B, H*W, C), (H, W)
        if self.cls_token is not None:
            x = torch.cat((self.cls_token.expand(batch, -1, -1), x), dim=1)
        x = x + resize_pos_embed(self.pos_embed, self.patch_resolution, patch_resolution,
                                 mode=self.interpolate_mode,
                                 num_extra_tokens=self.num_extra_tokens)
        x = self.pre_norm(self.drop_after_pos(x))  # (B, extra + H*W, C)
        terms = unit_terms([layer._modules.get('moppa') for layer in self.layers],
                           patch_resolution, self.num_extra_tokens, x)
        outs = []
        for i, layer in enumerate(self.layers):
            x = layer(x, patch_resolution, terms[i])
            if i == len(self.layers) - 1 and self.final_norm:
                x = self.ln1(x)
            if i in self.out_indices:
                outs.append(self._format_output(x, patch_resolution))
        return tuple(outs)

"""MoPPA Vision Transformer for MMPretrain (paper Sec. 4, Tables 2-4).

A subclass of mmpretrain's ``VisionTransformer``: after ``super().__init__()``
every layer gets a MoPPA unit before self-attention, on the patch-token grid
(extra tokens such as the class token pass unchanged), plus learnable scale &
shift (RLRR/SSF style, paper supplementary) on the patch embedding, the attention
value and output projections and both MLP layers. Each layer is a
:class:`MoPPAEncoderLayer`, whose forward runs the unit; the linear layers and
the patch projection run their scale & shift
(:mod:`moppa_mm.models.layers.scale_shift`). The base parameter names are
unchanged, so mmpretrain / timm / JAX checkpoints (through
:mod:`moppa_mm.models.converters`) load as they are.

The units need the patch grid, which only the patch embedding knows (a token
count such as 63 may be 7 x 9 or 9 x 7): :meth:`MoPPAVisionTransformer.forward`
is the base class's with the grid handed to every layer.
"""
import math
from typing import Optional, Tuple

import torch
from mmcv.cnn.bricks.drop import DropPath
from mmpretrain.models.backbones import VisionTransformer
from mmpretrain.models.backbones.vision_transformer import TransformerEncoderLayer
from mmpretrain.models.utils import resize_pos_embed
from mmpretrain.registry import MODELS

from moppa_mm.operators import MoPPAUnit, unit_terms
from ..layers import ScaleShift
from ..layers.scale_shift import attach_scale_shift, scale_shift_projection
from .adapter_mixin import AdapterMixin
from .class_swap import swap_class


class ViTMoPPAUnit(MoPPAUnit):
    """A :class:`MoPPAUnit` on a ViT layer's tokens, before its attention: the
    patch tokens on their grid, the extra tokens (the class token) unchanged."""

    enabled = True
    num_extra_tokens = 1

    def patch_grid(self, num_patches: int) -> Tuple[int, int]:
        """The (H, W) grid of ``num_patches`` patch tokens when a layer is
        called without one: the reference grid, else a square one."""
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
                       terms: Optional[Tuple[torch.Tensor, torch.Tensor]] = None
                       ) -> torch.Tensor:
        """The unit on ``x``: (B, extra + H*W, C), the patch tokens on the
        (H, W) ``grid`` (None: :meth:`patch_grid`); ``terms``: its filter and
        field, made by the backbone for all its units at once (None: its own;
        :meth:`~moppa_mm.operators.MoPPAUnit.forward`)."""
        if not self.enabled:
            return x
        grid = tuple(grid) if grid is not None else \
            self.patch_grid(x.shape[1] - self.num_extra_tokens)
        return self(x, grid, self.num_extra_tokens, terms)


class MoPPAEncoderLayer(TransformerEncoderLayer):
    """mmpretrain's ``TransformerEncoderLayer`` with the layer's MoPPA unit
    (``moppa``, when it has one) between ``ln1`` and the attention."""

    def forward(self, x: torch.Tensor, patch_grid: Optional[Tuple[int, int]] = None,
                unit_terms: Optional[Tuple[torch.Tensor, torch.Tensor]] = None) -> torch.Tensor:
        """``x``: (B, extra + H*W, C); ``patch_grid``: (H, W), None for the
        unit's guess from the token count (:meth:`ViTMoPPAUnit.patch_grid`);
        ``unit_terms``: the unit's filter and field, from the backbone
        (:func:`~moppa_mm.operators.unit_terms`; None: the unit's own)."""
        attn_input = self.ln1(x)
        unit = self._modules.get('moppa')
        if unit is not None:
            attn_input = unit.forward_tokens(attn_input, patch_grid, unit_terms)
        x = x + self.attn(attn_input)
        return self.ffn(self.ln2(x), identity=x)


@MODELS.register_module()
class MoPPAVisionTransformer(AdapterMixin, VisionTransformer):
    """Vision Transformer with MoPPA units and scale & shift adapters.

    All arguments of mmpretrain's ``VisionTransformer`` are accepted, plus
    those below. ``frozen_stages`` freezes the adapters inside the frozen parts
    too (the patch embedding's scale & shift, the frozen layers' adapters), as
    in the MoPPA Swin. The backbone's forward hands each layer the patch grid;
    a layer called on its own without one infers it from its token count.

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
            disagrees with this model, cannot be read or is absent (default);
            False warns instead.
        merged (bool): Build the backbone merged for inference
            (:meth:`merge_adapters`), to load a merged checkpoint
            (``publish_model.py --merge``). Defaults to False: the ``Pretrained``
            checkpoint of ``init_cfg`` is loaded when the backbone is built.
        random_base (bool): The frozen base is random on purpose (benchmarks,
            tests); otherwise training without a pre-trained base stops
            (:class:`~.adapter_mixin.AdapterMixin`). Defaults to False.

    With ``out_type='avg_featmap'`` (MAE's fine-tuning) mmpretrain adds a norm
    of the pooled patch tokens, ``ln2``, which no pre-trained base has: it
    trains with the adapters (``fresh_params``; the parameter table and the
    adapter record name it), and a base without it loads.
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
        self.moppa_config = moppa_config = self._pop_adapter_args(moppa_cfg, kwargs)
        super().__init__(*args, **kwargs)
        self.moppa_config = moppa_config
        self.use_moppa = use_moppa
        self.use_scale_shift = use_scale_shift
        grid = tuple(self.patch_embed.init_out_size)  # (H, W) at img_size
        for layer in self.layers:
            swap_class(layer, {TransformerEncoderLayer: MoPPAEncoderLayer})
            if use_moppa:
                heads = moppa_heads or layer.attn.num_heads
                layer.moppa = ViTMoPPAUnit(self.embed_dims, heads, grid,
                                           **moppa_config.unit_kwargs())
                layer.moppa.num_extra_tokens = self.num_extra_tokens
            if use_scale_shift:
                attach_scale_shift(layer.attn, layer.ffn, self.embed_dims)
        if use_scale_shift:
            scale_shift_projection(self.patch_embed, self.embed_dims)
        # the pooled tokens' norm (MAE's fc_norm) is new in fine-tuning: it trains
        self.fresh_params = ('ln2.*', ) if self.out_type == 'avg_featmap' else ()
        for module in self.modules():  # numpy rates (np.linspace) break dynamo's
            if isinstance(module, DropPath):  # graph at `drop_prob == 0.`
                module.drop_prob = float(module.drop_prob)
        self._finish_build(freeze_pretrained, route_loss_weight, route_schedule,
                           strict_adapter_record, random_base)
        if self.frozen_stages > 0:  # the adapters of frozen parts freeze too
            self._freeze_stages()
        self._build_base(merged)

    def arch_record(self) -> dict:
        return dict(embed_dims=self.embed_dims, num_layers=self.num_layers,
                    num_heads=self.layers[0].attn.num_heads,
                    feedforward_channels=self.layers[0].ffn.feedforward_channels,
                    patch_size=list(self.patch_embed.projection.kernel_size),
                    img_grid=list(self.patch_embed.init_out_size),
                    num_extra_tokens=self.num_extra_tokens)

    def adapter_options(self) -> dict:
        units = [layer.moppa for layer in self.layers if hasattr(layer, 'moppa')]
        options = dict(use_moppa=self.use_moppa, use_scale_shift=self.use_scale_shift,
                       moppa_heads=[unit.num_heads for unit in units],
                       grid=list(units[0].grid_size) if units else None)
        if self.fresh_params:  # recorded only where there are any (earlier records)
            options['fresh_params'] = list(self.fresh_params)
        return options

    def forward(self, x: torch.Tensor) -> tuple:
        """mmpretrain's ``VisionTransformer.forward`` with one change: every
        layer is called with the patch grid of this forward, which the patch
        embedding returns, and its unit's filter and field, made for all units
        at once (:func:`~moppa_mm.operators.unit_terms`)."""
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

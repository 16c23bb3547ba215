"""What the MoPPA Swin backbones share (MMDetection's and MMPretrain's Swin
have the same block structure): the MoPPA unit and conv adapter with the hooks
that put them in a ``SwinBlock``, and the mixin that wires them (and the
optional scale & shift) into every block after the base ``__init__``.

Both packages call ``SwinBlock.attn(x, hw_shape)`` (a ``ShiftWindowMSA``),
whose ``w_msa(windows, mask=...)`` is the ``WindowMSA`` with ``qkv`` and
``proj``, then ``norm2`` and ``ffn(x, identity=...)`` (mmcv's ``FFN``), and
both have ``patch_embed.projection``: the hooks below fit either.
"""
from typing import Optional

import torch.nn as nn

from moppa_mm.operators import MoPPAUnit
from ..layers import ConvAdapter, ScaleShift
from ..layers.scale_shift import attach_scale_shift
from .adapter_mixin import AdapterMixin

SCOPES = ('window', 'global')


class SwinMoPPAUnit(MoPPAUnit):
    """A :class:`MoPPAUnit` with the forward pre-hooks that put it in a Swin
    block. The hooks are bound methods, so ``copy.deepcopy`` of the backbone
    (EMA, for one) rewires them to the copied units."""

    enabled = True

    def window_hook(self, w_msa: nn.Module, args: tuple):
        """Before ``WindowMSA``: on the (shifted) windows the attention sees."""
        if not self.enabled:
            return None
        windows, *rest = args  # (B*nW, Wh*Ww, C)
        num_windows, _, channels = windows.shape
        windows = self(windows.view(num_windows, *self.grid_size,
                                    channels))  # (B*nW, Wh, Ww, C)
        return (windows.view(num_windows, -1, channels), *rest)

    def global_hook(self, attn: nn.Module, args: tuple):
        """Before ``ShiftWindowMSA``: on the block's whole feature map."""
        if not self.enabled:
            return None
        query, hw_shape = args  # (B, H*W, C), (H, W)
        batch, _, channels = query.shape
        query = self(query.view(batch, *hw_shape, channels))  # (B, H, W, C)
        return query.view(batch, -1, channels), hw_shape


class SwinConvAdapter(ConvAdapter):
    """A :class:`ConvAdapter` with the hooks that put it before a Swin FFN.

    It transforms the output of the block's ``norm2``, which only the FFN reads,
    so it can recompute that output from the norm's input in backward instead
    of saving it (:meth:`ConvAdapter.forward_after_norm`)."""

    enabled = True

    _grid = None  # (H, W) handed from the attention call to norm2, used once

    def attn_hook(self, attn: nn.Module, args: tuple):
        """Before ``ShiftWindowMSA.forward(query, hw_shape)``: hand the grid to
        the ``norm2`` call that follows in the same block forward.

        Both calls happen inside the block's inner forward, so a gradient
        checkpoint's recompute repeats them in the same order, with the grid of
        the forward being recomputed (a pre-hook on the block would not run
        again there)."""
        self._grid = tuple(args[1])
        return None

    def norm_hook(self, norm: nn.Module, args: tuple, output):
        """After ``norm2``, i.e. right before ``FFN.forward(x, identity)``."""
        grid, self._grid = self._grid, None
        if not self.enabled:
            return None
        if grid is None:
            raise RuntimeError(
                'SwinConvAdapter: norm2 ran without the attention call before it '
                'in the same block forward, so the token grid is unknown; call '
                'the whole SwinBlock')
        batch, _, channels = output.shape  # (B, H*W, C)
        x = output.view(batch, *grid, channels)  # (B, H, W, C)
        return self.forward_after_norm(x, args[0], norm).view(batch, -1, channels)


class SwinAdapterMixin(AdapterMixin):
    """Mixed into a Swin subclass (before the base class): adds the adapters
    to every block after the base ``__init__``.

    Subclasses set ``IMG_SIZE_ARG``, the base class's argument for the
    pre-training image size (the ``global`` scope's reference grids), and the
    defaults of the switches in their own ``__init__`` signature.

    Args:
        moppa_scope (str): Where the unit's DCT runs. ``'window'``: on the
            same (shifted) windows the attention sees, so ``L`` is the window's
            token count as in the paper's parameter formula, and no resizing
            is needed. ``'global'``: on the block's whole feature map, with
            frequency parameters on a reference grid (the stage's grid at the
            pre-training image size) resized to the runtime grid.
        moppa_cfg (dict | MoPPAConfig, optional): The units' options
            (:class:`~moppa_mm.models.MoPPAConfig`: ``eta``, ``init_mode``,
            ``heat_param``, ``experts``, ...); unset ones take the shipped
            recipe's defaults. The unit uses the stage's attention heads.
        adapter_ratio (float): Bottleneck of the conv adapter,
            ``hidden = round(C / adapter_ratio)``.
        use_moppa (bool): Add the MoPPA units (False: the paper's "w/o MoPPA"
            ablation, the other adapters stay).
        use_conv_adapter (bool): Add a 3x3 conv adapter before every FFN.
        use_scale_shift (bool): Add scale & shift (RLRR/SSF style) on the patch
            embedding, the attention's value and output projections and both
            FFN layers, as the paper does for classification.
        freeze_pretrained (bool): Freeze every parameter except the adapters
            when built, so that DDP sees the final trainable set.
        route_loss_weight (float): ``w`` of the route regularisation (paper
            Eq. 13), added to the model's loss dict as ``loss_route``; 0 turns
            it off.
        route_schedule (str): ``T`` of Eq. 13: ``'epoch'``, ``'iter'`` or
            ``'auto'`` (epochs when the run has more than one).
        strict_adapter_record (bool): Stop when a checkpoint's adapter record
            disagrees with this model; False warns instead.
    """

    ADAPTER_TYPES = (SwinMoPPAUnit, SwinConvAdapter, ScaleShift)
    PRETRAINED_LABEL = 'pre-trained Swin'
    IMG_SIZE_ARG = 'pretrain_img_size'

    def __init__(self,
                 *args,
                 moppa_scope: str,
                 moppa_cfg: Optional[dict],
                 adapter_ratio: float,
                 use_moppa: bool,
                 use_conv_adapter: bool,
                 use_scale_shift: bool,
                 freeze_pretrained: bool,
                 route_loss_weight: float = 1.0,
                 route_schedule: str = 'auto',
                 strict_adapter_record: bool = True,
                 **kwargs) -> None:
        if moppa_scope not in SCOPES:
            raise ValueError(f'unknown moppa_scope {moppa_scope!r}, expected one '
                             f'of {SCOPES}')
        if adapter_ratio <= 0:
            raise ValueError(f'adapter_ratio must be > 0, got {adapter_ratio}')
        moppa_config = self._pop_adapter_args(moppa_cfg, kwargs)
        super().__init__(*args, **kwargs)
        self.moppa_scope = moppa_scope
        self.moppa_config = moppa_config
        self.adapter_ratio = adapter_ratio
        self.use_moppa = use_moppa
        self.use_conv_adapter = use_conv_adapter
        self.use_scale_shift = use_scale_shift
        pretrain_size = kwargs.get(self.IMG_SIZE_ARG, 224)
        pretrain_size = pretrain_size if isinstance(pretrain_size, int) \
            else pretrain_size[0]
        patch_size = kwargs.get('patch_size', 4)
        for stage_idx, stage in enumerate(self.stages):
            global_grid = max(pretrain_size // (patch_size * 2**stage_idx), 1)
            for block in stage.blocks:
                self._add_adapters(block, global_grid)
        if use_scale_shift:
            projection = self.patch_embed.projection  # (B, C, H, W) output
            self.patch_embed.ssf_proj = ScaleShift(projection.out_channels,
                                                   channel_dim=1)
            projection.register_forward_hook(self.patch_embed.ssf_proj.output_hook)
        self._finish_build(freeze_pretrained, route_loss_weight, route_schedule,
                           strict_adapter_record)

    def arch_record(self) -> dict:
        blocks = [stage.blocks[0].attn.w_msa for stage in self.stages]
        return dict(embed_dims=self.patch_embed.projection.out_channels,
                    depths=[len(stage.blocks) for stage in self.stages],
                    num_heads=[w_msa.num_heads for w_msa in blocks],
                    window_size=list(blocks[0].window_size),
                    patch_size=list(self.patch_embed.projection.kernel_size))

    def adapter_options(self) -> dict:
        blocks = [block for stage in self.stages for block in stage.blocks]
        units = [block.moppa for block in blocks if hasattr(block, 'moppa')]
        convs = [block.conv_adapter for block in blocks if hasattr(block, 'conv_adapter')]
        return dict(use_moppa=self.use_moppa, use_conv_adapter=self.use_conv_adapter,
                    use_scale_shift=self.use_scale_shift, moppa_scope=self.moppa_scope,
                    moppa_heads=[unit.num_heads for unit in units],
                    grids=[list(unit.grid_size) for unit in units],
                    conv_adapter_dims=[conv.hidden_dims for conv in convs])

    def _add_adapters(self, block: nn.Module, global_grid: int) -> None:
        w_msa = block.attn.w_msa
        embed_dims, num_heads = w_msa.embed_dims, w_msa.num_heads
        if self.use_moppa and self.moppa_scope == 'window':
            grid = tuple(w_msa.window_size)  # (Wh, Ww)
            block.moppa = SwinMoPPAUnit(embed_dims, num_heads, grid,
                                        **self.moppa_config.unit_kwargs())
            w_msa.register_forward_pre_hook(block.moppa.window_hook)
        elif self.use_moppa:
            block.moppa = SwinMoPPAUnit(embed_dims, num_heads, global_grid,
                                        **self.moppa_config.unit_kwargs())
            block.attn.register_forward_pre_hook(block.moppa.global_hook)
        if self.use_conv_adapter:
            hidden = max(int(round(embed_dims / self.adapter_ratio)), 1)
            block.conv_adapter = SwinConvAdapter(embed_dims, hidden)
            # norm2's output feeds only the FFN; the grid comes from the
            # attention call of the same block forward
            block.attn.register_forward_pre_hook(block.conv_adapter.attn_hook)
            block.norm2.register_forward_hook(block.conv_adapter.norm_hook)
        if self.use_scale_shift:
            attach_scale_shift(w_msa, block.ffn, embed_dims)

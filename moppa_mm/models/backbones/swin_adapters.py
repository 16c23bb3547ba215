"""The MoPPA Swin, written once for mmdet's, mmpretrain's and mmseg's Swin (the
same block structure); each package's file declares its classes over these."""
from typing import Dict, Optional, Tuple

import torch
import torch.nn as nn
import torch.utils.checkpoint as cp

from moppa_mm.operators import MoPPAUnit, moppa_units, shared_unit_terms, sharing_unit_terms
from moppa_mm.operators.tracing import is_capturing
from ..layers import ConvAdapter, ScaleShift
from ..layers.scale_shift import Conv2dScaleShift, attach_scale_shift
from .adapter_mixin import AdapterMixin


class SwinMoPPAUnit(MoPPAUnit):
    """A :class:`MoPPAUnit` on a Swin block's tokens: the attention windows
    (``scope='window'``, run by :class:`MoPPAWindowMSAMixin`) or the block's
    whole feature map (``'global'``, run by :class:`MoPPASwinBlockMixin`)."""

    enabled = True
    scope = 'window'

    def forward_tokens(self, tokens: torch.Tensor, grid: Tuple[int, int]) -> torch.Tensor:
        """The unit on ``tokens`` (N, H*W, C) on ``grid``, with the filter and field
        built for the stage's units (:func:`~moppa_mm.operators.shared_unit_terms`)."""
        if not self.enabled:
            return tokens
        return self(tokens, grid, terms=shared_unit_terms(self, grid, tokens))

    def extra_repr(self) -> str:
        return f'scope={self.scope}, {super().extra_repr()}'


class SwinConvAdapter(ConvAdapter):
    """A :class:`ConvAdapter` on the output of a Swin block's ``norm2``, which it
    recomputes in backward (:meth:`ConvAdapter.forward_after_norm`)."""

    enabled = True

    def forward_tokens(self, tokens: torch.Tensor, norm_input: torch.Tensor,
                       norm: nn.Module, hw_shape: Tuple[int, int]) -> torch.Tensor:
        if not self.enabled:
            return tokens
        return self.forward_after_norm(tokens, norm_input, norm, hw_shape)  # (B, H*W, C)


class MoPPAShiftWindowMSAMixin:
    """Mixed into a package's ``ShiftWindowMSA``: its ``window_reverse`` reads
    the batch off the windows (``-1``), where the packages' own ``int()`` of a
    float division makes a constant in a traced graph (an ONNX graph exported
    at batch 2 misreads batch 3) and ``torch.export`` refuse a dynamic batch."""

    def window_reverse(self, windows: torch.Tensor, h: int, w: int,
                       window_size: Optional[int] = None) -> torch.Tensor:
        """(B*nW, Ws, Ws, C) windows of an (H, W) grid -> (B, H, W, C);
        ``window_size`` as mmpretrain passes it, else the module's (mmdet, mmseg)."""
        window_size = window_size or self.window_size
        channels = windows.shape[-1]
        x = windows.view(-1, h // window_size, w // window_size, window_size,
                         window_size, channels)  # (B, H/Ws, W/Ws, Ws, Ws, C)
        return x.permute(0, 1, 3, 2, 4, 5).reshape(-1, h, w, channels)  # (B, H, W, C)


class MoPPAWindowMSAMixin:
    """Mixed into a package's ``WindowMSA`` (window scope): its unit
    (``moppa``) on the (shifted) windows, then the attention."""

    moppa: SwinMoPPAUnit

    def forward(self, x: torch.Tensor, mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        """``x``: (B*nW, Wh*Ww, C) windows; ``mask`` as the base class's."""
        unit = self.moppa
        return super().forward(unit.forward_tokens(x, unit.grid_size), mask=mask)


class MoPPASwinBlockMixin:
    """Mixed into a package's ``SwinBlock``: its forward written out with the
    adapters (the global-scope unit after ``norm1``, the conv adapter after
    ``norm2``); ``with_cp`` checkpoints it as the base class does."""

    def forward(self, x: torch.Tensor, hw_shape: Tuple[int, int]) -> torch.Tensor:
        """``x``: (B, H*W, C) on the ``hw_shape`` (H, W) grid."""
        if self.with_cp and x.requires_grad:
            return cp.checkpoint(self.forward_inner, x, hw_shape, use_reentrant=True)
        return self.forward_inner(x, hw_shape)

    def forward_inner(self, x: torch.Tensor, hw_shape: Tuple[int, int]) -> torch.Tensor:
        """The block without checkpointing (what ``with_cp`` recomputes)."""
        identity = x  # (B, H*W, C)
        x = self.norm1(x)
        unit = self._modules.get('moppa')  # global scope
        if unit is not None:
            x = unit.forward_tokens(x, hw_shape)
        x = self.attn(x, hw_shape) + identity
        tokens = self.norm2(x)
        conv_adapter = self._modules.get('conv_adapter')
        if conv_adapter is not None:
            tokens = conv_adapter.forward_tokens(tokens, x, self.norm2, hw_shape)
        return self.ffn(tokens, identity=x)


class SwinAdapterMixin(AdapterMixin):
    """The MoPPA Swin, mixed into a package's ``SwinTransformer`` (before it):
    after the base ``__init__`` it swaps the layers' classes (``LAYER_CLASSES``,
    :meth:`_add_adapters`) and adds the adapters. It takes all arguments of the
    package's Swin, plus these.

    Args:
        moppa_scope (str): Where the unit's DCT runs. ``'window'`` (default): on the
            (shifted) windows the attention sees (``L`` of the paper's parameter
            formula). ``'global'``: on the block's whole feature map, its
            frequency parameters on the stage's grid at the pre-training image
            size, resized to the runtime grid.
        moppa_cfg (dict | MoPPAConfig, optional): The units' options
            (:class:`~moppa_mm.models.MoPPAConfig`); unset ones take the shipped
            recipe's. The unit uses the stage's attention heads.
        adapter_ratio (float): The conv adapter's bottleneck, ``hidden = round(C /
            adapter_ratio)``; the default puts Swin-B near the paper's 3.18M.
        use_moppa (bool): Add the MoPPA units (False: the paper's "w/o MoPPA"
            ablation, the other adapters stay). Defaults to True.
        use_conv_adapter (bool): Add a 3x3 conv adapter before every FFN, as the
            paper does for detection. Defaults to True.
        use_scale_shift (bool): Add scale & shift (RLRR/SSF style) on the patch
            embedding, the attention's value and output projections and both FFN
            layers, as the paper does for classification. Defaults to False.
        freeze_pretrained, route_loss_weight, route_schedule, strict_adapter_record,
            merged, random_base: The build options of every MoPPA backbone
            (:class:`~.adapter_mixin.AdapterMixin`).
    """

    ADAPTER_TYPES = (SwinMoPPAUnit, SwinConvAdapter, ScaleShift)
    PRETRAINED_LABEL = 'pre-trained Swin'
    IMG_SIZE_ARG = 'pretrain_img_size'  # the package's pre-training image size argument
    LAYER_CLASSES: Dict[type, type] = {}  # the package's layer classes -> their MoPPA ones

    def __init__(self, *args, moppa_scope: str = 'window', moppa_cfg: Optional[dict] = None,
                 adapter_ratio: float = 7.25, use_moppa: bool = True,
                 use_conv_adapter: bool = True, use_scale_shift: bool = False,
                 freeze_pretrained: bool = True,
                 route_loss_weight: float = 1.0, route_schedule: str = 'auto',
                 strict_adapter_record: bool = True, merged: bool = False,
                 random_base: bool = False, **kwargs) -> None:
        moppa_config = self._pop_adapter_args(kwargs, locals())
        super().__init__(*args, **kwargs)
        self.moppa_scope, self.moppa_config, self.adapter_ratio = \
            moppa_scope, moppa_config, adapter_ratio
        self.use_moppa, self.use_conv_adapter, self.use_scale_shift = \
            use_moppa, use_conv_adapter, use_scale_shift
        pretrain_size = kwargs.get(self.IMG_SIZE_ARG, 224)
        pretrain_size = pretrain_size if isinstance(pretrain_size, int) else pretrain_size[0]
        patch_size = kwargs.get('patch_size', 4)
        for stage_idx, stage in enumerate(self.stages):
            global_grid = max(pretrain_size // (patch_size * 2**stage_idx), 1)
            for block in stage.blocks:
                self._add_adapters(block, global_grid)
        if use_scale_shift:
            Conv2dScaleShift.convert(self.patch_embed.projection)
        self._finish_build(freeze_pretrained, route_loss_weight, route_schedule,
                           strict_adapter_record, random_base)
        if self.frozen_stages >= 0:  # the base class freezes them at every train(): the
            self._freeze_stages()  # frozen stages' adapters are frozen from the start
        self._build_base(merged)

    def forward(self, x: torch.Tensor) -> tuple:
        """The package's forward, each stage's units' terms built once for the
        call, stacked (:func:`~moppa_mm.operators.sharing_unit_terms`)."""
        if is_capturing():  # a graph compiler fuses each unit's own
            return super().forward(x)
        with sharing_unit_terms([moppa_units(stage) for stage in self.stages], x):
            return super().forward(x)

    def arch_record(self) -> dict:
        blocks = [stage.blocks[0].attn.w_msa for stage in self.stages]
        return dict(embed_dims=self.patch_embed.projection.out_channels,
                    depths=[len(stage.blocks) for stage in self.stages],
                    num_heads=[w_msa.num_heads for w_msa in blocks],
                    window_size=list(blocks[0].window_size),
                    patch_size=list(self.patch_embed.projection.kernel_size))

    def adapter_options(self) -> dict:
        blocks = [block for stage in self.stages for block in stage.blocks]
        units = moppa_units(self)
        convs = [block.conv_adapter for block in blocks if hasattr(block, 'conv_adapter')]
        return dict(use_moppa=self.use_moppa, use_conv_adapter=self.use_conv_adapter,
                    use_scale_shift=self.use_scale_shift, moppa_scope=self.moppa_scope,
                    moppa_heads=[unit.num_heads for unit in units],
                    grids=[list(unit.grid_size) for unit in units],
                    conv_adapter_dims=[conv.hidden_dims for conv in convs])

    def _check_mergeable(self) -> None:
        if self.use_moppa and self.moppa_scope == 'global':
            raise ValueError(
                f"{type(self).__name__}: moppa_scope='global' units filter the whole "
                'feature map, whose grid follows the input size: their filters cannot '
                "become constants (merge_adapters). Window-scope units (the default) "
                'always see the window grid and merge')

    def _add_adapters(self, block: nn.Module, global_grid: int) -> None:
        """Swap ``block``'s (and its attention's) class for its MoPPA subclass,
        which adds methods, no state: the package's Swin builds its blocks
        itself, and modules left in place keep the checkpoints' keys. Then
        register the adapters, after the base parameters (the checkpoints' order)."""
        block.__class__ = self.LAYER_CLASSES[type(block)]
        block.attn.__class__ = self.LAYER_CLASSES[type(block.attn)]
        w_msa = block.attn.w_msa
        embed_dims, num_heads = w_msa.embed_dims, w_msa.num_heads
        if self.use_moppa:
            window = self.moppa_scope == 'window'
            grid = tuple(w_msa.window_size) if window else global_grid  # (Wh, Ww)
            unit = SwinMoPPAUnit(embed_dims, num_heads, grid, **self.moppa_config.unit_kwargs())
            unit.scope = self.moppa_scope
            if window:  # run by the window attention, on its windows
                w_msa.__class__ = self.LAYER_CLASSES[type(w_msa)]
                w_msa.moppa = unit
            else:  # run by the block, on its feature map
                block.moppa = unit
        if self.use_conv_adapter:
            hidden = max(int(round(embed_dims / self.adapter_ratio)), 1)
            block.conv_adapter = SwinConvAdapter(embed_dims, hidden)
        if self.use_scale_shift:
            attach_scale_shift(w_msa, block.ffn, embed_dims)

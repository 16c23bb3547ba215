"""What the MoPPA Swin backbones share (MMDetection's and MMPretrain's Swin
have the same block structure): the MoPPA unit and conv adapter, the block and
window attention whose ``forward`` runs them, and the mixin that puts them (and
the optional scale & shift) in every block after the base ``__init__``.

Both packages' ``SwinBlock.forward(x, hw_shape)`` runs ``norm1``, ``attn``
(a ``ShiftWindowMSA``, whose ``w_msa(windows, mask=...)`` is the
``WindowMSA`` with ``qkv`` and ``proj``), ``norm2`` and ``ffn(x, identity=...)``
(mmcv's ``FFN``). Each block is swapped for a subclass
(:class:`MoPPASwinBlockMixin` with the package's ``SwinBlock``) whose forward
is written out with the adapters in it, and, for the window scope, its
``w_msa`` for one (:class:`MoPPAWindowMSAMixin`) that runs the unit on the
windows. The adapters stay registered on the block (``moppa``,
``conv_adapter``), where the checkpoints have them.
"""
from typing import Dict, Optional, Tuple

import torch
import torch.nn as nn
import torch.utils.checkpoint as cp

from moppa_mm.operators import MoPPAUnit
from ..layers import ConvAdapter, ScaleShift
from ..layers.scale_shift import attach_scale_shift, refer_to, scale_shift_projection
from .adapter_mixin import AdapterMixin
from .class_swap import swap_class

SCOPES = ('window', 'global')


class SwinMoPPAUnit(MoPPAUnit):
    """A :class:`MoPPAUnit` on a Swin block's tokens: the attention windows
    (``scope='window'``, run by :class:`MoPPAWindowMSAMixin`) or the block's
    whole feature map (``'global'``, run by :class:`MoPPASwinBlockMixin`)."""

    enabled = True
    scope = 'window'

    def forward_windows(self, windows: torch.Tensor) -> torch.Tensor:
        """The unit on the (shifted) windows the attention sees."""
        if not self.enabled:
            return windows
        return self(windows, self.grid_size)  # (B*nW, Wh*Ww, C)

    def forward_tokens(self, tokens: torch.Tensor,
                       hw_shape: Tuple[int, int]) -> torch.Tensor:
        """The unit on the block's whole (H, W) feature map."""
        if not self.enabled:
            return tokens
        return self(tokens, hw_shape)  # (B, H*W, C)

    def extra_repr(self) -> str:
        return f'scope={self.scope}, {super().extra_repr()}'


class SwinConvAdapter(ConvAdapter):
    """A :class:`ConvAdapter` on the output of a Swin block's ``norm2``, which
    only the FFN reads: it recomputes that output from the norm's input in
    backward instead of saving it (:meth:`ConvAdapter.forward_after_norm`)."""

    enabled = True

    def forward_tokens(self, tokens: torch.Tensor, norm_input: torch.Tensor,
                       norm: nn.Module, hw_shape: Tuple[int, int]) -> torch.Tensor:
        """The adapter on ``tokens = norm(norm_input)``, an (H, W) grid."""
        if not self.enabled:
            return tokens
        batch, _, channels = tokens.shape  # (B, H*W, C)
        x = tokens.view(batch, *hw_shape, channels)  # (B, H, W, C)
        return self.forward_after_norm(x, norm_input, norm).view(
            batch, -1, channels)  # (B, H*W, C)


def window_reverse(windows: torch.Tensor, h: int, w: int, window_size: int) -> torch.Tensor:
    """(B*nW, Ws, Ws, C) windows of an (H, W) grid -> (B, H, W, C), the batch
    read off the windows (``-1``). The packages' own ``window_reverse`` works B
    out with a float division and ``int()``: a constant in a traced graph (an
    ONNX graph exported at batch 2 misreads batch 3) and a specialisation that
    makes ``torch.export`` refuse a dynamic batch."""
    channels = windows.shape[-1]
    x = windows.view(-1, h // window_size, w // window_size, window_size,
                     window_size, channels)  # (B, H/Ws, W/Ws, Ws, Ws, C)
    return x.permute(0, 1, 3, 2, 4, 5).reshape(-1, h, w, channels)  # (B, H, W, C)


class MoPPAWindowMSAMixin:
    """Mixed into a package's ``WindowMSA`` (window scope): the block's unit
    on the windows, then the attention. The unit is registered on the block
    (``moppa``, the checkpoints' key); ``window_unit`` refers to it."""

    window_unit: SwinMoPPAUnit

    def forward(self, x: torch.Tensor, mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        """``x``: (B*nW, Wh*Ww, C) windows; ``mask`` as the base class's."""
        return super().forward(self.window_unit.forward_windows(x), mask=mask)

    def extra_repr(self) -> str:
        return "window_unit=(the block's moppa)"


class MoPPASwinBlockMixin:
    """Mixed into a package's ``SwinBlock``: its forward written out with the
    adapters (when the block has them): ``norm1``, the global-scope unit,
    ``attn`` (the window-scope unit runs inside, see
    :class:`MoPPAWindowMSAMixin`), the residual, ``norm2``, the conv adapter,
    ``ffn`` with the residual. ``with_cp`` checkpoints it as the base class
    does; the recompute gets the grid with the call."""

    def forward(self, x: torch.Tensor, hw_shape: Tuple[int, int]) -> torch.Tensor:
        """``x``: (B, H*W, C) on the ``hw_shape`` (H, W) grid."""
        if self.with_cp and x.requires_grad:
            return cp.checkpoint(self.forward_inner, x, hw_shape, use_reentrant=True)
        return self.forward_inner(x, hw_shape)

    def forward_inner(self, x: torch.Tensor, hw_shape: Tuple[int, int]) -> torch.Tensor:
        """The block without checkpointing (what ``with_cp`` recomputes)."""
        identity = x  # (B, H*W, C)
        x = self.norm1(x)
        unit = self._modules.get('moppa')
        if unit is not None and unit.scope == 'global':
            x = unit.forward_tokens(x, hw_shape)
        x = self.attn(x, hw_shape) + identity
        tokens = self.norm2(x)
        conv_adapter = self._modules.get('conv_adapter')
        if conv_adapter is not None:
            tokens = conv_adapter.forward_tokens(tokens, x, self.norm2, hw_shape)
        return self.ffn(tokens, identity=x)


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
            disagrees with this model, cannot be read or is absent; False
            warns instead.
        merged (bool): Build the backbone merged for inference
            (:meth:`merge_adapters`), to load a merged checkpoint
            (``publish_model.py --merge``). False (default): the ``Pretrained``
            checkpoint of ``init_cfg`` is loaded when the backbone is built.
        random_base (bool): The frozen base is random on purpose (benchmarks,
            tests); otherwise training without a pre-trained base stops
            (:class:`~.adapter_mixin.AdapterMixin`). Defaults to False.
    """

    ADAPTER_TYPES = (SwinMoPPAUnit, SwinConvAdapter, ScaleShift)
    PRETRAINED_LABEL = 'pre-trained Swin'
    IMG_SIZE_ARG = 'pretrain_img_size'
    # the package's classes -> their MoPPA subclasses (set by each backbone)
    BLOCK_CLASSES: Dict[type, type] = {}
    WINDOW_MSA_CLASSES: Dict[type, type] = {}
    SHIFT_WINDOW_MSA_CLASSES: Dict[type, type] = {}  # batch-free window_reverse

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
                 merged: bool = False,
                 random_base: bool = False,
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
            scale_shift_projection(self.patch_embed,
                                   self.patch_embed.projection.out_channels)
        self._finish_build(freeze_pretrained, route_loss_weight, route_schedule,
                           strict_adapter_record, random_base)
        self._build_base(merged)

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

    def _check_mergeable(self) -> None:
        if self.use_moppa and self.moppa_scope == 'global':
            raise ValueError(
                f"{type(self).__name__}: moppa_scope='global' units filter the whole "
                'feature map, whose grid follows the input size: their filters cannot '
                "become constants (merge_adapters). Window-scope units (the default) "
                'always see the window grid and merge')

    def _add_adapters(self, block: nn.Module, global_grid: int) -> None:
        """Swap ``block`` for its MoPPA subclass and register the adapters on
        it (after the base parameters: their names and order are those of the
        checkpoints)."""
        swap_class(block, self.BLOCK_CLASSES)
        swap_class(block.attn, self.SHIFT_WINDOW_MSA_CLASSES)
        w_msa = block.attn.w_msa
        embed_dims, num_heads = w_msa.embed_dims, w_msa.num_heads
        if self.use_moppa:
            window = self.moppa_scope == 'window'
            grid = tuple(w_msa.window_size) if window else global_grid  # (Wh, Ww)
            block.moppa = SwinMoPPAUnit(embed_dims, num_heads, grid,
                                        **self.moppa_config.unit_kwargs())
            block.moppa.scope = self.moppa_scope
            if window:
                swap_class(w_msa, self.WINDOW_MSA_CLASSES)
                refer_to(w_msa, 'window_unit', block.moppa)
        if self.use_conv_adapter:
            hidden = max(int(round(embed_dims / self.adapter_ratio)), 1)
            block.conv_adapter = SwinConvAdapter(embed_dims, hidden)
        if self.use_scale_shift:
            attach_scale_shift(w_msa, block.ffn, embed_dims)

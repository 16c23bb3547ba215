"""MoPPA Swin Transformer for MMDetection (paper Sec. 4, Table 5).

A subclass of mmdet's ``SwinTransformer``: after ``super().__init__()`` every
block gets a MoPPA unit before its (shifted-)window attention and a 3x3 conv
adapter before its FFN (on the output of ``norm2``), run by the blocks'
written-out forward (:class:`MoPPASwinBlock`, :class:`MoPPAWindowMSA`). None
of the base class's parameter names change, so official checkpoints (and
mmdet's Swin key conversion) load as they are; only adapter keys are new. The
wiring is shared with the MMPretrain MoPPA Swin (:mod:`.swin_adapters`).
"""
from typing import Optional

from mmdet.models.backbones import SwinTransformer
from mmdet.models.backbones.swin import ShiftWindowMSA, SwinBlock, WindowMSA
from mmdet.registry import MODELS

from .swin_adapters import (SCOPES, MoPPASwinBlockMixin, MoPPAWindowMSAMixin,
                            SwinAdapterMixin, SwinConvAdapter, SwinMoPPAUnit,
                            window_reverse)

__all__ = ['MoPPASwinTransformer', 'MoPPASwinBlock', 'MoPPAWindowMSA', 'MoPPAShiftWindowMSA',
           'SwinMoPPAUnit', 'SwinConvAdapter', 'SCOPES']


class MoPPASwinBlock(MoPPASwinBlockMixin, SwinBlock):
    """mmdet's ``SwinBlock`` with its adapters (see :class:`MoPPASwinBlockMixin`)."""


class MoPPAWindowMSA(MoPPAWindowMSAMixin, WindowMSA):
    """mmdet's ``WindowMSA`` after the block's window-scope unit."""


class MoPPAShiftWindowMSA(ShiftWindowMSA):
    """mmdet's ``ShiftWindowMSA`` whose ``window_reverse`` keeps the batch
    dynamic in traced and exported graphs (:func:`.swin_adapters.window_reverse`)."""

    def window_reverse(self, windows, H, W):
        return window_reverse(windows, H, W, self.window_size)


@MODELS.register_module()
class MoPPASwinTransformer(SwinAdapterMixin, SwinTransformer):
    """Swin Transformer with MoPPA units and conv adapters in every block.

    All arguments of mmdet's ``SwinTransformer`` are accepted, plus those of
    :class:`SwinAdapterMixin` (``moppa_scope``, ``moppa_cfg``,
    ``adapter_ratio``, ``use_moppa``, ``use_conv_adapter``,
    ``use_scale_shift``, ``freeze_pretrained``, ``route_loss_weight``,
    ``route_schedule``, ``strict_adapter_record``, ``merged``,
    ``random_base``). Defaults: window scope, MoPPA units and conv adapters, no
    scale & shift. The default ``adapter_ratio``
    7.25 puts Swin-B's trainable backbone parameters (window 7) at 3.21M, +0.8%
    of the paper's 3.18M (MoPPA units 0.06M, conv adapters 3.15M). The global
    scope's reference grid is the stage's grid at ``pretrain_img_size``.
    """

    PRETRAINED_MAY_LACK = ('norm[0-9]*', )  # mmdet's per-stage output norms
    IMG_SIZE_ARG = 'pretrain_img_size'
    BLOCK_CLASSES = {SwinBlock: MoPPASwinBlock}
    WINDOW_MSA_CLASSES = {WindowMSA: MoPPAWindowMSA}
    SHIFT_WINDOW_MSA_CLASSES = {ShiftWindowMSA: MoPPAShiftWindowMSA}

    def __init__(self,
                 *args,
                 moppa_scope: str = 'window',
                 moppa_cfg: Optional[dict] = None,
                 adapter_ratio: float = 7.25,
                 use_moppa: bool = True,
                 use_conv_adapter: bool = True,
                 use_scale_shift: bool = False,
                 freeze_pretrained: bool = True,
                 **kwargs) -> None:
        super().__init__(*args, moppa_scope=moppa_scope, moppa_cfg=moppa_cfg,
                         adapter_ratio=adapter_ratio, use_moppa=use_moppa,
                         use_conv_adapter=use_conv_adapter,
                         use_scale_shift=use_scale_shift,
                         freeze_pretrained=freeze_pretrained, **kwargs)

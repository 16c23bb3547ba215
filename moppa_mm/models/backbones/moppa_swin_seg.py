"""MoPPA Swin Transformer for MMSegmentation (UperNet and the other decode
heads on ``mmseg``'s Swin).

A subclass of MMSegmentation's ``SwinTransformer`` with the same adapters and
wiring as the MMDetection MoPPA Swin (:mod:`.swin_adapters`): a MoPPA unit
before every block's (shifted-)window attention and a 3x3 conv adapter before
its FFN. MMSegmentation's Swin keeps its own key format and ``init_weights``:
its released bases (converted by its ``tools/model_converters/swin2mmseg.py``,
with or without a ``backbone.`` prefix) load as they are, and only adapter
keys are new. It is registered in MMSegmentation's ``MODELS`` under the name
``MoPPASwinTransformer``, as mmdet's and mmseg's own Swin are both
``SwinTransformer``: a config's scope (``default_scope``) picks the one that
fits its task.
"""
from typing import Optional

from mmseg.models.backbones import SwinTransformer
from mmseg.models.backbones.swin import ShiftWindowMSA, SwinBlock, WindowMSA
from mmseg.registry import MODELS

from .swin_adapters import (MoPPASwinBlockMixin, MoPPAWindowMSAMixin, SwinAdapterMixin,
                            window_reverse)


class MoPPASwinBlockSeg(MoPPASwinBlockMixin, SwinBlock):
    """mmseg's ``SwinBlock`` with its adapters (see
    :class:`~.swin_adapters.MoPPASwinBlockMixin`)."""


class MoPPAWindowMSASeg(MoPPAWindowMSAMixin, WindowMSA):
    """mmseg's ``WindowMSA`` after the block's window-scope unit."""


class MoPPAShiftWindowMSASeg(ShiftWindowMSA):
    """mmseg's ``ShiftWindowMSA`` whose ``window_reverse`` keeps the batch
    dynamic in traced and exported graphs (:func:`.swin_adapters.window_reverse`)."""

    def window_reverse(self, windows, H, W):
        return window_reverse(windows, H, W, self.window_size)


@MODELS.register_module(name='MoPPASwinTransformer')
class MoPPASwinTransformerSeg(SwinAdapterMixin, SwinTransformer):
    """MMSegmentation's Swin Transformer with MoPPA units and conv adapters.

    All arguments of mmseg's ``SwinTransformer`` are accepted
    (``pretrain_img_size``, ``embed_dims``, ``depths``, ``out_indices``, ...),
    plus those of :class:`~.swin_adapters.SwinAdapterMixin`, with the defaults
    of the MMDetection MoPPA Swin (dense prediction, as detection):
    ``moppa_scope='window'``, MoPPA units and conv adapters
    (``adapter_ratio=7.25``), no scale & shift. Swin-B's trainable backbone
    parameters are then 3.21M, as in the detector.
    """

    PRETRAINED_MAY_LACK = ('norm[0-9]*', )  # mmseg's per-stage output norms
    IMG_SIZE_ARG = 'pretrain_img_size'
    BLOCK_CLASSES = {SwinBlock: MoPPASwinBlockSeg}
    WINDOW_MSA_CLASSES = {WindowMSA: MoPPAWindowMSASeg}
    SHIFT_WINDOW_MSA_CLASSES = {ShiftWindowMSA: MoPPAShiftWindowMSASeg}

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

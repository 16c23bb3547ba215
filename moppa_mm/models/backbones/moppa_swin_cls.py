"""MoPPA Swin Transformer for MMPretrain (paper supplementary, Swin-B on
VTAB-1K).

A subclass of mmpretrain's ``SwinTransformer`` (whose ``forward`` returns the
tuple of normalised stage outputs that mmpretrain's necks and heads expect),
with the same adapters and wiring as the MMDetection MoPPA Swin
(:mod:`.swin_adapters`). It is registered in mmpretrain's ``MODELS`` under the
same name, ``MoPPASwinTransformer``, as mmdet's and mmpretrain's own Swin are
both ``SwinTransformer``: a config's scope (``default_scope``) picks the one
that fits its task.

Defaults follow the paper's classification set-up: MoPPA units on the attention
windows and scale & shift on the patch embedding, the attention's value and
output projections and the MLP; no conv adapter (the paper adds those for
detection). Official Swin release files load after
``tools/model_converters/vit_to_mmpretrain.py swin`` (:mod:`..converters`).
"""
from typing import Optional

from mmpretrain.models.backbones import SwinTransformer
from mmpretrain.models.backbones.swin_transformer import SwinBlock
from mmpretrain.models.utils.attention import ShiftWindowMSA, WindowMSA
from mmpretrain.registry import MODELS

from .swin_adapters import (MoPPASwinBlockMixin, MoPPAWindowMSAMixin, SwinAdapterMixin,
                            window_reverse)


class MoPPASwinBlockCls(MoPPASwinBlockMixin, SwinBlock):
    """mmpretrain's ``SwinBlock`` with its adapters (see
    :class:`~.swin_adapters.MoPPASwinBlockMixin`)."""


class MoPPAWindowMSACls(MoPPAWindowMSAMixin, WindowMSA):
    """mmpretrain's ``WindowMSA`` after the block's window-scope unit."""


class MoPPAShiftWindowMSACls(ShiftWindowMSA):
    """mmpretrain's ``ShiftWindowMSA`` whose ``window_reverse`` keeps the
    batch dynamic in traced and exported graphs
    (:func:`~.swin_adapters.window_reverse`)."""

    @staticmethod
    def window_reverse(windows, H, W, window_size):
        return window_reverse(windows, H, W, window_size)


@MODELS.register_module(name='MoPPASwinTransformer')
class MoPPASwinTransformerCls(SwinAdapterMixin, SwinTransformer):
    """mmpretrain's Swin Transformer with MoPPA units and scale & shift.

    All arguments of mmpretrain's ``SwinTransformer`` are accepted (``arch``,
    ``img_size``, ``window_size``, ``out_indices``, ...), plus those of
    :class:`SwinAdapterMixin`: ``moppa_scope`` (``'window'``), ``moppa_cfg``,
    ``adapter_ratio`` (7.25, for ``use_conv_adapter=True``), ``use_moppa``
    (True), ``use_conv_adapter`` (False), ``use_scale_shift`` (True),
    ``freeze_pretrained`` (True), ``route_loss_weight`` (1.0),
    ``route_schedule`` ('auto'), ``strict_adapter_record`` (True), ``merged``
    (False: the ``init_cfg`` base is loaded when built), ``random_base``
    (False). The global
    scope's reference grid is the stage's grid at ``img_size``.

    With Swin-B, window 7, the trainable backbone parameters are 0.23M (MoPPA
    units 0.06M, scale & shift 0.17M); with a VTAB-1K head (mean of the 19
    tasks) 0.28M, where the paper reports 0.39M.
    """

    IMG_SIZE_ARG = 'img_size'
    BLOCK_CLASSES = {SwinBlock: MoPPASwinBlockCls}
    WINDOW_MSA_CLASSES = {WindowMSA: MoPPAWindowMSACls}
    SHIFT_WINDOW_MSA_CLASSES = {ShiftWindowMSA: MoPPAShiftWindowMSACls}

    def __init__(self,
                 *args,
                 moppa_scope: str = 'window',
                 moppa_cfg: Optional[dict] = None,
                 adapter_ratio: float = 7.25,
                 use_moppa: bool = True,
                 use_conv_adapter: bool = False,
                 use_scale_shift: bool = True,
                 freeze_pretrained: bool = True,
                 **kwargs) -> None:
        super().__init__(*args, moppa_scope=moppa_scope, moppa_cfg=moppa_cfg,
                         adapter_ratio=adapter_ratio, use_moppa=use_moppa,
                         use_conv_adapter=use_conv_adapter,
                         use_scale_shift=use_scale_shift,
                         freeze_pretrained=freeze_pretrained, **kwargs)

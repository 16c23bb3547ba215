"""MoPPA Swin Transformer for MMDetection (paper Sec. 4, Table 5)."""
from mmdet.models.backbones import SwinTransformer
from mmdet.models.backbones.swin import ShiftWindowMSA, SwinBlock, WindowMSA
from mmdet.registry import MODELS

from .swin_adapters import (MoPPAShiftWindowMSAMixin, MoPPASwinBlockMixin, MoPPAWindowMSAMixin,
                            SwinAdapterMixin, SwinConvAdapter, SwinMoPPAUnit)

__all__ = ['MoPPASwinTransformer', 'SwinMoPPAUnit', 'SwinConvAdapter']


class MoPPASwinBlock(MoPPASwinBlockMixin, SwinBlock):
    """mmdet's ``SwinBlock`` running its adapters (:class:`MoPPASwinBlockMixin`)."""


class MoPPAWindowMSA(MoPPAWindowMSAMixin, WindowMSA):
    """mmdet's ``WindowMSA`` after the block's window-scope unit."""


class MoPPAShiftWindowMSA(MoPPAShiftWindowMSAMixin, ShiftWindowMSA):
    """mmdet's ``ShiftWindowMSA`` with a batch-agnostic ``window_reverse``."""


@MODELS.register_module()
class MoPPASwinTransformer(SwinAdapterMixin, SwinTransformer):
    """mmdet's ``SwinTransformer`` (all its arguments) with the adapters and
    arguments of :class:`~.swin_adapters.SwinAdapterMixin`. Defaults: window-scope
    MoPPA units and conv adapters, no scale & shift.

    mmdet's Swin builds its blocks itself: after its ``__init__`` each
    ``SwinBlock``, ``ShiftWindowMSA`` and (window scope) ``WindowMSA`` becomes
    an instance of the MoPPA subclass above (``LAYER_CLASSES``) in place, so
    that base parameter names are unchanged: official checkpoints (and mmdet's
    Swin key conversion) load as they are.
    """

    LAYER_CLASSES = {SwinBlock: MoPPASwinBlock, WindowMSA: MoPPAWindowMSA,
                     ShiftWindowMSA: MoPPAShiftWindowMSA}
    PRETRAINED_MAY_LACK = ('norm[0-9]*', )  # mmdet's per-stage output norms

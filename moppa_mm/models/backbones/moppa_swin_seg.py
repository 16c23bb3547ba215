"""MoPPA Swin Transformer for MMSegmentation (UperNet and the other decode heads)."""
from mmseg.models.backbones import SwinTransformer
from mmseg.models.backbones.swin import ShiftWindowMSA, SwinBlock, WindowMSA
from mmseg.registry import MODELS

from .swin_adapters import (MoPPAShiftWindowMSAMixin, MoPPASwinBlockMixin, MoPPAWindowMSAMixin,
                            SwinAdapterMixin)


class MoPPASwinBlockSeg(MoPPASwinBlockMixin, SwinBlock):
    """mmseg's ``SwinBlock`` running its adapters (:class:`MoPPASwinBlockMixin`)."""


class MoPPAWindowMSASeg(MoPPAWindowMSAMixin, WindowMSA):
    """mmseg's ``WindowMSA`` after the block's window-scope unit."""


class MoPPAShiftWindowMSASeg(MoPPAShiftWindowMSAMixin, ShiftWindowMSA):
    """mmseg's ``ShiftWindowMSA`` with a batch-agnostic ``window_reverse``."""


@MODELS.register_module(name='MoPPASwinTransformer')
class MoPPASwinTransformerSeg(SwinAdapterMixin, SwinTransformer):
    """mmseg's ``SwinTransformer`` (all its arguments) with the adapters and
    arguments of :class:`~.swin_adapters.SwinAdapterMixin`, registered in mmseg's
    ``MODELS`` as ``MoPPASwinTransformer`` (a config's ``default_scope`` picks
    the package). Defaults: the detector's. Its blocks become the MoPPA
    subclasses above in place, as in :class:`~.moppa_swin.MoPPASwinTransformer`:
    mmseg's key format and ``init_weights`` stay, so its bases
    (``swin2mmseg.py``, with or without a ``backbone.`` prefix) load as they are.
    """

    LAYER_CLASSES = {SwinBlock: MoPPASwinBlockSeg, WindowMSA: MoPPAWindowMSASeg,
                     ShiftWindowMSA: MoPPAShiftWindowMSASeg}
    PRETRAINED_MAY_LACK = ('norm[0-9]*', )  # mmseg's per-stage output norms

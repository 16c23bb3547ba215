"""MoPPA Swin Transformer for MMSegmentation (UperNet and the other decode heads):
mmseg's ``SwinTransformer`` (all its arguments) with the adapters and arguments of
:class:`~moppa_mm.models.backbones.swin_adapters.SwinAdapterMixin`, registered in
mmseg's ``MODELS`` as ``MoPPASwinTransformer`` (a config's ``default_scope`` picks
the package). Defaults: the detector's, window-scope MoPPA units and conv adapters,
no scale & shift (Swin-B: 3.21M trainable). mmseg's key format and
``init_weights`` stay: its bases (``swin2mmseg.py``, with or without a
``backbone.`` prefix) load as they are.
"""
from mmseg.models.backbones import SwinTransformer
from mmseg.models.backbones.swin import ShiftWindowMSA, SwinBlock, WindowMSA
from mmseg.registry import MODELS

from .swin_adapters import register_swin

MoPPASwinTransformerSeg = register_swin(
    MODELS, SwinTransformer, SwinBlock, WindowMSA, ShiftWindowMSA, suffix='Seg',
    module=__name__, doc=__doc__, img_size_arg='pretrain_img_size',
    pretrained_may_lack=('norm[0-9]*', ),  # mmseg's per-stage output norms
    use_conv_adapter=True, use_scale_shift=False)

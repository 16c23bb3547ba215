"""MoPPA Swin Transformer for MMDetection (paper Sec. 4, Table 5): mmdet's
``SwinTransformer`` (all its arguments) with the adapters and arguments of
:class:`~moppa_mm.models.backbones.swin_adapters.SwinAdapterMixin`. Defaults:
window-scope MoPPA units and conv adapters, no scale & shift (Swin-B: 3.21M
trainable). Base parameter names are unchanged: official checkpoints (and mmdet's
Swin key conversion) load as they are.
"""
from mmdet.models.backbones import SwinTransformer
from mmdet.models.backbones.swin import ShiftWindowMSA, SwinBlock, WindowMSA
from mmdet.registry import MODELS

from .adapter_mixin import SCOPES
from .swin_adapters import SwinConvAdapter, SwinMoPPAUnit, register_swin

__all__ = ['MoPPASwinTransformer', 'SwinMoPPAUnit', 'SwinConvAdapter', 'SCOPES']

MoPPASwinTransformer = register_swin(
    MODELS, SwinTransformer, SwinBlock, WindowMSA, ShiftWindowMSA, suffix='',
    module=__name__, doc=__doc__, img_size_arg='pretrain_img_size',
    pretrained_may_lack=('norm[0-9]*', ),  # mmdet's per-stage output norms
    use_conv_adapter=True, use_scale_shift=False)

"""MoPPA Swin Transformer for MMPretrain (paper supplementary, Swin-B on VTAB-1K):
mmpretrain's ``SwinTransformer`` (all its arguments: ``arch``, ``img_size``...)
with the adapters and arguments of
:class:`~moppa_mm.models.backbones.swin_adapters.SwinAdapterMixin`, registered in
mmpretrain's ``MODELS`` as ``MoPPASwinTransformer`` (a config's ``default_scope``
picks the package). Defaults: the paper's classification set-up, window-scope
MoPPA units and scale & shift, no conv adapter (Swin-B, window 7: 0.23M trainable;
0.28M with a VTAB-1K head, where the paper reports 0.39M). Official Swin releases
load after ``tools/model_converters/vit_to_mmpretrain.py swin``.
"""
from mmpretrain.models.backbones import SwinTransformer
from mmpretrain.models.backbones.swin_transformer import SwinBlock
from mmpretrain.models.utils.attention import ShiftWindowMSA, WindowMSA
from mmpretrain.registry import MODELS

from .swin_adapters import register_swin

MoPPASwinTransformerCls = register_swin(
    MODELS, SwinTransformer, SwinBlock, WindowMSA, ShiftWindowMSA, suffix='Cls',
    module=__name__, doc=__doc__, img_size_arg='img_size',
    use_conv_adapter=False, use_scale_shift=True)

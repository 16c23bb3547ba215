"""MoPPA Swin Transformer for MMPretrain (paper supplementary, Swin-B on VTAB-1K)."""
from mmpretrain.models.backbones import SwinTransformer
from mmpretrain.models.backbones.swin_transformer import SwinBlock
from mmpretrain.models.utils.attention import ShiftWindowMSA, WindowMSA
from mmpretrain.registry import MODELS

from moppa_mm.utils.errors import InputValueError
from .swin_adapters import (MoPPAShiftWindowMSAMixin, MoPPASwinBlockMixin, MoPPAWindowMSAMixin,
                            SwinAdapterMixin)


class MoPPASwinBlockCls(MoPPASwinBlockMixin, SwinBlock):
    """mmpretrain's ``SwinBlock`` running its adapters (:class:`MoPPASwinBlockMixin`)."""


class MoPPAWindowMSACls(MoPPAWindowMSAMixin, WindowMSA):
    """mmpretrain's ``WindowMSA`` after the block's window-scope unit."""


class MoPPAShiftWindowMSACls(MoPPAShiftWindowMSAMixin, ShiftWindowMSA):
    """mmpretrain's ``ShiftWindowMSA`` with a batch-agnostic ``window_reverse``."""


@MODELS.register_module(name='MoPPASwinTransformer')
class MoPPASwinTransformerCls(SwinAdapterMixin, SwinTransformer):
    """mmpretrain's ``SwinTransformer`` (all its arguments: ``arch``,
    ``img_size``...) with the adapters and arguments of
    :class:`~.swin_adapters.SwinAdapterMixin`, registered in mmpretrain's
    ``MODELS`` as ``MoPPASwinTransformer`` (a config's ``default_scope`` picks the
    package). Defaults: the paper's classification set-up, window-scope MoPPA
    units and scale & shift, no conv adapter. Its blocks become the MoPPA
    subclasses above in place, as in :class:`~.moppa_swin.MoPPASwinTransformer`.
    Official Swin releases load after ``tools/model_converters/vit_to_mmpretrain.py swin``.
    """

    LAYER_CLASSES = {SwinBlock: MoPPASwinBlockCls, WindowMSA: MoPPAWindowMSACls,
                     ShiftWindowMSA: MoPPAShiftWindowMSACls}
    IMG_SIZE_ARG = 'img_size'

    def __init__(self, *args, use_conv_adapter: bool = False, use_scale_shift: bool = True,
                 **kwargs) -> None:
        super().__init__(*args, use_conv_adapter=use_conv_adapter,
                         use_scale_shift=use_scale_shift, **kwargs)

    def _refuse_uncovered(self, kwargs: dict) -> None:
        if isinstance(kwargs.get('window_size'), (list, tuple)):  # SwinTransformerV2's
            raise InputValueError(
                f"MoPPASwinTransformerCls: model.backbone.window_size = {kwargs['window_size']}:"
                " a window per stage is mmpretrain's SwinTransformerV2's, which MoPPA does not "
                "stand in for: keep type='SwinTransformerV2'")

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, *args, **kwargs):
        """mmpretrain's Swin renames the keys of checkpoints saved before its
        version 3 (the final ``norm.`` is ``norm{last}.`` now; the ``attn_mask``
        buffers are gone) only when ``self.__class__ is SwinTransformer``: done
        here for this subclass, so that such checkpoints load as they do there."""
        version = local_metadata.get('version') or 0  # None: before versions
        last = f'norm{len(self.stages) - 1}.'
        for key in [k for k in state_dict if k.startswith(prefix)]:
            name = key[len(prefix):]
            if version < 3 and 'attn_mask' in name:
                del state_dict[key]
            elif version < 2 and name.startswith('norm.'):
                state_dict[prefix + last + name[len('norm.'):]] = state_dict.pop(key)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, *args, **kwargs)

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
    units and scale & shift, no conv adapter (Swin-B, window 7: 0.23M trainable;
    0.28M with a VTAB-1K head, where the paper reports 0.39M). Official Swin
    releases load after ``tools/model_converters/vit_to_mmpretrain.py swin``.

    Its blocks become the MoPPA subclasses above in place after mmpretrain's
    ``__init__``, as in :class:`~.moppa_swin.MoPPASwinTransformer`, so that base
    parameter names are unchanged.
    """

    LAYER_CLASSES = {SwinBlock: MoPPASwinBlockCls, WindowMSA: MoPPAWindowMSACls,
                     ShiftWindowMSA: MoPPAShiftWindowMSACls}
    IMG_SIZE_ARG = 'img_size'

    def __init__(self, *args, use_conv_adapter: bool = False, use_scale_shift: bool = True,
                 **kwargs) -> None:
        super().__init__(*args, use_conv_adapter=use_conv_adapter,
                         use_scale_shift=use_scale_shift, **kwargs)

    def _refuse_uncovered(self, kwargs: dict) -> None:
        """Windows per stage (a list) are SwinTransformerV2's."""
        if isinstance(kwargs.get('window_size'), (list, tuple)):
            raise InputValueError(
                f"MoPPASwinTransformerCls: model.backbone.window_size = {kwargs['window_size']!r}"
                ": a window per stage is mmpretrain's SwinTransformerV2's, which MoPPA does not "
                "stand in for: keep type='SwinTransformerV2'")

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, *args, **kwargs):
        """mmpretrain's Swin renames the keys of checkpoints saved before its
        version 3 (the final ``norm.`` is ``norm{last}.`` now; the ``attn_mask``
        buffers are gone) only when ``self.__class__ is SwinTransformer``: done
        here for this subclass, so that such checkpoints load as they do there.
        A SwinTransformerV2 base stops here, naming its type."""
        if any('cpb_mlp' in key for key in state_dict):  # its continuous position bias
            raise InputValueError(
                f"{type(self).__name__}: the checkpoint holds cpb_mlp: the base of mmpretrain's "
                'SwinTransformerV2, which MoPPA does not stand in for: keep '
                "model.backbone.type='SwinTransformerV2'")
        version = local_metadata.get('version') or 0  # None: before versions
        last = f'norm{len(self.stages) - 1}.'
        for key in [k for k in state_dict if k.startswith(prefix)]:
            name = key[len(prefix):]
            if version < 3 and 'attn_mask' in name:
                del state_dict[key]
            elif version < 2 and name.startswith('norm.'):
                state_dict[prefix + last + name[len('norm.'):]] = state_dict.pop(key)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, *args, **kwargs)

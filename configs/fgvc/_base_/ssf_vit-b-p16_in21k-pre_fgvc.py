# Scale & shift baseline ("SSF"): the MoPPA ViT without its MoPPA units, i.e.
# only the learnable scale & shift on the patch embedding, the attention value
# and output projections and both MLP layers (and the head) train: MoPPA's
# ablation "w/o MoPPA". Everything else is the MoPPA FGVC config's.
_base_ = './moppa_vit-b-p16_in21k-pre_fgvc.py'

model = dict(backbone=dict(use_moppa=False))
custom_hooks = [  # the MoPPA FGVC config's, without RouteRegularizationHook
    dict(type='PEFTFreezeHook'),
    dict(type='AdapterCheckpointHook'),
    dict(type='RNGStateHook'),
    dict(type='PlainCheckpointHook'),
    dict(type='NonFiniteLossHook'),
]

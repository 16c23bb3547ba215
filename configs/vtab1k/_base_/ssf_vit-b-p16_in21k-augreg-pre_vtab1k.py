# Scale & shift baseline ("SSF"): the MoPPA ViT without its MoPPA units, i.e.
# only the learnable scale & shift on the patch embedding, the attention value
# and output projections and both MLP layers (and the head) train: MoPPA's
# ablation "w/o MoPPA". Everything else is the MoPPA config's.
_base_ = './moppa_vit-b-p16_in21k-augreg-pre_vtab1k.py'

model = dict(backbone=dict(use_moppa=False))
custom_hooks = [  # the MoPPA config's, without RouteRegularizationHook
    dict(type='PEFTFreezeHook'),
    dict(type='AdapterCheckpointHook'),
    dict(type='RNGStateHook'),
    dict(type='PlainCheckpointHook'),
    dict(type='NonFiniteLossHook'),
]

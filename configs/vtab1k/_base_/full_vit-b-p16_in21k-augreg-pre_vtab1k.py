# Full fine-tuning baseline: mmpretrain's plain VisionTransformer with every
# parameter trainable. Data, schedule and pre-trained checkpoint are those of
# the MoPPA config; the learning rate is 10x lower (all 86M weights move).
_base_ = './moppa_vit-b-p16_in21k-augreg-pre_vtab1k.py'

model = dict(backbone=dict(
    _delete_=True,
    type='VisionTransformer',
    arch='b',
    img_size=224,
    patch_size=16,
    drop_path_rate=0.1,
    out_type='cls_token',
    final_norm=True,
    init_cfg=_base_.model.backbone.init_cfg))
optim_wrapper = dict(optimizer=dict(lr=1e-4))
custom_hooks = [
    # freezes nothing; logs the parameter table
    dict(type='PEFTFreezeHook', trainable=[], frozen=[]),
    dict(type='RNGStateHook'),
    dict(type='PlainCheckpointHook'),
    dict(type='NonFiniteLossHook'),
]

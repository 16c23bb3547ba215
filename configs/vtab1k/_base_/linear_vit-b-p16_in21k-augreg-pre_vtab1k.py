# Linear probe baseline: mmpretrain's plain VisionTransformer, frozen whole
# (frozen_stages=12: patch embedding, position embedding, class token, the 12
# layers and the final norm); only the task head trains. Data, schedule and
# pre-trained checkpoint are those of the MoPPA config.
_base_ = './moppa_vit-b-p16_in21k-augreg-pre_vtab1k.py'

model = dict(backbone=dict(
    _delete_=True,
    type='VisionTransformer',
    arch='b',
    img_size=224,
    patch_size=16,
    drop_path_rate=0.0,  # nothing in the backbone learns
    out_type='cls_token',
    final_norm=True,
    frozen_stages=12,
    init_cfg=_base_.model.backbone.init_cfg))
custom_hooks = [
    dict(type='PEFTFreezeHook', trainable=[], frozen=['backbone.*']),
    # no AdapterCheckpointHook: a plain ViT cannot refill a checkpoint without
    # its backbone, so checkpoints keep the frozen weights
    dict(type='RNGStateHook'),
    dict(type='PlainCheckpointHook'),
    dict(type='NonFiniteLossHook'),
]

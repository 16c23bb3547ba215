# Full fine-tuning baseline: mmpretrain's plain VisionTransformer (ViT-B/16)
# with every parameter trainable; the head, the normalisation and
# `pretrained` are the MoPPA ViT's. The config that inherits this sets the
# checkpoint (model.backbone.init_cfg.checkpoint) and a learning rate about 10x
# lower than MoPPA's (all 86M weights move).
_base_ = './moppa_vit-b-p16.py'

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

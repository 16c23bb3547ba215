# MoPPA ViT-B/16 for classification (paper Tables 2-4): mmpretrain's ViT-B/16,
# frozen, with a MoPPA unit before each self-attention and scale & shift on the
# patch embedding, the attention value and output projections and both MLP
# layers; the class token with the final norm feeds a linear head. The
# pre-trained checkpoint (`pretrained`, model.backbone.init_cfg.checkpoint) and
# its normalisation (data_preprocessor) come from the config that inherits this.
# The backbone carries the method: it freezes its base when built, adds
# loss_route (w = route_loss_weight, paper Eq. 13) to the loss dict, and its
# checkpoints hold the adapters and their record; the units' options default to
# the shipped recipe (moppa_mm.models.MoPPAConfig).
pretrained = None

model = dict(
    type='ImageClassifier',
    backbone=dict(
        type='MoPPAVisionTransformer',
        arch='b',
        img_size=224,
        patch_size=16,
        drop_path_rate=0.1,
        out_type='cls_token',
        final_norm=True,
        freeze_pretrained=True,
        route_loss_weight=1.0,
        init_cfg=dict(type='Pretrained', checkpoint=pretrained, prefix='backbone.')),
    neck=None,
    head=dict(
        type='VisionTransformerClsHead',
        num_classes=100,
        in_channels=768,
        loss=dict(type='CrossEntropyLoss', loss_weight=1.0)))

data_preprocessor = dict(
    num_classes=100, mean=[127.5, 127.5, 127.5], std=[127.5, 127.5, 127.5],
    to_rgb=True)

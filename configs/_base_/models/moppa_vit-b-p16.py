# MoPPA ViT-B/16 for classification (paper Tables 2-4): mmpretrain's ViT-B/16,
# frozen, with a MoPPA unit before each self-attention and scale & shift on the
# patch embedding, the attention value and output projections and both MLP
# layers; the class token with the final norm feeds a linear head. The
# pre-trained checkpoint (`pretrained`, model.backbone.init_cfg.checkpoint) and
# its normalisation (data_preprocessor) come from the config that inherits this.
# With the model go the hooks of the method: what trains, what is saved.
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
        moppa_cfg=dict(eta=1e-3, init_mode='identity', heat_param='softplus'),
        freeze_pretrained=True,
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

# w of the route regularisation (paper Eq. 13): RouteRegularizationHook reads
# it from the config, so a child config or --cfg-options route_loss_weight=0.5
# changes it
route_loss_weight = 1.0
custom_hooks = [
    dict(type='PEFTFreezeHook'),
    dict(type='RouteRegularizationHook'),  # w = route_loss_weight, read at train start
    dict(type='AdapterCheckpointHook'),  # ~1 MB per task instead of ~330 MB
    dict(type='RNGStateHook'),
    dict(type='PlainCheckpointHook'),  # checkpoints load with weights_only=True
    dict(type='NonFiniteLossHook'),  # stops at a NaN/inf loss, before saving
]

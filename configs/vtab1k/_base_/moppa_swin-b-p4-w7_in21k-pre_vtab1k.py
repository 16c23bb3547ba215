# MoPPA Swin-B (window 7) on one VTAB-1K task (paper supplementary, Swin-B
# table): the ViT-B/16 VTAB-1K recipe (data, schedule, hooks) with mmpretrain's
# Swin-B, MoPPA units on the attention windows and scale & shift (the paper's
# classification adapters), global average pooling and a linear head.
# ImageNet-22K pre-trained official release; convert it once:
#   python tools/model_converters/vit_to_mmpretrain.py swin \
#       swin_base_patch4_window7_224_22k.pth data/pretrained/swin-b-p4-w7_in21k.pth
_base_ = './moppa_vit-b-p16_vtab1k.py'
pretrained = 'data/pretrained/swin-b-p4-w7_in21k.pth'
model = dict(
    backbone=dict(
        _delete_=True,
        type='MoPPASwinTransformer',  # mmpretrain's registry: MoPPASwinTransformerCls
        arch='b',
        img_size=224,
        window_size=7,
        drop_path_rate=0.1,
        moppa_scope='window',
        use_moppa=True,
        use_scale_shift=True,
        use_conv_adapter=False,
        freeze_pretrained=True,
        init_cfg=dict(type='Pretrained', checkpoint=pretrained, prefix='backbone.')),
    neck=dict(_delete_=True, type='GlobalAveragePooling'),
    head=dict(
        _delete_=True,
        type='LinearClsHead',
        num_classes=100,
        in_channels=1024,
        loss=dict(type='CrossEntropyLoss', loss_weight=1.0)))
data_preprocessor = dict(mean=[123.675, 116.28, 103.53], std=[58.395, 57.12, 57.375])

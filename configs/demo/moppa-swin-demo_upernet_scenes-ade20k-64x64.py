# The segmentation demo on CPU in about a minute: the real MoPPA Swin UperNet config
# (configs/segmentation/) with a small Swin, 64 px generated scenes in the ADE20K
# layout (5 ADE20K classes, made by `python tools/demo/ade_scenes.py --root data/ade_demo`),
# 40 iterations, mIoU; MMSegmentation's own tools/train.py and tools/test.py run it.
_base_ = ('../segmentation/moppa-swin-base-patch4-window7-in22k-pre_upernet_'
          '8xb2-160k_ade20k-512x512.py')

data_root = 'data/ade_demo/'
classes = ('wall', 'building', 'sky', 'floor', 'tree')  # ADE20K's first five
crop_size = (64, 64)
pretrained = data_root + 'swin_demo_pretrained.pth'  # MMSegmentation's Swin format

model = dict(
    data_preprocessor=dict(size=crop_size),
    backbone=dict(
        embed_dims=32,
        depths=[2, 2, 2, 2],
        num_heads=[1, 2, 4, 8],
        drop_path_rate=0.0,
        init_cfg=dict(type='Pretrained', checkpoint=pretrained)),
    decode_head=dict(in_channels=[32, 64, 128, 256], channels=32, num_classes=5),
    auxiliary_head=dict(in_channels=128, channels=16, num_classes=5))

train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', reduce_zero_label=True),
    dict(type='RandomFlip', prob=0.5),
    dict(type='PackSegInputs')
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', reduce_zero_label=True),
    dict(type='PackSegInputs')
]
train_dataloader = dict(
    batch_size=4,
    num_workers=0,
    persistent_workers=False,
    dataset=dict(
        data_root=data_root,
        metainfo=dict(classes=classes),
        data_prefix=dict(img_path='images/training', seg_map_path='annotations/training'),
        pipeline=train_pipeline))
val_dataloader = dict(
    batch_size=1,
    num_workers=0,
    persistent_workers=False,
    dataset=dict(
        data_root=data_root,
        metainfo=dict(classes=classes),
        data_prefix=dict(img_path='images/validation',
                         seg_map_path='annotations/validation'),
        pipeline=test_pipeline))
test_dataloader = val_dataloader

train_cfg = dict(type='IterBasedTrainLoop', max_iters=40, val_interval=40)
param_scheduler = [dict(type='LinearLR', start_factor=0.1, by_epoch=False, begin=0, end=5)]
optim_wrapper = dict(optimizer=dict(lr=1e-3))
default_hooks = dict(
    logger=dict(interval=10),
    checkpoint=dict(by_epoch=False, interval=40, max_keep_ckpts=1))
randomness = dict(seed=0)

# The quick-start's main job on CPU in a few minutes: the real MoPPA Cascade Mask
# R-CNN config with a small Swin, 128 px images of coloured shapes (3 classes,
# COCO format, made by `python tools/demo/coco_shapes.py`), 2 epochs, bbox + segm AP.
_base_ = '../moppa/cascade-mask-rcnn_moppa-swin-b-p4-w7_fpn_ms-crop-3x_coco.py'

data_root = 'data/shapes_demo/'
classes = ('square', 'circle', 'triangle')
pretrained = data_root + 'swin_demo_pretrained.pth'  # official Swin format

model = dict(
    backbone=dict(
        embed_dims=32,
        depths=[2, 2, 2, 2],
        num_heads=[1, 2, 4, 8],
        drop_path_rate=0.0,
        init_cfg=dict(checkpoint=pretrained)),
    neck=dict(in_channels=[32, 64, 128, 256], out_channels=64),
    rpn_head=dict(in_channels=64, feat_channels=64),
    roi_head=dict(
        bbox_roi_extractor=dict(out_channels=64),
        mask_roi_extractor=dict(out_channels=64),
        bbox_head=[
            dict(head, in_channels=64, fc_out_channels=128, num_classes=3)
            for head in _base_.model.roi_head.bbox_head
        ],
        mask_head=dict(in_channels=64, conv_out_channels=64, num_classes=3)),
    test_cfg=dict(
        rpn=dict(nms_pre=300, max_per_img=100),
        rcnn=dict(max_per_img=20)))

train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
    dict(type='Resize', scale=(128, 128), keep_ratio=True),
    dict(type='RandomFlip', prob=0.5),
    dict(type='PackDetInputs')
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=(128, 128), keep_ratio=True),
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
    dict(type='PackDetInputs',
         meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape',
                    'scale_factor'))
]
train_dataloader = dict(
    batch_size=2,
    num_workers=0,
    persistent_workers=False,
    dataset=dict(
        data_root=data_root,
        metainfo=dict(classes=classes),
        ann_file='annotations/train.json',
        data_prefix=dict(img='train/'),
        pipeline=train_pipeline))
val_dataloader = dict(
    batch_size=2,
    num_workers=0,
    persistent_workers=False,
    dataset=dict(
        data_root=data_root,
        metainfo=dict(classes=classes),
        ann_file='annotations/val.json',
        data_prefix=dict(img='val/'),
        pipeline=test_pipeline))
test_dataloader = val_dataloader
val_evaluator = dict(ann_file=data_root + 'annotations/val.json')
test_evaluator = val_evaluator

max_epochs = 2
train_cfg = dict(max_epochs=max_epochs, val_interval=1)
param_scheduler = [
    dict(type='LinearLR', start_factor=0.1, by_epoch=False, begin=0, end=5)
]
optim_wrapper = dict(optimizer=dict(lr=2e-4))
default_hooks = dict(
    logger=dict(interval=4),
    checkpoint=dict(interval=1, max_keep_ckpts=2))
randomness = dict(seed=0)

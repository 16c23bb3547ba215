# MoPPA (CVPR 2025, Table 5): Cascade Mask R-CNN, ImageNet-22K Swin-B with a MoPPA
# unit before every window attention and a 3x3 conv adapter before every FFN;
# only those (3.21M, paper 3.18M) plus the neck and heads train.
# Paper: box AP 52.7, mask AP 45.6 on COCO val2017 after 36 epochs.
_base_ = [
    './cascade-mask-rcnn_swin-b-p4-w7_fpn_ms-crop-3x_coco.py',
    '../_base_/safe_training.py',  # opt-in: one run per work dir, exact resume, NaN stop...
]

custom_imports = dict(imports=['moppa_mm'], allow_failed_imports=False)

model = dict(
    backbone=dict(
        type='MoPPASwinTransformer',
        moppa_scope='window',  # or 'global': the whole feature map
        adapter_ratio=7.25,
        freeze_pretrained=True,  # the base freezes when built
        route_loss_weight=1.0))  # loss_route = w max(1 - 2T/T_total, 0) L_reg

# mmdet's CocoDataset that also refuses a broken annotation file (truncated JSON,
# no image, unknown category ids, only degenerate boxes) when it is loaded;
# training workers restarted every epoch and seeded from the main process's
# generator: new random flips and crops every epoch, and a resumed run
# (RNGStateHook) draws the uninterrupted run's
train_dataloader = dict(
    persistent_workers=False, worker_init_fn=dict(type='epoch_seeded_worker_init'),
    dataset=dict(type='CheckedCocoDataset'))
val_dataloader = dict(dataset=dict(type='CheckedCocoDataset'))
test_dataloader = dict(dataset=dict(type='CheckedCocoDataset'))

# the optimizer holds what trains; no log line per frozen parameter
optim_wrapper = dict(constructor='TrainableParamsOptimWrapperConstructor')

# checkpoints written atomically (temporary file, fsync, rename), the outdated
# one deleted only after: a kill while saving leaves a checkpoint to resume from
default_hooks = dict(checkpoint=dict(type='AtomicCheckpointHook'))

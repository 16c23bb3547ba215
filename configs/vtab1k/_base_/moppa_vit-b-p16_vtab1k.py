# MoPPA ViT-B/16 on one VTAB-1K task (paper Table 2): train on train800val200,
# test on test, 224x224 resize + horizontal flip, 100 epochs after 10 warm-up
# epochs (linear from ~1e-7), AdamW, cosine. Per-task configs set the task and
# the head; per-pre-training bases set the checkpoint and the normalisation.
_base_ = ['mmpretrain::_base_/default_runtime.py']

custom_imports = dict(imports=['moppa_mm'], allow_failed_imports=False)

data_root = 'data/vtab-1k/'  # VPT/NOAH layout: <root>/<task>/{train800val200,test}.txt
pretrained = None  # set by the pre-training base

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

train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=(224, 224), interpolation='bicubic'),
    dict(type='RandomFlip', prob=0.5, direction='horizontal'),
    dict(type='PackInputs'),
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=(224, 224), interpolation='bicubic'),
    dict(type='PackInputs'),
]
train_dataloader = dict(
    batch_size=64,
    num_workers=4,
    persistent_workers=True,
    sampler=dict(type='DefaultSampler', shuffle=True),
    dataset=dict(type='VTAB1k', data_root=data_root, task='cifar',
                 split='train800val200', pipeline=train_pipeline))
val_dataloader = dict(
    batch_size=64,
    num_workers=4,
    persistent_workers=True,
    sampler=dict(type='DefaultSampler', shuffle=False),
    dataset=dict(type='VTAB1k', data_root=data_root, task='cifar', split='test',
                 pipeline=test_pipeline))
val_evaluator = dict(type='Accuracy', topk=(1, ))
test_dataloader = val_dataloader
test_evaluator = val_evaluator

warmup_epochs, max_epochs = 10, 110
optim_wrapper = dict(
    constructor='TrainableParamsOptimWrapperConstructor',  # frozen ones left out
    optimizer=dict(type='AdamW', lr=1e-3, weight_decay=1e-4, betas=(0.9, 0.999)),
    paramwise_cfg=dict(norm_decay_mult=0.0, bias_decay_mult=0.0))
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-4, by_epoch=True, begin=0,
         end=warmup_epochs, convert_to_iter_based=True),
    dict(type='CosineAnnealingLR', T_max=max_epochs - warmup_epochs, eta_min=1e-8,
         by_epoch=True, begin=warmup_epochs, end=max_epochs),
]
train_cfg = dict(by_epoch=True, max_epochs=max_epochs, val_interval=10)
val_cfg = dict()
test_cfg = dict()
auto_scale_lr = dict(base_batch_size=64)

default_hooks = dict(
    logger=dict(type='LoggerHook', interval=10),
    checkpoint=dict(type='CheckpointHook', interval=10, max_keep_ckpts=1))
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

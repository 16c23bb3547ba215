# ImageNet-1K as mmpretrain reads it (<data_root>/meta/{train,val}.txt): random
# resized crop 224 + horizontal flip for training; resize 256 + center crop 224
# for evaluation; batch 64 per GPU; top-1 and top-5.
data_root = 'data/imagenet/'

train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='RandomResizedCrop', scale=224, backend='pillow', interpolation='bicubic'),
    dict(type='RandomFlip', prob=0.5, direction='horizontal'),
    dict(type='PackInputs'),
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='ResizeEdge', scale=256, edge='short', backend='pillow',
         interpolation='bicubic'),
    dict(type='CenterCrop', crop_size=224),
    dict(type='PackInputs'),
]
# workers restarted every epoch and seeded from the main process's generator:
# new random flips every epoch, and a resumed run (RNGStateHook) draws the
# uninterrupted run's
train_dataloader = dict(
    batch_size=64,
    num_workers=4,
    persistent_workers=False,
    worker_init_fn=dict(type='epoch_seeded_worker_init'),
    sampler=dict(type='DefaultSampler', shuffle=True),
    dataset=dict(type='ImageNet', data_root=data_root, split='train',
                 pipeline=train_pipeline))
val_dataloader = dict(
    batch_size=64,
    num_workers=4,
    persistent_workers=True,
    sampler=dict(type='DefaultSampler', shuffle=False),
    dataset=dict(type='ImageNet', data_root=data_root, split='val',
                 pipeline=test_pipeline))
val_evaluator = dict(type='Accuracy', topk=(1, 5))
test_dataloader = val_dataloader
test_evaluator = val_evaluator

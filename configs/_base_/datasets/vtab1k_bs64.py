# One VTAB-1K task in the VPT/NOAH layout, <data_root>/<task>/{train800val200,
# test}.txt: train on train800val200, validate and test on test; 224x224
# resize + horizontal flip; batch 64. The per-task configs set the task.
data_root = 'data/vtab-1k/'

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
# workers restarted every epoch and seeded from the main process's generator:
# new random flips every epoch, and a resumed run (RNGStateHook) draws the
# uninterrupted run's
train_dataloader = dict(
    batch_size=64,
    num_workers=4,
    persistent_workers=False,
    worker_init_fn=dict(type='epoch_seeded_worker_init'),
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

# The classification quick-start on CPU in about half a minute: the real MoPPA ViT
# VTAB-1K config (MAE pre-training, eurosat) with a 2-layer ViT on 32 px images
# of a generated task (`python tools/demo/vtab_task.py`), 4 epochs, top-1.
#   bash tools/quickstart.sh cls
_base_ = '../vtab1k/moppa_vit-b-p16_mae-pre_vtab1k-eurosat.py'

data_root = 'data/vtab_demo/'
model = dict(
    backbone=dict(
        arch=dict(_delete_=True, embed_dims=32, num_layers=2, num_heads=4,
                  feedforward_channels=64),
        img_size=32,
        patch_size=8,
        drop_path_rate=0.0,
        init_cfg=dict(checkpoint='data/vtab_demo/vit_demo_mmpretrain.pth')),
    head=dict(in_channels=32))

train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=(32, 32), interpolation='bicubic'),
    dict(type='RandomFlip', prob=0.5, direction='horizontal'),
    dict(type='PackInputs'),
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=(32, 32), interpolation='bicubic'),
    dict(type='PackInputs'),
]
loader = dict(batch_size=8, num_workers=0, persistent_workers=False)
train_dataloader = dict(
    **loader, dataset=dict(data_root=data_root, pipeline=train_pipeline))
val_dataloader = dict(
    **loader, dataset=dict(data_root=data_root, pipeline=test_pipeline))
test_dataloader = val_dataloader

max_epochs = 4
param_scheduler = [
    dict(type='LinearLR', start_factor=0.1, by_epoch=True, begin=0, end=1,
         convert_to_iter_based=True),
    dict(type='CosineAnnealingLR', T_max=max_epochs - 1, by_epoch=True, begin=1,
         end=max_epochs),
]
train_cfg = dict(by_epoch=True, max_epochs=max_epochs, val_interval=max_epochs)
default_hooks = dict(logger=dict(interval=1),
                     checkpoint=dict(interval=max_epochs))
randomness = dict(seed=0)

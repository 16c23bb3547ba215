# MoPPA ViT-B/16 on one FGVC dataset (paper Table 3) with VPT's splits:
# train on train.json, validate on val.json, test on test.json; random resized
# crop 224 + flip; resize 256 + center crop 224 for evaluation.
_base_ = ['../../vtab1k/_base_/moppa_vit-b-p16_vtab1k.py']

data_root = 'data/fgvc/'
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
train_dataloader = dict(dataset=dict(
    _delete_=True, type='FGVC', data_root=data_root, dataset='cub', split='train',
    pipeline=train_pipeline))
val_dataloader = dict(dataset=dict(
    _delete_=True, type='FGVC', data_root=data_root, dataset='cub', split='val',
    pipeline=test_pipeline))
test_dataloader = dict(dataset=dict(
    _delete_=True, type='FGVC', data_root=data_root, dataset='cub', split='test',
    pipeline=test_pipeline))

# MoPPA ViT-B/16 (ImageNet-21K AugReg) fine-tuned on ImageNet-1K (paper Table 4:
# 83.9 top-1 with 0.99M trainable parameters). 8 GPUs x 64 images.
_base_ = '../vtab1k/_base_/moppa_vit-b-p16_in21k-augreg-pre_vtab1k.py'

data_root = 'data/imagenet/'
model = dict(head=dict(num_classes=1000))
data_preprocessor = dict(num_classes=1000)

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
    _delete_=True, type='ImageNet', data_root=data_root, split='train',
    pipeline=train_pipeline))
val_dataloader = dict(dataset=dict(
    _delete_=True, type='ImageNet', data_root=data_root, split='val',
    pipeline=test_pipeline))
test_dataloader = val_dataloader
val_evaluator = dict(type='Accuracy', topk=(1, 5))
test_evaluator = val_evaluator
train_cfg = dict(val_interval=1)
auto_scale_lr = dict(base_batch_size=512)

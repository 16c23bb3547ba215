# One FGVC data set with VPT's splits, <data_root>/{train,val,test}.json: train
# on train, validate on val, test on test; the ImageNet augmentation (random
# resized crop 224 + flip; resize 256 + center crop 224 for evaluation) and
# batch size; top-1. The per-data-set configs set the data set and its root.
_base_ = './imagenet_bs64.py'

data_root = 'data/fgvc/'
train_dataloader = dict(dataset=dict(
    _delete_=True, type='FGVC', data_root=data_root, dataset='cub', split='train',
    pipeline=_base_.train_pipeline))
val_dataloader = dict(dataset=dict(
    _delete_=True, type='FGVC', data_root=data_root, dataset='cub', split='val',
    pipeline=_base_.test_pipeline))
test_dataloader = dict(dataset=dict(
    _delete_=True, type='FGVC', data_root=data_root, dataset='cub', split='test',
    pipeline=_base_.test_pipeline))
val_evaluator = dict(topk=(1, ))
test_evaluator = val_evaluator

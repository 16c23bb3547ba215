# Full fine-tuning baseline (configs/_base_/models/full_vit-b-p16.py) on one FGVC data set,
# with the data, schedule and IN-21K checkpoint of the MoPPA configs
# (moppa_vit-b-p16_in21k-pre_fgvc.py).
_base_ = [
    '../../_base_/models/full_vit-b-p16.py',
    '../../_base_/datasets/fgvc_bs64.py',
    '../../_base_/schedules/bs64_adamw_110e.py',
    '../../_base_/default_runtime.py',
]
pretrained = 'data/pretrained/vit-b-p16_in21k.pth'
model = dict(backbone=dict(init_cfg=dict(checkpoint=pretrained)))
optim_wrapper = dict(optimizer=dict(lr=1e-4))  # 10x lower: all 86M weights move

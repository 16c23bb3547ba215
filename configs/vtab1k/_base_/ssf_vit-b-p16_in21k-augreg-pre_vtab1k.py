# Scale & shift (SSF) baseline (configs/_base_/models/ssf_vit-b-p16.py) on one VTAB-1K task,
# with the data, schedule and IN-21K AugReg checkpoint of the MoPPA configs
# (moppa_vit-b-p16_in21k-augreg-pre_vtab1k.py).
_base_ = [
    '../../_base_/models/ssf_vit-b-p16.py',
    '../../_base_/datasets/vtab1k_bs64.py',
    '../../_base_/schedules/bs64_adamw_110e.py',
    '../../_base_/default_runtime.py',
]
pretrained = 'data/pretrained/vit-b-p16_in21k-augreg.pth'
model = dict(backbone=dict(init_cfg=dict(checkpoint=pretrained)))

# MoPPA ViT-B/16 on one FGVC data set (paper Table 3): the shared MoPPA ViT, the
# FGVC data with VPT's splits (train on train.json, validate on val.json, test
# on test.json; random resized crop 224 + flip; resize 256 + center crop 224
# for evaluation) and the PEFT schedule of VTAB-1K. Per-data-set configs set the
# data set and the head; per-pre-training bases set the checkpoint and the
# normalisation.
_base_ = [
    '../../_base_/models/moppa_vit-b-p16.py',
    '../../_base_/datasets/fgvc_bs64.py',
    '../../_base_/schedules/bs64_adamw_110e.py',
    '../../_base_/default_runtime.py',
]

# MoPPA ViT-B/16 on one VTAB-1K task (paper Table 2): the shared MoPPA ViT, the
# VTAB-1K data (train on train800val200, test on test, 224x224 resize + flip)
# and the PEFT schedule (100 epochs after 10 warm-up epochs, AdamW, cosine).
# Per-task configs set the task and the head; per-pre-training bases set the
# checkpoint and the normalisation.
_base_ = [
    '../../_base_/models/moppa_vit-b-p16.py',
    '../../_base_/datasets/vtab1k_bs64.py',
    '../../_base_/schedules/bs64_adamw_110e.py',
    '../../_base_/default_runtime.py',
]

# MoPPA ViT-B/16 (ImageNet-21K AugReg) fine-tuned on ImageNet-1K (paper Table 4:
# 83.9 top-1 with 0.99M trainable parameters). 8 GPUs x 64 images; the PEFT
# schedule of VTAB-1K and FGVC, validated every epoch. The checkpoint is the
# VTAB-1K one (see configs/vtab1k/_base_/ for its conversion).
_base_ = [
    '../_base_/models/moppa_vit-b-p16.py',
    '../_base_/datasets/imagenet_bs64.py',
    '../_base_/schedules/bs64_adamw_110e.py',
    '../_base_/default_runtime.py',
]

pretrained = 'data/pretrained/vit-b-p16_in21k-augreg.pth'
model = dict(
    backbone=dict(init_cfg=dict(checkpoint=pretrained)),
    head=dict(num_classes=1000))
data_preprocessor = dict(num_classes=1000)  # ImageNet-21K normalisation: the model base's
train_cfg = dict(val_interval=1)
auto_scale_lr = dict(base_batch_size=512)

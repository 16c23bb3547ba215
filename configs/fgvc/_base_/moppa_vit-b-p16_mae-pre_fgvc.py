# ImageNet-1K MAE pre-trained ViT-B/16 (the VTAB-1K one). Convert it once:
#   python tools/model_converters/vit_to_mmpretrain.py mae \
#       mae_pretrain_vit_base.pth data/pretrained/vit-b-p16_mae.pth
_base_ = './moppa_vit-b-p16_fgvc.py'
pretrained = 'data/pretrained/vit-b-p16_mae.pth'
model = dict(backbone=dict(init_cfg=dict(checkpoint=pretrained)))
data_preprocessor = dict(mean=[123.675, 116.28, 103.53], std=[58.395, 57.12, 57.375])

# ImageNet-1K MoCo v3 pre-trained ViT-B/16. Convert it once:
#   python tools/model_converters/vit_to_mmpretrain.py mocov3 \
#       vit-b-300ep.pth.tar data/pretrained/vit-b-p16_mocov3.pth
_base_ = './moppa_vit-b-p16_vtab1k.py'
pretrained = 'data/pretrained/vit-b-p16_mocov3.pth'
model = dict(backbone=dict(init_cfg=dict(checkpoint=pretrained)))
data_preprocessor = dict(mean=[123.675, 116.28, 103.53], std=[58.395, 57.12, 57.375])

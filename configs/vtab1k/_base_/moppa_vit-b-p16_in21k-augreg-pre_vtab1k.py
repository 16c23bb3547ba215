# ImageNet-21K supervised ViT-B/16 with AugReg (JAX release). Convert it once:
#   python tools/model_converters/vit_to_mmpretrain.py jax \
#       ViT-B_16-i21k-300ep-lr_0.001-aug_medium1-wd_0.1-do_0.0-sd_0.0.npz \
#       data/pretrained/vit-b-p16_in21k-augreg.pth
_base_ = './moppa_vit-b-p16_vtab1k.py'
pretrained = 'data/pretrained/vit-b-p16_in21k-augreg.pth'
model = dict(backbone=dict(init_cfg=dict(checkpoint=pretrained)))
data_preprocessor = dict(mean=[127.5, 127.5, 127.5], std=[127.5, 127.5, 127.5])

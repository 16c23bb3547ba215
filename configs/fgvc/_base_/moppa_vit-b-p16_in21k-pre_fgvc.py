# ImageNet-21K supervised ViT-B/16 without AugReg (the original JAX release, as
# the paper's FGVC table). Convert it once:
#   python tools/model_converters/vit_to_mmpretrain.py jax \
#       imagenet21k_ViT-B_16.npz data/pretrained/vit-b-p16_in21k.pth
_base_ = './moppa_vit-b-p16_fgvc.py'
pretrained = 'data/pretrained/vit-b-p16_in21k.pth'
model = dict(backbone=dict(init_cfg=dict(checkpoint=pretrained)))
data_preprocessor = dict(mean=[127.5, 127.5, 127.5], std=[127.5, 127.5, 127.5])

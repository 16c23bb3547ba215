# MoPPA ViT-L/16 on one VTAB-1K task (paper supplementary, ViT-L table): the
# ViT-B/16 recipe with the ViT-L/16 architecture (24 layers, 1024 dims, 16
# heads). ImageNet-21K supervised pre-training, the original JAX release (as
# VPT, NOAH and RLRR use; the AugReg ViT-L file converts the same way).
# Convert it once:
#   python tools/model_converters/vit_to_mmpretrain.py jax \
#       ViT-L_16.npz data/pretrained/vit-l-p16_in21k.pth
_base_ = './moppa_vit-b-p16_vtab1k.py'
pretrained = 'data/pretrained/vit-l-p16_in21k.pth'
model = dict(
    backbone=dict(arch='l', init_cfg=dict(checkpoint=pretrained)),
    head=dict(in_channels=1024))
data_preprocessor = dict(mean=[127.5, 127.5, 127.5], std=[127.5, 127.5, 127.5])

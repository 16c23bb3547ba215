# UperNet on ADE20K (512x512, 160k iterations) with an ImageNet-22K Swin-B whose
# base is frozen: a MoPPA unit before every window attention and a 3x3 conv adapter
# before every FFN (3.21M trainable backbone parameters) plus the decode heads
# train. MMSegmentation's own config with the backbone's type changed (and the
# optimizer's constructor, below).
# The base is MMSegmentation's released Swin-B (its URL; a local copy with
# --cfg-options model.backbone.init_cfg.checkpoint=/path/to/swin_base_...pth).
_base_ = 'mmseg::swin/swin-base-patch4-window7-in22k-pre_upernet_8xb2-160k_ade20k-512x512.py'

custom_imports = dict(imports=['moppa_mm'], allow_failed_imports=False)

model = dict(backbone=dict(type='MoPPASwinTransformer'))

# its paramwise_cfg as it is, over the parameters that train: one log line instead
# of one warning per frozen parameter
optim_wrapper = dict(constructor='TrainableParamsOptimWrapperConstructor')

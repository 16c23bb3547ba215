# UperNet on ADE20K (512x512, 80k iterations) with a frozen ViT-B/16 (features of
# layers 3, 6, 9, 12 through MMSegmentation's MultiLevelNeck): a MoPPA unit before
# every self-attention and scale & shift on the patch embedding and the MLPs train,
# with the neck and the decode heads. MMSegmentation's own config with the
# backbone's type changed (and the optimizer's constructor, below). Its base is
# MMSegmentation's converted ViT-B/16 (model.pretrained,
# tools/model_converters/vit2mmseg.py of MMSegmentation).
_base_ = 'mmseg::vit/vit_vit-b16_mln_upernet_8xb2-80k_ade20k-512x512.py'

custom_imports = dict(imports=['moppa_mm'], allow_failed_imports=False)

model = dict(backbone=dict(type='MoPPAVisionTransformer'))

# its paramwise_cfg as it is, over the parameters that train: one log line instead
# of one warning per frozen parameter
optim_wrapper = dict(constructor='TrainableParamsOptimWrapperConstructor')

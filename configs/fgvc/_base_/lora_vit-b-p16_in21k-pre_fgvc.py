# LoRA baseline: mmpretrain's LoRAModel around its plain VisionTransformer,
# rank 8 on every fused qkv projection: 12 x 8 x (768 + 2304) = 294,912
# trainable backbone parameters, as many as rank 8 on separate q and v
# (12 x 2 x 8 x (768 + 768)), the usual LoRA baseline. LoRAModel builds the ViT
# and runs its init_cfg (the plain pre-trained checkpoint) before wrapping the
# layers, so plain checkpoints load unchanged; its checkpoints keep only the
# LoRA factors (and the head), the rest comes from init_cfg when built.
# Data, schedule and pre-trained checkpoint are those of the MoPPA FGVC config.
_base_ = './moppa_vit-b-p16_in21k-pre_fgvc.py'

model = dict(backbone=dict(
    _delete_=True,
    type='LoRAModel',
    rank=8,
    alpha=8,  # scaling alpha / rank = 1
    drop_rate=0.0,
    targets=[dict(type='qkv')],
    module=dict(
        type='VisionTransformer',
        arch='b',
        img_size=224,
        patch_size=16,
        drop_path_rate=0.1,
        out_type='cls_token',
        final_norm=True,
        init_cfg=_base_.model.backbone.init_cfg)))
custom_hooks = [
    dict(type='PEFTFreezeHook', trainable=['backbone.*lora_*'], frozen=['backbone.*'],
         components=[('backbone.lora', ['backbone.*lora_*']),
                     ('backbone (pre-trained)', ['backbone.*']),
                     ('head', ['*head.*'])]),
    dict(type='RNGStateHook'),
    dict(type='PlainCheckpointHook'),
    dict(type='NonFiniteLossHook'),
]

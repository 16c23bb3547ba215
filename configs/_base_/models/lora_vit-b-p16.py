# LoRA baseline: mmpretrain's LoRAModel around the plain ViT-B/16 of full
# fine-tuning, rank 8 on every fused qkv projection: 12 x 8 x (768 + 2304) =
# 294,912 trainable backbone parameters, as many as rank 8 on separate q and v
# (12 x 2 x 8 x (768 + 768)), the usual LoRA baseline. LoRAModel builds the ViT
# and runs its init_cfg (the plain pre-trained checkpoint) before wrapping the
# layers, so plain checkpoints load unchanged; its checkpoints keep only the
# LoRA factors (and the head), the rest comes from init_cfg when built. The
# config that inherits this sets the checkpoint
# (model.backbone.module.init_cfg.checkpoint).
_base_ = './full_vit-b-p16.py'

model = dict(backbone=dict(
    _delete_=True,
    type='LoRAModel',
    rank=8,
    alpha=8,  # scaling alpha / rank = 1
    drop_rate=0.0,
    targets=[dict(type='qkv')],
    module=_base_.model.backbone))

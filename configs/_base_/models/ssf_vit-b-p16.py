# Scale & shift baseline ("SSF"): the MoPPA ViT-B/16 without its MoPPA units,
# i.e. only the learnable scale & shift on the patch embedding, the attention
# value and output projections and both MLP layers (and the head) train:
# MoPPA's ablation "w/o MoPPA". The config that inherits this sets the
# checkpoint (model.backbone.init_cfg.checkpoint).
_base_ = './moppa_vit-b-p16.py'

model = dict(backbone=dict(use_moppa=False))

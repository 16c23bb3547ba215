# Linear probe baseline: the plain ViT-B/16 of full fine-tuning, frozen whole
# (frozen_stages=12: patch embedding, position embedding, class token, the 12
# layers and the final norm); only the task head trains. The config that
# inherits this sets the checkpoint (model.backbone.init_cfg.checkpoint).
_base_ = './full_vit-b-p16.py'

model = dict(backbone=dict(
    drop_path_rate=0.0,  # nothing in the backbone learns
    frozen_stages=12))

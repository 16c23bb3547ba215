# The PEFT schedule of the paper's classification experiments: 100 epochs after
# 10 warm-up epochs (linear from ~1e-7), AdamW (lr 1e-3 at batch 64, weight
# decay 1e-4, none on norms and biases), cosine to 1e-8; validation every 10
# epochs. The optimizer gets only the parameters that train.
warmup_epochs, max_epochs = 10, 110
optim_wrapper = dict(
    constructor='TrainableParamsOptimWrapperConstructor',  # frozen ones left out
    optimizer=dict(type='AdamW', lr=1e-3, weight_decay=1e-4, betas=(0.9, 0.999)),
    paramwise_cfg=dict(norm_decay_mult=0.0, bias_decay_mult=0.0))
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-4, by_epoch=True, begin=0,
         end=warmup_epochs, convert_to_iter_based=True),
    dict(type='CosineAnnealingLR', T_max=max_epochs - warmup_epochs, eta_min=1e-8,
         by_epoch=True, begin=warmup_epochs, end=max_epochs),
]
train_cfg = dict(by_epoch=True, max_epochs=max_epochs, val_interval=10)
val_cfg = dict()
test_cfg = dict()
auto_scale_lr = dict(base_batch_size=64)

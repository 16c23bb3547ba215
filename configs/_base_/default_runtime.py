# Runtime shared by the MoPPA classification configs (VTAB-1K, FGVC,
# ImageNet-1K): mmpretrain's, with moppa_mm imported (its models, data sets and
# hooks register themselves), a log line every 10 iterations and one checkpoint
# every 10 epochs, the last one kept (written atomically, the old one deleted
# after: AtomicCheckpointHook), and the opt-in guarantees of safe_training.py
# (one training run per work dir, exact resume, weights-only checkpoints, a stop at
# a NaN loss, the resume check).
# The method itself needs no hook: the MoPPA backbones freeze their base, add
# loss_route and save adapter-only checkpoints on their own.
_base_ = ['mmpretrain::_base_/default_runtime.py', './safe_training.py']

custom_imports = dict(imports=['moppa_mm'], allow_failed_imports=False)

default_hooks = dict(
    logger=dict(type='LoggerHook', interval=10),
    checkpoint=dict(type='AtomicCheckpointHook', interval=10, max_keep_ckpts=1))

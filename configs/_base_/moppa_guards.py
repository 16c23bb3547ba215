# Opt-in guarantees beyond the method, as one fragment: add it to a config's
# _base_ list (the MoPPA backbones need no hook; these make a long run safer).
#   RNGStateHook: an interrupted run resumes bit-identical (random states of
#       every process in the checkpoints)
#   PlainCheckpointHook: checkpoints hold only tensors and plain containers, so
#       any torch.load(weights_only=True) reads them, moppa_mm imported or not
#       (a scheduler's functions come back from the config on resume; anything
#       else that cannot be stored is left out with a warning, never a failed save)
#   NonFiniteLossHook: stops at the first NaN/inf loss, before it is saved
#   WorkDirLockHook: one training run per work dir (a second one stops, naming
#       the first's process and host; a killed run leaves no stale lock)
#   WorkDirLockRunner: mmengine's Runner, which under mmdet's and mmpretrain's
#       own tools takes that lock before it writes its config into the work
#       dir (our tools/train.py takes it before any Runner is built)
#   ResumeConfigCheckHook: --resume with a changed lr, schedule, batch size or
#       process count lists each value with both sides and which one the run
#       uses; another optimizer type or list of schedulers is refused
runner_type = 'WorkDirLockRunner'
custom_hooks = [
    dict(type='RNGStateHook'),
    dict(type='PlainCheckpointHook'),
    dict(type='NonFiniteLossHook'),
    dict(type='WorkDirLockHook'),
    dict(type='ResumeConfigCheckHook'),
]

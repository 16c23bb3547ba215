# Opt-in guarantees for long runs, as one fragment: add it to a config's
# _base_ list (the MoPPA backbones need no hook; these make a long run safer).
#   WorkDirLockRunner: one training run per work dir (a second one stops,
#       naming the first's process and host; a killed run leaves no stale
#       lock), taken before the Runner writes its config into the work dir
#   RNGStateHook: an interrupted run resumes bit-identical (random states of
#       every process in the checkpoints)
#   WeightsOnlyCheckpointHook: checkpoints hold only tensors and plain
#       containers, so any torch.load(weights_only=True) reads them, moppa_mm
#       imported or not (a scheduler's functions come back from the config on
#       resume; anything else that cannot be stored is left out with a warning)
#   NonFiniteLossHook: stops at the first NaN/inf loss, before it is saved
#   ResumeConfigCheckHook: --resume with a changed lr, schedule, batch size or
#       process count lists each value with both sides and which one the run
#       uses; another optimizer type or list of schedulers is refused
runner_type = 'WorkDirLockRunner'
custom_hooks = [
    dict(type='RNGStateHook'),
    dict(type='WeightsOnlyCheckpointHook'),
    dict(type='NonFiniteLossHook'),
    dict(type='ResumeConfigCheckHook'),
]

"""The registries of the ``moppa_mm`` scope: a config that inherits
``_base_ = 'moppa_mm::...'`` gets ``_scope_='moppa_mm'`` on the modules our
files define, and mmengine builds them from here. Our modules live in
MMPretrain's and MMDetection's registries (and mmengine's, for the hooks), so
each registry here is a child of MMPretrain's, whose lookups fall through to
it and to mmengine's root.
"""
from mmengine.registry import Registry
from mmpretrain import registry as mmpretrain_registry


def _child(name: str) -> Registry:
    parent = getattr(mmpretrain_registry, name)
    return Registry(parent.name, parent=parent, scope='moppa_mm', locations=['moppa_mm'])


RUNNERS = _child('RUNNERS')
RUNNER_CONSTRUCTORS = _child('RUNNER_CONSTRUCTORS')
LOOPS = _child('LOOPS')
HOOKS = _child('HOOKS')
LOG_PROCESSORS = _child('LOG_PROCESSORS')
OPTIMIZERS = _child('OPTIMIZERS')
OPTIM_WRAPPERS = _child('OPTIM_WRAPPERS')
OPTIM_WRAPPER_CONSTRUCTORS = _child('OPTIM_WRAPPER_CONSTRUCTORS')
PARAM_SCHEDULERS = _child('PARAM_SCHEDULERS')
DATASETS = _child('DATASETS')
DATA_SAMPLERS = _child('DATA_SAMPLERS')
TRANSFORMS = _child('TRANSFORMS')
MODELS = _child('MODELS')
MODEL_WRAPPERS = _child('MODEL_WRAPPERS')
WEIGHT_INITIALIZERS = _child('WEIGHT_INITIALIZERS')
BATCH_AUGMENTS = _child('BATCH_AUGMENTS')
TASK_UTILS = _child('TASK_UTILS')
METRICS = _child('METRICS')
EVALUATORS = _child('EVALUATORS')
VISUALIZERS = _child('VISUALIZERS')
VISBACKENDS = _child('VISBACKENDS')

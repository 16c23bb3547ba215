"""What ``import moppa_mm`` and building a MoPPA backbone change in torch's and
mmengine's process-wide state, in a fresh interpreter: exactly the effects
docs/design.md lists ("Process-wide effects"), nothing more. mmdet, mmpretrain
and mmseg are imported first, so that what changes is moppa_mm's own doing."""
import json
import os.path as osp
import subprocess
import sys

from tests.conftest import REPO, child_env

CHILD = r'''
import copyreg, gc, json, logging, sys
from collections import Counter
import torch
import torch.nn.modules.module as modules
import torch.optim.optimizer as optimizers
import mmdet.models, mmpretrain.models  # noqa: upstream's own effects come first
try:
    import mmseg.models  # noqa
except ImportError:
    pass
from mmengine.config.utils import MODULE2PACKAGE
from mmengine.logging import MMLogger

logger = MMLogger.get_current_instance()


def name(item):
    item = getattr(item, 'hook', item)  # torch wraps a load pre-hook
    named = item if hasattr(item, '__qualname__') else type(item)
    return f'{named.__module__}.{named.__qualname__}'


def state():
    hooks = {f'torch {kind}': [name(h) for h in getattr(modules, f'_global_{kind}').values()]
             for kind in ('module_registration_hooks', 'parameter_registration_hooks',
                          'buffer_registration_hooks', 'forward_hooks', 'forward_pre_hooks',
                          'backward_hooks', 'backward_pre_hooks')}
    return {**hooks,
            'torch optimizer step pre-hooks': [
                name(h) for h in optimizers._global_optimizer_pre_hooks.values()],
            'torch optimizer step post-hooks': [
                name(h) for h in optimizers._global_optimizer_post_hooks.values()],
            'torch safe globals': [name(g) for g in torch.serialization.get_safe_globals()],
            'copyreg dispatch table': [name(t) for t in copyreg.dispatch_table],
            'mmengine MODULE2PACKAGE': [f'{k}={v}' for k, v in MODULE2PACKAGE.items()],
            'logging filters': [name(f) for f in logger.filters + logging.root.filters],
            'logging handlers': [name(h) for h in logger.handlers + logging.root.handlers],
            'sys.meta_path': [name(f) for f in sys.meta_path]}


def changes(before, after):  # as multisets: a second hook of the same kind counts
    return {key: dict(added=sorted((Counter(after[key]) - Counter(before[key])).elements()),
                      removed=sorted((Counter(before[key]) - Counter(after[key])).elements()))
            for key in before if Counter(after[key]) != Counter(before[key])}


steps = {}
start = state()
import moppa_mm  # noqa
imported = state()
steps['import'] = changes(start, imported)
from moppa_mm.models import MoPPAVisionTransformer
arch = dict(embed_dims=32, num_layers=2, num_heads=4, feedforward_channels=64)
backbone = MoPPAVisionTransformer(arch=arch, img_size=32, patch_size=8, random_base=True)
built = state()
steps['build'] = changes(imported, built)
second = MoPPAVisionTransformer(arch=arch, img_size=32, patch_size=8, random_base=True)
steps['second build'] = changes(built, state())
for model in (backbone, second):  # their first steps, at the optimizer's lr
    torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1).step()
del backbone, second
gc.collect()
MoPPAVisionTransformer(arch=arch, img_size=32, patch_size=8, freeze_pretrained=False)
steps['first steps taken'] = changes(imported, state())
print(json.dumps(steps))
'''

SAFE_GLOBALS = 'torch safe globals'
BY_IMPORT = {  # what docs/design.md names as import's effects, beyond registry entries
    'copyreg dispatch table': dict(added=['mmengine.logging.history_buffer.HistoryBuffer'],
                                   removed=[]),
    'mmengine MODULE2PACKAGE': dict(added=['moppa_mm=moppa_mm.version'], removed=[]),
}
HOOK = 'moppa_mm.models.backbones.adapter_mixin._hook_the_model'
CHECK = 'moppa_mm.models.backbones.training_checks.FirstStepCheck'
BY_BUILD = {  # the first backbone's, as named there
    'torch module_registration_hooks': dict(added=[HOOK], removed=[]),
    'torch optimizer step pre-hooks': dict(added=[CHECK], removed=[]),
    'logging filters': dict(added=[CHECK + '.frozen_lines'], removed=[]),
}


def test_import_and_build_change_exactly_the_listed_process_wide_state():
    result = subprocess.run([sys.executable, '-c', CHILD], capture_output=True, text=True,
                            cwd=REPO, env=child_env(), timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    steps = json.loads(result.stdout.strip().splitlines()[-1])
    imported = dict(steps['import'])
    allowed = imported.pop(SAFE_GLOBALS)  # mmengine's HistoryBuffer and numpy's types
    assert allowed['removed'] == [] and \
        'mmengine.logging.history_buffer.HistoryBuffer' in allowed['added'], allowed
    assert all(g.startswith(('numpy.', 'mmengine.logging.history_buffer.HistoryBuffer'))
               for g in allowed['added']), allowed
    assert imported == BY_IMPORT
    assert steps['build'] == BY_BUILD
    # a second backbone: its own step check and filter; the registration hook is once
    assert steps['second build'] == {key: value for key, value in BY_BUILD.items()
                                     if key != 'torch module_registration_hooks'}
    # the checks go once their step is taken (or their backbone is gone); the
    # registration hook stays for the process
    assert steps['first steps taken'] == {
        'torch module_registration_hooks': dict(added=[HOOK], removed=[])}


def test_design_notes_name_every_effect():
    with open(osp.join(REPO, 'docs', 'design.md')) as f:
        notes = f.read()
    section = notes[notes.index('## Process-wide effects'):]
    section = section[:section.index('\n## ', 1)]
    for named in ('register_module_module_registration_hook',
                  'register_optimizer_step_pre_hook', 'add_safe_globals', 'copyreg',
                  'MODULE2PACKAGE', 'filter'):
        assert named in section, named

"""The previous release's names of hooks and of the run-safety fragment still
build what they named, with a warning, for one release."""
import os.path as osp

import pytest
from mmengine.config import Config
from mmengine.registry import HOOKS

from moppa_mm.engine import RouteWeightLoggerHook, WeightsOnlyCheckpointHook
from tests.conftest import REPO


@pytest.mark.parametrize('old, new', [('PlainCheckpointHook', WeightsOnlyCheckpointHook),
                                      ('RouteRegularizationHook', RouteWeightLoggerHook)])
def test_old_hook_names_build_the_renamed_hooks(old, new):
    with pytest.warns(FutureWarning, match=f'{old} is renamed {new.__name__}; the old name '
                                           'will be removed in the next release'):
        assert type(HOOKS.build(dict(type=old))) is new


def test_the_old_fragment_name_is_the_new_fragment():
    with pytest.warns(FutureWarning, match='configs/_base_/moppa_guards.py is renamed '
                                           'configs/_base_/safe_training.py'):
        old = Config.fromfile(osp.join(REPO, 'configs/_base_/moppa_guards.py'))
    new = Config.fromfile(osp.join(REPO, 'configs/_base_/safe_training.py'))
    assert old.to_dict() == new.to_dict()

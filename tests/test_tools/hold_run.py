"""Imported by a training subprocess (``custom_imports``): :class:`HoldHook`
writes ``<work_dir>/held`` before the first training iteration and then waits
(up to 5 minutes) until the test kills the process."""
import os.path as osp
import time

from mmengine.hooks import Hook
from mmengine.registry import HOOKS


@HOOKS.register_module()
class HoldHook(Hook):

    def before_train_iter(self, runner, batch_idx, data_batch=None) -> None:
        open(osp.join(runner.work_dir, 'held'), 'w').close()
        time.sleep(300)

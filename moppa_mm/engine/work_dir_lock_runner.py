"""mmengine's Runner that writes nothing into a work dir another training run
holds.

``Runner.__init__`` makes the work dir, then its log folder
(``<work_dir>/<timestamp>/``), builds the model and the hooks, and last
dumps the config to ``<work_dir>/<config name>``, all before any hook runs:
a second run started in a busy work dir writes its config over the first
run's before ``WorkDirLockHook.before_run`` can stop it. A config reaches no
earlier point than its ``runner_type``, which mmdet's and mmpretrain's
``tools/train.py`` and ``tools/test.py`` build through ``RUNNERS``. Whether the
Runner will train is unknown in ``__init__`` (the test tools build it from the
same config), so this Runner holds its config dump back until ``train()``
(after it takes the lock), ``val()`` or ``test()``. The log folder is still
made in ``__init__``.
"""
from mmengine.dist import is_main_process
from mmengine.registry import RUNNERS
from mmengine.runner import Runner

from .hooks.work_dir_lock_hook import lock_work_dir, unlock_work_dir


@RUNNERS.register_module()
class WorkDirLockRunner(Runner):
    """``Runner`` (same arguments) whose ``train()`` takes the work dir's lock
    (:func:`~moppa_mm.engine.hooks.work_dir_lock_hook.lock_work_dir`) in the
    main process before it writes the config there. Set with
    ``runner_type = 'WorkDirLockRunner'`` (``configs/_base_/moppa_guards.py``)."""

    def dump_config(self) -> None:
        self._config_pending = True  # written by train(), val() or test()

    def _dump_pending_config(self) -> None:
        if getattr(self, '_config_pending', False):
            self._config_pending = False
            Runner.dump_config(self)

    def train(self):
        taken = is_main_process() and lock_work_dir(self.work_dir)
        try:
            self._dump_pending_config()
            return super().train()
        finally:
            if taken:
                unlock_work_dir(self.work_dir)

    def val(self) -> dict:
        self._dump_pending_config()
        return super().val()

    def test(self) -> dict:
        self._dump_pending_config()
        return super().test()

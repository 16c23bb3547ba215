"""mmengine's ``CheckpointHook`` that never leaves a run without a complete
checkpoint to resume from.

mmengine's hook deletes the oldest kept checkpoint (and the previous best)
*before* it writes the new one, in place, then rewrites ``last_checkpoint``:
a kill during the write leaves a partial file and a ``last_checkpoint`` naming
a deleted one. Here every checkpoint is written to a hidden temporary file,
fsynced and renamed (:mod:`moppa_mm.utils.atomic`), ``last_checkpoint`` is
replaced after the rename, and an old checkpoint is deleted only once the new
one is complete. Where ``last_checkpoint`` is missing or names a file that is
gone, ``--resume`` takes the newest complete checkpoint of the work dir.
"""
import os.path as osp

from mmengine.dist import is_main_process
from mmengine.fileio import LocalBackend, get_file_backend, register_backend
from mmengine.hooks import CheckpointHook
from mmengine.registry import HOOKS

from moppa_mm.utils.atomic import atomic_write, remove_stale_partials
from moppa_mm.utils.checkpoints import checkpoint_to_resume

ATOMIC_BACKEND = 'moppa_atomic_local'


class AtomicLocalBackend(LocalBackend):
    """``LocalBackend`` whose ``put`` / ``put_text`` replace the file
    atomically (temporary file, fsync, rename)."""

    def put(self, obj: bytes, filepath) -> None:
        atomic_write(str(filepath), obj, what='checkpoint')

    def put_text(self, obj: str, filepath, encoding: str = 'utf-8') -> None:
        atomic_write(str(filepath), obj.encode(encoding), what='file')


register_backend(ATOMIC_BACKEND, AtomicLocalBackend, force=True)


@HOOKS.register_module()
class AtomicCheckpointHook(CheckpointHook):
    """``CheckpointHook`` (same arguments) with crash-safe writes, for local
    folders; a checkpoint folder of another backend (``s3://``...) keeps
    mmengine's behaviour."""

    def _local(self) -> bool:
        return self.file_client_args is None and isinstance(
            get_file_backend(self.out_dir, backend_args=self.backend_args),
            LocalBackend)

    def before_run(self, runner) -> None:
        """``--resume`` without a file (``resume=True``, no ``load_from``):
        where ``last_checkpoint`` is missing or names a file that is gone,
        resume from the newest complete checkpoint (before the Runner's
        ``load_or_resume``, which would otherwise train from scratch or stop)."""
        if not getattr(runner, '_resume', False) or runner._load_from is not None:
            return
        if not isinstance(get_file_backend(runner.work_dir), LocalBackend):
            return
        path, note = checkpoint_to_resume(runner.work_dir)
        if note:
            runner.logger.warning(note)
            runner._load_from = path

    def before_train(self, runner) -> None:
        super().before_train(runner)
        self._atomic = self._local()
        if not self._atomic:
            runner.logger.warning(
                f'AtomicCheckpointHook: {self.out_dir} is not a local folder; '
                'checkpoints there are written as mmengine writes them')
            return
        self.backend_args = dict(backend=ATOMIC_BACKEND)
        self.file_backend = AtomicLocalBackend()
        if is_main_process():
            for path in remove_stale_partials(self.out_dir):
                runner.logger.warning(f'removed {path}, the partial checkpoint '
                                      'of a run killed while it saved')

    def _save_checkpoint_with_step(self, runner, step, meta):
        if not getattr(self, '_atomic', False):
            return super()._save_checkpoint_with_step(runner, step, meta)
        outdated = None
        if self.max_keep_ckpts > 0 and not (
                self.keep_ckpt_ids and self.keep_ckpt_ids[-1] == step):
            if len(self.keep_ckpt_ids) == self.max_keep_ckpts:
                outdated = self.keep_ckpt_ids.popleft()
            self.keep_ckpt_ids.append(step)
            runner.message_hub.update_info('keep_ckpt_ids', list(self.keep_ckpt_ids))

        ckpt_filename = self.filename_tmpl.format(step)
        self.last_ckpt = self.file_backend.join_path(self.out_dir, ckpt_filename)
        runner.message_hub.update_info('last_ckpt', self.last_ckpt)
        runner.save_checkpoint(  # atomic: AtomicLocalBackend.put
            self.out_dir, ckpt_filename, self.file_client_args,
            save_optimizer=self.save_optimizer,
            save_param_scheduler=self.save_param_scheduler, meta=meta,
            by_epoch=self.by_epoch, backend_args=self.backend_args, **self.args)
        if not is_main_process():
            return
        # the new file is complete: point at it, then drop the outdated one
        atomic_write(osp.join(runner.work_dir, 'last_checkpoint'), self.last_ckpt,
                     what='last_checkpoint file')
        if outdated is not None and outdated != step:
            self._remove(self.file_backend.join_path(
                self.out_dir, self.filename_tmpl.format(outdated)))

    def _remove(self, path) -> None:
        if self.file_backend.isfile(path):
            self.file_backend.remove(path)
        elif self.file_backend.isdir(path):  # deepspeed's checkpoint folders
            self.file_backend.rmtree(path)

    def _save_best_checkpoint(self, runner, metrics) -> None:
        if not getattr(self, '_atomic', False) or not self.save_best:
            return super()._save_best_checkpoint(runner, metrics)
        # mmengine removes the previous best before it writes the new one: hide
        # the previous paths from it, and remove them once the new one is written
        single = getattr(self, 'best_ckpt_path', None)
        per_key = dict(getattr(self, 'best_ckpt_path_dict', {}))
        self.best_ckpt_path = None
        self.best_ckpt_path_dict = dict.fromkeys(per_key)
        try:
            super()._save_best_checkpoint(runner, metrics)
        except BaseException:  # nothing new was written: the previous ones stay
            self.best_ckpt_path, self.best_ckpt_path_dict = single, per_key
            raise
        replaced = [(single, self.best_ckpt_path)] + [
            (path, self.best_ckpt_path_dict[key]) for key, path in per_key.items()]
        self.best_ckpt_path = self.best_ckpt_path or single  # None: not improved
        self.best_ckpt_path_dict = {key: self.best_ckpt_path_dict[key] or path
                                    for key, path in per_key.items()}
        for old, new in replaced:
            if old and new and old != new and is_main_process():
                self._remove(old)
                runner.logger.info(f'The previous best checkpoint {old} is removed')

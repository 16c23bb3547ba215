"""mmengine's ``CheckpointHook`` that never leaves a run without a complete
checkpoint to resume from.

mmengine's hook deletes the oldest kept checkpoint (and the previous best)
*before* it writes the new one, in place: a kill during the write leaves a
partial file, and ``last_checkpoint`` naming a deleted one. Here the hook
saves through mmengine's file-backend API (``backend_args``) with
:class:`AtomicLocalBackend`: every checkpoint is written to a hidden temporary
file, fsynced and renamed (:mod:`moppa_mm.utils.atomic`), and a deletion the
hook asks for waits until the next checkpoint is complete. ``--resume``
without a file goes on from the newest complete checkpoint where
``last_checkpoint`` is missing or names a file that is gone
(:func:`checkpoint_to_resume`, the one place that chooses it).
"""
import os
import os.path as osp
import re
from typing import Dict, List, Optional, Tuple

from mmengine.dist import barrier, is_main_process
from mmengine.fileio import LocalBackend, get_file_backend, register_backend
from mmengine.hooks import CheckpointHook
from mmengine.registry import HOOKS

from moppa_mm.utils.atomic import atomic_write, remove_stale_partials
from moppa_mm.utils.checkpoints import is_whole_checkpoint

ATOMIC_BACKEND = 'moppa_atomic_local'


class AtomicLocalBackend(LocalBackend):
    """``LocalBackend`` whose ``put`` replaces the file atomically (temporary
    file, fsync, rename) and whose ``remove`` waits for the next ``put`` into
    the same folder: an old checkpoint goes once its successor is whole."""

    # folder -> files to remove after the next complete put there; shared by
    # the instances mmengine makes (the hook's and each save's)
    _pending_removals: Dict[str, List[str]] = {}

    def put(self, obj: bytes, filepath) -> None:
        filepath = str(filepath)
        atomic_write(filepath, obj, what='checkpoint')
        for old in self._pending_removals.pop(osp.dirname(osp.abspath(filepath)), []):
            if old != filepath and self.isfile(old):
                super().remove(old)

    def put_text(self, obj: str, filepath, encoding: str = 'utf-8') -> None:
        atomic_write(str(filepath), obj.encode(encoding), what='file')

    def remove(self, filepath) -> None:
        folder = osp.dirname(osp.abspath(str(filepath)))
        self._pending_removals.setdefault(folder, []).append(str(filepath))


register_backend(ATOMIC_BACKEND, AtomicLocalBackend, force=True)

# the names mmengine's CheckpointHook gives interval checkpoints (its default
# filename_tmpl), the number being the epoch or iteration
_INTERVAL_CHECKPOINT = re.compile(r'^(?:epoch|iter)_(\d+)\.pth$')


def checkpoint_to_resume(work_dir: str) -> Tuple[Optional[str], str]:
    """What ``--resume`` without a file resumes from, for a local work dir:
    the checkpoint ``<work_dir>/last_checkpoint`` names (mmengine's
    ``find_latest_checkpoint``) or, when that file is missing or names a file
    that is gone, the newest interval checkpoint (``epoch_N.pth``,
    ``iter_N.pth``: the largest N, then the newest) that is a whole PyTorch
    zip archive (a file cut short by a kill is not).

    Returns:
        ``(path, note)``: ``path`` is None where there is nothing to resume
        (mmengine then trains from scratch), and is the named, missing file
        where no complete checkpoint replaces it (the loader then says it is
        missing); ``note`` is a line saying which checkpoint was taken
        instead of ``last_checkpoint``'s, empty where it was followed.
    """
    pointer = osp.join(work_dir, 'last_checkpoint')
    named = None
    if osp.isfile(pointer):
        with open(pointer) as f:
            named = f.read().strip() or None
    if named is not None and ('://' in named or osp.isfile(named)):
        return named, ''
    paths = [osp.join(work_dir, n) for n in (os.listdir(work_dir) if osp.isdir(work_dir)
                                             else []) if _INTERVAL_CHECKPOINT.match(n)]
    found = sorted((int(_INTERVAL_CHECKPOINT.match(osp.basename(p)).group(1)),
                    osp.getmtime(p), p) for p in paths
                   if osp.isfile(p) and is_whole_checkpoint(p))
    if not found:
        return named, ''
    why = f'{pointer} names {named!r}, which is gone' if named else f'no {pointer}'
    return found[-1][2], (f'--resume: {why}; resuming from the newest complete '
                          f'checkpoint in the work dir, {found[-1][2]}')


def resume_settings(runner) -> Tuple[bool, Optional[str]]:
    """``(resume, load_from)`` of a Runner as it was built: mmengine keeps them
    in private attributes alone (its config holds them only where the Runner
    was built from one), so they are read here, in one place."""
    return bool(getattr(runner, '_resume', False)), getattr(runner, '_load_from', None)


@HOOKS.register_module()
class AtomicCheckpointHook(CheckpointHook):
    """``CheckpointHook`` (same arguments) with crash-safe writes into a local
    folder: its ``backend_args`` default to :class:`AtomicLocalBackend`'s
    there; a folder of another backend (``s3://``...), or backend arguments
    given, keep mmengine's behaviour."""

    def before_run(self, runner) -> None:
        """``--resume`` without a file: where ``last_checkpoint`` is missing or
        names a file that is gone, point it at the newest complete checkpoint
        (:func:`checkpoint_to_resume`) before the Runner follows it; say so,
        and say so where there is nothing to resume."""
        resume, load_from = resume_settings(runner)
        if not resume or load_from or not isinstance(get_file_backend(runner.work_dir),
                                                     LocalBackend):
            return
        if is_main_process():
            path, note = checkpoint_to_resume(runner.work_dir)
            if path is None:
                note = (f'--resume: nothing to resume in {runner.work_dir} (no '
                        'checkpoint): training starts from the beginning')
            elif note:
                atomic_write(osp.join(runner.work_dir, 'last_checkpoint'), path,
                             what='last_checkpoint file')
            if note:
                runner.logger.warning(note)
        barrier()  # the other ranks read last_checkpoint once it is right

    def before_train(self, runner) -> None:
        out_dir = self.out_dir or runner.work_dir
        local = isinstance(get_file_backend(out_dir), LocalBackend)
        if local and self.backend_args is None and self.file_client_args is None:
            self.backend_args = dict(backend=ATOMIC_BACKEND)
        elif not local:
            runner.logger.warning(
                f'AtomicCheckpointHook: {out_dir} is not a local folder; '
                'checkpoints there are written as mmengine writes them')
        super().before_train(runner)
        if local and is_main_process():
            for path in remove_stale_partials(self.out_dir):
                runner.logger.warning(f'removed {path}, the partial checkpoint '
                                      'of a run killed while it saved')

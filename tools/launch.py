"""What tools/train.py and tools/test.py share: they run MMDetection's or
MMPretrain's own tool (so every flag of those works), with our checks and CPU
distributed set-up right before the Runner is built.

A module of the tools, not of the package: it imports its neighbours
(``preflight``, ``cpu_distributed``) by their plain names, as a script in
``tools/`` sees them; the tests put ``tools/`` on ``sys.path`` the same way.
"""
import argparse
import contextlib
import importlib.util
import logging
import os
import os.path as osp
import sys
import warnings
from typing import List, Optional

# neighbours in tools/
from cpu_distributed import setup_distributed, shutdown_distributed
from mmengine.config import Config
from mmengine.logging import print_log
from preflight import check_config

from moppa_mm.engine.work_dir_lock import work_dir_lock
from moppa_mm.utils.checkpoints import checkpoint_to_resume
from moppa_mm.utils.config_files import read_config
from moppa_mm.utils.errors import (InputNotFoundError, InputValueError, MoPPAInputError,
                                   show_traceback, stop)
from moppa_mm.utils.malloc import keep_freed_memory

# default_scope of a config -> the package whose tools/{train,test}.py runs it
TOOL_PACKAGES = ('mmdet', 'mmpretrain', 'mmseg')
CONFIG_SUFFIXES = ('.py', '.json', '.yaml', '.yml')


def load_config(path: str, launcher: str = 'none', cfg_options: Optional[dict] = None,
                work_dir: Optional[str] = None,
                format_python_code: bool = True) -> Config:
    """``format_python_code=False`` skips yapf when the Runner logs and dumps
    the config (seconds per dump for a detection config)."""
    if not osp.isfile(path):
        raise InputNotFoundError(f'config file not found: {path!r}')
    cfg = read_config(path)
    if not format_python_code:  # fromfile drops this argument (mmengine 0.10)
        cfg = Config(cfg.to_dict(), cfg_text=cfg.text, filename=cfg.filename,
                     format_python_code=False)
    cfg.launcher = launcher
    if cfg_options:
        cfg.merge_from_dict(cfg_options)
    if work_dir is not None:
        cfg.work_dir = work_dir
    elif cfg.get('work_dir', None) is None:
        cfg.work_dir = osp.join('./work_dirs', osp.splitext(osp.basename(path))[0])
    return cfg


def launch_rank(launcher: str) -> int:
    """This process's global rank, from its launcher's environment (before the
    Runner initialises torch.distributed)."""
    if launcher != 'none':
        for name in ('RANK', 'SLURM_PROCID', 'OMPI_COMM_WORLD_RANK'):
            if name in os.environ:
                return int(os.environ[name])
    return 0


def resume_latest(cfg: Config) -> None:
    """``--resume`` without a file: where ``<work_dir>/last_checkpoint`` is
    missing or names a file that is gone, resume from the newest complete
    checkpoint of the work dir (``load_from``), and say so; say so too where
    there is nothing to resume (mmengine then starts from the beginning)."""
    if not cfg.get('resume') or cfg.get('load_from') or not cfg.get('work_dir'):
        return
    path, note = checkpoint_to_resume(cfg.work_dir)
    if path is None:  # a first run under an auto-resume script: fine, but said
        note = (f'--resume: nothing to resume in {cfg.work_dir} (no checkpoint): '
                'training starts from the beginning')
    elif note:
        cfg.load_from = path
    if note and launch_rank(cfg.get('launcher', 'none')) == 0:
        print_log(note, logger='current', level=logging.WARNING)


def prepare_run(cfg: Config, mode: str) -> None:
    """Fail fast on missing inputs, take the checkpoint ``--resume`` alone
    resumes from (:func:`resume_latest`), prepare CPU runs (distributed
    set-up, the allocator). ``mode``: 'train' or 'test'."""
    import torch
    check_config(cfg, mode=mode)
    if mode == 'train':
        resume_latest(cfg)
    setup_distributed(cfg, cfg.get('launcher', 'none'))
    if not torch.cuda.is_available():
        keep_freed_memory()


def build_runner(cfg: Config, mode: str):
    """:func:`prepare_run`, then build the Runner as mmdet's tools do."""
    from mmengine.registry import RUNNERS
    from mmengine.runner import Runner
    prepare_run(cfg, mode)
    return Runner.from_cfg(cfg) if 'runner_type' not in cfg else RUNNERS.build(cfg)


class _CheckedRunnerFactory:
    """Stands in for ``Runner`` and ``RUNNERS`` in the namespace of the tool we
    run (nowhere else): ``from_cfg`` / ``build`` call :func:`prepare_run` on the
    final config, after the tool has applied its flags, and, for training,
    take the work dir's lock in the main process (``work_dir_lock``, held
    until :func:`run_tool` closes ``locks``) before the Runner writes anything
    there (its config, its log folder); then the original."""

    def __init__(self, original, mode: str, locks: contextlib.ExitStack):
        self._original = original
        self._mode = mode
        self._locks = locks

    def _prepare(self, cfg) -> None:
        prepare_run(cfg, self._mode)
        if self._mode == 'train' and launch_rank(cfg.get('launcher', 'none')) == 0:
            self._locks.enter_context(work_dir_lock(cfg.work_dir))

    def from_cfg(self, cfg):
        self._prepare(cfg)
        return self._original.from_cfg(cfg)

    def build(self, cfg, *args, **kwargs):
        self._prepare(cfg)
        return self._original.build(cfg, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._original, name)


def _config_path(argv: List[str]) -> Optional[str]:
    """The config argument: the first one naming a config file (so options may
    come first, as the tools allow), else the first positional argument."""
    for arg in argv:
        if arg.endswith(CONFIG_SUFFIXES) and not arg.startswith('-') and '=' not in arg:
            return arg
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument('config', nargs='?')
    known, _ = parser.parse_known_args(argv)
    return known.config


def openmmlab_tool_path(scope: str, mode: str) -> str:
    """``<site-packages>/<scope>/.mim/tools/{mode}.py`` of an installed package."""
    if scope not in TOOL_PACKAGES:
        raise InputValueError(f'no tool for default_scope={scope!r}; moppa_mm runs '
                              f'the tools of {TOOL_PACKAGES}')
    package = importlib.import_module(scope)
    path = osp.join(osp.dirname(package.__file__), '.mim', 'tools', f'{mode}.py')
    if not osp.isfile(path):
        raise InputNotFoundError(f'{scope} ships no {path}; reinstall {scope}')
    return path


def main(mode: str) -> None:
    """``tools/{mode}.py``: :func:`run_tool` on ``sys.argv``. One of our
    verdicts on the input (:class:`MoPPAInputError`: a missing file, a bad
    option, a damaged or mismatched checkpoint) stops the process (each rank
    of a distributed run) with ``{mode}.py: <message>`` on stderr and exit
    status 1, without a traceback (``MOPPA_TRACEBACK=1`` shows it); any other
    exception keeps its traceback."""
    try:
        run_tool(mode)
    except MoPPAInputError as error:
        if show_traceback():
            raise
        stop(f'{mode}.py', error)


def run_tool(mode: str, argv: Optional[List[str]] = None) -> None:
    """Run mmdet's, mmpretrain's or mmseg's ``tools/{mode}.py`` (picked by the config's
    ``default_scope``) with ``argv``, so it takes every flag they take.

    Args:
        mode (str): 'train' or 'test'.
        argv (list[str], optional): the arguments after the script name;
            ``sys.argv[1:]`` by default.
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    config = _config_path(argv)
    scope = 'mmdet'  # for --help without a config
    if config is not None:
        if not osp.isfile(config):
            raise InputNotFoundError(f'config file not found: {config!r}')
        with warnings.catch_warnings():  # the tool reads it again, and warns then
            warnings.simplefilter('ignore')
            scope = read_config(config).get('default_scope', 'mmdet')
    path = openmmlab_tool_path(scope, mode)
    spec = importlib.util.spec_from_file_location(f'_{scope}_tools_{mode}', path)
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    saved_argv = sys.argv
    sys.argv = [saved_argv[0]] + argv  # the tool's parse_args reads sys.argv
    with contextlib.ExitStack() as locks:
        for name in ('Runner', 'RUNNERS'):  # mmseg's test.py has no RUNNERS
            if hasattr(tool, name):
                setattr(tool, name, _CheckedRunnerFactory(getattr(tool, name), mode, locks))
        try:
            tool.main()
        finally:
            sys.argv = saved_argv
    shutdown_distributed()

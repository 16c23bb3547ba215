"""What tools/train.py and tools/test.py share: reading the config as
mmdet's and mmpretrain's tools do, then checks and distributed set-up."""
import os.path as osp
from typing import Optional

from mmengine.config import Config

from .distributed import setup_distributed
from .malloc import keep_freed_memory
from .preflight import check_config


def load_config(path: str, launcher: str = 'none', cfg_options: Optional[dict] = None,
                work_dir: Optional[str] = None,
                format_python_code: bool = True) -> Config:
    """``format_python_code=False`` skips yapf when the Runner logs and dumps
    the config (seconds per dump for a detection config)."""
    if not osp.isfile(path):
        raise FileNotFoundError(f'config file not found: {path!r}')
    cfg = Config.fromfile(path)
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


def build_runner(cfg: Config, mode: str):
    """Fail fast on missing inputs, prepare CPU runs (distributed set-up, the
    allocator), build the Runner."""
    import torch
    from mmengine.registry import RUNNERS
    from mmengine.runner import Runner
    check_config(cfg, mode=mode)
    setup_distributed(cfg, cfg.launcher)
    if not torch.cuda.is_available():
        keep_freed_memory()
    return Runner.from_cfg(cfg) if 'runner_type' not in cfg else RUNNERS.build(cfg)

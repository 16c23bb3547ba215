"""The CPU-only quirks of DESIGN.md §5, each handled by the package."""
import os.path as osp
import pickle
import subprocess
import sys

import pytest
import torch
from mmengine.config import Config
from mmengine.logging import HistoryBuffer

from moppa_mm.utils.checkpoint_compat import load_local_checkpoint
from moppa_mm.utils.distributed import setup_distributed
from moppa_mm.utils.startup import PTH_NAME
from tests.conftest import REPO, child_env


def python(code):
    return subprocess.run([sys.executable, '-c', code], cwd=REPO, env=child_env(),
                          capture_output=True, text=True, timeout=300)


def test_torchvision_imports_in_a_fresh_interpreter_via_startup_hook():
    """mmpretrain (imported by mmdet's register_all_modules) needs torchvision;
    the .pth written by tools/install.sh arms the fix without importing moppa_mm."""
    import sysconfig
    assert osp.isfile(osp.join(sysconfig.get_paths()['purelib'], PTH_NAME))
    result = python('import sys, gc\n'
                    'assert "moppa_mm" not in sys.modules and "torch" not in sys.modules\n'
                    'from mmdet.utils import register_all_modules\n'
                    'register_all_modules()\n'
                    'gc.collect()\n'
                    'import torchvision, mmpretrain, torch\n'
                    'print("defined", hasattr(torch.ops.torchvision, "nms"))')
    assert result.returncode == 0, result.stderr[-2000:]
    assert 'defined True' in result.stdout


def test_fix_defines_only_what_is_missing():
    """Where torchvision's ops exist (a matching build loads its _C library),
    nothing is defined: simulate that by registering them first."""
    result = python(
        'import sys\n'
        'sys.modules.pop("_moppa_mm_torchvision_compat", None)\n'
        'sys.meta_path[:] = [f for f in sys.meta_path\n'
        '                    if type(f).__name__ != "_TorchvisionImportHook"]\n'
        'import torch\n'
        'lib = torch.library.Library("torchvision", "FRAGMENT")\n'
        'lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")\n'
        'lib.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")\n'
        'from moppa_mm.utils.torchvision_compat import ensure_torchvision_importable\n'
        'print("defined", ensure_torchvision_importable())\n')
    assert result.returncode == 0, result.stderr[-2000:]
    assert 'defined ()' in result.stdout


def test_fix_defines_the_schemas_when_the_ops_cannot_load():
    result = python(
        'import sys\n'
        'sys.meta_path[:] = [f for f in sys.meta_path\n'
        '                    if type(f).__name__ != "_TorchvisionImportHook"]\n'
        'import torch\n'
        'from moppa_mm.utils.torchvision_compat import _torchvision_ops_library\n'
        'try:\n'
        '    torch.ops.load_library(_torchvision_ops_library()); loads = True\n'
        'except OSError:\n'
        '    loads = False\n'
        'from moppa_mm.utils.torchvision_compat import ensure_torchvision_importable\n'
        'defined = ensure_torchvision_importable()\n'
        'print("ok", loads or defined == ("nms", "qnms"))\n'
        'import torchvision\n')
    assert result.returncode == 0, result.stderr[-2000:]
    assert 'ok True' in result.stdout


def test_runner_checkpoints_load_under_weights_only_default(tmp_path):
    plain = tmp_path / 'weights.pth'
    torch.save({'state_dict': {'w': torch.ones(2)}}, plain)
    assert load_local_checkpoint(str(plain))['state_dict']['w'].sum() == 2
    buffer = HistoryBuffer()
    buffer.update(1.5)
    runner_ckpt = tmp_path / 'iter_2.pth'
    torch.save({'state_dict': {}, 'message_hub': {'log_scalars': {'loss': buffer}}},
               runner_ckpt)
    with pytest.raises(pickle.UnpicklingError):  # what torch >= 2.6 does alone
        torch.load(runner_ckpt)
    loaded = load_local_checkpoint(str(runner_ckpt))
    assert loaded['message_hub']['log_scalars']['loss'].current() == 1.5
    with pytest.raises(FileNotFoundError, match='missing.pth'):
        load_local_checkpoint(str(tmp_path / 'missing.pth'))
    garbage = tmp_path / 'garbage.pth'
    garbage.write_bytes(b'not a checkpoint')
    with pytest.raises(Exception) as info:
        load_local_checkpoint(str(garbage))
    assert 'weights_only=False' not in str(info.value)


def test_cpu_distributed_setup(monkeypatch):
    cfg = Config(dict(env_cfg=dict(dist_cfg=dict(backend='nccl'))))
    assert setup_distributed(cfg, 'none') is False
    assert cfg.env_cfg.dist_cfg.backend == 'nccl'  # untouched
    if torch.cuda.is_available():  # mmengine's own path: nothing to do
        assert setup_distributed(cfg, 'slurm') is False
        assert cfg.env_cfg.dist_cfg.backend == 'nccl'
        return
    with pytest.raises(RuntimeError, match='launcher=.slurm. without CUDA'):
        setup_distributed(cfg, 'slurm')
    monkeypatch.delenv('MASTER_PORT', raising=False)
    with pytest.raises(RuntimeError, match='needs \\$'):
        setup_distributed(cfg, 'pytorch')

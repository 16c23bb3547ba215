"""The CPU-only quirks (README, "CPU-only quirks"), each handled by the package."""
import os.path as osp
import pickle
import subprocess
import sys

import pytest
import torch
from mmengine.config import Config
from mmengine.logging import HistoryBuffer

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
    """An ops library that fails to load (as torchvision's CUDA build does on a
    CPU-only torch; here a broken file, so the case is the same on any host)
    gets both schemas defined."""
    result = python(
        'import sys, tempfile\n'
        'sys.meta_path[:] = [f for f in sys.meta_path\n'
        '                    if type(f).__name__ != "_TorchvisionImportHook"]\n'
        'import torch\n'
        'from moppa_mm.utils import torchvision_compat as compat\n'
        'broken = tempfile.NamedTemporaryFile(suffix=".so", delete=False)\n'
        'broken.write(b"not a shared library"); broken.close()\n'
        'compat._torchvision_ops_library = lambda: broken.name\n'
        'defined = compat.ensure_torchvision_importable()\n'
        'print("defined", defined)\n'
        'print("schemas", hasattr(torch.ops.torchvision, "nms"),\n'
        '      hasattr(torch.ops.torchvision, "qnms"))\n')
    assert result.returncode == 0, result.stderr[-2000:]
    assert "defined ('nms', 'qnms')" in result.stdout
    assert 'schemas True True' in result.stdout


def test_import_keeps_mmengines_safe_loader():
    """``import moppa_mm`` replaces no loader: mmengine's local loader stays
    torch's default ``weights_only=True`` load and refuses pickled objects."""
    result = python(
        'from mmengine.runner.checkpoint import CheckpointLoader\n'
        'before = dict(CheckpointLoader._schemes)\n'
        'import moppa_mm\n'
        'assert dict(CheckpointLoader._schemes) == before, "loader replaced"\n'
        'print("kept")')
    assert result.returncode == 0, result.stderr[-2000:]
    assert 'kept' in result.stdout


def test_mmengine_loader_refuses_objects(tmp_path):
    from mmengine.runner.checkpoint import CheckpointLoader
    import moppa_mm  # noqa: F401
    buffer = HistoryBuffer()
    buffer.update(1.5)
    runner_ckpt = tmp_path / 'iter_2.pth'
    torch.save({'state_dict': {}, 'message_hub': {'log_scalars': {'loss': buffer}}},
               runner_ckpt)
    with pytest.raises(pickle.UnpicklingError):
        CheckpointLoader.load_checkpoint(str(runner_ckpt))


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

"""The CPU-only quirks (docs/cpu_quirks.md): the torchvision fix that
tools/install.sh arms, what ``import moppa_mm`` does (and does not), CPU
distributed set-up."""
import os.path as osp
import pickle
import subprocess
import sys

import numpy as np
import pytest
import torch
from cpu_distributed import setup_distributed  # tools/
from mmengine.config import Config
from mmengine.logging import HistoryBuffer

from tests.conftest import PYTHON, REPO, TOOLS, child_env

FIX = osp.join(TOOLS, 'torchvision_ops_fix.py')
# the CPU stack's failure on any host: torchvision's compiled ops do not load
BREAK_TORCHVISION_OPS = (
    'import torch\n'
    'load_library = torch.ops.load_library\n'
    'def failing(path):\n'
    '    if "torchvision" in str(path):\n'
    '        raise OSError(f"{path}: undefined symbol (simulated)")\n'
    '    return load_library(path)\n'
    'torch.ops.load_library = failing\n')
# a fresh interpreter without the start-up hook that tools/install.sh arms
WITHOUT_HOOK = ('import sys\n'
                'sys.meta_path[:] = [f for f in sys.meta_path\n'
                '                    if type(f).__name__ != "_TorchvisionImportHook"]\n')
LOAD_FIX = ('import importlib.util\n'
            f'spec = importlib.util.spec_from_file_location("fix", {FIX!r})\n'
            'fix = importlib.util.module_from_spec(spec)\n'
            'spec.loader.exec_module(fix)\n')


def python(code, *flags):
    return subprocess.run([sys.executable, *flags, '-c', code], cwd=REPO, env=child_env(),
                          capture_output=True, text=True, timeout=300)


def test_startup_pth_makes_torchvision_importable_for_tools_we_do_not_own(tmp_path):
    """The .pth that ``tools/torchvision_ops_fix.py`` writes (as tools/install.sh
    does) arms the fix without importing anything; then mmdet's
    register_all_modules, torchvision and mmpretrain import although
    torchvision's ops do not load, and moppa_mm is never imported."""
    import sysconfig
    written = subprocess.run([sys.executable, FIX, '--site-dir', str(tmp_path)],
                             capture_output=True, text=True, timeout=60)
    assert written.returncode == 0, written.stderr
    assert osp.isfile(tmp_path / 'moppa_mm_startup.pth')
    result = python(
        'import site, sys\n'
        f'site.addsitedir({str(tmp_path)!r})\n'  # this checkout's .pth first
        f'site.addsitedir({sysconfig.get_paths()["purelib"]!r})\n'
        'assert "torch" not in sys.modules, "the .pth imported torch"\n'
        'fix = sys.modules["_moppa_mm_torchvision_ops_fix"]\n'
        f'assert fix.__file__ == {FIX!r}, fix.__file__\n'
        'hooks = [type(f).__module__ for f in sys.meta_path\n'
        '         if type(f).__name__ == "_TorchvisionImportHook"]\n'
        'assert hooks == [fix.__name__], hooks\n' + BREAK_TORCHVISION_OPS +
        'from mmdet.utils import register_all_modules\n'
        'register_all_modules()\n'
        'import torchvision, mmpretrain\n'
        'print("defined", fix._STATE["defined"], "moppa_mm" in sys.modules)', '-S')
    assert result.returncode == 0, result.stderr[-2000:]
    assert "defined ('nms', 'qnms') False" in result.stdout


def test_startup_pth_names_a_fix_file_that_is_gone(tmp_path):
    """A .pth left behind by a moved or deleted checkout says so at start-up,
    instead of torchvision failing later with "operator ... does not exist"."""
    result = python(LOAD_FIX + f'site_dir = {str(tmp_path)!r}\n'
                    'with open(site_dir + "/" + fix.PTH_NAME, "w") as f:\n'
                    '    f.write(fix.startup_line("/gone/tools/torchvision_ops_fix.py"))\n'
                    'import site\n'
                    'site.addsitedir(site_dir)\n'
                    'print("started")\n', '-S')
    assert result.returncode == 0, result.stderr[-2000:]
    assert 'started' in result.stdout
    assert ('moppa_mm_startup.pth: cannot run /gone/tools/torchvision_ops_fix.py: '
            'FileNotFoundError') in result.stderr


def test_fix_defines_only_what_is_missing():
    """Where torchvision's ops exist (a matching build loads its _C library),
    nothing is defined: simulate that by registering them first."""
    result = python(
        WITHOUT_HOOK + 'import torch\n'
        'lib = torch.library.Library("torchvision", "FRAGMENT")\n'
        'lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")\n'
        'lib.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")\n'
        + LOAD_FIX + 'print("defined", fix.ensure_torchvision_importable())\n')
    assert result.returncode == 0, result.stderr[-2000:]
    assert 'defined ()' in result.stdout


def test_fix_defines_the_schemas_when_the_ops_cannot_load():
    """An ops library that fails to load (as torchvision's CUDA build does on a
    CPU-only torch; simulated, so the case is the same on any host) gets both
    schemas defined, and torchvision then imports."""
    result = python(
        WITHOUT_HOOK + BREAK_TORCHVISION_OPS + LOAD_FIX +
        'defined = fix.ensure_torchvision_importable()\n'
        'print("defined", defined)\n'
        'print("schemas", hasattr(torch.ops.torchvision, "nms"),\n'
        '      hasattr(torch.ops.torchvision, "qnms"))\n'
        'import torchvision\n')
    assert result.returncode == 0, result.stderr[-2000:]
    assert "defined ('nms', 'qnms')" in result.stdout
    assert 'schemas True True' in result.stdout


def test_import_without_the_fix_names_it():
    """Without the start-up hook, on a stack whose torchvision ops do not load,
    ``import moppa_mm`` patches nothing and says how to fix the environment."""
    result = python(WITHOUT_HOOK + BREAK_TORCHVISION_OPS + 'import moppa_mm\n')
    assert result.returncode != 0
    assert 'ImportError' in result.stderr
    assert 'tools/torchvision_ops_fix.py' in result.stderr
    assert 'torchvision::nms' in result.stderr


def test_import_only_registers():
    """``import moppa_mm`` in a fresh interpreter registers our modules and the
    ``moppa_mm::`` scope, and touches nothing else: no torch operator defined or
    library loaded by moppa_mm code, no import hook, mmengine's loaders (torch's
    ``weights_only=True`` load) and model wrappers as they were."""
    result = python(
        'import os, sys, traceback\n'
        'import torch\n'
        f'package = os.path.join({REPO!r}, "moppa_mm")\n'
        'touched = []\n'
        'def recording(name, original):\n'
        '    def call(*args, **kwargs):\n'
        '        caller = traceback.extract_stack()[-2].filename\n'
        '        if caller.startswith(package):  # called by moppa_mm itself\n'
        '            touched.append((name, args[1:2] or args[:1]))\n'
        '        return original(*args, **kwargs)\n'
        '    return call\n'
        'torch.ops.load_library = recording("load_library", torch.ops.load_library)\n'
        'torch.library.Library.define = recording("define", torch.library.Library.define)\n'
        'from mmengine.registry import MODEL_WRAPPERS\n'
        'from mmengine.runner.checkpoint import CheckpointLoader\n'
        'loaders, wrappers = dict(CheckpointLoader._schemes), set(MODEL_WRAPPERS.module_dict)\n'
        'meta_path = list(sys.meta_path)\n'
        'import moppa_mm\n'
        'assert touched == [], touched\n'
        'added = [f for f in sys.meta_path if f not in meta_path\n'
        '         and "moppa_mm" in type(f).__module__]\n'
        'assert added == [], f"import hooks added: {added}"\n'
        'assert dict(CheckpointLoader._schemes) == loaders, "loader replaced"\n'
        'assert set(MODEL_WRAPPERS.module_dict) == wrappers, "model wrapper registered"\n'
        'from mmdet.registry import MODELS as DET_MODELS\n'
        'from mmpretrain.registry import MODELS as CLS_MODELS, DATASETS\n'
        'from mmengine.registry import HOOKS\n'
        'from mmengine.config.utils import MODULE2PACKAGE\n'
        'assert DET_MODELS.get("MoPPASwinTransformer") is not None\n'
        'assert CLS_MODELS.get("MoPPAVisionTransformer") is not None\n'
        'assert DATASETS.get("VTAB1k") is not None\n'
        'assert HOOKS.get("RouteWeightLoggerHook") is not None\n'
        'assert MODULE2PACKAGE["moppa_mm"] == "moppa_mm.version"\n'
        'print("only registered")')
    assert result.returncode == 0, result.stderr[-2000:]
    assert 'only registered' in result.stdout


class _NotAllowed:
    pass


def test_mmengine_loader_reads_runner_checkpoints_and_refuses_other_objects(tmp_path):
    """With moppa_mm imported, mmengine's loader (torch's weights_only default)
    reads what a Runner saves (HistoryBuffer, numpy); any other object stays
    refused."""
    from mmengine.runner.checkpoint import CheckpointLoader

    import moppa_mm  # noqa: F401
    buffer = HistoryBuffer()
    buffer.update(1.5)
    runner_ckpt = tmp_path / 'iter_2.pth'
    torch.save({'state_dict': {}, 'message_hub': {'log_scalars': {'loss': buffer}},
                'meta': {'seed': np.int64(3), 'rng': np.random.get_state()}}, runner_ckpt)
    loaded = CheckpointLoader.load_checkpoint(str(runner_ckpt))
    assert loaded['message_hub']['log_scalars']['loss'].current() == 1.5
    other = tmp_path / 'other.pth'
    torch.save({'state_dict': {}, 'meta': {'x': _NotAllowed()}}, other)
    with pytest.raises(pickle.UnpicklingError):
        CheckpointLoader.load_checkpoint(str(other))


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


def test_an_old_torch_stops_the_import_in_one_line():
    """torch older than moppa_mm.MIN_TORCH (as a CUDA machine may have):
    ``import moppa_mm`` stops with one line naming both versions."""
    result = subprocess.run(
        [PYTHON, '-c', "import torch; torch.__version__ = '2.5.1+cu124'; import moppa_mm"],
        cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=300)
    assert result.returncode == 1
    assert result.stderr.splitlines()[-1] == (
        'ImportError: moppa_mm needs torch >= 2.6, found 2.5.1+cu124: install a newer '
        'torch (README, "Install")'), result.stderr[-2000:]

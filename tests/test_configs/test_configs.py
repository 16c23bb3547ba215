import ast
import copy
import functools
import glob
import os.path as osp

import pytest
from mmengine.config import Config
from mmengine.registry import init_default_scope

from moppa_mm.models.backbones.adapter_params import adapter_components, parameter_breakdown
from moppa_mm.models.backbones.adapter_record import adapter_record
from moppa_mm.utils.params import parameter_table
from tests.conftest import REPO

# whole configs (the family bases too); the pieces they compose, in the
# top-level configs/_base_/ (models, datasets, schedules, runtime), are tested
# below on their own
SHARED_BASES = sorted(glob.glob(osp.join(REPO, 'configs', '_base_', '**', '*.py'),
                                recursive=True))
# MMSegmentation's configs (the seg extra) are built by test_seg_configs.py and run
# by tests/test_tools/test_seg_tools.py
SEG_CONFIGS = set(glob.glob(osp.join(REPO, 'configs', 'segmentation', '*.py'))) | set(
    glob.glob(osp.join(REPO, 'configs', 'demo', '*upernet*.py')))
CONFIGS = sorted(set(glob.glob(osp.join(REPO, 'configs', '**', '*.py'), recursive=True))
                 - set(SHARED_BASES) - SEG_CONFIGS)


def test_there_are_configs():
    names = [osp.relpath(c, REPO) for c in CONFIGS]
    assert 'configs/cascade_moppa_swin_b_coco.py' in names
    assert len([n for n in names if n.startswith('configs/vtab1k/moppa_vit-b')]) == 57
    assert len([n for n in names if n.startswith('configs/vtab1k/moppa_swin-b')]) == 19
    assert len([n for n in names if n.startswith('configs/vtab1k/moppa_vit-l')]) == 19
    assert len([n for n in names if n.startswith('configs/fgvc/moppa_')]) == 10
    for method in ('linear', 'full', 'ssf', 'lora'):  # baselines
        assert len([n for n in names if n.startswith(f'configs/vtab1k/{method}_')]) == 19
        assert len([n for n in names if n.startswith(f'configs/fgvc/{method}_')]) == 5


@functools.lru_cache(maxsize=None)
def _parsed(path):
    return Config.fromfile(path)


def parsed(path):
    """``Config.fromfile(path)``, parsed once per test session (a copy: tests
    change what they get)."""
    return copy.deepcopy(_parsed(path))


def build_tiny(cfg):
    """Build the config's model with a tiny backbone and no weight loading."""
    backbone = cfg.model.backbone
    if backbone.type == 'LoRAModel':  # the LoRA baseline: shrink the ViT it wraps
        backbone = backbone.module
    backbone.init_cfg = None
    if backbone.get('frozen_stages') == 12:  # the linear probe: all layers
        backbone.frozen_stages = 1
    if 'VisionTransformer' in backbone.type:
        from mmpretrain.registry import MODELS
        init_default_scope('mmpretrain')
        backbone.update(arch=dict(embed_dims=32, num_layers=1, num_heads=2,
                                  feedforward_channels=64), img_size=32, patch_size=16)
        cfg.model.head.in_channels = 32
    elif cfg.default_scope == 'mmpretrain':  # the classification Swin
        from mmpretrain.registry import MODELS
        init_default_scope('mmpretrain')
        backbone.update(arch=dict(embed_dims=16, depths=[1, 1], num_heads=[1, 2]),
                        img_size=56, out_indices=(1, ))
        cfg.model.head.in_channels = 32
    else:
        from mmdet.registry import MODELS
        init_default_scope('mmdet')
        backbone.update(embed_dims=16, depths=[1, 1, 1, 1], num_heads=[1, 1, 2, 2])
        cfg.model.neck.in_channels = [16, 32, 64, 128]
    return MODELS.build(cfg.model)


@pytest.mark.parametrize('path', CONFIGS, ids=lambda p: osp.relpath(p, REPO))
def test_config_parses_and_builds(path):
    cfg = parsed(path)
    assert cfg.model.type
    if 'moppa' in osp.basename(path):
        assert cfg.custom_imports == dict(imports=['moppa_mm'],
                                          allow_failed_imports=False)
        assert cfg.model.backbone.type.startswith('MoPPA')
    model = build_tiny(cfg)
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    if cfg.model.backbone.type.startswith('MoPPA'):
        assert all(n.startswith(('head.', 'neck.', 'rpn_head.', 'roi_head.'))
                   or 'moppa' in n or 'ssf_' in n or 'conv_adapter' in n
                   for n in trainable)
    if 'num_classes' in cfg.model.get('head', {}):
        assert model.head.num_classes == cfg.model.head.num_classes


@pytest.mark.parametrize('path', CONFIGS, ids=lambda p: osp.relpath(p, REPO))
def test_moppa_config_builds_its_optimizer_over_the_trainable_set(path):
    """Every MoPPA config (the demos too) uses TrainableParamsOptimWrapperConstructor:
    with a paramwise_cfg, mmengine's default constructor logs one warning per
    frozen parameter. (The segmentation configs: test_seg_configs.py.)"""
    cfg = parsed(path)
    if cfg.model.backbone.type.startswith('MoPPA'):
        assert cfg.optim_wrapper.constructor == 'TrainableParamsOptimWrapperConstructor'


@pytest.mark.parametrize('path', SHARED_BASES, ids=lambda p: osp.relpath(p, REPO))
def test_shared_base_parses_alone(path):
    """A piece of configs/_base_/ needs nothing from the config that composes
    it; a model piece builds."""
    cfg = Config.fromfile(path)
    if osp.basename(osp.dirname(path)) == 'models':
        build_tiny(cfg)


def inherited_files(path):
    """Every file the config at ``path`` inherits, directly or through its
    bases (scoped bases such as ``mmpretrain::...`` left out)."""
    module = ast.parse(open(path).read())
    (bases, ) = [node.value for node in module.body if isinstance(node, ast.Assign)
                 and getattr(node.targets[0], 'id', None) == '_base_'] or [ast.List(elts=[])]
    names = [bases.value] if isinstance(bases, ast.Constant) else [
        element.value for element in bases.elts]
    files = set()
    for name in names:
        if '::' not in name:
            base = osp.normpath(osp.join(osp.dirname(path), name))
            files |= {base} | inherited_files(base)
    return files


@pytest.mark.parametrize('family', ['vtab1k', 'fgvc', 'moppa'])
def test_a_family_inherits_only_its_own_bases_and_the_shared_ones(family):
    """FGVC, VTAB-1K and ImageNet-1K configs compose configs/_base_/ and their
    own folder's bases, never another family's."""
    allowed = (osp.join(REPO, 'configs', family) + osp.sep,
               osp.join(REPO, 'configs', '_base_') + osp.sep)
    for path in CONFIGS:
        if path.startswith(allowed[0]):
            outside = [f for f in inherited_files(path) if not f.startswith(allowed)]
            assert not outside, (path, outside)


def test_generated_configs_are_up_to_date():
    import subprocess
    import sys
    result = subprocess.run([sys.executable, 'tools/misc/generate_configs.py',
                             '--check'], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_paper_detector_builds_with_the_paper_budget():
    from mmdet.registry import MODELS
    cfg = Config.fromfile(osp.join(REPO, 'configs/cascade_moppa_swin_b_coco.py'))
    assert cfg.train_cfg.max_epochs == 36
    assert cfg.optim_wrapper.optimizer.type == 'AdamW'
    assert 'CascadeRoIHead' == cfg.model.roi_head.type
    assert cfg.model.backbone.init_cfg.checkpoint.endswith(
        'swin_base_patch4_window7_224_22k.pth')
    init_default_scope('mmdet')
    # the backbone loads its base when built: the release's URL is not reachable here
    cfg.model.backbone.init_cfg = None
    model = MODELS.build(cfg.model)
    table, counts = parameter_table(
        model, adapter_components('backbone.') + (('backbone', ('backbone.*', )), ))
    print('\n' + table)
    backbone_trainable = sum(counts[k]['trainable'] for k in counts
                             if k.startswith('backbone'))
    assert abs(backbone_trainable / 3.18e6 - 1) < 0.05
    assert counts['backbone']['trainable'] == 0
    assert counts['other']['trainable'] == counts['other']['total']  # neck, heads


def test_user_config_inherits_through_the_package_scope(tmp_path):
    user = tmp_path / 'my_moppa.py'
    user.write_text(
        "_base_ = 'moppa_mm::moppa/cascade-mask-rcnn_moppa-swin-b-p4-w7_fpn_ms-crop-3x_coco.py'\n"
        "model = dict(backbone=dict(moppa_scope='global'))\n")
    cfg = Config.fromfile(str(user))
    assert cfg.model.backbone.type == 'MoPPASwinTransformer'
    assert cfg.model.backbone.moppa_scope == 'global'
    assert cfg.model.backbone.embed_dims == 128


def test_param_breakdown_tool_for_any_config():
    import subprocess
    import sys

    from tests.conftest import child_env
    result = subprocess.run(
        [sys.executable, 'tools/analysis/param_breakdown.py',
         'configs/vtab1k/moppa_vit-b-p16_mae-pre_vtab1k-dtd.py'],
        cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    # 217,572 adapters (the units of Eq. 11 and scale & shift) + the 47-class
    # head (768 * 47 + 47)
    assert 'trainable backbone parameters: 217,572' in result.stdout
    assert 'trainable in all: 253,715' in result.stdout
    assert 'backbone.moppa' in result.stdout and 'backbone.scale_shift' in result.stdout
    lora = subprocess.run(
        [sys.executable, 'tools/analysis/param_breakdown.py',
         'configs/vtab1k/lora_vit-b-p16_in21k-augreg-pre_vtab1k-dtd.py'],
        cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=300)
    assert lora.returncode == 0, lora.stderr[-2000:]
    assert 'trainable backbone parameters: 294,912' in lora.stdout  # rank 8 on qkv
    assert 'backbone.lora' in lora.stdout


@pytest.mark.parametrize('path', CONFIGS, ids=lambda p: osp.relpath(p, REPO))
def test_training_workers_are_seeded_for_an_exact_resume(path):
    """A config that resumes exactly (RNGStateHook) restarts its training
    workers every epoch, seeded from the main process's generator: workers
    that persist keep random states no checkpoint holds, and mmengine's seeding
    repeats the same random draws every epoch."""
    cfg = parsed(path)
    if not any(hook.type == 'RNGStateHook' for hook in cfg.get('custom_hooks', [])):
        return
    loader = cfg.train_dataloader
    assert 'moppa_mm' in cfg.custom_imports.imports  # registers the function
    if loader.num_workers > 0:
        assert not loader.persistent_workers
        assert loader.worker_init_fn == dict(type='epoch_seeded_worker_init')


@pytest.mark.parametrize('moppa, plain, scope', [
    ('configs/moppa/cascade-mask-rcnn_moppa-swin-b-p4-w7_fpn_ms-crop-3x_coco.py',
     'configs/moppa/cascade-mask-rcnn_swin-b-p4-w7_fpn_ms-crop-3x_coco.py', 'mmdet'),
    ('configs/vtab1k/moppa_vit-b-p16_in21k-augreg-pre_vtab1k-dtd.py',
     'configs/vtab1k/full_vit-b-p16_in21k-augreg-pre_vtab1k-dtd.py', 'mmpretrain'),
])
def test_two_lines_give_the_shipped_method(moppa, plain, scope):
    """The backbones' defaults are the shipped recipe: the plain baseline's
    backbone with only its type changed builds the adapter of the shipped
    MoPPA config (same record, same trainable set)."""
    from mmengine.registry import MODELS, init_default_scope
    init_default_scope(scope)
    shipped = copy.deepcopy(parsed(osp.join(REPO, moppa)).model.backbone)
    two_lines = copy.deepcopy(parsed(osp.join(REPO, plain)).model.backbone)
    two_lines.type = shipped.type
    for backbone in (shipped, two_lines):
        backbone.init_cfg = None  # the architecture, no weights
    built = [MODELS.build(backbone) for backbone in (shipped, two_lines)]
    assert adapter_record(built[0]) == adapter_record(built[1])
    assert parameter_breakdown(built[0]) == parameter_breakdown(built[1])


@pytest.mark.parametrize('path', CONFIGS, ids=lambda p: osp.relpath(p, REPO))
def test_checkpoints_are_written_atomically(path):
    """Every config that imports moppa_mm saves through AtomicCheckpointHook
    (a kill while saving leaves the previous checkpoint and a last_checkpoint
    naming it: tests/test_tools/test_durability.py); the plain-mmdet baseline
    detector does not import moppa_mm and keeps mmdet's hook."""
    cfg = parsed(path)
    if 'moppa_mm' not in cfg.get('custom_imports', {}).get('imports', []):
        return
    assert cfg.default_hooks.checkpoint.type == 'AtomicCheckpointHook'

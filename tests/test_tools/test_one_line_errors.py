"""Our verdicts on a user's input stop the tools with one line and exit status
1 (no traceback); an error that is not ours keeps its traceback; bytes of a
MoPPA checkpoint changed after its save (which torch.load reads silently) are
refused by the record's digest, naming the file."""
import os.path as osp
import subprocess
import zipfile

import pytest
import torch

from moppa_mm.utils.checkpoints import CheckpointLoadError, load_checkpoint_file
from moppa_mm.utils.errors import MoPPAInputError
from tests.conftest import PYTHON, REPO, child_env, dump_cfg, tiny_detection_cfg


def run_train(cfg, tmp_path, *args, env=None):
    return subprocess.run(
        [PYTHON, 'tools/train.py', dump_cfg(cfg, tmp_path / 'tiny.py'), *args], cwd=REPO,
        env=env or child_env(), capture_output=True, text=True, timeout=600)


def assert_one_line(run, message, tool='train.py'):
    assert run.returncode == 1, run.stderr[-3000:]
    assert 'Traceback' not in run.stderr, run.stderr[-3000:]
    assert f'{tool}: {message}' in run.stderr, run.stderr[-3000:]


def run_tool(tool, *args, cwd=REPO):
    return subprocess.run([PYTHON, osp.join(REPO, 'tools', tool), *map(str, args)], cwd=cwd,
                          env=child_env(), capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize('bases', [{'self.py': './self.py'},  # a list naming itself hung
                                   {'self.py': './b.py', 'b.py': './self.py'}])
def test_a_cycle_of_base_files_is_one_line(tmp_path, bases):
    for name, base in bases.items():
        (tmp_path / name).write_text(f"_base_ = ['{base}']\ndefault_scope = 'mmpretrain'\n")
    cycle = ' -> '.join(str(tmp_path / name) for name in list(bases) + ['self.py'])
    assert_one_line(run_tool('train.py', tmp_path / 'self.py'),
                    f'{tmp_path}/self.py: its _base_ files name each other in a cycle '
                    f'(mmengine would recurse until it fails): {cycle}')


def test_a_work_dir_that_is_a_file_is_one_line(shapes_data, tmp_path):
    cfg = tiny_detection_cfg(shapes_data, tmp_path / 'work', max_iters=1)
    config = dump_cfg(cfg, tmp_path / 'tiny.py')
    (tmp_path / 'file').write_text('')
    for tool, args in (('train.py', ()), ('test.py', (shapes_data['pretrained'], ))):
        for work_dir in ('file', 'file/sub'):
            run = run_tool(tool, config, *args, '--work-dir', tmp_path / work_dir)
            assert_one_line(run, f"work_dir = '{tmp_path}/{work_dir}' (--work-dir): "
                            f"'{tmp_path}/file' is a file, not a folder", tool)


def test_missing_data_root_is_one_line(shapes_data, tmp_path):
    cfg = tiny_detection_cfg(shapes_data, tmp_path / 'work', max_iters=1)
    cfg.train_dataloader.dataset.data_root = str(tmp_path / 'nonexistent_root')
    assert_one_line(run_train(cfg, tmp_path), 'data root not found: train_dataloader.'
                    f"dataset.data_root = '{tmp_path}/nonexistent_root'")


def test_missing_base_checkpoint_is_one_line(shapes_data, tmp_path):
    cfg = tiny_detection_cfg(shapes_data, tmp_path / 'work', max_iters=1)
    cfg.model.backbone.init_cfg.checkpoint = str(tmp_path / 'nope_base.pth')
    assert_one_line(run_train(cfg, tmp_path), 'checkpoint model.backbone.init_cfg.'
                    f"checkpoint = '{tmp_path}/nope_base.pth' not found")


def test_unknown_moppa_option_is_one_line(shapes_data, tmp_path):
    cfg = tiny_detection_cfg(shapes_data, tmp_path / 'work', max_iters=1)
    cfg.model.backbone.moppa_cfg = dict(heat_parm='learned')
    run = run_train(cfg, tmp_path)
    assert_one_line(run, '')
    assert "moppa_cfg has unknown option(s) ['heat_parm']" in run.stderr
    # the traceback on request
    env = dict(child_env(), MOPPA_TRACEBACK='1')
    run = run_train(cfg, tmp_path, env=env)
    assert run.returncode == 1 and 'Traceback' in run.stderr, run.stderr[-3000:]


@pytest.mark.parametrize('tool', ['train.py', 'test.py'])
def test_a_mistyped_type_is_one_line_with_the_type_meant(shapes_data, tmp_path, tool):
    """The value users edit first: a typo of a MoPPA type, named with its key
    and the registered type meant, before the Runner is built."""
    cfg = tiny_detection_cfg(shapes_data, tmp_path / 'work', max_iters=1)
    cfg.model.backbone.type = 'MoPPASwinTransfomer'
    config = dump_cfg(cfg, tmp_path / 'typo.py')
    run = run_tool(tool, config, *(['nope.pth'] if tool == 'test.py' else []))
    assert_one_line(run, "model.backbone.type = 'MoPPASwinTransfomer' is not a registered "
                    "type: did you mean 'MoPPASwinTransformer'?", tool=tool)
    assert run.stderr.count('\n') == 1, run.stderr  # nothing else: no pkg_resources warning


def test_a_misspelt_backbone_argument_is_one_line_with_the_closest_name(shapes_data,
                                                                        tmp_path):
    """Under our train.py one line; under mmdet's own, the traceback's last."""
    cfg = tiny_detection_cfg(shapes_data, tmp_path / 'work', max_iters=1)
    cfg.model.backbone.route_los_weight = 0.5
    message = ("model.backbone.route_los_weight is not an argument of MoPPASwinTransformer "
               "(nor of mmdet's SwinTransformer): did you mean route_loss_weight?")
    run = run_train(cfg, tmp_path)
    assert_one_line(run, '')
    assert message in run.stderr
    mmdet_train = osp.join(osp.dirname(__import__('mmdet').__file__), '.mim', 'tools',
                           'train.py')
    run = subprocess.run([PYTHON, mmdet_train, dump_cfg(cfg, tmp_path / 'tiny.py')], cwd=REPO,
                         env=child_env(), capture_output=True, text=True, timeout=600)
    assert run.returncode == 1 and run.stderr.strip().splitlines()[-1].endswith(message)


def test_truncated_checkpoint_is_one_line(shapes_data, tmp_path):
    data = open(shapes_data['pretrained'], 'rb').read()
    half = tmp_path / 'half.pth'
    half.write_bytes(data[:len(data) // 2])
    cfg = tiny_detection_cfg(shapes_data, tmp_path / 'work', max_iters=1)
    cfg.model.backbone.init_cfg.checkpoint = str(half)
    run = run_train(cfg, tmp_path)
    assert_one_line(run, 'pre-trained checkpoint model.backbone.init_cfg.checkpoint =')
    assert 'without its end' in run.stderr
    assert len(run.stderr.strip().splitlines()[-1]) > 50  # the one line says it all


def test_an_error_not_ours_keeps_its_traceback(shapes_data, tmp_path):
    cfg = tiny_detection_cfg(shapes_data, tmp_path / 'work', max_iters=1)
    cfg.model.neck.type = 'NoSuchNeck'  # upstream's registry says so, not we
    run = run_train(cfg, tmp_path)
    assert run.returncode != 0
    assert 'Traceback' in run.stderr and 'NoSuchNeck' in run.stderr, run.stderr[-3000:]


def test_our_errors_keep_their_builtin_bases():
    from moppa_mm.models.backbones.load_check import AdapterRecordMismatchError
    from moppa_mm.models.backbones.training_checks import NoPretrainedBaseError
    from moppa_mm.utils.errors import InputNotFoundError, InputValueError
    assert issubclass(CheckpointLoadError, (MoPPAInputError, RuntimeError))
    assert issubclass(AdapterRecordMismatchError, RuntimeError)
    assert issubclass(NoPretrainedBaseError, MoPPAInputError)
    assert issubclass(InputNotFoundError, FileNotFoundError)
    assert issubclass(InputValueError, ValueError)


def tensor_record(path):
    """The name and byte offset of the largest tensor record of a zip checkpoint."""
    with zipfile.ZipFile(path) as archive:
        info = max((i for i in archive.infolist() if '/data/' in i.filename),
                   key=lambda i: i.file_size)
    with open(path, 'rb') as f:  # data starts after the local header
        f.seek(info.header_offset + 26)
        name_len, extra_len = (int.from_bytes(f.read(2), 'little') for _ in range(2))
    return info, info.header_offset + 30 + name_len + extra_len


def test_a_compressed_record_that_cannot_be_inflated_is_named(tmp_path):
    """An archive whose deflated record is damaged, and whole zips that are
    not PyTorch's: named, not torch's bare RuntimeError."""
    path = tmp_path / 'deflated.pth'
    with zipfile.ZipFile(path, 'w', compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr('archive/data.pkl', b'abc' * 3000)
    data = bytearray(path.read_bytes())
    data[30 + len('archive/data.pkl')] = 0x07  # the first deflate block: an invalid type
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointLoadError, match=f"checkpoint '{path}'"):
        load_checkpoint_file(str(path))
    for name in ('notes.txt', 'archive/notes.txt'):  # whole zips, not PyTorch's
        other = tmp_path / 'other.zip'
        with zipfile.ZipFile(other, 'w') as archive:
            archive.writestr(name, 'hello')
        with pytest.raises(CheckpointLoadError, match=f"checkpoint '{other}'"):
            load_checkpoint_file(str(other))


def flipped_adapter_checkpoint(shapes_data, tmp_path):
    """The demo detector's adapter-only checkpoint (as every tool saves it:
    adapters, neck and heads, the record with its digest), with 64 bytes of
    its largest tensor record overwritten in the file, as a disk or copy
    error would: torch.load reads other (finite) weights without a word."""
    from mmdet.registry import MODELS
    from mmengine.registry import DefaultScope
    cfg = tiny_detection_cfg(shapes_data, tmp_path / 'work')
    with DefaultScope.overwrite_default_scope('mmdet'):  # whatever an earlier test left
        model = MODELS.build(cfg.model)
    path = tmp_path / 'epoch_1.pth'
    torch.save({'state_dict': model.state_dict(), 'meta': {}}, path)
    saved = torch.load(path, weights_only=True)['state_dict']
    info, start = tensor_record(path)
    data = bytearray(path.read_bytes())
    data[start:start + 64] = b'\x3f' * 64
    path.write_bytes(bytes(data))
    loaded = torch.load(path, weights_only=True)['state_dict']
    changed = [k for k in saved if not torch.equal(saved[k], loaded[k])]
    assert len(changed) == 1 and torch.isfinite(loaded[changed[0]]).all(), changed
    return cfg, path


def test_flipped_bytes_in_a_tensor_are_refused(shapes_data, tmp_path):
    """The model's own load check (mmengine's loader, as load_from, --resume,
    the test tools and init_detector call it) and publish_model.py (one line,
    exit 1) refuse the file, naming it."""
    from mmdet.registry import MODELS
    from mmengine.registry import DefaultScope
    from mmengine.runner.checkpoint import load_checkpoint
    cfg, path = flipped_adapter_checkpoint(shapes_data, tmp_path)
    with DefaultScope.overwrite_default_scope('mmdet'):
        model = MODELS.build(cfg.model)
    with pytest.raises(CheckpointLoadError, match='the checkpoint is damaged: its tensors '
                       '.* do not match the digest'):
        load_checkpoint(model, str(path), map_location='cpu')
    run = subprocess.run(
        [PYTHON, 'tools/model_converters/publish_model.py', str(path),
         str(tmp_path / 'moppa.pth')], cwd=REPO, env=child_env(), capture_output=True,
        text=True, timeout=300)
    assert run.returncode == 1 and 'Traceback' not in run.stderr, run.stderr[-3000:]
    assert (f"publish_model.py: checkpoint to publish '{path}' is damaged: its "
            'tensors') in run.stderr, run.stderr[-3000:]
    assert not list(tmp_path.glob('moppa*'))


def test_a_bad_backbone_argument_is_one_line(shapes_data, tmp_path):
    """Once taken as True (a non-empty string): the one check of the backbones'
    arguments names the key and what it must be."""
    cfg = tiny_detection_cfg(shapes_data, tmp_path / 'work', max_iters=1)
    assert_one_line(run_train(cfg, tmp_path, '--cfg-options', 'model.backbone.use_moppa=no'),
                    "MoPPASwinTransformer: model.backbone.use_moppa = 'no': it must be True "
                    'or False')


def test_unreachable_url_base_is_one_line(shapes_data, tmp_path):
    import socket
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(('127.0.0.1', 0))
        port = sock.getsockname()[1]
    cfg = tiny_detection_cfg(shapes_data, tmp_path / 'work', max_iters=1)
    url = f'http://127.0.0.1:{port}/swin_tiny_base.pth'
    cfg.model.backbone.init_cfg.checkpoint = url
    run = run_train(cfg, tmp_path, env=dict(child_env(), TORCH_HOME=str(tmp_path / 'torch')))
    assert_one_line(run, f"pre-trained checkpoint model.backbone.init_cfg.checkpoint = {url!r} "
                    'could not be downloaded')
    assert 'model.backbone.init_cfg.checkpoint=/path/to/file.pth' in run.stderr


def test_a_distributed_stop_exits_non_zero(shapes_data, tmp_path):
    """Two ranks under torchrun (gloo): the error comes at the model's build,
    after the process group is up; each rank prints its line and exits 1, and
    torchrun with it."""
    from tests.test_tools.resume import train
    cfg = tiny_detection_cfg(shapes_data, tmp_path / 'work', max_iters=1)
    cfg.model.backbone.moppa_cfg = dict(heat_parm='learned')
    run = train(dump_cfg(cfg, tmp_path / 'tiny.py'), tmp_path / 'work', processes=2)
    assert run.returncode == 1, run.stderr[-3000:]
    assert "train.py: model.backbone.moppa_cfg has unknown option(s) ['heat_parm']" in run.stderr
    assert 'moppa_config.py' not in run.stderr, run.stderr[-3000:]  # no frame of ours


def test_a_seg_head_of_another_class_count_is_one_line(tmp_path, monkeypatch):
    """MMSegmentation's heads are checked as mmdet's are (it was torch's bare
    IndexError at the first iteration): the segmentation demo, 5 classes."""
    pytest.importorskip('mmseg', reason='the seg extra (mmsegmentation) is not installed')
    from demo.ade_scenes import DEMO_SWIN, make_ade20k_scenes, make_mmseg_swin_checkpoint
    from preflight import load_config
    from preflight import check_config
    root = tmp_path / 'data' / 'ade_demo'
    make_ade20k_scenes(str(root), num_train=2, num_val=1)
    make_mmseg_swin_checkpoint(str(root / 'swin_demo_pretrained.pth'), **DEMO_SWIN)
    config = osp.join(REPO, 'configs/demo/moppa-swin-demo_upernet_scenes-ade20k-64x64.py')
    monkeypatch.chdir(tmp_path)  # the config reads data/ade_demo/
    check_config(load_config(config))  # as shipped: fine
    run = run_tool('train.py', config, '--cfg-options', 'model.decode_head.num_classes=4',
                   cwd=tmp_path)
    assert_one_line(run, "model.decode_head.num_classes = 4, but train_dataloader.dataset has "
                    "5 classes ('wall', 'building', 'sky', 'floor', 'tree'; "
                    'train_dataloader.dataset.metainfo.classes)')


CLS_DEMO = osp.join(REPO, 'configs/demo/moppa_vit-demo_mae-pre_vtab1k-eurosat.py')


@pytest.fixture(scope='module')
def cls_demo(tmp_path_factory):
    """A folder with what the classification demo config reads, as
    tools/quickstart.sh cls makes it: data/vtab_demo/ (the generated task and
    the converted base)."""
    from demo.vtab_task import make_mae_vit_checkpoint, make_vtab_task
    from model_converters.vit_to_mmpretrain import convert, save_backbone
    root = tmp_path_factory.mktemp('cls_demo')
    data = root / 'data' / 'vtab_demo'
    make_vtab_task(str(data))
    save_backbone(convert(make_mae_vit_checkpoint(str(data / 'mae.pth')), 'mae'),
                  str(data / 'vit_demo_mmpretrain.pth'))
    return root


@pytest.mark.parametrize('args', [('--amp', ),
                                  ('--cfg-options', 'optim_wrapper.type=AmpOptimWrapper',
                                   'optim_wrapper.dtype=bfloat16')])
def test_amp_without_a_gpu_is_one_line(cls_demo, tmp_path, args):
    """mmengine's AmpOptimWrapper asserts a GPU when the Runner builds it (a
    traceback, after the model); CUDA hidden, as on a CPU-only machine."""
    run = subprocess.run(
        [PYTHON, osp.join(REPO, 'tools/train.py'), CLS_DEMO, '--work-dir',
         str(tmp_path / 'work'), *args], cwd=cls_demo,
        env=dict(child_env(), CUDA_VISIBLE_DEVICES=''), capture_output=True, text=True,
        timeout=600)
    assert_one_line(run, "optim_wrapper.type = 'AmpOptimWrapper' (--amp, --cfg-options or "
                    "the config): mmengine's AmpOptimWrapper trains only on a GPU")
    assert 'torch.autocast' in run.stderr
    assert not (tmp_path / 'work').exists()  # stopped before the Runner


def test_an_adapter_checkpoint_given_as_the_base_is_one_line(cls_demo, tmp_path,
                                                             monkeypatch):
    """The classification demo's adapter-only checkpoint (as training saves it)
    given as the pre-trained base: named as what it is, with the base its
    record names, by the model's own load check (any tool)."""
    from mmengine.config import Config
    from mmengine.registry import DefaultScope
    from mmpretrain.registry import MODELS
    monkeypatch.chdir(cls_demo)  # the config reads data/vtab_demo/
    with DefaultScope.overwrite_default_scope('mmpretrain'):
        model = MODELS.build(Config.fromfile(CLS_DEMO).model)
    adapters = tmp_path / 'epoch_4.pth'
    torch.save({'state_dict': model.state_dict(), 'meta': {}}, adapters)
    run = run_tool('train.py', CLS_DEMO, '--work-dir', tmp_path / 'work', '--cfg-options',
                   f'model.backbone.init_cfg.checkpoint={adapters}', cwd=cls_demo)
    assert_one_line(run, f"pre-trained checkpoint model.backbone.init_cfg.checkpoint = "
                    f"'{adapters}': "
                    'MoPPAVisionTransformer: the checkpoint holds adapters and no '
                    'pre-trained weights: an adapter checkpoint, not a pre-trained base.')
    assert f"(recorded: '{cls_demo}/data/vtab_demo/vit_demo_mmpretrain.pth')" in run.stderr


def test_a_misspelt_key_in_cfg_options_is_one_line(shapes_data, tmp_path):
    """mmengine adds a key the config lacks, and nothing reads it: the run
    would train at the config's settings, exit 0. A key within a typo of one
    the config has stops; a new key far from every one is added."""
    from mmengine.config import Config
    from preflight import load_config
    cfg = tiny_detection_cfg(shapes_data, tmp_path / 'work', max_iters=1)
    run = run_train(cfg, tmp_path, '--cfg-options', 'optim_wraper.optimizer.lr=0.1')
    assert_one_line(run, "--cfg-options optim_wraper.optimizer.lr: the config has no key "
                    "'optim_wraper': did you mean 'optim_wrapper'?")
    config = Config(dict(val_dataloader=dict(batch_size=1))).dump(tmp_path / 'small.py')
    loaded = load_config(str(tmp_path / 'small.py'), cfg_options={
        'train_dataloader.batch_size': 2, 'custom_hooks': []})
    assert loaded.train_dataloader.batch_size == 2 and loaded.custom_hooks == [] and config is None


def test_a_distilled_deit_head_on_a_moppa_vit_is_one_line():
    """DeiTClsHead unpacks the class and distillation tokens of mmpretrain's
    DistilledVisionTransformer; on a MoPPA ViT it fails at the first step."""
    from mmengine.config import Config
    from preflight import check_config
    cfg = Config(dict(model=dict(
        type='ImageClassifier', backbone=dict(type='MoPPAVisionTransformer', arch='deit-tiny'),
        head=dict(type='DeiTClsHead', num_classes=10, in_channels=192))))
    with pytest.raises(MoPPAInputError, match="model.head.type = 'DeiTClsHead' reads the "
                       "distillation token .* keep model.backbone.type="
                       "'DistilledVisionTransformer'"):
        check_config(cfg)
    cfg.model.backbone.type = 'DistilledVisionTransformer'
    check_config(cfg)  # the upstream pair stays

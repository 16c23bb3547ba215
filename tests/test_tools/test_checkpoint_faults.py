"""Bad checkpoints stop before the first iteration, naming the file and what
to do: NaN / infinite weights or optimizer state (every path that loads
weights), trained tensors changed since the save (the record's digest, under
every tool), an adapter record that cannot be read, a release not converted
for the config, a missing ``--resume`` file.
Run on the classification demo (generated VTAB-1K task, MAE-format ViT)."""
import contextlib
import glob
import importlib.util
import os
import os.path as osp
import re

import pytest
import torch
from preflight import load_config  # tools/
from mmengine.runner import load_checkpoint

from demo.vtab_task import prepare_cls_demo
from model_converters.vit_to_mmpretrain import convert, save_backbone
from moppa_mm.models import read_adapter_record
from moppa_mm.models.backbones.adapter_params import is_adapter_key
from moppa_mm.models.backbones.adapter_record import encode_record
from moppa_mm.models.backbones.load_check import AdapterRecordMismatchError, PretrainedMismatchError
from moppa_mm.utils.checkpoints import CheckpointLoadError
from moppa_mm.utils.release_formats import SourceFormatError
from tests.conftest import REPO, child_env

CONFIG = osp.join(REPO, 'configs/demo/moppa_vit-demo_mae-pre_vtab1k-eurosat.py')
PRETRAINED = 'data/vtab_demo/vit_demo_mmpretrain.pth'  # the config's, relative
RAW_MAE = 'data/vtab_demo/mae_pretrain_vit_demo.pth'
INIT_CFG = 'model.backbone.init_cfg.checkpoint'


@pytest.fixture(scope='module')
def demo(tmp_path_factory):
    """The demo's task and checkpoints in a fresh folder (the config's paths
    are relative to it): the converted pre-trained ViT, a copy with one NaN,
    an adapter-only fine-tuned checkpoint (adapters + head) with one NaN in a
    MoPPA tensor, and the model's own adapter-only checkpoint (with its
    digest) whose head changed after the save, also with its digest removed."""
    root = tmp_path_factory.mktemp('cls_demo')
    paths = prepare_cls_demo(str(root / 'data/vtab_demo'))
    save_backbone(convert(paths['mae_checkpoint'], 'mae'), str(root / PRETRAINED), 'mae')

    pretrained = torch.load(root / PRETRAINED, weights_only=True)
    pretrained['state_dict']['backbone.layers.1.attn.qkv.bias'][5] = float('nan')
    torch.save(pretrained, root / 'nan_pretrained.pth')

    model = build_model(load_config(CONFIG))
    adapters = {k: v for k, v in model.state_dict().items()
                if not k.startswith('backbone.') or is_adapter_key(k[len('backbone.'):])}
    moppa_key = next(k for k in adapters if '.moppa.' in k)
    adapters[moppa_key] = adapters[moppa_key].clone()
    adapters[moppa_key].view(-1)[0] = float('nan')
    torch.save({'state_dict': adapters, 'meta': {'adapter_only': True}},
               root / 'nan_adapter.pth')
    state = model.state_dict()  # as every tool saves it: adapter-only, with the digest
    state['head.layers.head.weight'].view(-1)[:4] += 0.25  # a disk or copy error
    torch.save({'state_dict': state, 'meta': {}}, root / 'damaged_adapter.pth')
    record = read_adapter_record(state)
    del record['digest']  # the damage hidden by an edit
    state['backbone._extra_state'] = encode_record(record)
    torch.save({'state_dict': state, 'meta': {}}, root / 'digest_removed.pth')
    (root / 'linear_demo.py').write_text(LINEAR_DEMO)
    with chdir(root):  # the configs' paths are relative
        adapters = build_model(load_config(CONFIG)).state_dict()  # on the demo's base
        # the shipped linear-probe baseline at the demo's size: base and head, no adapters
        linear = build_model(load_config(str(root / 'linear_demo.py')))
        linear.init_weights()
    torch.save({'state_dict': adapters, 'meta': {}}, root / 'adapter.pth')
    torch.save({'state_dict': linear.state_dict(), 'meta': {}}, root / 'linear_probe.pth')
    return dict(root=root, moppa_key=moppa_key)


LINEAR = osp.join(REPO, 'configs/vtab1k/linear_vit-b-p16_in21k-augreg-pre_vtab1k-eurosat.py')
LINEAR_DEMO = f"""_base_ = '{LINEAR}'
model = dict(
    backbone=dict(arch=dict(_delete_=True, embed_dims=32, num_layers=2, num_heads=4,
                            feedforward_channels=64), frozen_stages=2,
                  img_size=32, patch_size=8, init_cfg=dict(checkpoint='{PRETRAINED}')),
    head=dict(in_channels=32))
"""


@contextlib.contextmanager
def chdir(path):
    previous = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(previous)


@pytest.fixture
def in_demo(demo, monkeypatch):
    monkeypatch.chdir(demo['root'])
    return demo


def run_tool(mode, argv):
    """``tools/{mode}.py``'s ``main`` on ``argv``, in this process."""
    path = osp.join(REPO, 'tools', f'{mode}.py')
    spec = importlib.util.spec_from_file_location(f'_tool_{mode}', path)
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    tool.main(argv)


def build_model(cfg):
    from mmengine.registry import init_default_scope
    from mmpretrain.registry import MODELS
    init_default_scope('mmpretrain')
    return MODELS.build(cfg.model)


def test_test_tool_refuses_nan_adapter_checkpoint(in_demo):
    with pytest.raises(CheckpointLoadError) as error:
        run_tool('test', [CONFIG, 'nan_adapter.pth', '--work-dir', 'work'])
    text = str(error.value)
    assert "to test (CHECKPOINT argument, load_from) = 'nan_adapter.pth'" in text, text
    assert f"in 1 tensor: state_dict.{in_demo['moppa_key']} (1 of " in text, text


@pytest.mark.parametrize('mode', ['train', 'test'])
def test_tools_refuse_nan_pretrained_checkpoint(in_demo, mode):
    args = [CONFIG, '--cfg-options', f'{INIT_CFG}=nan_pretrained.pth', '--work-dir', 'work']
    if mode == 'test':
        args.insert(1, PRETRAINED)  # any checkpoint: the backbone's build stops first
    with pytest.raises(CheckpointLoadError,
                       match=rf"{INIT_CFG} = 'nan_pretrained.pth': MoPPAVisionTransformer: the "
                             r"checkpoint holds NaN or infinite values in 1 tensor: "
                             r"layers\.1\.attn\.qkv\.bias \(1 of 96\)"):
        run_tool(mode, args)


@pytest.mark.parametrize('resume', ['given', 'latest'])
def test_resume_refuses_non_finite_optimizer_state(in_demo, tmp_path, resume):
    checkpoint = torch.load(PRETRAINED, weights_only=True)
    checkpoint['optimizer'] = {
        'state': {0: {'step': torch.tensor(4.0), 'exp_avg_sq': torch.full((3, ), float('inf'))}},
        'param_groups': [{'lr': 1e-3, 'params': [0]}]}
    path = str(tmp_path / 'epoch_3.pth')
    torch.save(checkpoint, path)
    if resume == 'given':
        args, how = ['--resume', path], r'\(--resume, load_from\)'
    else:  # --resume alone: the latest checkpoint of the work dir
        (tmp_path / 'last_checkpoint').write_text(path)
        args, how = ['--resume'], r'\(--resume: the latest in work_dir\)'
    with pytest.raises(CheckpointLoadError,
                       match=rf"to resume from {how} = .*epoch_3\.pth' .*"
                             r"optimizer\.state\.0\.exp_avg_sq \(3 of 3\)"):
        run_tool('train', [CONFIG, *args, '--work-dir', str(tmp_path)])


def test_missing_resume_checkpoint_names_resume(in_demo):
    with pytest.raises(FileNotFoundError,
                       match=r"to resume from \(--resume, load_from\) = "
                             r"'work_dirs/nope/epoch_3.pth' not found"):
        run_tool('train', [CONFIG, '--resume', 'work_dirs/nope/epoch_3.pth'])


def test_backbone_refuses_nan_from_loaders_beside_our_tools(in_demo):
    """mmdet's and mmpretrain's own tools and APIs load through mmengine, not
    through our tools: the MoPPA backbone's state-dict check stops them."""
    cfg = load_config(CONFIG, cfg_options={INIT_CFG: 'nan_pretrained.pth'})
    with pytest.raises(CheckpointLoadError,
                       match=r"'nan_pretrained.pth': MoPPAVisionTransformer: the checkpoint "
                       r'holds NaN .*layers\.1\.attn\.qkv\.bias'):
        build_model(cfg).init_weights()  # mmengine's Pretrained init
    model = build_model(load_config(CONFIG))
    moppa_key = in_demo['moppa_key'][len('backbone.'):]
    with pytest.raises(CheckpointLoadError, match=rf'{moppa_key} \(1 of '):
        load_checkpoint(model, 'nan_adapter.pth')  # what the Runner calls


DAMAGED = (r"MoPPAVisionTransformer: the checkpoint is damaged: its tensors \(the adapters, "
           r'the tensors around the backbone and any base it carries\) do not match the digest')


@pytest.mark.parametrize('how', ['test', 'load_from', 'resume'])
def test_our_tools_refuse_damaged_trained_tensors(in_demo, how):
    args = {'test': ['test', [CONFIG, 'damaged_adapter.pth']],
            'load_from': ['train', [CONFIG, '--cfg-options', 'load_from=damaged_adapter.pth']],
            'resume': ['train', [CONFIG, '--resume', 'damaged_adapter.pth']]}[how]
    with pytest.raises(CheckpointLoadError, match=DAMAGED):
        run_tool(args[0], args[1] + ['--work-dir', f'work_{how}'])


def mmpretrain_test(demo, checkpoint: str, work_dir: str):
    """mmpretrain's own tools/test.py on the demo config, in a process of its own."""
    import subprocess
    import sys
    tool = osp.join(osp.dirname(__import__('mmpretrain').__file__), '.mim/tools/test.py')
    return subprocess.run([sys.executable, tool, CONFIG, checkpoint, '--work-dir', work_dir],
                          cwd=demo['root'], env=child_env(), capture_output=True, text=True,
                          timeout=600)


NO_DIGEST = (r"MoPPAVisionTransformer: the checkpoint: its adapter record \(key "
             r"'backbone._extra_state'\) has no digest .* edited after the save")


@pytest.mark.parametrize('checkpoint, stop', [('damaged_adapter.pth', DAMAGED),
                                              ('digest_removed.pth', NO_DIGEST)])
def test_mmpretrains_own_test_tool_refuses_damaged_trained_tensors(in_demo, checkpoint, stop):
    """Once: exit 0, top-1 41.7 instead of 33.3, also once its digest was
    removed. The model's own check stops mmpretrain's tools/test.py too."""
    result = mmpretrain_test(in_demo, checkpoint, 'work_upstream')
    assert result.returncode != 0, result.stdout[-2000:]
    assert re.search(stop, result.stderr), result.stderr[-3000:]


LINEAR_PROBE = (r'MoPPAVisionTransformer: the checkpoint holds \d+ backbone tensors and 2 '
                r'around it \(head.layers.head.bias, head.layers.head.weight\) but none of the '
                r'\d+ adapter tensors of this model: the checkpoint of another model, such as '
                r'a linear probe or a full fine-tuning of the plain backbone')


def test_a_linear_probe_checkpoint_stops_every_test_tool(in_demo):
    """The shipped linear-probe baseline's checkpoint (base and head, no
    adapters) tested with the MoPPA config: once top-1 30.0, exit 0 and no
    warning under our and mmpretrain's tools/test.py, and a bare KeyError
    in the adapter bank. Each stops, naming what it lacks and what it is."""
    from moppa_mm import AdapterBank
    with pytest.raises(AdapterRecordMismatchError,
                       match=LINEAR_PROBE + '.*strict_adapter_record=False'):
        run_tool('test', [CONFIG, 'linear_probe.pth', '--work-dir', 'work_linear'])
    result = mmpretrain_test(in_demo, 'linear_probe.pth', 'work_linear_upstream')
    assert result.returncode != 0, result.stdout[-2000:]
    assert re.search(LINEAR_PROBE, result.stderr), result.stderr[-3000:]
    assert 'accuracy/top1' not in result.stdout
    with pytest.raises(AdapterRecordMismatchError,
                       match=r"AdapterBank: task 'linear' \(linear_probe.pth\) holds \d+ "
                       r'backbone tensors .* but none of the \d+ adapter tensors'):
        AdapterBank.from_config(CONFIG).add('linear', 'linear_probe.pth')


def test_a_swin_release_given_to_the_vit_config_says_so(in_demo, shapes_data):
    """Once the swin converter was suggested, whose output only met a second
    stop: the file is a Swin release, and the config builds a ViT."""
    swin = shapes_data['pretrained']  # an official-format Swin release
    message = (rf"{INIT_CFG} = '{swin}' has no 'backbone.' keys .*: it is an official Swin "
               r'release .*, a Swin release, and this config builds a MoPPAVisionTransformer: '
               r'give it a pre-trained ViT')
    with pytest.raises(SourceFormatError, match=message):  # our tools: the backbone's build
        run_tool('train', [CONFIG, '--cfg-options', f'{INIT_CFG}={swin}', '--work-dir', 'w'])
    with pytest.raises(SourceFormatError, match=message):  # mmpretrain's: at the build
        build_model(load_config(CONFIG, cfg_options={INIT_CFG: swin}))


def test_an_adapter_checkpoint_given_as_the_base_says_so(in_demo):
    """Once: "names 'adapter.pth', which was not loaded (missing when the model
    was built?)" of a file that is there."""
    message = (rf"{INIT_CFG} = 'adapter.pth': MoPPAVisionTransformer: the checkpoint holds "
               r'adapters and no pre-trained weights: an adapter checkpoint, not a pre-trained '
               r'base\. Give it to the whole model \(the checkpoint of tools/test.py, '
               r'load_from, .*\) with the base it was trained on as '
               r"model.backbone.init_cfg.checkpoint \(recorded: '.*vit_demo_mmpretrain.pth'\)"
               r'\.$')
    with pytest.raises(PretrainedMismatchError, match=message):
        run_tool('train', [CONFIG, '--cfg-options', f'{INIT_CFG}=adapter.pth',
                           '--work-dir', 'work'])


def test_a_detector_checkpoint_given_as_the_swin_base_says_what_it_is(in_demo, shapes_data):
    """mmdet's Swin init strips 'backbone.' and the demo's ``convert_weights``
    adds one back: the keys come one level down. Once "none of this model's
    104 adapters: another model or config?" of the model's own checkpoint."""
    from mmdet.registry import MODELS
    from mmengine.registry import init_default_scope

    from tests.conftest import tiny_detection_cfg
    cfg = tiny_detection_cfg(shapes_data, str(in_demo['root'] / 'det'))
    init_default_scope('mmdet')
    torch.save({'state_dict': MODELS.build(cfg.model).state_dict(), 'meta': {}}, 'det.pth')
    for path, message in (('det.pth', r"holds adapters and no pre-trained weights: an adapter "
                                      r"checkpoint, not a pre-trained base\..*\(recorded: "),
                          ('adapter.pth', r"is a checkpoint of MMPretrain's MoPPAVisionTransformer"
                                          r" \(its adapter record says so\); this config builds "
                                          r"MMDetection's MoPPASwinTransformer$")):
        cfg.model.backbone.init_cfg.checkpoint = path
        with pytest.raises(PretrainedMismatchError, match=message):
            MODELS.build(cfg.model)


def test_test_tool_stops_on_a_record_of_another_format_and_the_override_tests(in_demo):
    """A user's ``tools/test.py`` on an adapter checkpoint whose record is of
    another format version (once: loaded unchecked, exit 0): it stops naming
    the key and the override; with the override on the command line it tests,
    and the log says what was not checked. mmengine's loader (the Runner's)
    meets the same check."""
    model = build_model(load_config(CONFIG))  # the base loads at build
    state = model.state_dict()
    record = read_adapter_record(state)
    assert record['base']['fingerprint']  # an adapter-only checkpoint
    state['backbone._extra_state'] = encode_record({**record, 'format': 'moppa_mm.adapter/0'})
    torch.save({'state_dict': state}, 'other_format.pth')
    problem = (r"MoPPAVisionTransformer: the checkpoint: its adapter record \(key "
               r"'backbone._extra_state'\) has format 'moppa_mm.adapter/0'; this version "
               r"of moppa_mm reads 'moppa_mm.adapter/1'")
    with pytest.raises(AdapterRecordMismatchError,
                       match=rf'{problem}.*strict_adapter_record=False'):
        run_tool('test', [CONFIG, 'other_format.pth', '--work-dir', 'refused'])
    with pytest.raises(AdapterRecordMismatchError, match=problem):
        load_checkpoint(build_model(load_config(CONFIG)), 'other_format.pth')
    run_tool('test', [CONFIG, 'other_format.pth', '--work-dir', 'tested', '--cfg-options',
                      'model.backbone.strict_adapter_record=False'])
    logs = glob.glob('tested/*/*.log')
    assert len(logs) == 1, logs
    log = open(logs[0]).read()
    assert re.search(rf'{problem}.*\(strict_adapter_record=False: loading anyway\)', log)
    assert 'accuracy/top1' in log


def test_publish_refuses_nan_checkpoint(in_demo):
    publish_model = load_tool('tools/model_converters/publish_model.py')
    with pytest.raises(CheckpointLoadError, match="publish 'nan_adapter.pth'"):
        publish_model.publish('nan_adapter.pth', 'published.pth')
    assert not osp.exists('published.pth') and not osp.exists('published.tmp.pth')


@pytest.mark.parametrize('mode', ['train', 'test'])
def test_unconverted_release_names_the_converter_command(in_demo, mode):
    command = (f'python tools/model_converters/vit_to_mmpretrain.py mae {RAW_MAE} '
               f'{RAW_MAE[:-len(".pth")]}_mmpretrain.pth')
    args = [CONFIG, '--cfg-options', f'{INIT_CFG}={RAW_MAE}', '--work-dir', 'work']
    if mode == 'test':
        args.insert(1, 'adapter.pth')  # it loads; the base stops the model's build
    with pytest.raises(SourceFormatError) as error:  # our tools: the backbone's build
        run_tool(mode, args)
    text = str(error.value)
    assert f"{INIT_CFG} = '{RAW_MAE}' has no 'backbone.' keys" in text, text
    assert 'timm / MAE ViT checkpoint' in text and command in text, text
    # mmpretrain's own tools: the error of mmengine's Pretrained init, explained
    cfg = load_config(CONFIG, cfg_options={INIT_CFG: RAW_MAE})
    with pytest.raises(SourceFormatError, match='timm / MAE ViT checkpoint') as error:
        build_model(cfg).init_weights()
    assert command in str(error.value)
    # the converted file passes
    build_model(load_config(CONFIG)).init_weights()


def test_jax_npz_as_pretrained_names_the_jax_converter(in_demo, tmp_path):
    import numpy as np
    npz = str(tmp_path / 'ViT-B_16.npz')
    np.savez(npz, cls=np.zeros((1, 1, 32), np.float32))
    with pytest.raises(CheckpointLoadError,
                       match=rf"{INIT_CFG} = '{npz}' is a NumPy \.npz archive, not a PyTorch "
                             rf"checkpoint .*vit_to_mmpretrain.py jax {npz} DST.pth"):
        run_tool('train', [CONFIG, '--cfg-options', f'{INIT_CFG}={npz}'])


def load_tool(relative_path):
    spec = importlib.util.spec_from_file_location(
        osp.splitext(osp.basename(relative_path))[0], osp.join(REPO, relative_path))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_visualize_tool_refuses_nan_checkpoint(in_demo, monkeypatch):
    visualize = load_tool('tools/analysis/visualize_moppa.py')
    monkeypatch.setattr('sys.argv', ['visualize_moppa.py', CONFIG, 'nan_adapter.pth',
                                     '--out-dir', 'maps'])
    with pytest.raises(CheckpointLoadError, match="'nan_adapter.pth' holds NaN"):
        visualize.main()


def test_detector_refuses_nan_official_swin_release(shapes_data, tmp_path):
    """The detection demo's pre-trained file is an official Swin release, which
    mmdet's Swin converts on the fly: NaN there stops mmdet's own loading path
    (its ``init_weights``, run when the backbone is built, under every tool)
    with the file named."""
    from mmdet.registry import MODELS
    from mmengine.registry import init_default_scope

    from tests.conftest import tiny_detection_cfg
    release = torch.load(shapes_data['pretrained'], weights_only=True)
    key = next(k for k in release['model'] if k.endswith('attn.qkv.weight'))
    release['model'][key][0, 0] = float('inf')
    nan_release = str(tmp_path / 'swin_release.pth')
    torch.save(release, nan_release)
    cfg = tiny_detection_cfg(shapes_data, tmp_path / 'work')
    cfg.model.backbone.init_cfg.checkpoint = nan_release
    init_default_scope('mmdet')
    with pytest.raises(CheckpointLoadError, match=rf"'{nan_release}': MoPPASwinTransformer: "
                       'the checkpoint holds NaN'):
        MODELS.build(cfg.model)

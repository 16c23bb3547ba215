"""AdapterBank: one base loaded once, the adapters and heads of many tasks
switched by name, on real mmpretrain classifiers and an mmdet detector. Each
task's outputs equal those of its checkpoint loaded the usual way, and no base
tensor is ever written."""
import copy
import os

import pytest
import torch
from mmengine.config import Config
from mmengine.runner.checkpoint import load_checkpoint

from moppa_mm import AdapterBank
from moppa_mm.models import full_state_dict
from moppa_mm.models.backbones.adapter_params import is_adapter_key
from moppa_mm.models.backbones.load_check import AdapterRecordMismatchError, PretrainedMismatchError
from moppa_mm.utils.checkpoints import CheckpointLoadError
from tests.test_models.test_adapter_record import (build, classifier_cfg,  # noqa: F401
                                                   detector, trained_classifier)

IMAGE = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))


def task_cfg(pretrained, num_classes, **backbone):
    cfg = classifier_cfg(pretrained, **backbone)
    cfg['head']['num_classes'] = num_classes
    return Config(dict(model=cfg, data_preprocessor=dict(num_classes=num_classes),
                       default_scope='mmpretrain'))


def train_task(cfg, path, seed):
    """A checkpoint of ``cfg``'s model 'trained' on its base: adapters and
    head moved off their init; saved adapter-only, as every tool saves it."""
    torch.manual_seed(seed)
    model = build(cfg.model)
    model.init_weights()
    with torch.no_grad():
        for param in model.parameters():
            if param.requires_grad:
                param.add_(0.05 * torch.randn_like(param))
    torch.save({'state_dict': model.state_dict()}, str(path))
    return model.eval()


def outputs(model):
    with torch.no_grad():
        return model(IMAGE, mode='tensor')


@pytest.fixture(scope='module')
def tasks(trained_classifier, tmp_path_factory):  # noqa: F811
    """Three tasks on the fixture's base: 5 classes (the bank model's head),
    3 and 7 classes (their own configs)."""
    root = tmp_path_factory.mktemp('bank')
    pretrained = trained_classifier['pretrained']
    found = {}
    for seed, (name, classes) in enumerate([('five', 5), ('three', 3), ('seven', 7)]):
        cfg = task_cfg(pretrained, classes)
        path = root / f'{name}.pth'
        found[name] = dict(cfg=cfg, checkpoint=str(path), model=train_task(cfg, path, seed))
    return found


def base_state(bank):
    """(data_ptr, _version) of every base tensor of the bank's backbone."""
    state = bank.backbone.state_dict(keep_vars=True)  # the backbone's own: whole
    return {k: (v.data_ptr(), v._version) for k, v in state.items()
            if not is_adapter_key(k) and not k.endswith('_extra_state')}


def test_switching_tasks_gives_their_outputs_and_never_touches_the_base(tasks):
    bank = AdapterBank.from_config(tasks['five']['cfg'])
    before = base_state(bank)
    assert len(before) > 10
    adapters = [p for n, p in bank.model.backbone.named_parameters() if p.requires_grad]
    bank.add('five', tasks['five']['checkpoint'])  # the bank model's own head shape
    bank.add('three', tasks['three']['checkpoint'], cfg=tasks['three']['cfg'])
    bank.add('seven', tasks['seven']['checkpoint'], cfg=tasks['seven']['cfg'])
    assert bank.names() == ['five', 'three', 'seven'] and bank.active is None
    for name in ['three', 'five', 'seven', 'seven', 'five', 'three'] * 4:
        model = bank.use(name)
        assert model is bank.model and bank.active == name
        expected = outputs(tasks[name]['model'])
        torch.testing.assert_close(outputs(model), expected, rtol=0, atol=0)
        assert model.head.num_classes == expected.shape[1]
        assert model.data_preprocessor.num_classes == expected.shape[1]
    assert base_state(bank) == before  # neither written nor replaced
    # the model's adapter parameters are the same objects, written in place
    assert adapters == [p for n, p in bank.model.backbone.named_parameters()
                        if p.requires_grad]
    # the model saves as the task's checkpoint
    state = bank.model.state_dict()
    saved = torch.load(tasks['three']['checkpoint'], weights_only=True)['state_dict']
    assert state.keys() == saved.keys()
    for key in saved:
        torch.testing.assert_close(state[key], saved[key], rtol=0, atol=0)


def test_the_base_is_read_once(tasks, tmp_path):
    """After the bank is built its base file may even be gone: adding and
    switching read none of it (the usual load restores the base from it)."""
    import shutil
    pretrained = str(tmp_path / 'base.pth')
    shutil.copy(tasks['five']['cfg'].model.backbone.init_cfg.checkpoint, pretrained)
    cfg = copy.deepcopy(tasks['five']['cfg'])
    cfg.model.backbone.init_cfg.checkpoint = pretrained
    model = build(cfg.model)
    model.init_weights()
    bank = AdapterBank(model.eval())
    os.remove(pretrained)
    for name, task in tasks.items():
        bank.add(name, task['checkpoint'], cfg=task['cfg'])
        torch.testing.assert_close(outputs(bank.use(name)), outputs(task['model']),
                                   rtol=0, atol=0)


def test_names_and_memory(tasks):
    bank = AdapterBank.from_config(tasks['five']['cfg'])
    bank.add('five', tasks['five']['checkpoint'])
    bank.add('three', tasks['three']['checkpoint'], cfg=tasks['three']['cfg'])
    with pytest.raises(KeyError, match=r"no task 'dtd' in the adapter bank; it holds: "
                       r"'five', 'three'"):
        bank.use('dtd')
    with pytest.raises(ValueError, match="task 'five' is in the adapter bank already"):
        bank.add('five', tasks['five']['checkpoint'])
    trained = tasks['three']['model']
    adapters = sum(p.numel() for n, p in trained.backbone.named_parameters()
                   if p.requires_grad)
    head = sum(p.numel() for p in trained.head.parameters())
    assert bank.task_bytes('three') == 4 * (adapters + head)
    base = sum(p.numel() for n, p in trained.backbone.named_parameters()
               if not p.requires_grad)
    assert bank.base_bytes() == 4 * base
    bank.use('three')
    bank.remove('three')
    assert bank.names() == ['five'] and bank.active is None
    with pytest.raises(KeyError, match="it holds: 'five'"):
        bank.remove('three')


def test_a_head_of_another_size_needs_the_tasks_config(tasks):
    bank = AdapterBank.from_config(tasks['five']['cfg'])
    with pytest.raises(PretrainedMismatchError,
                       match=r"(?s)task 'three' .*head.layers.head.weight: \(3, 32\) in the "
                       r'checkpoint, \(5, 32\) in the model.*build the model from its config'):
        bank.add('three', tasks['three']['checkpoint'])
    assert bank.names() == []


def test_options_that_differ_are_named(tasks):
    bank = AdapterBank.from_config(task_cfg(
        tasks['five']['cfg'].model.backbone.init_cfg.checkpoint, 5,
        moppa_cfg=dict(eta=1e-2)))
    with pytest.raises(AdapterRecordMismatchError,
                       match=r"(?s)task 'five' \(.*five.pth\) was built with other options.*"
                       r'moppa_cfg.eta: .* in the checkpoint, 0.01 in the model'):
        bank.add('five', tasks['five']['checkpoint'])
    # a task's config whose backbone differs from the bank's
    cfg = copy.deepcopy(tasks['three']['cfg'])
    cfg.model.backbone.drop_path_rate = 0.1
    bank = AdapterBank.from_config(tasks['five']['cfg'])
    with pytest.raises(AdapterRecordMismatchError,
                       match=r"model.backbone.drop_path_rate: 0.1 in the task's config, "
                       r"'\(unset\)' in the bank's"):
        bank.add('three', tasks['three']['checkpoint'], cfg=cfg)


def test_another_base_is_refused(tasks, tmp_path):
    pretrained = tasks['five']['cfg'].model.backbone.init_cfg.checkpoint
    other = str(tmp_path / 'other_base.pth')
    state = torch.load(pretrained, weights_only=True)
    state['state_dict']['backbone.layers.0.ln1.weight'] += 1
    torch.save(state, other)
    bank = AdapterBank.from_config(task_cfg(other, 5))
    with pytest.raises(AdapterRecordMismatchError,
                       match=r"(?s)task 'five' .*trained on the pre-trained base "
                       r"'.*vit_base.pth' \(fingerprint [0-9a-f]{32}; .*but the model's base is "
                       r"'.*other_base.pth' \(fingerprint [0-9a-f]{32}\)"):
        bank.add('five', tasks['five']['checkpoint'])
    # a self-contained checkpoint: its base tensors are compared with the bank's
    model = tasks['five']['model']
    full = {'state_dict': full_state_dict(model)}
    with pytest.raises(AdapterRecordMismatchError,
                       match=r"holds \d+ base tensors; 1 differ from the bank's base "
                       r'\(e.g. layers.0.ln1.weight\)'):
        bank.add('five', full)
    bank = AdapterBank.from_config(tasks['five']['cfg'])
    bank.add('five', full)  # the bank's base: only its adapters and head are kept
    assert bank.task_bytes('five') < bank.base_bytes() / 10
    torch.testing.assert_close(outputs(bank.use('five')), outputs(model), rtol=0, atol=0)


def test_non_finite_and_foreign_checkpoints_are_refused(tasks, tmp_path):
    bank = AdapterBank.from_config(tasks['five']['cfg'])
    checkpoint = torch.load(tasks['five']['checkpoint'], weights_only=True)
    checkpoint['state_dict']['backbone.layers.1.moppa.channel_maps'][1, 0] = float('nan')
    path = str(tmp_path / 'nan.pth')
    torch.save(checkpoint, path)
    with pytest.raises(CheckpointLoadError, match=r"task 'nan' checkpoint '.*nan.pth' "
                       r'holds NaN.*backbone.layers.1.moppa.channel_maps'):
        bank.add('nan', path)
    with pytest.raises(CheckpointLoadError, match=r"task 'nan' \(<state dict>\)"):
        bank.add('nan', checkpoint)
    checkpoint = torch.load(tasks['five']['checkpoint'], weights_only=True)
    del checkpoint['state_dict']['backbone._extra_state']
    with pytest.raises(AdapterRecordMismatchError, match=r"task 'old' .*has no adapter record"):
        bank.add('old', checkpoint)
    assert bank.names() == []


def test_a_model_without_a_moppa_backbone_is_refused():
    cfg = classifier_cfg()
    cfg['backbone']['type'] = 'VisionTransformer'
    with pytest.raises(TypeError, match='one MoPPA backbone among its children; '
                       'ImageClassifier has 0'):
        AdapterBank(build(cfg))


def test_detector_tasks_switch_and_match_the_usual_load(detector, tmp_path):  # noqa: F811
    """Two 'trained' tasks of the demo Cascade Mask R-CNN: after each switch
    the whole state equals that of the task's checkpoint loaded the usual way."""
    cfg = Config(dict(model=detector['cfg'].model, default_scope='mmdet'))
    paths = []
    for seed in range(2):
        path = str(tmp_path / f'task{seed}.pth')
        train_task(cfg, path, seed)
        paths.append(path)
    bank = AdapterBank.from_config(cfg)
    before = base_state(bank)
    for seed, path in enumerate(paths):
        bank.add(f'task{seed}', path)
    for seed in [1, 0, 1]:
        model = bank.use(f'task{seed}')
        usual = build(cfg.model, scope='mmdet')
        load_checkpoint(usual, paths[seed], map_location='cpu')
        ours, theirs = full_state_dict(model), full_state_dict(usual)
        assert ours.keys() == theirs.keys()
        for key in ours:
            torch.testing.assert_close(ours[key], theirs[key], rtol=0, atol=0)
    assert base_state(bank) == before


def test_a_runner_on_the_switched_model(tasks, tmp_path):
    bank = AdapterBank.from_config(tasks['five']['cfg'])
    bank.add('three', tasks['three']['checkpoint'], cfg=tasks['three']['cfg'])
    cfg = copy.deepcopy(tasks['three']['cfg'])
    cfg.work_dir = str(tmp_path)
    runner = bank.runner('three', cfg)
    assert runner.model is bank.model and bank.active == 'three'
    assert runner.model.head.num_classes == 3
    cfg.load_from = tasks['three']['checkpoint']
    with pytest.raises(ValueError, match=r"cfg.load_from = '.*three.pth': the Runner would "
                       r"load it into the bank's model, over task 'three'"):
        bank.runner('three', cfg)


def image_folders(root, classes, per_class=2):
    """A folder per class of random 32 px images: mmpretrain's CustomDataset
    without an annotation file."""
    import cv2
    import numpy as np
    rng = np.random.default_rng(0)
    for label in range(classes):
        os.makedirs(root / f'class{label}')
        for index in range(per_class):
            image = rng.integers(0, 255, (32, 32, 3)).astype(np.uint8)
            cv2.imwrite(str(root / f'class{label}' / f'{index}.png'), image)
    return str(root)


def training_cfg(task, data_root, work_dir, iters=3):
    cfg = copy.deepcopy(task['cfg'])
    cfg.merge_from_dict(dict(
        work_dir=str(work_dir),
        train_dataloader=dict(
            batch_size=2, num_workers=0,
            sampler=dict(type='DefaultSampler', shuffle=False),
            dataset=dict(type='CustomDataset', data_root=data_root,
                         pipeline=[dict(type='LoadImageFromFile'), dict(type='PackInputs')])),
        train_cfg=dict(by_epoch=False, max_iters=iters),
        optim_wrapper=dict(optimizer=dict(type='SGD', lr=0.5)),
        default_hooks=dict(checkpoint=dict(type='CheckpointHook', by_epoch=False,
                                           interval=iters),
                           logger=dict(type='LoggerHook', interval=1))))
    return cfg


def state(model):
    return {k: v.clone() for k, v in model.state_dict().items()}


def assert_state_dict_equal(got, expected):
    assert got.keys() == expected.keys()
    for key in expected:
        torch.testing.assert_close(got[key], expected[key], rtol=0, atol=0, msg=key)


def test_a_runner_trains_the_task_as_a_whole(tasks, tmp_path):
    """``bank.runner(name, cfg).train()`` starts from the task's weights (not
    mmengine's init) and leaves the bank's task the trained one, head and
    adapters: after switching away and back the model equals the checkpoint
    the Runner saved; the other task is untouched and the base unwritten."""
    from mmengine.hooks import Hook

    class FirstIteration(Hook):
        def before_train_iter(self, runner, batch_idx, data_batch=None):
            if runner.iter == 0:
                self.start = state(runner.model)

    bank = AdapterBank.from_config(tasks['five']['cfg'])
    bank.add('five', tasks['five']['checkpoint'])
    bank.add('three', tasks['three']['checkpoint'], cfg=tasks['three']['cfg'])
    before = base_state(bank)
    cfg = training_cfg(tasks['three'], image_folders(tmp_path / 'data', 3), tmp_path / 'work')
    runner = bank.runner('three', cfg)
    probe = FirstIteration()
    runner.register_hook(probe)
    bank.use('five')  # the Runner is task three's: it switches back
    runner.train()
    assert bank.active == 'three' and bank.model.head.num_classes == 3
    untrained = torch.load(tasks['three']['checkpoint'], weights_only=True)['state_dict']
    assert_state_dict_equal(probe.start, untrained)  # trained from the task's weights
    saved = torch.load(str(tmp_path / 'work' / 'iter_3.pth'),
                       weights_only=True)['state_dict']
    moved = {k for k in saved if not torch.equal(saved[k], untrained[k])}
    assert 'head.layers.head.weight' in moved
    assert any(is_adapter_key(k[len('backbone.'):]) for k in moved)
    for name in ['five', 'three', 'five']:  # five: its checkpoint's outputs
        model = bank.use(name)
        if name == 'five':
            torch.testing.assert_close(outputs(model.eval()), outputs(tasks['five']['model']),
                                       rtol=0, atol=0)
    assert_state_dict_equal(bank.use('three').state_dict(), saved)
    assert_state_dict_equal(bank.use('three').state_dict(), saved)  # use twice: no revert
    assert base_state(bank) == before


def test_a_fine_tuning_outside_the_bank_is_the_tasks(tasks):
    """A training step on ``bank.use(name)`` by hand: after a switch away and
    back the task holds the stepped adapters and head together."""
    bank = AdapterBank.from_config(tasks['five']['cfg'])
    bank.add('five', tasks['five']['checkpoint'])
    bank.add('seven', tasks['seven']['checkpoint'], cfg=tasks['seven']['cfg'])
    model = bank.use('seven').train()
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.5)
    loss = model(IMAGE, mode='tensor').square().mean()
    loss.backward()
    optimizer.step()
    stepped = state(model)
    untrained = torch.load(tasks['seven']['checkpoint'], weights_only=True)['state_dict']
    moved = {k for k in stepped if not torch.equal(stepped[k], untrained[k])}
    assert 'head.layers.head.weight' in moved
    assert any(is_adapter_key(k[len('backbone.'):]) for k in moved)
    bank.use('five')
    assert_state_dict_equal(bank.model.state_dict(),
                            torch.load(tasks['five']['checkpoint'],
                                       weights_only=True)['state_dict'])
    assert_state_dict_equal(bank.use('seven').state_dict(), stepped)


def test_a_runner_refuses_what_would_overwrite_the_task(tasks, tmp_path):
    bank = AdapterBank.from_config(tasks['five']['cfg'])
    bank.add('three', tasks['three']['checkpoint'], cfg=tasks['three']['cfg'])
    cfg = training_cfg(tasks['three'], image_folders(tmp_path / 'data', 3), tmp_path)
    cfg.resume = True
    with pytest.raises(ValueError, match=r"cfg.resume = True: the Runner would load the "
                       r"work_dir's last checkpoint into the bank's model, over task 'three'"):
        bank.runner('three', cfg)
    cfg.resume = False
    bank.backbone.layers[0].ln1.weight.requires_grad_(True)  # an unfrozen base
    with pytest.raises(ValueError, match=r"training task 'three' would change the base every "
                       r'task shares: 1 base parameters are trainable: '
                       r'backbone.layers.0.ln1.weight'):
        bank.runner('three', cfg).train()

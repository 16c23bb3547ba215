"""A checkpoint says how its adapter was built, and loading stops on any
disagreement, naming the key, both values and the fix: on a real mmpretrain
classifier and a real mmdet detector, built from configs as the tools build
them. The base comes from the config when the model is built; a load only
compares the checkpoint's record (options, base fingerprint) with the model,
and never opens the base file (or URL) the record names."""
import copy
import json
import os
import re
import socket

import pytest
import torch
from mmengine.config import Config
from mmengine.registry import init_default_scope
from mmengine.runner.checkpoint import load_checkpoint

from moppa_mm.models import MoPPAConfig, full_state_dict, read_adapter_record
from moppa_mm.models.backbones.adapter_record import MAX_RECORD_BYTES, encode_record
from moppa_mm.models.backbones.load_check import AdapterRecordMismatchError, PretrainedMismatchError
from moppa_mm.utils.errors import InputValueError
from tests.conftest import DEMO_CONFIG, logged_messages

ARCH = dict(embed_dims=32, num_layers=2, num_heads=4, feedforward_channels=64)


def classifier_cfg(pretrained=None, **backbone):
    cfg = dict(
        type='ImageClassifier',
        backbone=dict(type='MoPPAVisionTransformer', arch=ARCH, img_size=32,
                      patch_size=8, out_type='cls_token', **backbone),
        head=dict(type='VisionTransformerClsHead', num_classes=5, in_channels=32,
                  loss=dict(type='CrossEntropyLoss')))
    if pretrained:
        cfg['backbone']['init_cfg'] = dict(type='Pretrained', checkpoint=pretrained,
                                           prefix='backbone.')
    return cfg


def build(cfg, scope='mmpretrain'):
    from mmengine.registry import MODELS
    init_default_scope(scope)
    return MODELS.build(copy.deepcopy(cfg))


def with_recorded_base(checkpoint_path, base, tmp_path):
    """A copy of the adapter checkpoint whose record names ``base`` as the
    pre-trained file it was trained on."""
    checkpoint = torch.load(checkpoint_path, weights_only=True)
    record = read_adapter_record(checkpoint)
    record['base']['checkpoint'] = str(base)
    checkpoint['state_dict']['backbone._extra_state'] = encode_record(record)
    path = str(tmp_path / 'adapter.pth')
    torch.save(checkpoint, path)
    return path


@pytest.fixture(scope='module')
def trained_classifier(tmp_path_factory):
    """A pre-trained base file, and the adapter-only checkpoint of a
    classifier 'trained' on it (its adapters and head moved off their init)."""
    root = tmp_path_factory.mktemp('record')
    torch.manual_seed(0)
    base = build(classifier_cfg())
    pretrained = str(root / 'vit_base.pth')
    state = {k: v for k, v in full_state_dict(base).items()
             if k.startswith('backbone.') and '.moppa.' not in k
             and 'ssf_' not in k and not k.endswith('_extra_state')}
    torch.save({'state_dict': state}, pretrained)
    model = build(classifier_cfg(pretrained))
    model.init_weights()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.requires_grad:
                param.add_(0.01 * torch.randn_like(param))
    checkpoint = str(root / 'adapter.pth')
    torch.save({'state_dict': model.state_dict()}, checkpoint)
    return dict(pretrained=pretrained, checkpoint=checkpoint, model=model, root=root)


def test_adapter_checkpoint_is_small_and_says_what_it_is(trained_classifier):
    state = torch.load(trained_classifier['checkpoint'], weights_only=True)['state_dict']
    record = read_adapter_record(state)
    assert record['backbone'] == 'MoPPAVisionTransformer'
    assert record['moppa_cfg'] == MoPPAConfig().to_dict()  # the shipped recipe
    assert record['adapters']['use_moppa'] and record['adapters']['use_scale_shift']
    assert record['arch']['embed_dims'] == 32 and record['arch']['num_layers'] == 2
    assert record['base']['checkpoint'] == trained_classifier['pretrained']
    assert len(record['base']['fingerprint']) == 32
    assert record['heads'] == {'head.layers.head.weight': [5, 32],
                               'head.layers.head.bias': [5]}
    frozen = [k for k in state if k.startswith('backbone.') and '.moppa.' not in k
              and 'ssf_' not in k and not k.endswith('_extra_state')]
    assert frozen == []


def test_the_base_comes_from_the_config_when_built(trained_classifier):
    """Built from the config (init_cfg names the base), no init_weights: the
    adapter-only checkpoint gives the trained model's outputs."""
    model = build(classifier_cfg(trained_classifier['pretrained']))
    assert model.backbone.pretrained_base['checkpoint'] == trained_classifier['pretrained']
    load_checkpoint(model, trained_classifier['checkpoint'], map_location='cpu')
    trained = trained_classifier['model']
    image = torch.randn(2, 3, 32, 32)
    model.eval(), trained.eval()
    torch.testing.assert_close(model(image, mode='tensor'), trained(image, mode='tensor'))


@pytest.fixture
def opened(monkeypatch):
    """The files torch.load opens and the addresses sockets connect to."""
    seen = dict(files=[], addresses=[])
    torch_load = torch.load

    def spy_load(f, *args, **kwargs):
        seen['files'].append(str(f))
        return torch_load(f, *args, **kwargs)

    def spy_connect(sock, address):
        seen['addresses'].append(address)
        raise ConnectionRefusedError('nothing listens here (test)')

    monkeypatch.setattr(torch, 'load', spy_load)
    monkeypatch.setattr(socket.socket, 'connect', spy_connect)
    return seen


@pytest.mark.parametrize('recorded', ['url', 'other file'])
def test_a_load_never_opens_the_recorded_base(trained_classifier, tmp_path, opened,
                                              recorded):
    """A record naming another base file or a URL steers nothing: into a model
    without a base the load stops with the fix, naming the recorded path as
    information; into a model with its base it loads; neither opens it."""
    other = str(tmp_path / 'other_base.pth')
    state = torch.load(trained_classifier['pretrained'], weights_only=True)
    state['state_dict']['backbone.ln1.weight'] += 1  # would change the outputs
    torch.save(state, other)
    base = 'http://127.0.0.1:9/base.pth' if recorded == 'url' else other
    path = with_recorded_base(trained_classifier['checkpoint'], base, tmp_path)
    opened['files'].clear()
    with pytest.raises(PretrainedMismatchError,
                       match=r'(?s)adapter-only.*no pre-trained base.*names no Pretrained '
                       rf"checkpoint.*trained on '{base}'.*does not open it.*init_cfg.*"
                       '--merge-base'):
        load_checkpoint(build(classifier_cfg()), path, map_location='cpu')
    model = build(classifier_cfg(trained_classifier['pretrained']))
    load_checkpoint(model, path, map_location='cpu')
    assert opened['addresses'] == []
    assert other not in opened['files'] and base not in opened['files']
    assert set(opened['files']) == {path, trained_classifier['pretrained']}
    trained = trained_classifier['model'].eval()
    image = torch.randn(2, 3, 32, 32)
    torch.testing.assert_close(model.eval()(image, mode='tensor'),
                               trained(image, mode='tensor'))


def test_a_missing_base_file_at_build_warns_and_the_load_stops(trained_classifier,
                                                               tmp_path):
    missing = str(tmp_path / 'moved.pth')
    with logged_messages() as messages:
        model = build(classifier_cfg(missing))
    log = '\n'.join(messages)
    assert f"init_cfg.checkpoint = '{missing}' does not exist" in log
    assert model.backbone.pretrained_base is None
    with pytest.raises(PretrainedMismatchError,
                       match=r"(?s)no pre-trained base: model.backbone.init_cfg names "
                       rf"'{missing}', which was not loaded.*vit_base.pth"):
        load_checkpoint(model, trained_classifier['checkpoint'], map_location='cpu')


def test_init_weights_after_the_build_keeps_the_base(trained_classifier, tmp_path):
    """The Runner calls init_weights() after the build: the base loaded then
    stays, and is not read again while it is unchanged (the file may be gone)."""
    copied = tmp_path / 'base_copy.pth'
    copied.write_bytes(open(trained_classifier['pretrained'], 'rb').read())
    model = build(classifier_cfg(str(copied)))
    base = model.backbone.layers[0].attn.qkv.weight.detach().clone()
    os.remove(copied)
    model.init_weights()
    model.backbone.init_weights()
    torch.testing.assert_close(model.backbone.layers[0].attn.qkv.weight, base)


@pytest.mark.parametrize('option, value, key', [
    ('heat_param', 'softplus', 'moppa_cfg.heat_param'),
    ('init_mode', 'identity', 'moppa_cfg.init_mode'),
    ('eta', 1e-2, 'moppa_cfg.eta'),
    ('experts', ('heat', 'wave'), 'moppa_cfg.experts'),
])
def test_unit_option_mismatch_stops(trained_classifier, option, value, key):
    model = build(classifier_cfg(moppa_cfg={option: value}))
    with pytest.raises(AdapterRecordMismatchError, match=rf'(?s){key}:.* in the checkpoint.*'
                       r'in the model.*moppa_cfg.<option>.*strict_adapter_record'):
        load_checkpoint(model, trained_classifier['checkpoint'], map_location='cpu')


@pytest.mark.parametrize('switch, key', [('use_scale_shift', 'adapters.use_scale_shift'),
                                         ('use_moppa', 'adapters.use_moppa')])
def test_adapter_switch_mismatch_stops(trained_classifier, switch, key):
    model = build(classifier_cfg(**{switch: False}))
    with pytest.raises(AdapterRecordMismatchError, match=rf"{key}: True in the checkpoint, "
                       'False in the model'):
        load_checkpoint(model, trained_classifier['checkpoint'], map_location='cpu')


def test_a_head_of_another_size_stops(trained_classifier):
    cfg = classifier_cfg()
    cfg['head']['num_classes'] = 7
    with pytest.raises(PretrainedMismatchError,
                       match=r'(?s)head.layers.head.weight: \(5, 32\) in the checkpoint, '
                       r'\(7, 32\) in the model.*another task'):
        load_checkpoint(build(cfg), trained_classifier['checkpoint'], map_location='cpu')


def test_the_override_loads_with_a_warning(trained_classifier):
    model = build(classifier_cfg(trained_classifier['pretrained'], moppa_cfg=dict(eta=1e-2),
                                 strict_adapter_record=False))
    load_checkpoint(model, trained_classifier['checkpoint'], map_location='cpu')


def test_another_base_stops(trained_classifier, tmp_path):
    """The record's fingerprint: adapters on a base they were not trained on."""
    other = str(tmp_path / 'other_base.pth')
    state = torch.load(trained_classifier['pretrained'], weights_only=True)
    state['state_dict']['backbone.layers.0.ln1.weight'] += 1
    torch.save(state, other)
    model = build(classifier_cfg(other))
    model.init_weights()
    with pytest.raises(AdapterRecordMismatchError,
                       match=r'(?s)trained on the pre-trained base .*vit_base.pth.*'
                       r"model's base is .*other_base.pth"):
        load_checkpoint(model, trained_classifier['checkpoint'], map_location='cpu')


def test_a_recorded_base_elsewhere_is_information(trained_classifier, tmp_path):
    """The record names a file that is not here: the model's base (by its
    fingerprint) decides; another base file in init_cfg is refused."""
    path = with_recorded_base(trained_classifier['checkpoint'], tmp_path / 'gone.pth',
                              tmp_path)
    with pytest.raises(PretrainedMismatchError,
                       match=r"(?s)no pre-trained base.*trained on '.*gone.pth'.*--merge-base"):
        load_checkpoint(build(classifier_cfg()), path, map_location='cpu')
    # the file under another name, given in init_cfg: verified by the fingerprint
    model = build(classifier_cfg(trained_classifier['pretrained']))
    load_checkpoint(model, path, map_location='cpu')
    # another file there: refused
    other = str(tmp_path / 'other.pth')
    state = torch.load(trained_classifier['pretrained'], weights_only=True)
    state['state_dict']['backbone.ln1.weight'] += 1
    torch.save(state, other)
    with pytest.raises(AdapterRecordMismatchError, match='fingerprint'):
        load_checkpoint(build(classifier_cfg(other)), path, map_location='cpu')


def test_the_recorded_options_survive_a_round_trip_with_strict_loading(trained_classifier):
    model = build(classifier_cfg(trained_classifier['pretrained']))
    model.init_weights()
    state = torch.load(trained_classifier['checkpoint'], weights_only=True)['state_dict']
    assert model.load_state_dict(state, strict=True)  # the record is no missing key


def test_the_model_hooks_are_named_and_leave_with_the_backbone():
    model = build(classifier_cfg())
    assert 'model_hooks=(ImageClassifier.backbone: loss_route into the loss dict; ' \
        'adapter-only save, record and digest; the load check)' in repr(model)
    hooks = (model._forward_hooks, model._state_dict_hooks, model._load_state_dict_pre_hooks)
    assert [len(h) for h in hooks] == [1, 1, 1]
    backbone = model.backbone
    model.backbone = torch.nn.Identity()  # another module in the backbone's place
    assert [len(h) for h in hooks] == [0, 0, 0]
    assert 'model_hooks' not in repr(backbone) and 'model_hooks' not in repr(model)
    model.backbone = backbone  # back: hooked again, once
    model.backbone = backbone
    assert [len(h) for h in hooks] == [1, 1, 1]


def test_bad_options_are_named():
    with pytest.raises(InputValueError, match=r"unknown option\(s\) \['heat'\]"):
        build(classifier_cfg(moppa_cfg=dict(heat='raw')))
    with pytest.raises(InputValueError, match="unknown heat_param 'softplu'"):
        build(classifier_cfg(moppa_cfg=dict(heat_param='softplu')))
    # --cfg-options model.backbone.moppa_cfg.experts=heat gives a string
    with pytest.raises(InputValueError, match=r"experts must be a list of distinct names "
                       r"from \('heat', 'wave', 'poisson'\), got the string 'heat' \(a list: "
                       r"\['heat'\]\)"):
        build(classifier_cfg(moppa_cfg=dict(experts='heat')))


@pytest.mark.parametrize('value, kind', [('heat_param=raw', 'str'), (['raw'], 'list'),
                                         (0.5, 'float')])
def test_moppa_cfg_of_another_type_is_named(value, kind):
    """``--cfg-options model.backbone.moppa_cfg=...`` gives a string or a list:
    one line naming the key (once a raw ValueError / TypeError of ``dict()``)."""
    with pytest.raises(InputValueError, match=(
            rf'^model.backbone.moppa_cfg = {re.escape(repr(value))} is a {kind}: it must be a '
            r"dict of the units' options \(any of \['eta', .*\]\), e.g. "
            r"moppa_cfg=dict\(heat_param='raw'\)$")):
        build(classifier_cfg(moppa_cfg=value))


SWIN = dict(type='MoPPASwinTransformer', embed_dims=16, depths=[2], num_heads=[2],
            out_indices=(0, ), random_base=True)
TRUE_OR_FALSE = 'True or False'
# (backbone, argument, a bad value, what the message says the value must be)
BAD_ARGUMENTS = [
    ('vit', 'moppa_heads', 0, "a positive int, or None for the attention's heads"),
    ('vit', 'moppa_heads', -2, "a positive int, or None for the attention's heads"),
    ('vit', 'moppa_heads', '4', "a positive int, or None for the attention's heads"),
    ('vit', 'use_moppa', 'no', TRUE_OR_FALSE),
    ('vit', 'use_scale_shift', 0, TRUE_OR_FALSE),
    ('vit', 'freeze_pretrained', None, TRUE_OR_FALSE),
    ('vit', 'strict_adapter_record', 'False', TRUE_OR_FALSE),
    ('vit', 'route_loss_weight', 'abc', r'a number >= 0 \(0: no route loss\)'),
    ('vit', 'route_loss_weight', -1, r'a number >= 0 \(0: no route loss\)'),
    ('vit', 'route_loss_weight', float('nan'), r'a number >= 0 \(0: no route loss\)'),
    ('vit', 'route_schedule', 'weekly', r"one of \('auto', 'epoch', 'iter'\)"),
    ('swin', 'moppa_scope', 'foo', r"one of \('window', 'global'\)"),
    ('swin', 'adapter_ratio', 0, 'a number > 0'),
    ('swin', 'adapter_ratio', 'wide', 'a number > 0'),
    ('swin', 'use_conv_adapter', 'yes', TRUE_OR_FALSE),
    ('swin', 'merged', 1, TRUE_OR_FALSE),
]


@pytest.mark.parametrize('backbone, argument, value, allowed', BAD_ARGUMENTS)
def test_a_bad_backbone_argument_is_named_with_what_it_must_be(
        backbone, argument, value, allowed):
    """Once: moppa_heads=0 silently meant the attention's heads, use_moppa='no'
    meant True, the others were plain ValueErrors (tracebacks in our tools)."""
    cfg = classifier_cfg()['backbone'] if backbone == 'vit' else SWIN
    with pytest.raises(InputValueError, match=rf'^MoPPA\w+: model.backbone.{argument} = '
                       rf'{re.escape(repr(value))}: it must be {allowed}$'):
        build(dict(cfg, **{argument: value}), scope='mmdet' if backbone == 'swin' else
              'mmpretrain')


@pytest.mark.parametrize('backbone, argument, value', [
    ('vit', 'moppa_scope', 'window'), ('vit', 'adapter_ratio', 8),
    ('vit', 'use_conv_adapter', True), ('swin', 'moppa_heads', 2)])
def test_an_argument_of_the_other_backbone_is_named(backbone, argument, value):
    """Once: the base class's TypeError (unexpected keyword argument)."""
    cfg = dict(classifier_cfg()['backbone'], random_base=True) if backbone == 'vit' else SWIN
    with pytest.raises(InputValueError, match=rf'model.backbone.{argument} is an argument of '
                       'another MoPPA backbone, not of this one: remove it'):
        build(dict(cfg, **{argument: value}), scope='mmdet' if backbone == 'swin' else
              'mmpretrain')


@pytest.fixture(scope='module')
def detector(shapes_data, tmp_path_factory):
    cfg = Config.fromfile(DEMO_CONFIG)
    cfg.model.backbone.init_cfg.checkpoint = shapes_data['pretrained']
    model = build(cfg.model, scope='mmdet')
    model.init_weights()
    checkpoint = str(tmp_path_factory.mktemp('det') / 'adapter.pth')
    torch.save({'state_dict': model.state_dict()}, checkpoint)
    return dict(cfg=cfg, checkpoint=checkpoint)


@pytest.mark.parametrize('change, key', [
    (dict(moppa_cfg=dict(heat_param='softplus')), 'moppa_cfg.heat_param'),
    (dict(moppa_cfg=dict(init_mode='identity')), 'moppa_cfg.init_mode'),
    (dict(moppa_cfg=dict(eta=0.5)), 'moppa_cfg.eta'),
    (dict(use_moppa=False), 'adapters.use_moppa'),
    (dict(use_scale_shift=True), 'adapters.use_scale_shift'),
    (dict(moppa_scope='global'), 'adapters.moppa_scope'),
])
def test_detector_mismatch_stops(detector, change, key):
    cfg = copy.deepcopy(detector['cfg'])
    cfg.model.backbone.update(change)
    cfg.model.backbone.init_cfg = None  # as init_detector builds it
    with pytest.raises(AdapterRecordMismatchError, match=rf'{key}:'):
        load_checkpoint(build(cfg.model, scope='mmdet'), detector['checkpoint'],
                        map_location='cpu')


def test_detector_with_other_classes_stops(detector):
    cfg = copy.deepcopy(detector['cfg'])
    for head in cfg.model.roi_head.bbox_head:
        head.num_classes = 5
    cfg.model.roi_head.mask_head.num_classes = 5
    with pytest.raises(PretrainedMismatchError, match=r'(?s)roi_head.*in the checkpoint.*'
                       'another task'):
        load_checkpoint(build(cfg.model, scope='mmdet'), detector['checkpoint'],
                        map_location='cpu')


def test_mismatch_names_the_command_line_fix(trained_classifier):
    """A checkpoint built with other unit options names the option, both
    values and the command line that loads it."""
    checkpoint = torch.load(trained_classifier['checkpoint'], weights_only=True)
    record = read_adapter_record(checkpoint)
    assert record['moppa_cfg']['init_mode'] == 'paper'  # the shipped default
    with pytest.raises(AdapterRecordMismatchError, match=r'(?s)moppa_cfg.init_mode: '
                       r"'paper' in the checkpoint, 'identity' in the model.*--cfg-options "
                       r'model.backbone.moppa_cfg.init_mode=paper\)'):
        load_checkpoint(build(classifier_cfg(moppa_cfg=dict(init_mode='identity'))),
                        trained_classifier['checkpoint'], map_location='cpu')


def test_a_parent_init_cfg_does_not_leave_the_base_randomised(trained_classifier):
    """mmpretrain's DeiT / Swin classifiers carry ``init_cfg=[TruncNormal on
    every Linear, Constant on LayerNorm]``: the Runner's ``init_weights()``
    applies it to the backbone too, after the backbone loaded its base at
    build. The backbone's own ``init_weights()`` (which mmengine then calls)
    loads the base again: training and a later test see the same base."""
    base = torch.load(trained_classifier['pretrained'], weights_only=True)['state_dict']
    cfg = classifier_cfg(trained_classifier['pretrained'])
    cfg['init_cfg'] = [dict(type='TruncNormal', layer='Linear', std=.02, bias=0.),
                       dict(type='Constant', layer='LayerNorm', val=1., bias=0.)]
    model = build(cfg)
    qkv = 'backbone.layers.0.attn.qkv.weight'
    torch.testing.assert_close(model.state_dict()[qkv] if qkv in model.state_dict()
                               else dict(model.named_parameters())[qkv], base[qkv])
    model.init_weights()  # what the Runner does before training
    for key, value in base.items():
        torch.testing.assert_close(dict(model.named_parameters()).get(
            key, dict(model.named_buffers()).get(key)), value, msg=key)


def test_old_identity_checkpoint_without_a_record_is_refused(trained_classifier, tmp_path):
    """A record-less checkpoint of identity-init units holds gate tensors the
    model lacks: torch would drop them as unexpected keys and the units would
    run without their gates."""
    cfg = classifier_cfg(trained_classifier['pretrained'], moppa_cfg=dict(init_mode='identity'))
    model = build(cfg)
    model.init_weights()
    path = str(tmp_path / 'old_identity.pth')
    state = {k: v for k, v in model.state_dict().items() if not k.endswith('_extra_state')}
    torch.save({'state_dict': state}, path)
    with pytest.raises(AdapterRecordMismatchError, match=r"(?s)2 adapter tensors this model "
                       r"does not have: .*layers.0.moppa.gate.*init_mode='identity'"):
        load_checkpoint(build(classifier_cfg(trained_classifier['pretrained'])), path,
                        map_location='cpu')
    cfg['backbone']['strict_adapter_record'] = False  # no record: options unchecked
    load_checkpoint(build(cfg), path, map_location='cpu')  # with its options it loads


def test_new_task_from_adapters_with_the_override(trained_classifier):
    """strict_adapter_record=False: the adapters load, heads of another size
    start anew (a warning instead of the stop)."""
    cfg = classifier_cfg(trained_classifier['pretrained'], strict_adapter_record=False)
    cfg['head']['num_classes'] = 7
    model = build(cfg)
    head = model.head.layers.head.weight.clone()
    load_checkpoint(model, trained_classifier['checkpoint'], map_location='cpu')
    torch.testing.assert_close(model.head.layers.head.weight, head)  # kept its init
    trained = trained_classifier['model'].backbone.layers[0].moppa.channel_maps
    torch.testing.assert_close(model.backbone.layers[0].moppa.channel_maps, trained)


def test_a_changed_base_file_is_named_as_changed(trained_classifier, tmp_path):
    import shutil
    base = str(tmp_path / 'vit_base.pth')
    shutil.copy(trained_classifier['pretrained'], base)
    path = with_recorded_base(trained_classifier['checkpoint'], base, tmp_path)
    state = torch.load(base, weights_only=True)
    state['state_dict']['backbone.ln1.weight'] += 1
    torch.save(state, base)  # the same path, other weights
    with pytest.raises(AdapterRecordMismatchError, match='has changed since the adapters'):
        load_checkpoint(build(classifier_cfg(base)), path, map_location='cpu')


def test_a_configured_base_that_is_gone_too_is_named(trained_classifier, tmp_path):
    path = with_recorded_base(trained_classifier['checkpoint'], tmp_path / 'gone.pth',
                              tmp_path)
    with pytest.raises(PretrainedMismatchError,
                       match=r"(?s)init_cfg names '.*moved.pth', which was not loaded.*"
                       "trained on '.*gone.pth'.*--merge-base"):
        load_checkpoint(build(classifier_cfg(str(tmp_path / 'moved.pth'))), path,
                        map_location='cpu')


def test_an_adapter_checkpoint_for_a_plain_model_is_refused(trained_classifier):
    from mmengine.config import Config as MMConfig
    from preflight import check_config  # tools/
    cfg = classifier_cfg()
    cfg['backbone']['type'] = 'VisionTransformer'
    cfg = MMConfig(dict(model=cfg, load_from=trained_classifier['checkpoint']))
    with pytest.raises(ValueError, match=r"MoPPA adapter checkpoint.*no MoPPA\s+backbone"
                       r"|MoPPA adapter checkpoint.*no MoPPA backbone"):
        check_config(cfg, mode='test')


# ------------------------------------------- records that cannot be read
def with_record(checkpoint_path, tmp_path, value, name='damaged.pth'):
    """A copy of the adapter checkpoint whose record key holds ``value``, or
    none (``value`` None), written with torch.save as a checkpoint is."""
    checkpoint = torch.load(checkpoint_path, weights_only=True)
    state = checkpoint['state_dict']
    if value is None:
        del state['backbone._extra_state']
    else:
        state['backbone._extra_state'] = value
    path = str(tmp_path / name)
    torch.save(checkpoint, path)
    return path


def utf8(data: bytes) -> torch.Tensor:
    """Bytes as a record's state-dict value is stored (uint8)."""
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).clone()


def nested(levels: int):
    return [nested(levels - 1)] if levels else []


# damage -> (the record value, given the valid record; what the message says)
DAMAGED_RECORDS = {
    'truncated JSON': (lambda r: utf8(json.dumps(r).encode()[:60]),
                       r'is not valid JSON \([^)]*: line 1 column \d+\)'),
    'not UTF-8': (lambda r: utf8(b'\xff' + json.dumps(r).encode()),
                  r'is not UTF-8 text \(invalid start byte at byte 0\)'),
    'another format version': (lambda r: encode_record({**r, 'format': 'moppa_mm.adapter/2'}),
                               r"has format 'moppa_mm.adapter/2'; this version of moppa_mm "
                               r"reads 'moppa_mm.adapter/1'"),
    'no format': (lambda r: encode_record({k: v for k, v in r.items() if k != 'format'}),
                  r"has no 'format' field"),
    'a JSON list': (lambda r: utf8(b'[1, 2]'), 'is a JSON list, not an object'),
    'a float tensor': (lambda r: torch.zeros(3), r'is a torch.float32 tensor of shape \(3,\), '
                       'not a 1-D uint8 tensor of UTF-8 JSON'),
    'base a string': (lambda r: encode_record({**r, 'base': 'vit_base.pth'}),
                      r"field 'base' is str 'vit_base.pth', not dict or null"),
    'fingerprint a number': (
        lambda r: encode_record({**r, 'base': {**r['base'], 'fingerprint': 5}}),
        r"field 'base.fingerprint' is int 5, not str"),
    'no fingerprint': (lambda r: encode_record({**r, 'base': {'checkpoint': 'x.pth'}}),
                       r"lacks the field 'base.fingerprint'"),
    'options a list': (lambda r: encode_record({**r, 'moppa_cfg': [1]}),
                       r"field 'moppa_cfg' is list \[1\], not dict or null"),
    'no base field': (lambda r: encode_record({k: v for k, v in r.items() if k != 'base'}),
                      r"lacks the field\(s\) \['base'\]"),
    # deeper than Python's parser recurses: json raises RecursionError
    'nested 100,000 deep': (lambda r: utf8(b'{"a": ' + b'[' * 100_000 + b']' * 100_000 + b'}'),
                            'is nested more than 16 levels deep'),
    'nested 20 deep': (lambda r: encode_record({**r, 'arch': {'depths': nested(20)}}),
                       'is nested more than 16 levels deep'),
    # 2 MiB (a 60 MB one once made a message of 63 million characters)
    'too large': (lambda r: encode_record({**r, 'arch': {'name': 'x' * (2 << 20)}}),
                  rf'is 2,0\d\d,\d\d\d bytes, more than the {MAX_RECORD_BYTES:,} a record '
                  'may take'),
}


@pytest.mark.parametrize('damage', sorted(DAMAGED_RECORDS))
def test_a_record_that_cannot_be_read_stops_unless_the_override(trained_classifier,
                                                                tmp_path, damage):
    """A damaged record used to load as a record-less file with a warning (in
    a model of other options: NaN logits, top-1 0.0, exit 0). It stops,
    naming the key and what is wrong, in one bounded message; the adapter
    bank refuses the same file with the same words (one validation); the
    override loads it with a warning."""
    make, problem = DAMAGED_RECORDS[damage]
    valid = read_adapter_record(torch.load(trained_classifier['checkpoint'], weights_only=True))
    path = with_record(trained_classifier['checkpoint'], tmp_path, make(valid))
    model = build(classifier_cfg(trained_classifier['pretrained']))
    with pytest.raises(AdapterRecordMismatchError) as error:
        load_checkpoint(model, path, map_location='cpu')
    message = str(error.value)
    assert re.search(r"MoPPAVisionTransformer: the checkpoint: its adapter record \(key "
                     rf"'backbone._extra_state'\) {problem}.*\. To load it anyway, .*"
                     r'model.backbone.strict_adapter_record=False\.$', message), message
    assert len(message) < 1000, len(message)

    from moppa_mm import AdapterBank
    bank = AdapterBank(build(classifier_cfg(trained_classifier['pretrained'])))
    with pytest.raises(AdapterRecordMismatchError, match=rf"task 'damaged' \(.*damaged.pth\): its "
                       rf"adapter record \(key 'backbone._extra_state'\) {problem}"):
        bank.add('damaged', path)
    assert bank.names() == []

    model = build(classifier_cfg(trained_classifier['pretrained'],
                                 strict_adapter_record=False))
    with logged_messages() as messages:
        load_checkpoint(model, path, map_location='cpu')
    warnings = [m for m in messages if 'adapter record' in m]
    assert len(warnings) == 1 and re.search(problem, warnings[0]), warnings
    assert warnings[0].endswith('(strict_adapter_record=False: loading anyway)')
    image = torch.randn(2, 3, 32, 32)
    torch.testing.assert_close(model.eval()(image, mode='tensor'),
                               trained_classifier['model'].eval()(image, mode='tensor'))


def test_a_checkpoint_without_a_record_stops_unless_the_override(trained_classifier,
                                                                 tmp_path):
    """Without a record the options and the base cannot be checked (on another
    base such a file once loaded silently: top-1 16.7); it stops, naming the
    key and the override, which loads it with a warning."""
    path = with_record(trained_classifier['checkpoint'], tmp_path, None, 'old.pth')
    other = str(tmp_path / 'other_base.pth')
    state = torch.load(trained_classifier['pretrained'], weights_only=True)
    state['state_dict']['backbone.layers.0.ln1.weight'] += 1
    torch.save(state, other)
    for base in (trained_classifier['pretrained'], other):
        with pytest.raises(AdapterRecordMismatchError,
                           match=r"(?s)the checkpoint has no adapter record \(key "
                           r"'backbone._extra_state'.*cannot be checked.*set "
                           r'model.backbone.strict_adapter_record=False\.$'):
            load_checkpoint(build(classifier_cfg(base)), path, map_location='cpu')
    model = build(classifier_cfg(trained_classifier['pretrained'],
                                 strict_adapter_record=False))
    with logged_messages() as messages:
        load_checkpoint(model, path, map_location='cpu')
    assert [m for m in messages if 'has no adapter record' in m
            and m.endswith('(strict_adapter_record=False: loading anyway)')], messages
    image = torch.randn(2, 3, 32, 32)
    torch.testing.assert_close(model.eval()(image, mode='tensor'),
                               trained_classifier['model'].eval()(image, mode='tensor'))


def test_a_record_less_checkpoint_gets_every_check_its_tensors_allow(trained_classifier,
                                                                     tmp_path):
    """Under the override too: NaN, shapes, the model's adapters, and a base in
    the model for an adapter-only file still stop."""
    from moppa_mm.utils.checkpoints import CheckpointLoadError
    checkpoint = torch.load(trained_classifier['checkpoint'], weights_only=True)
    del checkpoint['state_dict']['backbone._extra_state']
    adapter = 'backbone.layers.1.moppa.channel_maps'
    faults = {
        'nan': ({adapter: checkpoint['state_dict'][adapter] * float('nan')},
                CheckpointLoadError, rf'{adapter[len("backbone."):]} \(\d+ of'),
        'shape': ({adapter: checkpoint['state_dict'][adapter].repeat(2, 1)},
                  PretrainedMismatchError, 'do not fit the model'),
        'an adapter missing': ({adapter: None}, PretrainedMismatchError,
                               r"lacks 1 of the model's \d+ adapter parameters"),
    }
    cfg = classifier_cfg(trained_classifier['pretrained'], strict_adapter_record=False)
    for name, (change, error, match) in faults.items():
        state = dict(checkpoint['state_dict'])
        state.update(change)
        state = {k: v for k, v in state.items() if v is not None}
        path = str(tmp_path / f'{name}.pth')
        torch.save({'state_dict': state}, path)
        with pytest.raises(error, match=match):
            load_checkpoint(build(cfg), path, map_location='cpu')
    path = with_record(trained_classifier['checkpoint'], tmp_path, None, 'old.pth')
    with pytest.raises(PretrainedMismatchError, match='is adapter-only.*no pre-trained base'):
        load_checkpoint(build(classifier_cfg(strict_adapter_record=False)), path,
                        map_location='cpu')


def test_an_adapter_only_checkpoint_recording_no_base_stops(trained_classifier, tmp_path):
    """A record with ``base: null`` (adapters trained on a backbone as built)
    gives the fingerprint nothing to compare: into a model with a base it
    stops."""
    valid = read_adapter_record(torch.load(trained_classifier['checkpoint'], weights_only=True))
    path = with_record(trained_classifier['checkpoint'], tmp_path,
                       encode_record({**valid, 'base': None}))
    with pytest.raises(AdapterRecordMismatchError, match=r"records no pre-trained base .*"
                       r"but the model's base is '.*vit_base.pth'"):
        load_checkpoint(build(classifier_cfg(trained_classifier['pretrained'])), path,
                        map_location='cpu')
    load_checkpoint(build(classifier_cfg(trained_classifier['pretrained'],
                                         strict_adapter_record=False)), path,
                    map_location='cpu')


def test_a_readable_record_of_many_or_long_values_gives_a_short_message(
        trained_classifier, tmp_path):
    """Within the size bound, a record can still differ in thousands of keys
    or hold long strings: the message lists 20 and cuts each value."""
    valid = read_adapter_record(torch.load(trained_classifier['checkpoint'], weights_only=True))
    record = {**valid, 'arch': {**valid['arch'], 'a_name': 'x' * 500_000,
                                **{f'extra_{i}': i for i in range(20_000)}}}
    path = with_record(trained_classifier['checkpoint'], tmp_path, encode_record(record))
    with pytest.raises(AdapterRecordMismatchError) as error:
        load_checkpoint(build(classifier_cfg(trained_classifier['pretrained'])), path,
                        map_location='cpu')
    message = str(error.value)
    assert 'other options than this model; 20001 differ' in message, message[:500]
    assert "arch.a_name: 'xxxx" in message and '... (20001 in all)' in message
    assert len(message) < 5000, len(message)

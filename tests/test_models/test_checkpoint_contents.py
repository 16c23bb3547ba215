"""What a model with a MoPPA backbone saves (decided by its config, the same
under every tool) and what its one load check catches beyond the record:
damaged trained tensors (the record's digest), a checkpoint of another model
around the same backbone, a record of another backbone type. Real mmpretrain
classifiers and mmdet detectors, loaded through mmengine's loader (what
``load_from``, ``--resume``, the test tools and the inference APIs call) and
torch's."""
import copy
import re
import struct
import zipfile
import zlib

import pytest
import torch
from mmengine.config import Config
from mmengine.runner.checkpoint import load_checkpoint

from moppa_mm.models import adapter_state_dict, full_state_dict, read_adapter_record
from moppa_mm.models.backbones.arguments import BACKBONE_ARGS
from moppa_mm.models.backbones.adapter_params import is_adapter_key
from moppa_mm.models.backbones.adapter_record import encode_record
from moppa_mm.models.backbones.load_check import (AdapterRecordMismatchError, BaseOnlyCheckpoint,
                                                  PretrainedMismatchError)
from moppa_mm.utils.checkpoints import CheckpointLoadError
from tests.conftest import logged_messages
from tests.test_models.test_adapter_record import (build, classifier_cfg,  # noqa: F401
                                                   detector, trained_classifier)

IMAGE = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))


def base_keys(state, prefix='backbone.'):
    return [k for k in state if k.startswith(prefix) and not k.endswith('_extra_state')
            and not is_adapter_key(k[len(prefix):])]


def test_what_the_model_saves_follows_its_config(trained_classifier):  # noqa: F811
    """Adapter-only where the backbone's config names its frozen base, whole
    otherwise; the backbone's own state and full_state_dict are whole;
    adapter_state_dict leaves the base out whatever the config."""
    pretrained = trained_classifier['pretrained']
    named = build(classifier_cfg(pretrained))
    assert base_keys(named.state_dict()) == []
    assert 'head.layers.head.weight' in named.state_dict()
    whole = full_state_dict(named)
    own = named.backbone.state_dict()  # the backbone's own: whole (its base classes read it)
    assert len(base_keys(own, '')) > 20
    assert set(base_keys(whole)) == {'backbone.' + k for k in base_keys(own, '')}
    random = build(classifier_cfg())  # no base named: nothing to restore it from
    assert base_keys(random.state_dict()) == base_keys(whole)
    assert base_keys(adapter_state_dict(random)) == []
    unfrozen = build(classifier_cfg(pretrained, freeze_pretrained=False))  # the base trains
    assert base_keys(unfrozen.state_dict()) == base_keys(whole)
    # the adapter-only and the whole state load alike (both with the digest)
    for state in (named.state_dict(), whole):
        model = build(classifier_cfg(pretrained))
        model.load_state_dict(state, strict=True)
        torch.testing.assert_close(model.eval()(IMAGE, mode='tensor'),
                                   named.eval()(IMAGE, mode='tensor'))


def damaged(path, tmp_path, key, name='damaged.pth'):
    """A copy of the checkpoint with bytes of ``key``'s tensor changed after
    the save, as a disk or copy error changes them (finite values)."""
    checkpoint = torch.load(path, weights_only=True)
    tensor = checkpoint['state_dict'][key]
    tensor.view(-1)[:4] += 0.25
    out = str(tmp_path / name)
    torch.save(checkpoint, out)
    return out


@pytest.mark.parametrize('key', ['head.layers.head.weight',
                                 'backbone.layers.1.moppa.channel_maps'])
def test_damaged_trained_tensors_stop_every_loader(trained_classifier, tmp_path, key):  # noqa: F811
    """torch.load reads changed bytes silently (before the digest such a head
    tested at top-1 41.7 instead of 33.3, exit 0): the record's digest stops
    mmengine's loader, torch's load_state_dict and the adapter bank."""
    from moppa_mm import AdapterBank
    path = damaged(trained_classifier['checkpoint'], tmp_path, key)
    pretrained = trained_classifier['pretrained']
    match = r"MoPPAVisionTransformer: the checkpoint is damaged: its tensors"
    with pytest.raises(CheckpointLoadError, match=match):
        load_checkpoint(build(classifier_cfg(pretrained)), path, map_location='cpu')
    state = torch.load(path, weights_only=True)['state_dict']
    with pytest.raises(CheckpointLoadError, match=match):  # no override for damage
        build(classifier_cfg(pretrained, strict_adapter_record=False)).load_state_dict(state)
    with pytest.raises(CheckpointLoadError, match=r"task 'x' \(.*damaged.pth\) is damaged"):
        AdapterBank(build(classifier_cfg(pretrained))).add('x', path)
    load_checkpoint(build(classifier_cfg(pretrained)), trained_classifier['checkpoint'],
                    map_location='cpu')  # the undamaged file loads


@pytest.mark.parametrize('edit', ['removed', 'emptied'])
def test_a_record_without_its_digest_stops_every_loader(trained_classifier, tmp_path,  # noqa: F811
                                                        edit):
    """A damaged file whose digest was removed or emptied (it once passed for
    a record saved before the digest, and tested at top-1 41.7 instead of
    33.3, exit 0) stops mmengine's loader, torch's load (no override), the
    adapter bank and publish_model.py, in one line."""
    from moppa_mm import AdapterBank
    from tests.test_tools.test_checkpoint_faults import load_tool
    path = damaged(trained_classifier['checkpoint'], tmp_path, 'head.layers.head.weight')
    checkpoint = torch.load(path, weights_only=True)
    record = read_adapter_record(checkpoint)
    if edit == 'removed':
        del record['digest']
    else:
        record['digest'] = ''
    checkpoint['state_dict']['backbone._extra_state'] = encode_record(record)
    torch.save(checkpoint, path)
    pretrained = trained_classifier['pretrained']
    match = (r"^MoPPAVisionTransformer: the checkpoint: its adapter record \(key "
             r"'backbone._extra_state'\) has no digest .*edited after the save[^\n]*$")
    with pytest.raises(CheckpointLoadError, match=match):
        load_checkpoint(build(classifier_cfg(pretrained)), path, map_location='cpu')
    with pytest.raises(CheckpointLoadError, match=match):
        build(classifier_cfg(pretrained, strict_adapter_record=False)).load_state_dict(
            checkpoint['state_dict'])
    with pytest.raises(CheckpointLoadError, match='has no digest'):
        AdapterBank(build(classifier_cfg(pretrained))).add('x', path)
    publish = load_tool('tools/model_converters/publish_model.py')
    with pytest.raises(CheckpointLoadError, match='has no digest'):
        publish.publish(path, str(tmp_path / 'published.pth'))


def test_a_record_of_another_backbone_type_says_so(trained_classifier, detector):  # noqa: F811
    """Not the record's options: the backbone itself is another (no override
    helps, and none is offered)."""
    for strict in (True, False):
        model = build(classifier_cfg(trained_classifier['pretrained'],
                                     strict_adapter_record=strict))
        with pytest.raises(PretrainedMismatchError) as error:
            load_checkpoint(model, detector['checkpoint'], map_location='cpu')
        message = str(error.value)
        assert ("the checkpoint is a checkpoint of MMDetection's MoPPASwinTransformer (its "
                "adapter record says so); this config builds MMPretrain's "
                'MoPPAVisionTransformer') in message, message
        assert 'strict_adapter_record' not in message


def test_a_seg_swin_checkpoint_in_the_detector_says_so(detector, tmp_path):  # noqa: F811
    """MMSegmentation's and MMDetection's Swins are both MoPPASwinTransformer in
    a config: the message names the package, not the internal class."""
    checkpoint = torch.load(detector['checkpoint'], weights_only=True)
    record = read_adapter_record(checkpoint)
    record['backbone'] = 'MoPPASwinTransformerSeg'  # as a segmentor's record says
    checkpoint['state_dict']['backbone._extra_state'] = encode_record(record)
    path = str(tmp_path / 'segmentor.pth')
    torch.save(checkpoint, path)
    with pytest.raises(PretrainedMismatchError) as error:
        load_checkpoint(build(detector['cfg'].model, scope='mmdet'), path, map_location='cpu')
    assert str(error.value).endswith(
        "the checkpoint is a checkpoint of MMSegmentation's MoPPASwinTransformer (its adapter "
        "record says so); this config builds MMDetection's MoPPASwinTransformer"), error.value


def mask_rcnn_cfg(detector, tmp_path):  # noqa: F811
    """The demo's backbone, neck and RPN with mmdet's Mask R-CNN RoI head (one
    stage) in place of the Cascade's three."""
    (tmp_path / 'mask_rcnn.py').write_text(
        "_base_ = 'mmdet::swin/mask-rcnn_swin-t-p4-w7_fpn_1x_coco.py'\n")
    mask = Config.fromfile(str(tmp_path / 'mask_rcnn.py')).model
    cfg = copy.deepcopy(detector['cfg'].model)
    for key in ('type', 'train_cfg', 'test_cfg', 'roi_head'):
        cfg[key] = mask[key]
    cfg.roi_head.bbox_roi_extractor.out_channels = 64
    cfg.roi_head.mask_roi_extractor.out_channels = 64
    cfg.roi_head.bbox_head.update(in_channels=64, fc_out_channels=128, num_classes=3)
    cfg.roi_head.mask_head.update(in_channels=64, conv_out_channels=64, num_classes=3)
    return cfg


def test_another_models_checkpoint_stops_naming_both(detector, tmp_path):  # noqa: F811
    """A Mask R-CNN's adapter checkpoint into the Cascade Mask R-CNN of the same
    backbone and base, and the reverse: once loaded with only mmengine's
    missing / unexpected key notice (AP 0.002); now it stops, naming the keys
    of each side; the override starts new heads from the adapters."""
    mask_cfg = mask_rcnn_cfg(detector, tmp_path)
    mask = build(mask_cfg, scope='mmdet')
    mask_path = str(tmp_path / 'mask_rcnn.pth')
    torch.save({'state_dict': mask.state_dict()}, mask_path)
    cascade = build(detector['cfg'].model, scope='mmdet')
    with pytest.raises(AdapterRecordMismatchError,
                       match=r'(?s)the checkpoint is of another model \(it was saved from a '
                       r'MaskRCNN\): it holds \d+ tensors around the backbone that this model '
                       r'does not have \(roi_head.bbox_head.fc_cls.*and lacks \d+ that it '
                       r'trains \(roi_head.bbox_head.0.*strict_adapter_record=False'):
        load_checkpoint(cascade, mask_path, map_location='cpu')
    with pytest.raises(AdapterRecordMismatchError,
                       match=r'(?s)saved from a CascadeRCNN.*roi_head.bbox_head.0.*'
                       r'roi_head.bbox_head.fc_cls'):
        load_checkpoint(build(mask_cfg, scope='mmdet'), detector['checkpoint'],
                        map_location='cpu')
    cfg = copy.deepcopy(detector['cfg'].model)
    cfg.backbone.strict_adapter_record = False
    new_task = build(cfg, scope='mmdet')
    load_checkpoint(new_task, mask_path, map_location='cpu')  # a warning: adapters load
    torch.testing.assert_close(
        new_task.backbone.stages[0].blocks[0].attn.w_msa.moppa.channel_maps,
        mask.backbone.stages[0].blocks[0].attn.w_msa.moppa.channel_maps)


def test_an_ema_checkpoint_loads_both_ways(trained_classifier):  # noqa: F811
    """mmengine's EMAHook saves ``ema_state_dict`` (the averaged copy's, under
    ``module.``) and swaps its values with ``state_dict``'s, records included:
    each side's digest is of its own tensors, so the swapped checkpoint loads
    for testing and, swapped back, resumes (into the averaged model too)."""
    from mmengine.model import ExponentialMovingAverage
    model = build(classifier_cfg(trained_classifier['pretrained']))
    ema = ExponentialMovingAverage(model)  # a deepcopy: its hooks are the copy's
    with torch.no_grad():
        model.head.layers.head.weight.add_(1.0)  # the model moves on, the average not
    checkpoint = {'state_dict': model.state_dict(), 'ema_state_dict': ema.state_dict()}
    for key in [k for k in checkpoint['ema_state_dict'] if k.startswith('module.')]:
        checkpoint['state_dict'][key[7:]], checkpoint['ema_state_dict'][key] = \
            checkpoint['ema_state_dict'][key], checkpoint['state_dict'][key[7:]]
    tested = build(classifier_cfg(trained_classifier['pretrained']))
    tested.load_state_dict(checkpoint['state_dict'])  # the averaged weights
    torch.testing.assert_close(tested.head.layers.head.weight, ema.module.head.layers.head.weight)
    averaged = ExponentialMovingAverage(build(classifier_cfg(trained_classifier['pretrained'])))
    averaged.load_state_dict(checkpoint['ema_state_dict'])  # the model's, as on resume
    torch.testing.assert_close(averaged.module.head.layers.head.weight,
                               model.head.layers.head.weight)


# ----------------------------------------- checkpoints without the adapters
def without_adapters(state):
    """What a linear probe or a plain model saves: the backbone's base and the
    tensors around it, no adapter, no record."""
    return {k: v for k, v in state.items()
            if not k.endswith('_extra_state') and not is_adapter_key(k)}


ANOTHER_MODEL = (r'(?s)the checkpoint holds \d+ backbone tensors and \d+ around it \({}.*\) but '
                 r'none of the \d+ adapter tensors of this model.*a linear probe or a full '
                 r'fine-tuning of the plain backbone.*initial values')


def test_base_and_head_without_adapters_stop(trained_classifier, tmp_path):  # noqa: F811
    """The base and a head, no adapters, no record (what a linear probe saves):
    once loaded silently (top-1 30.0, exit 0, under our and mmpretrain's
    tools/test.py). It stops mmengine's loader and torch's, naming what it
    lacks and what it is; the override loads it with a warning, the adapters
    at their init."""
    trained, pretrained = trained_classifier['model'], trained_classifier['pretrained']
    state = without_adapters(full_state_dict(trained))
    path = str(tmp_path / 'base_plus_head.pth')
    torch.save({'state_dict': state}, path)
    match = ANOTHER_MODEL.format('head.layers.head')
    with pytest.raises(AdapterRecordMismatchError, match=match + '.*strict_adapter_record=False'):
        load_checkpoint(build(classifier_cfg(pretrained)), path, map_location='cpu')
    with pytest.raises(AdapterRecordMismatchError, match=match):
        build(classifier_cfg(pretrained)).load_state_dict(state)
    lenient = build(classifier_cfg(pretrained, strict_adapter_record=False))
    unit = lenient.backbone.layers[0].moppa.channel_maps.clone()
    with logged_messages() as messages:
        load_checkpoint(lenient, path, map_location='cpu')
    assert [m for m in messages if re.search(match, m)
            and m.endswith('(strict_adapter_record=False: loading anyway)')], messages
    torch.testing.assert_close(lenient.head.layers.head.weight, trained.head.layers.head.weight)
    torch.testing.assert_close(lenient.backbone.layers[0].moppa.channel_maps, unit)


def test_a_plain_swin_detectors_checkpoint_stops(detector, tmp_path):  # noqa: F811
    """mmdet's plain Swin Cascade, fully fine-tuned, tested with the MoPPA
    Cascade config: once exit 0 and bbox_mAP 0.004."""
    cfg = copy.deepcopy(detector['cfg'].model)
    cfg.backbone = {k: v for k, v in cfg.backbone.items()
                    if k not in BACKBONE_ARGS and k != 'moppa_cfg'}
    cfg.backbone.update(type='SwinTransformer', init_cfg=None)
    plain = build(cfg, scope='mmdet')
    path = str(tmp_path / 'plain_cascade.pth')
    torch.save({'state_dict': plain.state_dict(), 'meta': {}}, path)
    with pytest.raises(AdapterRecordMismatchError, match=ANOTHER_MODEL.format('neck|roi_head')):
        load_checkpoint(build(detector['cfg'].model, scope='mmdet'), path, map_location='cpu')


def test_the_pre_trained_base_as_the_models_checkpoint_warns(trained_classifier):  # noqa: F811
    """The base alone given to the whole model (``load_from`` before training,
    or by mistake as the checkpoint to test: top-1 0.0) loads with a warning
    naming what keeps its initial values; the adapter bank refuses it."""
    from moppa_mm import AdapterBank
    pretrained = trained_classifier['pretrained']
    warning = (r'holds only pre-trained weights \(\d+ backbone tensors\): the '
               r"\d+ adapter tensors and the model's tensors around the backbone \(heads, "
               r'neck\) keep their initial values')
    model = build(classifier_cfg(pretrained))
    head = model.head.layers.head.weight.clone()
    for load in (lambda: load_checkpoint(model, pretrained, map_location='cpu'),
                 lambda: model.load_state_dict(torch.load(pretrained)['state_dict'],
                                               strict=False)):
        with logged_messages() as messages:
            load()
        assert len([m for m in messages if re.search(warning, m)]) == 1, messages
    torch.testing.assert_close(model.head.layers.head.weight, head)
    with pytest.raises(BaseOnlyCheckpoint, match=warning):
        AdapterBank(build(classifier_cfg(pretrained))).add('base', pretrained)


# ------------------------------------- damage in merged, self-contained files
def flip_bytes(path, key, out):
    """A copy of the checkpoint at ``path`` with the lowest bit of two numbers of
    ``key``'s tensor flipped inside the file, and the zip's CRC-32s rewritten
    to match: only the record's digest can tell (torch.load reads it as is)."""
    tensor = torch.load(path, weights_only=True)['state_dict'][key]
    data = bytearray(open(path, 'rb').read())
    with zipfile.ZipFile(path) as archive:
        info = next(i for i in archive.infolist() if '/data/' in i.filename
                    and archive.read(i) == bytes(tensor.untyped_storage()))
    name_len, extra_len = struct.unpack('<HH', data[info.header_offset + 26:
                                                    info.header_offset + 30])
    start = info.header_offset + 30 + name_len + extra_len
    middle = start + info.file_size // 8 * 4  # a float32 half-way
    data[middle] ^= 1
    data[middle + 4] ^= 1
    crc = zlib.crc32(data[start:start + info.file_size])
    struct.pack_into('<I', data, info.header_offset + 14, crc)  # the local header's
    central = data.find(b'PK\x01\x02' + bytes(data[info.header_offset + 4:
                                                   info.header_offset + 6]))
    while bytes(data[central + 46:central + 46 + len(info.filename)]) != \
            info.filename.encode():
        central = data.find(b'PK\x01\x02', central + 4)
    struct.pack_into('<I', data, central + 16, crc)  # the central directory's
    open(out, 'wb').write(data)
    with zipfile.ZipFile(out) as archive:
        assert archive.testzip() is None
    changed = torch.load(out, weights_only=True)['state_dict'][key]
    assert not torch.equal(changed, tensor) and torch.isfinite(changed).all()
    return str(out)


def published(checkpoint, cfg, tmp_path, **how):
    """``publish_model.py CHECKPOINT OUT --config CFG`` with ``how``
    (``merge=True``, ``merge_base=True``), in this process."""
    from tests.test_tools.test_checkpoint_faults import load_tool
    config = str(tmp_path / 'config.py')
    Config(cfg).dump(config)
    publish = load_tool('tools/model_converters/publish_model.py')
    return publish.publish(checkpoint, str(tmp_path / 'published.pth'), config=config, **how)


def test_changed_bytes_in_a_merged_file_stop(trained_classifier, tmp_path):  # noqa: F811
    """publish_model.py --merge folds the adapters into the base's weights: the
    digest covers them all (once: 8 bytes flipped in a folded fc1 weight tested
    at top-1 20.0 instead of 40.0, exit 0)."""
    cfg = dict(model=classifier_cfg(trained_classifier['pretrained']),
               default_scope='mmpretrain')
    merged = published(trained_classifier['checkpoint'], cfg, tmp_path, merge=True)
    key = 'backbone.layers.1.ffn.layers.0.0.weight'
    flipped = flip_bytes(merged, key, tmp_path / 'flipped.pth')
    with pytest.raises(CheckpointLoadError, match=r'the checkpoint is damaged: its tensors'):
        load_checkpoint(build(classifier_cfg(merged=True)), flipped, map_location='cpu')
    load_checkpoint(build(classifier_cfg(merged=True)), merged, map_location='cpu')


def test_changed_bytes_in_a_self_contained_base_stop(detector, tmp_path):  # noqa: F811
    """publish_model.py --merge-base: the base the file carries is covered by
    the digest too (once: a flipped qkv weight of the base tested, exit 0)."""
    full = published(detector['checkpoint'], detector['cfg'].to_dict(), tmp_path,
                     merge_base=True)
    key = 'backbone.stages.0.blocks.0.attn.w_msa.qkv.weight'
    flipped = flip_bytes(full, key, tmp_path / 'flipped.pth')
    cfg = copy.deepcopy(detector['cfg'].model)
    cfg.backbone.init_cfg = None  # a self-contained file needs no base (init_detector)
    with pytest.raises(CheckpointLoadError, match=r'the checkpoint is damaged: its tensors'):
        load_checkpoint(build(cfg, scope='mmdet'), flipped, map_location='cpu')
    load_checkpoint(build(cfg, scope='mmdet'), full, map_location='cpu')

"""What a model with a MoPPA backbone saves (decided by its config, the same
under every tool) and what its one load check catches beyond the record:
damaged trained tensors (the record's digest), a checkpoint of another model
around the same backbone, a record of another backbone type. Real mmpretrain
classifiers and mmdet detectors, loaded through mmengine's loader (what
``load_from``, ``--resume``, the test tools and the inference APIs call) and
torch's."""
import copy
import warnings

import pytest
import torch
from mmengine.config import Config
from mmengine.runner.checkpoint import load_checkpoint

from moppa_mm.models import adapter_state_dict, full_state_dict, read_adapter_record
from moppa_mm.models.backbones.adapter_state import (AdapterRecordMismatchError,
                                                     PretrainedMismatchError, encode_record,
                                                     is_adapter_key)
from moppa_mm.utils.checkpoints import CheckpointLoadError
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
                                 'backbone.layers.1.moppa.source_channel'])
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


def test_a_checkpoint_from_before_the_digest_loads(trained_classifier, tmp_path):  # noqa: F811
    """Records before the digest (no 'digest', 'model' or 'heads' field) are of
    the same format: they load, strictly, to the trained outputs."""
    checkpoint = torch.load(trained_classifier['checkpoint'], weights_only=True)
    record = read_adapter_record(checkpoint)
    assert len(record['digest']) == 32 and record['model'] == 'ImageClassifier'
    for field in ('digest', 'model', 'heads'):
        del record[field]
    checkpoint['state_dict']['backbone._extra_state'] = encode_record(record)
    model = build(classifier_cfg(trained_classifier['pretrained']))
    model.load_state_dict(checkpoint['state_dict'], strict=True)
    torch.testing.assert_close(model.eval()(IMAGE, mode='tensor'),
                               trained_classifier['model'].eval()(IMAGE, mode='tensor'))


def test_a_record_of_another_backbone_type_says_so(trained_classifier, detector):  # noqa: F811
    """Not the record's options: the backbone itself is another (no override
    helps, and none is offered)."""
    for strict in (True, False):
        model = build(classifier_cfg(trained_classifier['pretrained'],
                                     strict_adapter_record=strict))
        with pytest.raises(PretrainedMismatchError) as error:
            load_checkpoint(model, detector['checkpoint'], map_location='cpu')
        message = str(error.value)
        assert ('the checkpoint is a MoPPASwinTransformer checkpoint (its adapter record '
                'says so); this config builds a MoPPAVisionTransformer') in message, message
        assert 'strict_adapter_record' not in message


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
    torch.testing.assert_close(new_task.backbone.stages[0].blocks[0].moppa.source_channel,
                               mask.backbone.stages[0].blocks[0].moppa.source_channel)


def test_the_adapter_checkpoint_hook_is_a_deprecated_no_op():
    from mmengine.registry import HOOKS
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        hook = HOOKS.build(dict(type='AdapterCheckpointHook'))
    assert any(issubclass(w.category, FutureWarning) and 'deprecated' in str(w.message)
               for w in caught)
    checkpoint = {'state_dict': {'w': torch.ones(1)}}
    hook.before_save_checkpoint(None, checkpoint)  # the model decides what it saves
    assert list(checkpoint['state_dict']) == ['w']


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

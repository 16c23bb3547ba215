"""A frozen base must be a pre-trained one before the adapters train: the first
training forward without one stops (``NoPretrainedBaseError``) naming
``init_cfg`` and the two ways out; a base loaded when built, by a whole-model
checkpoint or by ``load_state_dict`` lets it train; ``random_base=True`` says
a random base is meant; the parameter table never calls a random base
pre-trained."""
import pytest
import torch

from moppa_mm.models.backbones.adapter_mixin import full_state_dict
from moppa_mm.models.backbones.adapter_params import parameter_report
from moppa_mm.models.backbones.training_checks import NoPretrainedBaseError
from tests.conftest import logged_messages
from .test_explicit_modules import MODELS


def training_step(model, size):
    model.train()
    outs = model(torch.randn(1, 3, size, size))
    sum(out.sum() for out in outs).backward()


def base_file(build, tmp_path):
    """A pre-trained base under ``backbone.`` (no adapter keys), and its
    ``init_cfg``; the state dict."""
    state = {k: v for k, v in full_state_dict(build(random_base=True)).items()
             if not any(t in k for t in ('moppa', 'conv_adapter', 'ssf_', '_extra'))}
    path = str(tmp_path / 'base.pth')
    torch.save({'state_dict': {'backbone.' + k: v for k, v in state.items()}}, path)
    init_cfg = dict(type='Pretrained', checkpoint=path)
    if 'pos_embed' in state:  # mmpretrain's ViT: the prefix goes to the Pretrained init
        init_cfg['prefix'] = 'backbone.'  # (mmdet's Swin strips it itself)
    return init_cfg, state


@pytest.mark.parametrize('name', list(MODELS))
def test_training_a_random_frozen_base_stops_with_the_ways_out(name):
    build, size, _ = MODELS[name]
    model = build()
    assert 'random (no base loaded)' in parameter_report(model)
    assert 'pre-trained' not in parameter_report(model)
    with torch.no_grad():  # inference, and any forward without gradients, runs
        model(torch.randn(1, 3, size, size))
    model.eval()(torch.randn(1, 3, size, size))
    with pytest.raises(NoPretrainedBaseError, match=r"(?s)init_cfg is None.*type='Pretrained'"
                       r'.*freeze_pretrained=False.*random_base=True'):
        training_step(model, size)
    # the two ways out, and the benchmarks' word for a random base on purpose
    training_step(build(freeze_pretrained=False), size)
    meant = build(random_base=True)
    training_step(meant, size)
    assert 'random (on purpose)' in parameter_report(meant)


@pytest.mark.parametrize('name', ['swin_det_window', 'vit'])
def test_a_base_from_init_cfg_or_a_checkpoint_lets_it_train(name, tmp_path):
    build, size, _ = MODELS[name]
    init_cfg, state = base_file(build, tmp_path)
    built_with = build(init_cfg=init_cfg)
    assert built_with.pretrained_base and 'random' not in parameter_report(built_with)
    training_step(built_with, size)
    loaded = build()  # the base loaded after building: load_state_dict
    loaded.load_state_dict(state, strict=False)
    training_step(loaded, size)
    whole = full_state_dict(built_with)  # a whole-model checkpoint (load_from, resume)
    resumed = build()
    resumed.load_state_dict(whole)
    training_step(resumed, size)


def test_a_missing_base_file_warns_when_built_and_stops_training(tmp_path):
    build, size, _ = MODELS['vit']
    missing = str(tmp_path / 'nowhere.pth')
    with logged_messages() as messages:
        model = build(init_cfg=dict(type='Pretrained', checkpoint=missing))
    assert any('does not exist' in m and 'training stops' in m for m in messages)
    with pytest.raises(NoPretrainedBaseError, match=f'names {missing!r}, which was not '
                       'there when the model was built'):
        training_step(model, size)


def test_an_init_cfg_that_misses_its_type_or_prefix_names_the_line(tmp_path):
    """``--cfg-options model.backbone.init_cfg.checkpoint=BASE`` on a config
    without an ``init_cfg`` gives one with no type (mmengine: a bare
    KeyError 'type'); a whole-model file given without its prefix restores
    nothing. Each is named with the line that fixes it."""
    from moppa_mm.models.backbones.load_check import PretrainedMismatchError
    build = MODELS['vit'][0]
    init_cfg, _ = base_file(build, tmp_path)
    with pytest.raises(ValueError, match=r"names a checkpoint but no type.*"
                                         r"init_cfg.type='Pretrained'"):
        build(init_cfg=dict(checkpoint=init_cfg['checkpoint']))
    without_prefix = dict(type='Pretrained', checkpoint=init_cfg['checkpoint'])
    with pytest.raises(PretrainedMismatchError,
                       match=r"behind the prefix 'backbone.': set "
                             r"model.backbone.init_cfg.prefix='backbone.'"):
        build(init_cfg=without_prefix)
    build(init_cfg=init_cfg)  # with both: the base loads

"""model-index.yml lists every config with the paper's result."""
import glob
import os.path as osp
from statistics import mean

from mmengine.fileio import load

from moppa_mm.datasets import VTAB_TASKS
from vtab_table import PAPER_MOPPA, config_stem  # tools/
from tests.conftest import REPO


def index_models():
    index = load(osp.join(REPO, 'model-index.yml'))
    assert [c['Name'] for c in index['Collections']] == ['MoPPA', 'Baselines']
    models = []
    for metafile in index['Import']:
        models += load(osp.join(REPO, metafile))['Models']
    return models


def top1(model):
    (result, ) = model['Results']
    assert result['Task'] == 'Image Classification'
    return result['Metrics']['Top 1 Accuracy']


def test_every_config_is_indexed_once_and_every_entry_exists():
    configs = sorted(osp.relpath(path, REPO) for path in glob.glob(
        osp.join(REPO, 'configs', '**', '*.py'), recursive=True)
        if '_base_' not in path)
    models = index_models()
    indexed = [m['Config'] for m in models]
    assert sorted(indexed) == configs
    assert len({m['Name'] for m in models}) == len(models)
    baseline = ('linear_', 'full_', 'ssf_', 'lora_')
    assert all(m['In Collection'] == ('Baselines' if m['Name'].startswith(baseline)
                                      else 'MoPPA') for m in models)


def test_results_are_the_papers():
    models = {m['Name']: m for m in index_models()}
    for pretrain, row in PAPER_MOPPA.items():
        for task, paper in zip(VTAB_TASKS, row):
            assert top1(models[f'moppa_{config_stem(pretrain)}-pre_vtab1k-{task}']) == paper
    fgvc = ('cub', 'nabirds', 'oxford_flowers', 'stanford_dogs', 'stanford_cars')
    for pretrain, paper_average in (('mae', 84.1), ('in21k', 91.0)):  # Table 3
        ours = [top1(models[f'moppa_vit-b-p16_{pretrain}-pre_fgvc-{d}']) for d in fgvc]
        assert abs(mean(ours) - paper_average) < 0.05
    assert top1(models['moppa_vit-b-p16_in21k-augreg-pre_8xb64-110e_in1k']) == 83.9
    for name in ('cascade-mask-rcnn_moppa-swin-b-p4-w7_fpn_ms-crop-3x_coco',
                 'cascade_moppa_swin_b_coco'):
        box, mask = models[name]['Results']
        assert box['Metrics'] == {'box AP': 52.7}
        assert mask['Metrics'] == {'mask AP': 45.6}


def test_baseline_results_are_the_papers_where_it_has_them():
    from vtab_table import PAPER_BASELINES  # tools/
    models = {m['Name']: m for m in index_models()}
    rows = PAPER_BASELINES['in21k-augreg']
    for method, row in rows.items():
        for task, paper in zip(VTAB_TASKS, row):
            assert top1(models[f'{method}_vit-b-p16_in21k-augreg-pre_vtab1k-{task}']) == paper
    for task in VTAB_TASKS:  # the paper has no linear probe
        assert 'Results' not in models[f'linear_vit-b-p16_in21k-augreg-pre_vtab1k-{task}']
    fgvc = ('cub', 'nabirds', 'oxford_flowers', 'stanford_dogs', 'stanford_cars')
    for method, paper_average in (('full', 88.5), ('lora', 89.5)):  # Table 3, IN22K
        ours = [top1(models[f'{method}_vit-b-p16_in21k-pre_fgvc-{d}']) for d in fgvc]
        assert abs(mean(ours) - paper_average) < 0.05
    for method in ('linear', 'ssf'):
        assert all('Results' not in models[f'{method}_vit-b-p16_in21k-pre_fgvc-{d}']
                   for d in fgvc)
    meta = models['lora_vit-b-p16_in21k-augreg-pre_vtab1k-cifar']['Metadata']
    assert meta['Trainable parameters (M, paper)'] == 0.29
    assert meta['Trainable parameters (M, moppa_mm, mean head)'] == 0.33

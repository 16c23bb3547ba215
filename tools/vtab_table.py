"""VTAB-1K results shaped like the paper's tables (Table 2, supplementary), for
``tools/vtab_sweep.py``, ``tools/misc/generate_configs.py`` and the model index."""
import csv
import glob
import io
import json
import os.path as osp
from collections import OrderedDict
from typing import Dict, List, Mapping, Optional

from moppa_mm.datasets.vtab import VTAB_GROUPS, VTAB_TASKS

# The paper's per-task MoPPA rows (supplementary table), in VTAB_TASKS order.
PAPER_MOPPA = {
    'mae': [39.1, 90.4, 62.9, 85.6, 86.3, 89.6, 26.9, 86.1, 94.3, 80.4, 75.6,
            81.1, 63.7, 51.4, 82.0, 84.7, 56.2, 37.5, 44.5],
    'mocov3': [62.6, 92.5, 69.4, 92.1, 88.3, 89.6, 42.8, 86.9, 95.5, 83.6, 75.2,
               82.5, 64.5, 49.1, 83.2, 84.8, 53.6, 33.1, 45.4],
    'in21k-augreg': [79.7, 94.9, 78.3, 99.7, 92.4, 92.4, 57.5, 87.6, 96.1, 89.2,
                     76.4, 81.4, 63.7, 54.6, 83.3, 86.7, 56.2, 34.0, 43.1],
    # other backbones (supplementary tables), keyed '<backbone>_<pre-training>'
    'swin-b-p4-w7_in21k': [70.7, 93.9, 76.2, 99.7, 92.0, 90.0, 54.7, 87.3, 96.1,
                           88.4, 76.9, 78.1, 59.9, 56.1, 84.0, 87.6, 54.9, 32.2, 38.4],
    'vit-l-p16_in21k': [81.6, 95.5, 78.3, 99.6, 92.5, 92.2, 58.9, 88.3, 96.1, 89.1,
                        76.4, 80.6, 63.7, 54.7, 83.6, 88.0, 56.2, 33.0, 44.3],
}
# ... and the group means / average / params the paper prints for them
PAPER_SUMMARY = {
    'mae': dict(Natural=68.7, Specialized=84.1, Structured=62.7, Average=69.4,
                params=0.26),
    'mocov3': dict(Natural=76.8, Specialized=85.3, Structured=62.0, Average=72.4,
                   params=0.26),
    'in21k-augreg': dict(Natural=85.0, Specialized=87.3, Structured=62.9,
                         Average=76.2, params=0.26),
    'swin-b-p4-w7_in21k': dict(Natural=82.5, Specialized=87.2, Structured=61.4,
                               Average=74.6, params=0.39),
    'vit-l-p16_in21k': dict(Natural=85.5, Specialized=87.5, Structured=63.0,
                            Average=76.5, params=0.65),
}
PRETRAINS = tuple(PAPER_MOPPA)
HEADER = ['method'] + list(VTAB_TASKS) + [*VTAB_GROUPS, 'Average', 'params (M)']


def config_stem(pretrain: str) -> str:
    """``<backbone>_<pre-training>`` of a VTAB-1K config name
    (``configs/vtab1k/moppa_<stem>-pre_vtab1k-<task>.py``): a bare pre-training
    name is ViT-B/16's."""
    return pretrain if '_' in pretrain else f'vit-b-p16_{pretrain}'


def paper_results(pretrain: str) -> 'OrderedDict[str, float]':
    if pretrain not in PAPER_MOPPA:
        raise ValueError(f'unknown pre-training {pretrain!r}, expected one of '
                         f'{PRETRAINS}')
    return OrderedDict(zip(VTAB_TASKS, PAPER_MOPPA[pretrain]))


def summarize(results: Mapping[str, float]) -> 'OrderedDict[str, float]':
    """Group means and the paper's "weighted average": each group's mean weighted
    by its number of tasks, i.e. the mean over the 19 tasks."""
    missing = [t for t in VTAB_TASKS if t not in results]
    if missing:
        raise KeyError(f'results are missing tasks: {", ".join(missing)}')
    summary = OrderedDict()
    for group, tasks in VTAB_GROUPS.items():
        summary[group] = sum(results[t] for t in tasks) / len(tasks)
    summary['Average'] = sum(
        summary[g] * len(tasks) for g, tasks in VTAB_GROUPS.items()) / len(VTAB_TASKS)
    return summary


def collect(work_root: str) -> Dict[str, float]:
    """Top-1 per task from ``<work_root>/<task>/test/*/*.json`` (what
    ``tools/test.py --work-dir <work_root>/<task>/test`` writes); the newest
    file wins. Tasks without results are left out."""
    results = {}
    for task in VTAB_TASKS:
        paths = sorted(glob.glob(osp.join(work_root, task, 'test', '*', '*.json')))
        for path in reversed(paths):
            with open(path) as f:
                metrics = json.load(f)
            if 'accuracy/top1' in metrics:
                results[task] = float(metrics['accuracy/top1'])
                break
    return results


def _row(name: str, results: Mapping[str, float], params: Optional[float]) -> List[str]:
    cells = [name] + [f'{results[t]:.1f}' if t in results else '-' for t in VTAB_TASKS]
    if all(t in results for t in VTAB_TASKS):
        summary = summarize(results)
        cells += [f'{summary[k]:.1f}' for k in (*VTAB_GROUPS, 'Average')]
    else:
        cells += ['-'] * (len(VTAB_GROUPS) + 1)
    cells.append(f'{params:.3f}' if params is not None else '-')
    return cells


def to_markdown(rows: List[List[str]]) -> str:
    lines = ['| ' + ' | '.join(rows[0]) + ' |',
             '|' + '---|' * len(rows[0])]
    lines += ['| ' + ' | '.join(r) + ' |' for r in rows[1:]]
    return '\n'.join(lines) + '\n'


def to_csv(rows: List[List[str]]) -> str:
    out = io.StringIO()
    csv.writer(out).writerows(rows)
    return out.getvalue()


# ---- Baselines: the same table across fine-tuning methods ----
# config prefix -> row name; configs are '<prefix>_vit-b-p16_<pre-training>-pre_vtab1k-<task>.py'
METHODS = OrderedDict([
    ('linear', 'Linear probe'),
    ('full', 'Full fine-tuning'),
    ('ssf', 'Scale & shift (SSF)'),
    ('lora', 'LoRA'),
    ('moppa', 'MoPPA'),
])
# The paper's baseline rows for IN22K SUP (supplementary per-task table), in
# VTAB_TASKS order; it has none for linear probing. Its SSF is SSF (Lian et
# al.) with scale & shift after every operation; ours scales and shifts where
# MoPPA does (0.13M in the backbone against its 0.24M in all).
PAPER_BASELINES = {
    'in21k-augreg': OrderedDict([
        ('full', [68.9, 87.7, 64.3, 97.2, 86.9, 87.4, 38.8, 79.7, 95.7, 84.2, 73.9,
                  56.3, 58.6, 41.7, 65.5, 57.5, 46.7, 25.7, 29.1]),
        ('lora', [67.1, 91.4, 69.4, 98.8, 90.4, 85.3, 54.0, 84.9, 95.3, 84.4, 73.6,
                  82.9, 69.2, 49.8, 78.5, 75.7, 47.1, 31.0, 44.0]),
        ('ssf', [69.0, 92.6, 75.1, 99.4, 91.8, 90.2, 52.9, 87.4, 95.9, 87.4, 75.5,
                 75.9, 62.3, 53.3, 80.6, 77.3, 54.9, 29.5, 37.9]),
    ]),
}
PAPER_BASELINE_SUMMARY = {
    'in21k-augreg': {
        'full': dict(Natural=75.9, Specialized=83.4, Structured=47.6, Average=65.6,
                     params=85.80),
        'lora': dict(Natural=79.5, Specialized=84.6, Structured=59.8, Average=72.3,
                     params=0.29),
        'ssf': dict(Natural=81.6, Specialized=86.6, Structured=59.0, Average=73.1,
                    params=0.24),
    },
}


def paper_method_results(method: str, pretrain: str
                         ) -> Optional['OrderedDict[str, float]']:
    """The paper's per-task row of ``method`` with ``pretrain``, or None where
    the paper has none (linear probing; baselines other than IN22K SUP)."""
    if method not in METHODS:
        raise ValueError(f'unknown method {method!r}, expected one of {tuple(METHODS)}')
    if method == 'moppa':
        return paper_results(pretrain)
    row = PAPER_BASELINES.get(pretrain, {}).get(method)
    return None if row is None else OrderedDict(zip(VTAB_TASKS, row))


def paper_method_params(method: str, pretrain: str) -> Optional[float]:
    if method == 'moppa':
        return PAPER_SUMMARY[pretrain]['params']
    return PAPER_BASELINE_SUMMARY.get(pretrain, {}).get(method, {}).get('params')


def table(pretrain: str, measured: Mapping[str, Mapping[str, float]],
          our_params: Optional[Mapping[str, float]] = None) -> List[List[str]]:
    """:data:`HEADER`, then per method (in :data:`METHODS` order) our row and
    the paper's row where it has one: the paper's per-task table across
    methods (every row of the paper's where nothing is measured).

    Args:
        pretrain (str): Pre-training, e.g. ``'in21k-augreg'``.
        measured (Mapping[str, Mapping[str, float]]): ``{method: {task: top1}}``
            of our runs; a method without any result still gets its row.
        our_params (Mapping[str, float], optional): ``{method: trainable M}``.
    """
    unknown = [m for m in measured if m not in METHODS]
    if unknown:
        raise ValueError(f'unknown method(s) {unknown}, expected some of '
                         f'{tuple(METHODS)}')
    our_params = our_params or {}
    rows = [list(HEADER)]
    for method, name in METHODS.items():
        if method in measured:
            rows.append(_row(f'{name} (moppa_mm, {pretrain})', measured[method],
                             our_params.get(method)))
        paper = paper_method_results(method, pretrain)
        if paper is not None and (method in measured or not measured):
            rows.append(_row(f'{name} (paper, {pretrain})', paper,
                             paper_method_params(method, pretrain)))
    return rows

"""Run (or collect) the 19 VTAB-1K tasks for one pre-training and write the
paper-shaped table (Markdown + CSV) with the paper's MoPPA row beside ours.

    # train + test every task, one after another (GPUS>1 uses tools/dist_*.sh)
    python tools/vtab_sweep.py run --pretrain in21k-augreg [--gpus 8] [--tasks cifar dtd]
    # only gather the results of earlier runs
    python tools/vtab_sweep.py collect --pretrain in21k-augreg
    # other backbones: --pretrain swin-b-p4-w7_in21k, --pretrain vit-l-p16_in21k

Work dirs: <work-root>/<pretrain>/<task>/ (training) and .../<task>/test/ (test).
Outputs: <out>.md and <out>.csv (default results/vtab1k_<pretrain>).

Baselines (configs <method>_vit-b-p16_in21k-augreg-pre_vtab1k-<task>.py):
    python tools/vtab_sweep.py run --method lora --pretrain in21k-augreg
    # every method's results (ours where measured) beside the paper's rows
    python tools/vtab_sweep.py compare --pretrain in21k-augreg
Their work dirs: <work-root>/<method>/<pretrain>/<task>/ (MoPPA's stay as above);
outputs: results/vtab1k_<method>_<pretrain>, results/vtab1k_compare_<pretrain>.
"""
import argparse
import os
import os.path as osp
import subprocess
import sys

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
sys.path.insert(0, ROOT)

from moppa_mm.datasets import VTAB_TASKS  # noqa: E402
from moppa_mm.evaluation import vtab_table  # noqa: E402


def config_path(pretrain: str, task: str) -> str:
    return osp.join(ROOT, 'configs', 'vtab1k',
                    f'moppa_{vtab_table.config_stem(pretrain)}-pre_vtab1k-{task}.py')


def method_config_path(method: str, pretrain: str, task: str) -> str:
    """The config of ``method`` (a config prefix, ``vtab_table.METHODS``):
    MoPPA's with its prefix swapped."""
    path = config_path(pretrain, task)
    return osp.join(osp.dirname(path), method + osp.basename(path)[len('moppa'):])


def method_work_root(work_root: str, method: str, pretrain: str) -> str:
    if method == 'moppa':
        return osp.join(work_root, pretrain)
    return osp.join(work_root, method, pretrain)


def run_task(pretrain, task, work_dir, gpus, extra, method='moppa'):
    config = method_config_path(method, pretrain, task)
    if gpus > 1:
        train = ['bash', osp.join(ROOT, 'tools/dist_train.sh'), config, str(gpus)]
    else:
        train = [sys.executable, osp.join(ROOT, 'tools/train.py'), config]
    subprocess.run(train + ['--work-dir', work_dir] + extra, check=True)
    with open(osp.join(work_dir, 'last_checkpoint')) as f:
        checkpoint = f.read().strip()
    if gpus > 1:
        test = ['bash', osp.join(ROOT, 'tools/dist_test.sh'), config, checkpoint,
                str(gpus)]
    else:
        test = [sys.executable, osp.join(ROOT, 'tools/test.py'), config, checkpoint]
    subprocess.run(test + ['--work-dir', osp.join(work_dir, 'test')] + extra, check=True)


def trainable_params(pretrain: str, method: str = 'moppa') -> float:
    """Trainable parameters (M), averaged over the 19 tasks' heads."""
    from mmengine.config import Config
    from mmengine.registry import init_default_scope
    from mmpretrain.registry import MODELS
    init_default_scope('mmpretrain')
    cfg = Config.fromfile(method_config_path(method, pretrain, 'cifar'))
    backbone = cfg.model.backbone
    (backbone.module if backbone.type == 'LoRAModel' else backbone).init_cfg = None
    model = MODELS.build(cfg.model)
    adapters = sum(p.numel() for p in model.backbone.parameters() if p.requires_grad)
    dims = cfg.model.head.in_channels
    heads = sum(dims * c + c for c in VTAB_TASKS.values()) / len(VTAB_TASKS)
    return (adapters + heads) / 1e6


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('mode', choices=('run', 'collect', 'compare'))
    parser.add_argument('--pretrain', required=True, choices=vtab_table.PRETRAINS)
    parser.add_argument('--method', default='moppa', choices=tuple(vtab_table.METHODS),
                        help='run / collect: the configs\' prefix (default: moppa)')
    parser.add_argument('--methods', nargs='+', choices=tuple(vtab_table.METHODS),
                        default=list(vtab_table.METHODS), help='compare: the rows')
    parser.add_argument('--work-root', default='work_dirs/vtab1k')
    parser.add_argument('--tasks', nargs='+', default=list(VTAB_TASKS))
    parser.add_argument('--gpus', type=int, default=1)
    parser.add_argument('--out', help='output path without extension')
    parser.add_argument('--no-params', action='store_true',
                        help='skip building the model to count parameters')
    args, extra = parser.parse_known_args()
    unknown = [t for t in args.tasks if t not in VTAB_TASKS]
    if unknown:
        parser.error(f'unknown VTAB-1K task(s) {unknown}; the 19 tasks are: '
                     f'{", ".join(VTAB_TASKS)}')
    if args.mode == 'compare':
        return compare(args)
    if not osp.isfile(method_config_path(args.method, args.pretrain, 'cifar')):
        parser.error(f'no {args.method} configs for --pretrain {args.pretrain} '
                     f'({method_config_path(args.method, args.pretrain, "<task>")})')
    work_root = method_work_root(args.work_root, args.method, args.pretrain)
    if args.mode == 'run':
        for task in args.tasks:
            run_task(args.pretrain, task, osp.join(work_root, task), args.gpus, extra,
                     method=args.method)
    results = vtab_table.collect(work_root)
    params = None if args.no_params else trainable_params(args.pretrain, args.method)
    if args.method == 'moppa':
        rows = vtab_table.table(args.pretrain, results, params)
        name = args.pretrain
    else:  # a baseline: its row beside the paper's
        rows = vtab_table.comparison_table(args.pretrain, {args.method: results},
                                           {args.method: params})
        name = f'{args.method}_{args.pretrain}'
    out = args.out or osp.join('results', f'vtab1k_{name}')
    write_outputs(rows, out)
    print(f'{len(results)}/19 tasks have results; wrote {out}.md and {out}.csv')


def write_outputs(rows, out: str) -> None:
    os.makedirs(osp.dirname(osp.abspath(out)), exist_ok=True)
    with open(out + '.md', 'w') as f:
        f.write(vtab_table.to_markdown(rows))
    with open(out + '.csv', 'w') as f:
        f.write(vtab_table.to_csv(rows))
    print(vtab_table.to_markdown(rows))


def compare(args) -> None:
    """Every method's collected results (ours) beside the paper's rows."""
    measured, params = {}, {}
    for method in args.methods:
        measured[method] = vtab_table.collect(
            method_work_root(args.work_root, method, args.pretrain))
        if not args.no_params and osp.isfile(
                method_config_path(method, args.pretrain, 'cifar')):
            params[method] = trainable_params(args.pretrain, method)
    rows = vtab_table.comparison_table(args.pretrain, measured, params)
    out = args.out or osp.join('results', f'vtab1k_compare_{args.pretrain}')
    write_outputs(rows, out)
    counts = ', '.join(f'{m} {len(r)}/19' for m, r in measured.items())
    print(f'tasks with results: {counts}; wrote {out}.md and {out}.csv')


if __name__ == '__main__':
    main()

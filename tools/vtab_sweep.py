"""Run (or collect) the 19 VTAB-1K tasks for one pre-training and write the
paper-shaped table (Markdown + CSV) with the paper's MoPPA row beside ours.

    # train + test every task, one after another (GPUS>1 uses tools/dist_*.sh)
    python tools/vtab_sweep.py run --pretrain in21k-augreg [--gpus 8] [--tasks cifar dtd]
    # only gather the results of earlier runs
    python tools/vtab_sweep.py collect --pretrain in21k-augreg
    # other backbones: --pretrain swin-b-p4-w7_in21k, --pretrain vit-l-p16_in21k

Work dirs: <work-root>/<pretrain>/<task>/ (training) and .../<task>/test/ (test).
Outputs: <out>.md and <out>.csv (default results/vtab1k_<pretrain>).
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


def run_task(pretrain, task, work_dir, gpus, extra):
    config = config_path(pretrain, task)
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


def trainable_params(pretrain: str) -> float:
    """Trainable parameters (M), averaged over the 19 tasks' heads."""
    from mmengine.config import Config
    from mmengine.registry import init_default_scope
    from mmpretrain.registry import MODELS
    init_default_scope('mmpretrain')
    cfg = Config.fromfile(config_path(pretrain, 'cifar'))
    cfg.model.backbone.init_cfg = None
    model = MODELS.build(cfg.model)
    adapters = sum(p.numel() for p in model.backbone.parameters() if p.requires_grad)
    dims = cfg.model.head.in_channels
    heads = sum(dims * c + c for c in VTAB_TASKS.values()) / len(VTAB_TASKS)
    return (adapters + heads) / 1e6


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('mode', choices=('run', 'collect'))
    parser.add_argument('--pretrain', required=True, choices=vtab_table.PRETRAINS)
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
    work_root = osp.join(args.work_root, args.pretrain)
    if args.mode == 'run':
        for task in args.tasks:
            run_task(args.pretrain, task, osp.join(work_root, task), args.gpus, extra)
    results = vtab_table.collect(work_root)
    params = None if args.no_params else trainable_params(args.pretrain)
    rows = vtab_table.table(args.pretrain, results, params)
    out = args.out or osp.join('results', f'vtab1k_{args.pretrain}')
    os.makedirs(osp.dirname(osp.abspath(out)), exist_ok=True)
    with open(out + '.md', 'w') as f:
        f.write(vtab_table.to_markdown(rows))
    with open(out + '.csv', 'w') as f:
        f.write(vtab_table.to_csv(rows))
    print(vtab_table.to_markdown(rows))
    print(f'{len(results)}/19 tasks have results; wrote {out}.md and {out}.csv')


if __name__ == '__main__':
    main()

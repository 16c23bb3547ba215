"""Run the 19 VTAB-1K tasks of one pre-training, or collect their results, and
write the paper-shaped table with the paper's rows beside ours (<out>.md and
<out>.csv; default results/vtab1k_[<method>_]<pretrain>).

    python tools/vtab_sweep.py run --pretrain in21k-augreg [--gpus 8] [--tasks cifar dtd]
    python tools/vtab_sweep.py collect --pretrain in21k-augreg    # the runs' results only
    python tools/vtab_sweep.py test-bank --pretrain in21k-augreg  # every task on ONE base load
    python tools/vtab_sweep.py run --method lora --pretrain in21k-augreg  # a baseline
    python tools/vtab_sweep.py compare --pretrain in21k-augreg    # every method's rows

Other backbones: --pretrain swin-b-p4-w7_in21k or vit-l-p16_in21k. Configs:
configs/vtab1k/<method>_<backbone>_<pretrain>-pre_vtab1k-<task>.py, or the same names
in --config-dir. Work dirs: <work-root>/[<method>/]<pretrain>/<task>/ (no <method>/
for MoPPA), the test's in .../<task>/test/ (GPUS>1 runs tools/dist_*.sh).
"""
import argparse
import os
import os.path as osp
import subprocess
import sys
import time

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
sys.path.insert(0, ROOT)

from moppa_mm.datasets import VTAB_TASKS  # noqa: E402
import vtab_table  # noqa: E402  tools/vtab_table.py


CONFIG_DIR = osp.join(ROOT, 'configs', 'vtab1k')


def config_path(method: str, pretrain: str, task: str, config_dir: str = CONFIG_DIR) -> str:
    """The config of ``method`` (a config prefix, ``vtab_table.METHODS``)."""
    return osp.join(config_dir,
                    f'{method}_{vtab_table.config_stem(pretrain)}-pre_vtab1k-{task}.py')


def method_work_root(work_root: str, method: str, pretrain: str) -> str:
    """MoPPA's runs under ``<work_root>/<pretrain>``, a baseline's under
    ``<work_root>/<method>/<pretrain>``."""
    return osp.join(work_root, pretrain) if method == 'moppa' else \
        osp.join(work_root, method, pretrain)


def tool(name: str, gpus: int, *args: str) -> list:
    """The command of ``tools/<name>.py``, or of ``tools/dist_<name>.sh`` on ``gpus``."""
    if gpus > 1:
        return ['bash', osp.join(ROOT, f'tools/dist_{name}.sh'), *args, str(gpus)]
    return [sys.executable, osp.join(ROOT, f'tools/{name}.py'), *args]


def run_task(config: str, work_dir: str, gpus: int, extra) -> None:
    subprocess.run(tool('train', gpus, config) + ['--work-dir', work_dir] + extra, check=True)
    with open(osp.join(work_dir, 'last_checkpoint')) as f:
        checkpoint = f.read().strip()
    subprocess.run(tool('test', gpus, config, checkpoint)
                   + ['--work-dir', osp.join(work_dir, 'test')] + extra, check=True)


def trainable_params(pretrain: str, method: str, config_dir: str = CONFIG_DIR) -> float:
    """Trainable parameters (M), averaged over the 19 tasks' heads."""
    from analysis.param_breakdown import build_model  # tools/; it loads no weights
    from moppa_mm.utils.config_files import read_config
    cfg = read_config(config_path(method, pretrain, 'cifar', config_dir))
    model = build_model(cfg)
    adapters = sum(p.numel() for p in model.backbone.parameters() if p.requires_grad)
    dims = cfg.model.head.in_channels
    heads = sum(dims * c + c for c in VTAB_TASKS.values()) / len(VTAB_TASKS)
    return (adapters + heads) / 1e6


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('mode', choices=('run', 'test-bank', 'collect', 'compare'))
    parser.add_argument('--pretrain', required=True, choices=vtab_table.PRETRAINS)
    parser.add_argument('--method', default='moppa', choices=tuple(vtab_table.METHODS),
                        help='run / collect: the configs\' prefix (default: moppa)')
    parser.add_argument('--methods', nargs='+', choices=tuple(vtab_table.METHODS),
                        default=list(vtab_table.METHODS), help='compare: the rows')
    parser.add_argument('--work-root', default='work_dirs/vtab1k')
    parser.add_argument('--config-dir', default=CONFIG_DIR,
                        help='the per-task configs (default: configs/vtab1k)')
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
    first_config = config_path(args.method, args.pretrain, args.tasks[0], args.config_dir)
    if not osp.isfile(first_config):
        parser.error(f'no {args.method} configs for --pretrain {args.pretrain} '
                     f'({first_config})')
    work_root = method_work_root(args.work_root, args.method, args.pretrain)
    if args.mode == 'run':
        for task in args.tasks:
            run_task(config_path(args.method, args.pretrain, task, args.config_dir),
                     osp.join(work_root, task), args.gpus, extra)
    elif args.mode == 'test-bank':
        if args.gpus > 1:
            parser.error('test-bank runs in one process (--gpus 1)')
        test_bank(args, extra, work_root, parser)
    results = vtab_table.collect(work_root)
    name = args.pretrain if args.method == 'moppa' else f'{args.method}_{args.pretrain}'
    out = write_table(args, {args.method: results}, name)
    print(f'{len(results)}/19 tasks have results; wrote {out}.md and {out}.csv')


def write_table(args, measured, name: str) -> str:
    """The table of ``measured`` beside the paper's rows (with each method's
    trainable parameters unless ``--no-params``), as ``<out>.md`` and ``.csv``;
    returns ``<out>``."""
    params = {method: trainable_params(args.pretrain, method, args.config_dir)
              for method in measured if not args.no_params and osp.isfile(
                  config_path(method, args.pretrain, 'cifar', args.config_dir))}
    rows = vtab_table.table(args.pretrain, measured, params)
    out = args.out or osp.join('results', f'vtab1k_{name}')
    os.makedirs(osp.dirname(osp.abspath(out)), exist_ok=True)
    with open(out + '.md', 'w') as f:
        f.write(vtab_table.to_markdown(rows))
    with open(out + '.csv', 'w') as f:
        f.write(vtab_table.to_csv(rows))
    print(vtab_table.to_markdown(rows))
    return out


def last_checkpoints(work_root: str, tasks) -> dict:
    """``{task: checkpoint}`` from each run's ``<task>/last_checkpoint``;
    tasks without one are named and left out."""
    found = {}
    for task in tasks:
        marker = osp.join(work_root, task, 'last_checkpoint')
        if not osp.isfile(marker):
            print(f'test-bank: {task} left out: no {marker} (train it with `run`)')
            continue
        with open(marker) as f:
            found[task] = f.read().strip()
    return found


def test_config(path: str, work_dir: str, cfg_options):
    """The config as MMPretrain's tools/test.py makes it (no ``load_from``:
    the bank holds the weights), checked as tools/test.py checks it."""
    from preflight import check_config, load_config, mmpretrain_loader_defaults  # tools/
    cfg = load_config(path, cfg_options=cfg_options, work_dir=work_dir)
    cfg.load_from = None
    mmpretrain_loader_defaults(cfg, ('test_dataloader', ),
                               dict(pin_memory=True, collate_fn=dict(type='default_collate')), {})
    check_config(cfg, mode='test')  # the base is read (and checked) once, by the bank
    return cfg


def test_bank(args, extra, work_root: str, parser) -> None:
    """Every task's last checkpoint on one base load (``moppa_mm.AdapterBank``):
    one Runner per task from its config on the bank's model, switched to the
    task; it writes what ``tools/test.py --work-dir <task>/test`` writes."""
    from mmengine.config import DictAction
    from mmengine.device import get_device
    from mmengine.evaluator import DumpResults

    from moppa_mm import AdapterBank
    from moppa_mm.utils.malloc import keep_freed_memory
    options = argparse.ArgumentParser(prog='vtab_sweep.py test-bank')
    options.add_argument('--cfg-options', nargs='+', action=DictAction,
                         help='as tools/test.py\'s, for every task')
    options.add_argument('--out-preds', metavar='DIR',
                         help='each task\'s predictions to DIR/<task>.pkl (as '
                         'tools/test.py --out)')
    options = options.parse_args(extra)
    checkpoints = last_checkpoints(work_root, args.tasks)
    if not checkpoints:
        parser.error(f'test-bank: no task has a checkpoint under {work_root}')
    configs = {task: test_config(
        config_path(args.method, args.pretrain, task, args.config_dir),
        osp.join(work_root, task, 'test'), options.cfg_options) for task in checkpoints}
    device = get_device()
    if device == 'cpu':
        keep_freed_memory()
    start = time.perf_counter()
    try:
        bank = AdapterBank.from_config(next(iter(configs.values())), device=device)
    except TypeError as error:  # no MoPPA backbone (a baseline's configs)
        parser.error(f'test-bank --method {args.method}: {error}')
    base_seconds = time.perf_counter() - start
    added, switched = [], []
    for task, checkpoint in checkpoints.items():
        start = time.perf_counter()
        bank.add(task, checkpoint, cfg=configs[task])
        added.append(time.perf_counter() - start)
        start = time.perf_counter()
        bank.use(task)
        switched.append(time.perf_counter() - start)
        runner = bank.runner(task, configs[task])
        if options.out_preds:
            runner.test_evaluator.metrics.append(
                DumpResults(out_file_path=osp.join(options.out_preds, f'{task}.pkl')))
        runner.test()
    per_task = sum(bank.task_bytes(t) for t in bank.names()) / len(bank.names())
    print(f'test-bank: {len(checkpoints)} tasks on one base ({bank.base_bytes() / 2**20:.1f} '
          f'MiB, built and loaded in {base_seconds:.2f} s); per task: '
          f'{per_task / 2**20:.2f} MiB of adapters and heads, added in '
          f'{1e3 * sum(added) / len(added):.1f} ms, switched in '
          f'{1e3 * sum(switched) / len(switched):.2f} ms')


def compare(args) -> None:
    """Every method's collected results (ours) beside the paper's rows."""
    measured = {method: vtab_table.collect(method_work_root(args.work_root, method,
                                                            args.pretrain))
                for method in args.methods}
    out = write_table(args, measured, f'compare_{args.pretrain}')
    counts = ', '.join(f'{m} {len(r)}/19' for m, r in measured.items())
    print(f'tasks with results: {counts}; wrote {out}.md and {out}.csv')


if __name__ == '__main__':
    main()

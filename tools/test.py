"""Evaluate a checkpoint (full or adapter-only): used like mmdet's tools/test.py.

    python tools/test.py CONFIG CHECKPOINT [--work-dir DIR] [--out results.pkl]
        [--cfg-options k=v ...] [--launcher pytorch]
"""
import argparse
import os

import moppa_mm  # noqa: F401  first: torchvision fix, registries
from mmengine.config import DictAction
from mmengine.evaluator import DumpResults

from moppa_mm.utils.distributed import shutdown_distributed
from moppa_mm.utils.launch import build_runner, load_config


def parse_args():
    parser = argparse.ArgumentParser(description='Test a MoPPA model')
    parser.add_argument('config', help='test config file path')
    parser.add_argument('checkpoint', help='checkpoint file (adapter-only or full)')
    parser.add_argument('--work-dir', help='the dir to save logs and metrics')
    parser.add_argument('--out', type=str,
                        help='dump predictions to a pickle file (.pkl)')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction,
                        help='override settings of the config, xxx=yyy')
    parser.add_argument('--launcher', choices=['none', 'pytorch', 'slurm', 'mpi'],
                        default='none', help='job launcher')
    parser.add_argument('--local_rank', '--local-rank', type=int, default=0)
    args = parser.parse_args()
    if 'LOCAL_RANK' not in os.environ:
        os.environ['LOCAL_RANK'] = str(args.local_rank)
    return args


def main():
    args = parse_args()
    cfg = load_config(args.config, args.launcher, args.cfg_options, args.work_dir)
    cfg.load_from = args.checkpoint

    runner = build_runner(cfg, mode='test')
    if args.out is not None:
        assert args.out.endswith(('.pkl', '.pickle')), \
            f'--out must be a .pkl file, got {args.out!r}'
        runner.test_evaluator.metrics.append(DumpResults(out_file_path=args.out))
    runner.test()
    shutdown_distributed()


if __name__ == '__main__':
    main()

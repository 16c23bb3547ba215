"""Train a MoPPA model: used exactly like mmdet's / mmpretrain's tools/train.py.

    python tools/train.py CONFIG [--work-dir DIR] [--resume [CKPT]] [--amp]
        [--auto-scale-lr] [--cfg-options k=v ...] [--launcher pytorch]
"""
import argparse
import os

import moppa_mm  # noqa: F401  first: torchvision fix, registries
from mmengine.config import DictAction

from moppa_mm.utils.distributed import shutdown_distributed
from moppa_mm.utils.launch import build_runner, load_config


def parse_args():
    parser = argparse.ArgumentParser(description='Train a MoPPA model')
    parser.add_argument('config', help='train config file path')
    parser.add_argument('--work-dir', help='the dir to save logs and models')
    parser.add_argument('--amp', action='store_true',
                        help='enable automatic-mixed-precision training')
    parser.add_argument('--auto-scale-lr', action='store_true',
                        help='enable automatically scaling LR')
    parser.add_argument(
        '--resume', nargs='?', type=str, const='auto',
        help='resume from this checkpoint, or without a path from the latest '
        'one in the work directory')
    parser.add_argument(
        '--cfg-options', nargs='+', action=DictAction,
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
    if args.amp:
        cfg.optim_wrapper.type = 'AmpOptimWrapper'
        cfg.optim_wrapper.loss_scale = 'dynamic'
    if args.auto_scale_lr:
        if 'base_batch_size' not in cfg.get('auto_scale_lr', {}):
            raise RuntimeError('--auto-scale-lr needs auto_scale_lr.'
                               'base_batch_size in the config')
        cfg.auto_scale_lr.enable = True
    if args.resume == 'auto':
        cfg.resume = True
        cfg.load_from = None
    elif args.resume is not None:
        cfg.resume = True
        cfg.load_from = args.resume

    runner = build_runner(cfg, mode='train')
    runner.train()
    shutdown_distributed()


if __name__ == '__main__':
    main()

"""Train a model from an OpenMMLab config (MoPPA or not) with the flags of
MMDetection's and MMPretrain's own tools/train.py, our checks of the final
config before the Runner is built (``preflight``) and, without CUDA, gloo for
distributed runs (``cpu_distributed``):

    python tools/train.py CONFIG [--work-dir DIR] [--resume [CKPT]] [--amp]
        [--auto-scale-lr] [--no-validate] [--cfg-options k=v ...] [--launcher pytorch]
"""
import argparse

from preflight import (build_runner, load_config, mmpretrain_loader_defaults,
                       parse_tool_args, run_main)

import moppa_mm  # noqa: F401  its modules, in every registry, before the checks
from moppa_mm.utils.errors import InputValueError


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description='Train a model from a config')
    parser.add_argument('config', help='the config file')
    parser.add_argument('--work-dir', help='the folder for the logs and checkpoints')
    parser.add_argument('--resume', nargs='?', type=str, const='auto',
                        help='resume from CKPT or, without it, from the latest '
                        'checkpoint of the work dir')
    parser.add_argument('--amp', action='store_true', help='mixed precision training')
    parser.add_argument('--auto-scale-lr', action='store_true',
                        help="scale the lr by the batch size (the config's auto_scale_lr)")
    parser.add_argument('--no-validate', action='store_true', help='no validation')
    parser.add_argument('--no-pin-memory', action='store_true',
                        help='mmpretrain configs: no pin_memory in the data loaders')
    parser.add_argument('--no-persistent-workers', action='store_true',
                        help='mmpretrain configs: no persistent_workers in the data loaders')
    return parse_tool_args(parser, argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    cfg = load_config(args.config, args.launcher, args.cfg_options, args.work_dir)
    if args.amp:
        cfg.optim_wrapper.type = 'AmpOptimWrapper'
        cfg.optim_wrapper.setdefault('loss_scale', 'dynamic')
    if args.auto_scale_lr:
        if 'base_batch_size' not in (cfg.get('auto_scale_lr') or {}):
            raise InputValueError('--auto-scale-lr: the config has no '
                                  'auto_scale_lr.base_batch_size to scale from')
        cfg.auto_scale_lr.enable = True
    if args.resume is not None:
        cfg.resume = True
        cfg.load_from = None if args.resume == 'auto' else args.resume
    if args.no_validate:
        cfg.val_cfg = cfg.val_dataloader = cfg.val_evaluator = None
    mmpretrain_loader_defaults(
        cfg, ('train_dataloader', 'val_dataloader', 'test_dataloader'),
        dict(pin_memory=True, persistent_workers=True, collate_fn=dict(type='default_collate')),
        {**({'pin_memory': False} if args.no_pin_memory else {}),
         **({'persistent_workers': False} if args.no_persistent_workers else {})})
    build_runner(cfg, 'train').train()


if __name__ == '__main__':
    run_main(main, 'train.py')

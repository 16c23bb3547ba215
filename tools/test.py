"""Evaluate a checkpoint (full or adapter-only) of an OpenMMLab config with the
flags of MMDetection's, MMPretrain's and MMSegmentation's own tools/test.py, our
checks of the final config (``preflight``) and, without CUDA, gloo:

    python tools/test.py CONFIG CHECKPOINT [--work-dir DIR] [--out FILE]
        [--show-dir DIR] [--tta] [--cfg-options k=v ...] [--launcher pytorch]
"""
import argparse

import mmengine
from mmengine.config import ConfigDict
from preflight import (build_runner, load_config, mmpretrain_loader_defaults,
                       parse_tool_args, run_main)

import moppa_mm  # noqa: F401  its modules, in every registry, before the checks
from moppa_mm.utils.errors import InputValueError


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description='Test (evaluate) a checkpoint')
    parser.add_argument('config', help='the config file')
    parser.add_argument('checkpoint', help='the checkpoint file')
    parser.add_argument('--work-dir', help='the folder for the logs and metrics')
    parser.add_argument('--out', help='dump the predictions (mmseg: into this folder)')
    parser.add_argument('--out-item', choices=['metrics', 'pred'],
                        help='mmpretrain configs: what --out dumps')
    parser.add_argument('--show', action='store_true', help='show the predictions')
    parser.add_argument('--show-dir', help='paint the predictions into this folder')
    parser.add_argument('--wait-time', type=float, default=2, help='seconds per shown image')
    parser.add_argument('--interval', type=int, default=1, help='paint every N-th image')
    parser.add_argument('--tta', action='store_true', help='test-time augmentation')
    parser.add_argument('--no-pin-memory', action='store_true',
                        help='mmpretrain configs: no pin_memory in the data loader')
    return parse_tool_args(parser, argv)


def paint_predictions(cfg, scope: str, args) -> None:
    """Turn on the config's visualization hook, as each package's tool does."""
    hook = (cfg.get('default_hooks') or {}).get('visualization')
    if hook is None:
        raise InputValueError('--show / --show-dir: the config has no '
                              'default_hooks.visualization to paint with')
    if scope == 'mmpretrain':
        hook.update(enable=True, show=args.show, wait_time=args.wait_time,
                    out_dir=args.show_dir, interval=args.interval)
        return
    hook.update(draw=True, show=args.show, wait_time=args.wait_time)
    if scope == 'mmdet':
        hook.update(test_out_dir=args.show_dir)
    elif args.show_dir:  # mmseg
        cfg.visualizer.save_dir = args.show_dir


def test_time_augmentation(cfg, scope: str) -> None:
    """Wrap the model in the config's ``tta_model`` and test on its
    ``tta_pipeline`` (mmpretrain: flip averaging where the config has none)."""
    if scope == 'mmpretrain':
        cfg.setdefault('tta_model', dict(type='mmpretrain.AverageClsScoreTTA'))
        if 'tta_pipeline' not in cfg:
            pipeline = list(cfg.test_dataloader.dataset.pipeline)
            pipeline[-1] = dict(type='TestTimeAug', transforms=[
                [dict(type='RandomFlip', prob=1.), dict(type='RandomFlip', prob=0.)],
                [pipeline[-1]]])
            cfg.tta_pipeline = pipeline
    if 'tta_model' not in cfg or 'tta_pipeline' not in cfg:
        raise InputValueError('--tta: the config needs tta_model and tta_pipeline')
    cfg.model = ConfigDict(**cfg.tta_model, module=cfg.model)
    cfg.test_dataloader.dataset.pipeline = cfg.tta_pipeline


def main(argv=None) -> None:
    args = parse_args(argv)
    cfg = load_config(args.config, args.launcher, args.cfg_options, args.work_dir)
    cfg.load_from = args.checkpoint
    scope = cfg.get('default_scope', 'mmdet')
    if args.show or args.show_dir:
        paint_predictions(cfg, scope, args)
    if args.tta:
        test_time_augmentation(cfg, scope)
    if args.out and scope == 'mmseg':
        cfg.test_evaluator.update(output_dir=args.out, keep_results=True)
    mmpretrain_loader_defaults(cfg, ('test_dataloader', ),
                               dict(pin_memory=True, collate_fn=dict(type='default_collate')),
                               dict(pin_memory=False) if args.no_pin_memory else {})
    runner = build_runner(cfg, 'test')
    if args.out and scope != 'mmseg' and args.out_item != 'metrics':
        if scope == 'mmdet':
            from mmdet.evaluation import DumpDetResults as Dump
        else:
            from mmengine.evaluator import DumpResults as Dump
        runner.test_evaluator.metrics.append(Dump(out_file_path=args.out))
    metrics = runner.test()
    if args.out and args.out_item == 'metrics':
        mmengine.dump(metrics, args.out)


if __name__ == '__main__':
    run_main(main, 'test.py')

"""Draw the learned MoPPA maps (k, c, H1 per unit) and the routers of a trained
model, as PNGs; or, with --priors, the three priors' responses to a point
source (paper Fig. 2) straight from the operator.

    python tools/analysis/visualize_moppa.py CONFIG CHECKPOINT --out-dir DIR
    python tools/analysis/visualize_moppa.py --priors --out-dir DIR [--time 12]
"""
import argparse
import os.path as osp

import moppa_mm  # noqa: F401  first: torchvision fix, registries
from mmengine.config import Config
from mmengine.registry import MODELS, init_default_scope
from mmengine.runner import CheckpointLoader

from moppa_mm.visualization import (draw_learned_maps, draw_point_source_responses,
                                    load_moppa_parameters)


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('config', nargs='?', help='config file')
    parser.add_argument('checkpoint', nargs='?',
                        help='checkpoint (full or adapter-only)')
    parser.add_argument('--out-dir', required=True, help='where the PNGs go')
    parser.add_argument('--priors', action='store_true',
                        help='draw the priors\' point-source responses instead')
    parser.add_argument('--size', type=int, default=65, help='--priors grid size')
    parser.add_argument('--time', type=float, default=12.0, help='--priors t')
    args = parser.parse_args()
    if not args.priors and (args.config is None or args.checkpoint is None):
        parser.error('CONFIG and CHECKPOINT are needed (or --priors)')
    return args


def main():
    args = parse_args()
    if args.priors:
        path = draw_point_source_responses(
            osp.join(args.out_dir, 'priors_point_source.png'), args.size, args.time)
        print(f'wrote {path}')
        return
    for path, what in ((args.config, 'config'), (args.checkpoint, 'checkpoint')):
        if not osp.isfile(path):
            raise FileNotFoundError(f'{what} file not found: {path!r}')
    cfg = Config.fromfile(args.config)
    init_default_scope(cfg.get('default_scope', 'mmdet'))
    model = MODELS.build(cfg.model)  # no init_weights: only MoPPA tensors are drawn
    checkpoint = CheckpointLoader.load_checkpoint(args.checkpoint, map_location='cpu')
    state_dict = checkpoint.get('state_dict', checkpoint)
    count = load_moppa_parameters(model, state_dict)
    paths = draw_learned_maps(model, args.out_dir)
    print(f'{count} MoPPA tensors from {args.checkpoint}; wrote {len(paths)} PNGs '
          f'to {args.out_dir}')


if __name__ == '__main__':
    main()

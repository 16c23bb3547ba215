"""Draw the learned MoPPA maps (k, c, H1 per unit) and the routers of a trained
model, as PNGs; or, with --priors, the three priors' responses to a point
source (paper Fig. 2) straight from the operator.

    python tools/analysis/visualize_moppa.py CONFIG CHECKPOINT --out-dir DIR
    python tools/analysis/visualize_moppa.py --priors --out-dir DIR [--time 12]
"""
import argparse
import os
import os.path as osp
import sys
from typing import Dict, List, Tuple

import numpy as np
import torch
import torch.nn as nn

from mmengine.registry import MODELS, init_default_scope

import moppa_mm  # noqa: F401  registries (the config's model)
from moppa_mm.operators import EXPERTS, MoPPAUnit, dct2d
from moppa_mm.utils.checkpoints import load_checkpoint_file

# tools/, appended: tools/test.py must not shadow the standard `test`
sys.path.append(osp.dirname(osp.dirname(osp.abspath(__file__))))
from preflight import load_config, run_main  # noqa: E402

# what the paper calls each expert's frequency-indexed map (Hr, Wr, N)
FREQUENCY_MAPS = dict(heat='k (heat)', wave='c (wave)', poisson='H1 (Poisson source)')


def named_units(model: nn.Module) -> List[Tuple[str, MoPPAUnit]]:
    units = [(n, m) for n, m in model.named_modules() if isinstance(m, MoPPAUnit)]
    if not units:
        raise ValueError(f'{type(model).__name__} holds no MoPPA unit')
    return units


def point_source_responses(size: int = 65, time: float = 12.0, eta: float = 1e-3
                           ) -> Dict[str, np.ndarray]:
    """Each prior alone applied to a unit impulse at the centre of a
    ``size x size`` grid, through :class:`MoPPAUnit` (one channel, one head).

    heat ``exp(-k w^2 t)`` diffuses the impulse into a Gaussian of variance
    ``2 k t``; wave ``cos(c |w| t)`` sends it out as a ring of radius ``c t``;
    Poisson takes the impulse as its source ``SD`` and returns the potential
    ``SD / (w^2 + eta)``, peaked at the source and falling off with distance.
    k = c = 1, in pixels. Returns ``{expert: (size, size) array}``.
    """
    impulse = torch.zeros(1, size, size, 1)
    impulse[0, size // 2, size // 2, 0] = 1.0
    responses = {}
    with torch.no_grad():
        for expert in EXPERTS:
            unit = MoPPAUnit(1, 1, size, eta=eta, experts=(expert, )).eval()
            frequency, channel = unit.expert_maps(expert)
            if expert == 'poisson':  # the impulse is the source: H1 = DCT(impulse)
                frequency.copy_(dct2d(impulse)[0])  # (H, W, 1)
                channel.fill_(1.0)
                x = torch.zeros_like(impulse)
            else:  # k or c, t
                frequency.fill_(1.0)
                channel.fill_(time)
                x = impulse
            responses[expert] = unit(x)[0, :, :, 0].numpy()  # (H, W)
    return responses


def _pyplot():
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    return plt


def draw_point_source_responses(path: str, size: int = 65, time: float = 12.0) -> str:
    """Save the three responses of :func:`point_source_responses` as one PNG."""
    plt = _pyplot()
    responses = point_source_responses(size, time)
    fig, axes = plt.subplots(1, 3, figsize=(10.5, 3.6))
    titles = dict(heat=f'heat: exp(-w²t), t={time:g}',
                  wave=f'wave: cos(|w|t), t={time:g}',
                  poisson='Poisson: source / (w²+η)')
    for ax, (expert, image) in zip(axes, responses.items()):
        shown = ax.imshow(image, cmap='RdBu_r', vmin=-abs(image).max(),
                          vmax=abs(image).max())
        ax.set_title(titles[expert], fontsize=9)
        ax.axis('off')
        fig.colorbar(shown, ax=ax, fraction=0.046)
    fig.suptitle('MoPPA priors: response to a point source')
    fig.tight_layout()
    os.makedirs(osp.dirname(osp.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def draw_learned_maps(model: nn.Module, out_dir: str) -> List[str]:
    """One PNG per MoPPA unit with its k, c and H1 maps over the reference
    frequency grid (mean over heads; low frequencies top left), and
    ``route_weights.png``: every unit's router as stacked bars. Returns the
    paths written."""
    plt = _pyplot()
    os.makedirs(out_dir, exist_ok=True)
    units = named_units(model)
    paths = []
    for name, unit in units:
        maps = [(FREQUENCY_MAPS[expert], unit.expert_maps(expert)[0])
                for expert in unit.experts if hasattr(unit, 'frequency_maps')]
        fig, axes = plt.subplots(1, len(maps), figsize=(3.6 * len(maps), 3.4),
                                 squeeze=False)
        for ax, (label, param) in zip(axes[0], maps):
            image = param.detach().float().mean(-1).cpu().numpy()  # (Hr, Wr)
            shown = ax.imshow(image, cmap='viridis')
            ax.set_title(label, fontsize=9)
            ax.set_xlabel('frequency m')
            ax.set_ylabel('frequency n')
            fig.colorbar(shown, ax=ax, fraction=0.046)
        weights = ', '.join(f'{e} {a:.3f}' for e, a in
                            zip(unit.experts, unit.route_weights().tolist()))
        fig.suptitle(f'{name}\nroute: {weights}', fontsize=9)
        fig.tight_layout()
        path = osp.join(out_dir, f'{name}.png')
        fig.savefig(path, dpi=80)
        plt.close(fig)
        paths.append(path)

    fig, ax = plt.subplots(figsize=(max(6, 0.35 * len(units)), 3.6))
    bottom = np.zeros(len(units))
    for expert in EXPERTS:
        values = np.array([
            dict(zip(u.experts, u.route_weights().tolist())).get(expert, 0.0)
            for _, u in units])
        ax.bar(range(len(units)), values, bottom=bottom, label=expert)
        bottom += values
    ax.set_xticks(range(len(units)))
    ax.set_xticklabels([n.replace('backbone.', '').replace('.moppa', '')
                        for n, _ in units], rotation=90, fontsize=7)
    ax.set_ylabel('route weight a = softmax(λ)')
    ax.set_ylim(0, 1)
    ax.legend(loc='upper right', fontsize=8)
    fig.tight_layout()
    path = osp.join(out_dir, 'route_weights.png')
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return paths + [path]


def load_moppa_parameters(model: nn.Module, state_dict: Dict[str, torch.Tensor]
                          ) -> int:
    """Copy every MoPPA unit's parameters from ``state_dict`` (a full or
    adapter-only checkpoint's) into ``model``. Raises if the checkpoint lacks
    any of them. Returns how many tensors were copied."""
    wanted = {f'{name}.{p}' for name, unit in named_units(model)
              for p, _ in unit.named_parameters()}
    missing = sorted(wanted - set(state_dict))
    if missing:
        raise KeyError(f'the checkpoint lacks {len(missing)} MoPPA parameters, '
                       f'e.g. {missing[:3]}: is it a checkpoint of this config?')
    for name, unit in named_units(model):  # unit by unit: no other adapter needed
        unit.load_state_dict({p: state_dict[f'{name}.{p}']
                              for p, _ in unit.named_parameters()})
    return len(wanted)


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
    cfg = load_config(args.config)  # missing or out of bounds: named
    init_default_scope(cfg.get('default_scope', 'mmdet'))
    model = MODELS.build(cfg.model)  # no init_weights: only MoPPA tensors are drawn
    checkpoint = load_checkpoint_file(args.checkpoint)  # safe; NaN / inf refused
    state_dict = checkpoint.get('state_dict', checkpoint)
    count = load_moppa_parameters(model, state_dict)
    paths = draw_learned_maps(model, args.out_dir)
    print(f'{count} MoPPA tensors from {args.checkpoint}; wrote {len(paths)} PNGs '
          f'to {args.out_dir}')


if __name__ == '__main__':
    run_main(main, 'visualize_moppa.py')

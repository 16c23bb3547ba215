"""The paper's adaptation analysis (supplementary, "Detailed Analysis
Implementation"; Fig. 1): how closely LoRA (qkv, rank 6) and MoPPA + scale &
shift can bend a ViT-B's layers, only their adapters trained (AdamW, MSE), to
map a random 14x14x768 token grid onto a random target; each trial draws a new
input, target and base ViT (random unless ``--checkpoint``). docs/accuracy.md
has the settings, the paper's numbers and a run.

    python tools/analysis/adaptation_analysis.py                      # the paper's settings
    python tools/analysis/adaptation_analysis.py --depth 1 --iters 100 --trials 3

Prints the per-trial table and writes the figure (mean over channels of the
target and of each method's absolute error, last trial) to ``--fig``.
"""
import argparse
import logging
import os
import os.path as osp
import statistics
import sys
import time
from typing import Dict, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from mmengine.logging import MMLogger
from mmpretrain.models.backbones import VisionTransformer
from mmpretrain.models.peft import LoRAModel

import moppa_mm  # noqa: F401  registries
from moppa_mm.models.backbones.moppa_vit import MoPPAEncoderLayer, MoPPAVisionTransformer
from moppa_mm.utils.checkpoints import load_checkpoint_file

# tools/, appended: tools/test.py must not shadow the standard `test`
sys.path.append(osp.dirname(osp.dirname(osp.abspath(__file__))))
from model_converters.vit_to_mmpretrain import plain_to_lora_keys  # noqa: E402

GRID = (14, 14)  # ViT-B/16 at 224 px
PAPER = {'LoRA': (0.065, 0.0007), 'MoPPA': (0.050, 0.0011)}


def vit_kwargs(depth: int) -> dict:
    arch = dict(embed_dims=768, num_layers=depth, num_heads=12, feedforward_channels=3072)
    return dict(arch=arch, img_size=224, patch_size=16, drop_rate=0., drop_path_rate=0.)


def load_base(path: str) -> Dict[str, torch.Tensor]:
    """An mmpretrain ViT-B state dict (a plain tensor file or a checkpoint with
    ``state_dict``; ``backbone.`` prefixes dropped), read safely, NaN refused."""
    state = load_checkpoint_file(path, what='base checkpoint')
    state = state.get('state_dict', state)
    return {k[len('backbone.'):] if k.startswith('backbone.') else k: v
            for k, v in state.items()}


def build(method: str, depth: int, base: Dict[str, torch.Tensor], rank: int,
          moppa_cfg: dict) -> nn.Module:
    """The backbone with ``method``'s adapters, only they trainable; the base
    weights ``base`` loaded under the backbone's own names."""
    if method == 'LoRA':
        model = LoRAModel(module=dict(type='mmpretrain.VisionTransformer',
                                      **vit_kwargs(depth)),
                          alpha=rank, rank=rank, targets=[dict(type='qkv')])
        missing, unexpected = model.module.load_state_dict(
            plain_to_lora_keys(base, model.module), strict=False)
        assert not unexpected and all('lora_' in k for k in missing), (missing, unexpected)
        return model
    model = MoPPAVisionTransformer(**vit_kwargs(depth), moppa_cfg=moppa_cfg)
    missing, unexpected = model.load_state_dict(base, strict=False)
    assert not unexpected and all('moppa' in k or 'ssf_' in k for k in missing), \
        (missing, unexpected)
    return model


def map_tokens(model: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    """(1, H, W, C) tokens through the ViT's layers -> (1, H, W, C)."""
    vit = model.module if isinstance(model, LoRAModel) else model
    batch, height, width, channels = tokens.shape
    x = tokens.reshape(batch, height * width, channels)  # (1, H*W, C)
    x = torch.cat([vit.cls_token.expand(batch, -1, -1), x], dim=1)  # (1, 1 + H*W, C)
    for layer in vit.layers:  # the patch embedding is bypassed: the grid is given
        x = layer(x, (height, width)) if isinstance(layer, MoPPAEncoderLayer) else layer(x)
    return x[:, 1:].reshape(batch, height, width, channels)


def fit(model: nn.Module, tokens: torch.Tensor, target: torch.Tensor, iters: int,
        lr: float) -> torch.Tensor:
    """Train the adapters; returns the final prediction (1, H, W, C)."""
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=lr)
    model.train()
    for _ in range(iters):
        loss = F.mse_loss(map_tokens(model, tokens), target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()
    with torch.no_grad():
        return map_tokens(model, tokens)


def draw(target: torch.Tensor, errors: Dict[str, torch.Tensor], path: str) -> None:
    """Fig. 1: the target and each method's |error|, averaged over channels."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    maps = {'GT': target[0].mean(-1)}  # (H, W)
    maps.update({f'|error| {name}': err[0].mean(-1) for name, err in errors.items()})
    vmax = max(m.max().item() for name, m in maps.items() if name != 'GT')
    fig, axes = plt.subplots(1, len(maps), figsize=(3.2 * len(maps), 3))
    for ax, (name, image) in zip(axes, maps.items()):
        shown = ax.imshow(image.numpy(), cmap='viridis',
                          vmin=0 if name != 'GT' else None, vmax=vmax if name != 'GT' else None)
        mse = '' if name == 'GT' else f'\nMSE {errors[name.split()[-1]].pow(2).mean():.4f}'
        ax.set_title(name + mse)
        ax.axis('off')
        fig.colorbar(shown, ax=ax, fraction=0.046)
    fig.tight_layout()
    os.makedirs(osp.dirname(osp.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run(depth: int, iters: int, trials: int, lr: float = 2e-3, rank: int = 6,
        moppa_cfg: Optional[dict] = None, checkpoint: Optional[str] = None,
        fig: Optional[str] = None, log=print) -> dict:
    moppa_cfg = dict(moppa_cfg or {})
    results = {'LoRA': [], 'MoPPA': []}
    counts = {}
    errors = target = None
    for trial in range(trials):
        generator = torch.Generator().manual_seed(trial)
        tokens = torch.rand(1, *GRID, 768, generator=generator)  # (1, 14, 14, 768)
        target = torch.rand(1, *GRID, 768, generator=generator)
        torch.manual_seed(trial)
        if checkpoint:
            base = load_base(checkpoint)
        else:
            base_vit = VisionTransformer(**vit_kwargs(depth))
            base_vit.init_weights()
            base = base_vit.state_dict()
        errors = {}
        for method in results:
            started = time.perf_counter()
            torch.manual_seed(trial)
            model = build(method, depth, base, rank, moppa_cfg)
            counts[method] = sum(p.numel() for p in model.parameters() if p.requires_grad)
            prediction = fit(model, tokens, target, iters, lr)
            errors[method] = (prediction - target).abs()
            results[method].append(F.mse_loss(prediction, target).item())
            log(f'trial {trial + 1} {method}: MSE {results[method][-1]:.4f} '
                f'({time.perf_counter() - started:.0f} s)')
    if fig and errors is not None:
        draw(target, errors, fig)
    return dict(mse=results, trainable=counts, depth=depth, iters=iters, trials=trials,
                lr=lr, rank=rank, moppa_cfg=moppa_cfg, pretrained=bool(checkpoint))


def table(result: dict) -> str:
    """The paper's table (per trial, then mean ± std), as markdown."""
    mse = result['mse']
    lines = [f'| trial | LoRA (rank {result["rank"]}, {result["trainable"]["LoRA"]:,} params) '
             f'| MoPPA + scale & shift ({result["trainable"]["MoPPA"]:,} params) |',
             '|---:|---:|---:|']
    for trial, (lora, moppa) in enumerate(zip(mse['LoRA'], mse['MoPPA'])):
        lines.append(f'| {trial + 1} | {lora:.4f} | {moppa:.4f} |')

    def summary(values):
        std = statistics.stdev(values) if len(values) > 1 else 0.0
        return f'{statistics.mean(values):.4f} ± {std:.4f}'

    lines.append(f'| mean ± std | {summary(mse["LoRA"])} | {summary(mse["MoPPA"])} |')
    lines.append(f'| paper (pre-trained ViT-B, 12 layers, 20000 iterations) '
                 f'| {PAPER["LoRA"][0]} ± {PAPER["LoRA"][1]} '
                 f'| {PAPER["MoPPA"][0]} ± {PAPER["MoPPA"][1]} |')
    return '\n'.join(lines)


def parse_args():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--depth', type=int, default=12, help='ViT-B layers (paper: 12)')
    parser.add_argument('--iters', type=int, default=20000, help='AdamW steps (paper: 20000)')
    parser.add_argument('--trials', type=int, default=5, help='trials (paper: 5)')
    parser.add_argument('--lr', type=float, default=2e-3)
    parser.add_argument('--rank', type=int, default=6, help='LoRA rank (alpha = rank)')
    parser.add_argument('--init-mode', default='paper', choices=('paper', 'identity'))
    parser.add_argument('--heat-param', default='raw', choices=('raw', 'softplus'))
    parser.add_argument('--checkpoint', help='mmpretrain ViT-B weights (default: random init)')
    parser.add_argument('--fig', default='work_dirs/adaptation_analysis.png',
                        help='where to write Fig. 1')
    parser.add_argument('--threads', type=int, help='torch threads (default: torch\'s)')
    return parser.parse_args()


def main():
    args = parse_args()
    MMLogger.get_current_instance().setLevel(logging.WARNING)  # LoRAModel's init log
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.depth < 1 or args.iters < 1 or args.trials < 1:
        raise SystemExit('--depth, --iters and --trials must be >= 1')
    result = run(args.depth, args.iters, args.trials, args.lr, args.rank,
                 dict(init_mode=args.init_mode, heat_param=args.heat_param),
                 args.checkpoint, args.fig, log=lambda m: print(m, flush=True))
    print(f'\nViT-B with {args.depth} layer(s), {args.iters} AdamW steps at lr {args.lr}, '
          f'{args.trials} trials, base ViT '
          f'{"pre-trained" if args.checkpoint else "randomly initialised"}, MoPPA '
          f'init_mode={args.init_mode!r}, heat_param={args.heat_param!r}:\n')
    print(table(result))
    print(f'\nFig. 1 written to {args.fig}')


if __name__ == '__main__':
    main()

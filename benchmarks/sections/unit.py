"""The MoPPA unit alone (train: fwd+bwd; eval: cached forward) against the
frozen block it sits in (a ViT-B layer; a Swin-B block on the same tokens)."""
from typing import Callable, List, NamedTuple, Tuple

import torch
import torch.nn as nn

from benchmarks.results import SectionResult, Table
from benchmarks.sections import SHIPPED_UNIT_OPTIONS
from benchmarks.timing import block_step, interleaved, median_ms, ratio
from moppa_mm.operators import MoPPAUnit

NAME = 'unit'


class Case(NamedTuple):
    id: str
    label: str
    unit_shape: Tuple[int, ...]  # (B, H, W, C)
    heads: int
    make_block: Callable[[], nn.Module]
    block_shape: Tuple[int, ...]  # (B, N, C), or (B, N, C) and the Swin (H, W)


class _SwinBlockCall(nn.Module):
    """``SwinBlock(x, hw_shape)`` as a one-argument module."""

    def __init__(self, block: nn.Module, hw_shape: Tuple[int, int]):
        super().__init__()
        self.block, self.hw_shape = block, hw_shape

    def forward(self, x):
        return self.block(x, self.hw_shape)


def cases(quick: bool) -> List[Case]:
    from mmdet.models.backbones.swin import SwinBlock
    from mmpretrain.models.backbones.vision_transformer import TransformerEncoderLayer
    if quick:
        return [Case('vit_tiny_layer', 'ViT tiny layer, 2 x 4x4x32', (2, 4, 4, 32), 2,
                     lambda: TransformerEncoderLayer(32, 2, 64), (2, 17, 32))]
    found = [Case('vit_b_layer', 'ViT-B layer, 8 x 14x14x768', (8, 14, 14, 768), 12,
                  lambda: TransformerEncoderLayer(768, 12, 3072), (8, 197, 768))]
    for stage, (grid, dims, heads) in enumerate(
            [(56, 128, 4), (28, 256, 8), (14, 512, 16), (7, 1024, 32)], start=1):
        windows = (grid // 7)**2
        found.append(Case(f'swin_b_stage{stage}_224_window',
                          f'Swin-B stage {stage} @224 (window), 8 x {grid}x{grid}x{dims}',
                          (8 * windows, 7, 7, dims), heads,
                          lambda d=dims, h=heads: SwinBlock(d, h, 4 * d, window_size=7),
                          (8, grid * grid, dims, (grid, grid))))
    for scope, unit_shape in (('window', (29 * 48, 7, 7, 128)), ('global', (1, 200, 334, 128))):
        found.append(Case(f'swin_b_stage1_800x1333_{scope}',
                          f'Swin-B stage 1 @800x1333 ({scope}), 1 x 200x334x128', unit_shape, 4,
                          lambda: SwinBlock(128, 4, 512, window_size=7),
                          (1, 200 * 334, 128, (200, 334))))
    return found


def run(device: torch.device, quick: bool) -> SectionResult:
    result = SectionResult()
    metrics, rows = result.metrics, []
    for case in cases(quick):
        shape = case.unit_shape
        unit = MoPPAUnit(shape[-1], case.heads, shape[1:3], **SHIPPED_UNIT_OPTIONS).to(device)
        x = torch.randn(*shape, device=device)
        block = case.make_block().to(device)
        for p in block.parameters():
            p.requires_grad_(False)  # frozen, as in PEFT
        if len(case.block_shape) == 4:  # SwinBlock(x, hw_shape)
            b, n, c, hw = case.block_shape
            tokens = torch.randn(b, n, c, device=device)
            wrapper = _SwinBlockCall(block, hw)
        else:
            tokens = torch.randn(*case.block_shape, device=device)
            wrapper = block
        rounds = 3 if quick else 7
        unit.train()
        train = interleaved(dict(unit=block_step(unit, x, True),
                                 block=block_step(wrapper, tokens, True)), device, 2, rounds)
        unit.eval()
        infer = interleaved(dict(unit=block_step(unit, x, False),
                                 block=block_step(wrapper, tokens, False)), device, 2, rounds)
        key = f'unit.{case.id}'
        metrics.update({
            f'{key}.unit_train_ms': median_ms(train, 'unit'),
            f'{key}.block_train_ms': median_ms(train, 'block'),
            f'{key}.train_share': ratio(train, 'unit', 'block'),
            f'{key}.unit_eval_ms': median_ms(infer, 'unit'),
            f'{key}.block_eval_ms': median_ms(infer, 'block'),
            f'{key}.eval_share': ratio(infer, 'unit', 'block'),
        })
        columns = ('unit_train_ms', 'block_train_ms', 'train_share', 'unit_eval_ms',
                   'block_eval_ms', 'eval_share')
        rows.append(dict(case=case.label, **{c: metrics[f'{key}.{c}'] for c in columns}))
    result.tables.append(Table(
        'MoPPA unit alone vs the block it sits in (frozen block, fwd+bwd / eval fwd)', rows,
        dict(case='', unit_train_ms='.2f', block_train_ms='.1f', train_share='.2%',
             unit_eval_ms='.2f', block_eval_ms='.1f', eval_share='.2%')))
    return result

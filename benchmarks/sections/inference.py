"""Inference: the plain frozen backbone, the MoPPA backbone unmerged, merged
(:func:`moppa_mm.merge_adapters`) and merged + ``torch.compile``, in eval
under ``torch.no_grad``: ViT-B/16 (batch 8, 224) and the Swin-B backbone
(batch 1, 800x1333), one table each, all variants timed in alternating rounds.

``--quick`` compiles with the ``aot_eager`` backend (it checks the harness,
not the speed-up); the full run with inductor, torch.compile's default, with
its ``freezing`` option on (weights folded in as constants: what inductor
recommends for inference; without it, the compiled Swin-B was 6.5% slower than
eager here). The compile itself is left out of the timings (warm-up)."""
import copy
from typing import Callable, Dict, Tuple

import torch
import torch.nn as nn

from benchmarks.results import SectionResult, Table, pct
from benchmarks.sections import SHIPPED_UNIT_OPTIONS
from benchmarks.timing import interleaved, median_ms, ratio

NAME = 'inference'
PREFIX = 'infer'
LABELS = {'plain': 'plain frozen backbone',
          'unmerged': 'MoPPA, unmerged',
          'merged': 'MoPPA, merged (merge_adapters)',
          'compiled': 'MoPPA, merged + torch.compile (inductor, freezing)',
          'unmergeable_off': 'merged, units (and conv adapters) off: not a model, '
                             'shows what the unmergeable parts cost'}


def _trained(model: nn.Module) -> nn.Module:
    """Adapters moved off their init (an identity-initialised unit is not
    what a fine-tuned model runs)."""
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for param in model.parameters():
            if param.requires_grad:
                param.add_(0.02 * torch.randn(param.shape, generator=generator).to(param))
    return model


def models(kind: str, quick: bool) -> Tuple[nn.Module, nn.Module, tuple]:
    """(plain backbone, MoPPA backbone, input shape) of ``kind``."""
    if kind == 'vit_b':
        from mmpretrain.models.backbones import VisionTransformer

        from moppa_mm.models import MoPPAVisionTransformer
        arch = dict(embed_dims=64, num_layers=2, num_heads=4, feedforward_channels=128) \
            if quick else 'b'
        size = dict(img_size=64 if quick else 224, patch_size=16)
        shape = (2, 3, 64, 64) if quick else (8, 3, 224, 224)
        return (VisionTransformer(arch=arch, **size),
                MoPPAVisionTransformer(arch=arch, **size, moppa_cfg=SHIPPED_UNIT_OPTIONS), shape)
    from mmdet.models.backbones import SwinTransformer

    from moppa_mm.models import MoPPASwinTransformer
    cfg = dict(embed_dims=32, depths=[1, 1, 1, 1], num_heads=[1, 2, 4, 8], window_size=7) \
        if quick else dict(embed_dims=128, depths=[2, 2, 18, 2], num_heads=[4, 8, 16, 32],
                           window_size=7)
    shape = (1, 3, 128, 160) if quick else (1, 3, 800, 1333)
    return (SwinTransformer(**cfg),
            MoPPASwinTransformer(**cfg, moppa_cfg=SHIPPED_UNIT_OPTIONS), shape)


def variants(kind: str, quick: bool, device: torch.device) -> Tuple[Dict[str, Callable], tuple]:
    from moppa_mm import merge_adapters
    torch.manual_seed(0)
    plain, moppa, shape = models(kind, quick)
    plain, moppa = plain.to(device), _trained(moppa).to(device)
    plain.eval()  # (mmpretrain's ViT returns None from train())
    moppa.eval()
    merged = merge_adapters(copy.deepcopy(moppa))
    unmergeable_off = copy.deepcopy(merged)
    for module in unmergeable_off.modules():  # the units' DCTs, Swin's conv adapters
        if hasattr(module, 'enabled'):
            module.enabled = False
    compiled = torch.compile(copy.deepcopy(merged),
                             backend='aot_eager' if quick else 'inductor')
    images = torch.randn(*shape, device=device)
    # the first call compiles; inductor's freezing (weights as constants, packed
    # for the CPU's kernels) is its setting for inference; on a GPU it needs its
    # matmul padding off for the Swin (docs/deploy.md, torch.compile)
    options = {} if quick else dict(freezing=True, shape_padding=False)
    with torch.no_grad(), torch._inductor.config.patch(**options):
        # the compiled merged model computes the unmerged one's outputs
        difference = max(float((a - b).abs().max())
                         for a, b in zip(moppa(images), compiled(images)))

    def infer(model):
        def step():
            with torch.no_grad():
                model(images)
        return step

    steps = {'plain': infer(plain), 'unmerged': infer(moppa), 'merged': infer(merged),
             'compiled': infer(compiled), 'unmergeable_off': infer(unmergeable_off)}
    return steps, (shape, difference)


def run(device: torch.device, quick: bool) -> SectionResult:
    result = SectionResult()
    m = result.metrics
    for kind, title in (('vit_b', 'ViT-B/16'), ('swin_b', 'Swin-B backbone')):
        steps, (shape, difference) = variants(kind, quick, device)
        times = interleaved(steps, device, 1 if quick else 2, 3 if quick else 7)
        prefix = f'{PREFIX}.{kind}'
        for name in steps:
            m[f'{prefix}.ms.{name}'] = median_ms(times, name)
            m[f'{prefix}.{name}_over_plain'] = ratio(times, name, 'plain')
            m[f'{prefix}.{name}_over_merged'] = ratio(times, name, 'merged')
        m[f'{prefix}.merged_over_unmergeable_off'] = ratio(times, 'merged', 'unmergeable_off')
        m[f'{prefix}.compiled_max_abs_diff'] = difference
        result.tables.append(Table.of_variants(
            f'Inference: {title} eval forward (batch {shape[0]}, {shape[2]}x{shape[3]}, '
            'no_grad)', 'variant', LABELS,
            {'ms': ('.0f', prefix + '.ms.{v}'),
             'vs_plain': ('.3f', prefix + '.{v}_over_plain'),
             'vs_merged': ('.3f', prefix + '.{v}_over_merged')}, m))
        result.summary.append(
            f'Inference, {title} (batch {shape[0]}, {shape[2]}x{shape[3]}) over the plain '
            f'frozen backbone: unmerged {pct(m[prefix + ".unmerged_over_plain"])}, merged '
            f'{pct(m[prefix + ".merged_over_plain"])}, merged + torch.compile '
            f'{pct(m[prefix + ".compiled_over_plain"])} (compiled over eager merged: '
            f'{pct(m[prefix + ".compiled_over_merged"])}; largest output difference, '
            f'compiled merged vs eager unmerged: {difference:.1e}). What merging cannot '
            'remove (the units\' DCTs and filters' + (', the 3x3 conv adapters' if kind ==
                                                      'swin_b' else '') +
            f'): {pct(m[prefix + ".merged_over_unmergeable_off"])} over the merged model '
            'without them.')
    return result

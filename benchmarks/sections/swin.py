"""Swin-B backbone training step (batch 1, 800x1333, AdamW) and its saved
activations: the frozen backbone without and with backward through it, and
MoPPA + conv adapters with window and global scope."""
from typing import Callable, List, NamedTuple

import torch
import torch.nn as nn

from benchmarks.results import SectionResult, Table, pct
from benchmarks.sections import SHIPPED_UNIT_OPTIONS
from benchmarks.timing import interleaved, median_ms, ratio, step_memory_mb

NAME = 'swin'
PREFIX = 'swin_b'
BASE = 'frozen_backward'  # what PEFT with adapters in every stage must pay at least


class Variant(NamedTuple):
    id: str
    label: str
    build: Callable[[], nn.Module]
    backward: bool  # whether the step runs a backward through the backbone


def variants(quick: bool) -> List[Variant]:
    from mmdet.models.backbones import SwinTransformer

    from moppa_mm.models import MoPPASwinTransformer
    cfg = dict(embed_dims=32, depths=[1, 1, 1, 1], num_heads=[1, 2, 4, 8], window_size=7) \
        if quick else dict(embed_dims=128, depths=[2, 2, 18, 2], num_heads=[4, 8, 16, 32],
                           window_size=7)
    return [
        Variant('frozen_no_backward', 'frozen Swin, no backward into it',
                lambda: SwinTransformer(**cfg), False),
        Variant('frozen_backward', 'frozen Swin, backward through it',
                lambda: SwinTransformer(**cfg), True),
        Variant('moppa_window', 'MoPPA + conv adapters (window)',
                lambda: MoPPASwinTransformer(**cfg, moppa_cfg=SHIPPED_UNIT_OPTIONS,
                                             random_base=True), True),
        Variant('moppa_global', 'MoPPA + conv adapters (global)',
                lambda: MoPPASwinTransformer(**cfg, moppa_scope='global', random_base=True,
                                             moppa_cfg=SHIPPED_UNIT_OPTIONS), True),
    ]


def mac_floor(model: nn.Module, shape) -> float:
    """The adapters' training multiply-adds over the frozen backbone's, summed
    over every block at the input ``shape`` (windows padded as Swin pads them):
    the frozen blocks run forward and input gradient (2x), the adapters also
    their weight gradients (3x, conv adapter; the DCTs have no weights: 2x)."""
    height, width = shape[2] // 4, shape[3] // 4  # after the 4x4 patch embedding
    base = adapters = 0
    for stage in model.stages:
        for block in stage.blocks:
            window = block.attn.w_msa.window_size[0] * block.attn.w_msa.window_size[1]
            side = block.attn.w_msa.window_size[0]
            tokens = -(-height // side) * side * -(-width // side) * side
            dims = block.attn.w_msa.embed_dims
            base += tokens * 2 * (12 * dims**2 + 2 * window * dims)
            if hasattr(block, 'conv_adapter'):
                hidden = block.conv_adapter.hidden_dims
                adapters += tokens * 3 * (2 * dims * hidden + 9 * hidden**2)
            if hasattr(block, 'moppa') or hasattr(block.attn.w_msa, 'moppa'):
                adapters += tokens * 2 * 2 * window * dims  # Kronecker DCT and inverse
        height, width = -(-height // 2), -(-width // 2)  # patch merging
    return adapters / base


def run(device: torch.device, quick: bool) -> SectionResult:
    from moppa_mm.models import MoPPASwinTransformer
    shape = (1, 3, 128, 160) if quick else (1, 3, 800, 1333)
    images = torch.randn(*shape, device=device)
    steps, built = {}, {}
    for variant in variants(quick):
        torch.manual_seed(0)
        model = variant.build().to(device)
        if not isinstance(model, MoPPASwinTransformer):
            model.requires_grad_(False)
        params = [p for p in model.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(params, lr=1e-4) if params else None
        # without trainable parameters, a backward needs an input that asks for it
        inputs = images.detach().requires_grad_(variant.backward and not params)
        model.train()

        def step(model=model, inputs=inputs, backward=variant.backward, optimizer=optimizer):
            outs = model(inputs)
            if backward:
                sum(o.float().square().mean() for o in outs).backward()
            if optimizer is not None:
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)

        steps[variant.id], built[variant.id] = step, (variant, model, params)
    times = interleaved(steps, device, 1, 2 if quick else 5)

    result = SectionResult()
    m = result.metrics
    m[f'{PREFIX}.mac_floor.moppa_window'] = mac_floor(built['moppa_window'][1], shape)
    for name, (_, model, params) in built.items():
        m[f'{PREFIX}.trainable.{name}'] = sum(p.numel() for p in params)
        m[f'{PREFIX}.step_ms.{name}'] = median_ms(times, name)
        m[f'{PREFIX}.step.{name}_over_{BASE}'] = ratio(times, name, BASE)
        for kind, value in step_memory_mb(steps[name], device, model).items():
            m[f'{PREFIX}.{kind}.{name}'] = value  # saved_mb, peak_alloc_mb (CUDA)
    for name in built:
        m[f'{PREFIX}.saved.{name}_over_{BASE}'] = \
            m[f'{PREFIX}.saved_mb.{name}'] / max(m[f'{PREFIX}.saved_mb.{BASE}'], 1e-9)
    # the ratio of the two per-round ratios' medians
    m[f'{PREFIX}.step.moppa_window_over_frozen_no_backward'] = \
        m['swin_b.step.moppa_window_over_frozen_backward'] \
        / m['swin_b.step.frozen_no_backward_over_frozen_backward']
    result.summary.append(
        'Swin-B backbone training step, MoPPA + conv adapters (window) over the frozen '
        'backbone with backward through it: '
        f'{pct(m["swin_b.step.moppa_window_over_frozen_backward"])}; saved activations '
        f'{pct(m["swin_b.saved.moppa_window_over_frozen_backward"])}. Global scope: '
        f'{pct(m["swin_b.step.moppa_global_over_frozen_backward"])}, saved activations '
        f'{pct(m["swin_b.saved.moppa_global_over_frozen_backward"])}. Against a frozen '
        'backbone that needs no backward at all (what full PEFT must pay to reach adapters '
        f'in stage 1): x{m["swin_b.step.moppa_window_over_frozen_no_backward"]:.2f}. '
        'The multiply-add floor of the window-scope adapters over the frozen backbone\'s '
        f'training multiply-adds (every stage, at the paper\'s budget): '
        f'+{100 * m["swin_b.mac_floor.moppa_window"]:.1f}%; the rest of the measured cost is '
        'overhead (memory passes, small matmuls).')
    columns = {  # column: (format, result id of variant {v})
        'trainable': (',', PREFIX + '.trainable.{v}'),
        'step_ms': ('.0f', PREFIX + '.step_ms.{v}'),
        'step_vs_through': ('.3f', PREFIX + '.step.{v}_over_' + BASE),
        'saved_mb': ('.0f', PREFIX + '.saved_mb.{v}'),
    }
    if device.type == 'cuda':
        columns['peak_alloc_mb'] = ('.0f', PREFIX + '.peak_alloc_mb.{v}')
    labels = {name: variant.label for name, (variant, _, _) in built.items()}
    result.tables.append(Table.of_variants(
        f'Swin-B backbone training step (batch 1, {shape[2]}x{shape[3]})', 'variant', labels,
        columns, m))
    return result

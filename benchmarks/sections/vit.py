"""ViT-B/16 training step (batch 8, 224, AdamW, a 100-class head), its saved
activations, and eval throughput: the frozen backbone, scale & shift only,
MoPPA (units + scale & shift), and LoRA on qkv at matched parameters."""
from typing import Callable, Dict, List, NamedTuple

import torch
import torch.nn as nn

from benchmarks.results import SectionResult, Table, pct
from benchmarks.sections import SHIPPED_UNIT_OPTIONS
from benchmarks.timing import interleaved, median_ms, ratio, step_memory_mb

NAME = 'vit'
PREFIX = 'vit_b'
BASELINES = ('ssf', 'lora')  # the variants every other one is compared with


class Variant(NamedTuple):
    id: str
    label: str
    build: Callable[[], nn.Module]


def variants(quick: bool) -> List[Variant]:
    """The four backbones, built on call."""
    from mmpretrain.models.backbones import VisionTransformer
    from mmpretrain.models.peft import LoRAModel

    from moppa_mm.models import MoPPAVisionTransformer
    arch = dict(embed_dims=64, num_layers=2, num_heads=4, feedforward_channels=128) \
        if quick else 'b'
    size = dict(img_size=64 if quick else 224, patch_size=16)

    def frozen():
        model = VisionTransformer(arch=arch, **size)
        model.requires_grad_(False)
        return model

    def ssf_only():  # timed training steps on a random base: random_base=True
        model = MoPPAVisionTransformer(arch=arch, **size, random_base=True)
        for layer in model.layers:
            layer.moppa.enabled = False
            layer.moppa.requires_grad_(False)
        return model

    def moppa():  # the unit options every shipped config uses
        return MoPPAVisionTransformer(arch=arch, **size, moppa_cfg=SHIPPED_UNIT_OPTIONS,
                                      random_base=True)

    def lora():
        rank = 1 if quick else 6  # 12 x 6 x (768 + 2304) = 221K, MoPPA: 218K
        vit = dict(type='mmpretrain.VisionTransformer', arch=arch, **size)
        return LoRAModel(module=vit, alpha=rank, rank=rank, targets=[dict(type='qkv')])

    return [Variant('frozen', 'frozen ViT + head', frozen),
            Variant('ssf', '+ scale & shift only', ssf_only),
            Variant('moppa', '+ MoPPA (ours)', moppa),
            Variant('lora', '+ LoRA on qkv, matched params', lora)]


def input_size(quick: bool) -> Dict[str, int]:
    """Batch, image size and feature dims of the benchmark."""
    return dict(batch=2, size=64, dims=64) if quick else dict(batch=8, size=224, dims=768)


def train_step_fn(backbone: nn.Module, head: nn.Module, images: torch.Tensor,
                  labels: torch.Tensor, optimizer: torch.optim.Optimizer) -> Callable:
    """One AdamW step of backbone + linear head on the last feature map."""
    loss_fn = nn.CrossEntropyLoss()

    def step():
        feats = backbone(images)[-1]
        loss = loss_fn(head(feats), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    return step


def run(device: torch.device, quick: bool) -> SectionResult:
    sizes = input_size(quick)
    batch, size = sizes['batch'], sizes['size']
    images = torch.randn(batch, 3, size, size, device=device)
    labels = torch.randint(0, 100, (batch, ), device=device)
    built, train_steps, infer_steps = {}, {}, {}
    for variant in variants(quick):
        torch.manual_seed(0)
        backbone = variant.build().to(device)
        head = nn.Linear(sizes['dims'], 100).to(device)
        params = [p for p in backbone.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(params + list(head.parameters()), lr=1e-4)
        built[variant.id] = (variant, backbone, params)
        train_steps[variant.id] = train_step_fn(backbone, head, images, labels, optimizer)

        def infer(backbone=backbone, head=head):
            with torch.no_grad():
                head(backbone(images)[-1])

        infer_steps[variant.id] = infer
    for _, backbone, _ in built.values():
        backbone.train()
    train = interleaved(train_steps, device, 1 if quick else 2, 3 if quick else 9)
    memory = {name: step_memory_mb(train_steps[name], device, backbone)
              for name, (_, backbone, _) in built.items()}
    for _, backbone, _ in built.values():
        backbone.eval()
    infer = interleaved(infer_steps, device, 1 if quick else 2, 3 if quick else 9)

    result = SectionResult()
    m = result.metrics
    for name, (_, _, params) in built.items():
        m[f'{PREFIX}.trainable.{name}'] = sum(p.numel() for p in params)
        m[f'{PREFIX}.step_ms.{name}'] = median_ms(train, name)
        m[f'{PREFIX}.eval_img_s.{name}'] = batch / (median_ms(infer, name) / 1e3)
        for kind, value in memory[name].items():  # saved_mb, peak_alloc_mb (CUDA)
            m[f'{PREFIX}.{kind}.{name}'] = value
        for base in BASELINES:
            m[f'{PREFIX}.step.{name}_over_{base}'] = ratio(train, name, base)
            # throughput: > 1 is faster than the base
            m[f'{PREFIX}.eval.{name}_over_{base}'] = 1 / ratio(infer, name, base)
            m[f'{PREFIX}.saved.{name}_over_{base}'] = \
                memory[name]['saved_mb'] / max(memory[base]['saved_mb'], 1e-9)
    result.summary += [
        f'ViT-B training step, MoPPA over scale & shift only: '
        f'{pct(m["vit_b.step.moppa_over_ssf"])}; eval throughput '
        f'{pct(m["vit_b.eval.moppa_over_ssf"])}.',
        f'ViT-B, MoPPA against LoRA at matched parameters ({m["vit_b.trainable.moppa"]:,} vs '
        f'{m["vit_b.trainable.lora"]:,}): training step {pct(m["vit_b.step.moppa_over_lora"])}, '
        f'eval throughput {pct(m["vit_b.eval.moppa_over_lora"])}, saved activations '
        f'{m["vit_b.saved_mb.moppa"]:.0f} vs {m["vit_b.saved_mb.lora"]:.0f} MB '
        f'(x{m["vit_b.saved.moppa_over_lora"]:.2f}).',
    ]
    columns = {  # column: (format, result id of variant {v})
        'trainable': (',', PREFIX + '.trainable.{v}'),
        'step_ms': ('.0f', PREFIX + '.step_ms.{v}'),
        'step_vs_ssf': ('.3f', PREFIX + '.step.{v}_over_ssf'),
        'step_vs_lora': ('.3f', PREFIX + '.step.{v}_over_lora'),
        'saved_mb': ('.0f', PREFIX + '.saved_mb.{v}'),
        'eval_img_s': ('.2f', PREFIX + '.eval_img_s.{v}'),
        'eval_vs_ssf': ('.3f', PREFIX + '.eval.{v}_over_ssf'),
    }
    if device.type == 'cuda':
        columns['peak_alloc_mb'] = ('.0f', PREFIX + '.peak_alloc_mb.{v}')
    labels = {name: variant.label for name, (variant, _, _) in built.items()}
    result.tables.append(Table.of_variants(
        f'ViT-B/16 training step (batch {batch}, {size}, AdamW) and eval throughput',
        'variant', labels, columns, m))
    return result

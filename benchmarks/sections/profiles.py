"""Where the time goes: profiles of the MoPPA unit alone at ViT-B size and of a
whole ViT-B MoPPA training step (top operators by self time)."""
import torch
import torch.nn as nn

from benchmarks.results import SectionResult, Table
from benchmarks.sections import SHIPPED_UNIT_OPTIONS, vit
from benchmarks.timing import top_ops
from moppa_mm.operators import MoPPAUnit

NAME = 'profiles'


def run(device: torch.device, quick: bool) -> SectionResult:
    clock = 'self CUDA time' if device.type == 'cuda' else 'self time'
    formats = dict(op='', calls='', self_ms='.1f', share='.1%')
    result = SectionResult()

    shape = (2, 4, 4, 32) if quick else (8, 14, 14, 768)
    unit = MoPPAUnit(shape[-1], 2 if quick else 12, shape[1:3],
                     **SHIPPED_UNIT_OPTIONS).to(device)
    x = torch.randn(*shape, device=device, requires_grad=True)
    grad = torch.randn(*shape, device=device)
    result.tables.append(Table(
        f'Profile: MoPPA unit forward+backward, {"x".join(map(str, shape))} '
        f'(top operators by {clock})', top_ops(lambda: unit(x).backward(grad), device),
        formats))

    moppa = next(v for v in vit.variants(quick) if v.id == 'moppa')
    backbone = moppa.build().to(device)
    sizes = vit.input_size(quick)
    head = nn.Linear(sizes['dims'], 100).to(device)
    params = [p for p in backbone.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params + list(head.parameters()), lr=1e-4)
    images = torch.randn(sizes['batch'], 3, sizes['size'], sizes['size'], device=device)
    labels = torch.randint(0, 100, (sizes['batch'], ), device=device)
    step = vit.train_step_fn(backbone, head, images, labels, optimizer)
    result.tables.append(Table(
        f'Profile: ViT-B {moppa.label} training step (top operators by {clock})',
        top_ops(step, device, rows=12), formats))
    return result

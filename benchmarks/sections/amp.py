"""Training steps at the sizes users train at on a GPU, under bfloat16
autocast (the forward autocast, the backward outside it, AdamW): ViT-B/16 at
batch 64, 224 (full fine-tuning, LoRA on qkv, scale & shift only, MoPPA) and
the Swin-B backbone at 800x1333, batch 2 (frozen with backward through it,
MoPPA + conv adapters with window and global scope, full fine-tuning). Step
time, memory and what a step launches: on CUDA the allocator's peak and the
kernels (torch.profiler's device events); on CPU the activations saved for
backward and the aten calls, the proxies.

A full-size CPU run skips it (ViT-B at batch 64 takes minutes a step on 2
cores, and CPU times do not predict a GPU's: docs/benchmarks.md); ``--quick``
runs it at tiny sizes on any device."""
from typing import Callable, Dict, List, NamedTuple, Optional

import torch
import torch.nn as nn

from benchmarks.results import SectionResult, Table, pct
from benchmarks.sections import swin, vit
from benchmarks.timing import interleaved, launches_per_call, median_ms, ratio, step_memory_mb

NAME = 'amp'
DTYPE = torch.bfloat16


class Step(NamedTuple):
    label: str
    model: nn.Module
    params: List[nn.Parameter]
    run: Callable[[], None]


def amp_step(forward_loss: Callable[[], torch.Tensor], device: torch.device,
             optimizer: Optional[torch.optim.Optimizer]) -> Callable[[], None]:
    """A step as mmengine's ``AmpOptimWrapper`` runs it in bfloat16 (which
    needs no loss scaling): the forward under autocast, the backward and the
    optimizer outside it."""

    def step():
        with torch.autocast(device.type, dtype=DTYPE):
            loss = forward_loss()
        loss.backward()
        if optimizer is not None:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

    return step


def trainable(model: nn.Module) -> List[nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]


def vit_steps(device: torch.device, quick: bool) -> Dict[str, Step]:
    """Full fine-tuning, LoRA, scale & shift only and MoPPA (the ViT section's
    builds, the frozen one with every weight trainable for full fine-tuning)."""
    by_id = {variant.id: variant for variant in vit.variants(quick)}
    row_labels = dict(full='full fine-tuning', lora=by_id['lora'].label,
                      ssf=by_id['ssf'].label, moppa=by_id['moppa'].label)
    batch, size, dims = (2, 64, 64) if quick else (64, 224, 768)
    images = torch.randn(batch, 3, size, size, device=device)
    classes = torch.randint(0, 100, (batch, ), device=device)
    loss_fn = nn.CrossEntropyLoss()
    steps = {}
    for name, label in row_labels.items():
        torch.manual_seed(0)
        model = by_id['frozen' if name == 'full' else name].build().to(device)
        if name == 'full':
            model.requires_grad_(True)
        head = nn.Linear(dims, 100).to(device)
        params = trainable(model)
        optimizer = torch.optim.AdamW(params + list(head.parameters()), lr=1e-4)
        model.train()

        def forward_loss(model=model, head=head):
            return loss_fn(head(model(images)[-1]), classes)

        steps[name] = Step(label, model, params, amp_step(forward_loss, device, optimizer))
    return steps


def swin_steps(device: torch.device, quick: bool) -> Dict[str, Step]:
    """The frozen Swin with backward through it, MoPPA (window, global) and
    full fine-tuning (the Swin section's builds), at batch 2."""
    by_id = {variant.id: variant for variant in swin.variants(quick)}
    builds = dict(frozen_backward=by_id['frozen_backward'], moppa_window=by_id['moppa_window'],
                  moppa_global=by_id['moppa_global'], full=by_id['frozen_backward'])
    images = torch.randn(2, 3, *((128, 160) if quick else (800, 1333)), device=device)
    steps = {}
    for name, variant in builds.items():
        torch.manual_seed(0)
        model = variant.build().to(device)
        if name == 'frozen_backward':
            model.requires_grad_(False)
        params = trainable(model)
        optimizer = torch.optim.AdamW(params, lr=1e-4) if params else None
        # without trainable parameters, a backward needs an input that asks for it
        inputs = images.detach().requires_grad_(not params)
        model.train()

        def forward_loss(model=model, inputs=inputs):
            return sum(out.float().square().mean() for out in model(inputs))

        label = 'full fine-tuning' if name == 'full' else variant.label
        steps[name] = Step(label, model, params, amp_step(forward_loss, device, optimizer))
    return steps


def measure(prefix: str, steps: Dict[str, Step], device: torch.device, quick: bool,
            rounds: int, bases, metrics: Dict) -> None:
    """Step time, memory and launches of each step; its time over each of
    ``bases`` and its memory over full fine-tuning's."""
    times = interleaved({name: step.run for name, step in steps.items()}, device,
                        1 if quick else 2, 3 if quick else rounds)
    memory_kind = 'peak_alloc_mb' if device.type == 'cuda' else 'saved_mb'
    for name, step in steps.items():
        metrics[f'{prefix}.trainable.{name}'] = sum(p.numel() for p in step.params)
        metrics[f'{prefix}.step_ms.{name}'] = median_ms(times, name)
        for kind, value in step_memory_mb(step.run, device, step.model).items():
            metrics[f'{prefix}.{kind}.{name}'] = value  # saved_mb, peak_alloc_mb (CUDA)
        metrics[f'{prefix}.launches.{name}'] = launches_per_call(step.run, device)
    for name in steps:
        for base in bases:
            metrics[f'{prefix}.step.{name}_over_{base}'] = ratio(times, name, base)
        metrics[f'{prefix}.memory.{name}_over_full'] = \
            metrics[f'{prefix}.{memory_kind}.{name}'] / \
            max(metrics[f'{prefix}.{memory_kind}.full'], 1e-9)


def table(title: str, prefix: str, labels: Dict[str, str], base: str,
          device: torch.device, metrics: Dict) -> Table:
    columns = {  # column: (format, result id of variant {v})
        'trainable': (',', prefix + '.trainable.{v}'),
        'step_ms': ('.1f', prefix + '.step_ms.{v}'),
        f'step_vs_{base}': ('.3f', prefix + '.step.{v}_over_' + base),
        'step_vs_full': ('.3f', prefix + '.step.{v}_over_full'),
        'saved_mb': ('.1f', prefix + '.saved_mb.{v}'),
    }
    if device.type == 'cuda':
        columns['peak_alloc_mb'] = ('.0f', prefix + '.peak_alloc_mb.{v}')
    columns['memory_vs_full'] = ('.3f', prefix + '.memory.{v}_over_full')
    columns['kernels' if device.type == 'cuda' else 'aten_calls'] = (
        ',', prefix + '.launches.{v}')
    return Table.of_variants(title, 'variant', labels, columns, metrics)


def run(device: torch.device, quick: bool) -> SectionResult:
    result = SectionResult()
    if device.type == 'cpu' and not quick:
        result.summary.append(
            'bfloat16 at GPU sizes (ViT-B/16 batch 64, Swin-B 800x1333 batch 2): not run on '
            'CPU (minutes a step on 2 cores; `--device cuda` runs it, `--quick` checks it).')
        return result
    m = result.metrics
    memory = "the allocator's peak" if device.type == 'cuda' else 'activations saved'
    launches = 'CUDA kernels' if device.type == 'cuda' else 'aten calls'
    vit_size, swin_size = ((2, 64), (128, 160)) if quick else ((64, 224), (800, 1333))

    steps = vit_steps(device, quick)
    vit_labels = {name: step.label for name, step in steps.items()}
    measure('amp.vit_b', steps, device, quick, 9, ('full', 'lora', 'ssf'), m)
    del steps  # ViT-B's optimizer states before Swin-B's
    if device.type == 'cuda':
        torch.cuda.empty_cache()
    steps = swin_steps(device, quick)
    swin_labels = {name: step.label for name, step in steps.items()}
    measure('amp.swin_b', steps, device, quick, 7, ('full', 'frozen_backward'), m)

    result.summary += [
        f'bfloat16, ViT-B/16 batch {vit_size[0]}: MoPPA over LoRA at matched parameters '
        f'{pct(m["amp.vit_b.step.moppa_over_lora"])}, over scale & shift only '
        f'{pct(m["amp.vit_b.step.moppa_over_ssf"])}, over full fine-tuning '
        f'{pct(m["amp.vit_b.step.moppa_over_full"])} in time and '
        f'{pct(m["amp.vit_b.memory.moppa_over_full"])} in {memory}; '
        f'{m["amp.vit_b.launches.moppa"]:,} {launches} a step (LoRA '
        f'{m["amp.vit_b.launches.lora"]:,}, full fine-tuning {m["amp.vit_b.launches.full"]:,}).',
        'bfloat16, Swin-B backbone batch 2: MoPPA + conv adapters (window) over the frozen '
        'backbone with backward through it '
        f'{pct(m["amp.swin_b.step.moppa_window_over_frozen_backward"])} (global scope '
        f'{pct(m["amp.swin_b.step.moppa_global_over_frozen_backward"])}), over full '
        f'fine-tuning {pct(m["amp.swin_b.step.moppa_window_over_full"])} in time and '
        f'{pct(m["amp.swin_b.memory.moppa_window_over_full"])} in {memory}.',
    ]
    result.tables += [
        table(f'bfloat16 ViT-B/16 training step (batch {vit_size[0]}, {vit_size[1]}, AdamW; '
              f'memory_vs_full: {memory})', 'amp.vit_b', vit_labels, 'lora', device, m),
        table(f'bfloat16 Swin-B backbone training step (batch 2, {swin_size[0]}x{swin_size[1]},'
              f' AdamW; memory_vs_full: {memory})', 'amp.swin_b', swin_labels,
              'frozen_backward', device, m),
    ]
    return result

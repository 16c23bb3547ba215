"""Few-shot transfer on generated data: MoPPA side by side with the methods a
user would pick instead; writes its section of docs/accuracy.md (or --out).

    .venv/bin/python benchmarks/transfer.py            # full, see below for the time
    .venv/bin/python benchmarks/transfer.py --quick    # minuscule: checks the harness

No pre-trained weights or public data sets are needed: a small ViT
(mmpretrain's ``VisionTransformer``) is pre-trained here on 16 generated shape
classes (:mod:`shapes_data`), then adapted few-shot to 10 unseen shape classes
by each method:

- linear probe (the backbone frozen),
- full fine-tuning,
- scale & shift only (MoPPA's SSF-style adapters, the units switched off),
- LoRA on qkv (mmpretrain's ``LoRAModel``), rank matched to MoPPA + scale &
  shift's trainable count,
- MoPPA units only, and MoPPA + scale & shift (the paper's set), each with
  both ``init_mode`` values and both ``heat_param`` values.

Every method gets the same new linear head, steps, batch, schedule (AdamW,
cosine) and a small learning-rate grid; the learning rate is chosen on a
validation split with seed 0, then the test accuracy is the mean ± std over
all seeds at that rate (the seed draws the few-shot training images, the head
and the order). Before any step the script also measures what inserting the
method does to the pre-trained function: the source-task validation accuracy
with the pre-trained head, and the relative change of the class-token features.

Time: 5.0 min in all (71 s of pre-training) with one thread on an otherwise idle
2-core CPU (2026-11-22; 21 min when four other jobs shared it); ``--cache-dir``
keeps the pre-trained ViT for the next run, ``--methods`` runs a subset.
"""
import argparse
import copy
import hashlib
import logging
import math
import os
import os.path as osp
import platform
import re
import statistics
import sys
import time
from typing import Dict, List, Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, osp.join(ROOT, 'benchmarks'))

from mmengine.logging import MMLogger  # noqa: E402
from mmpretrain.models.backbones import VisionTransformer  # noqa: E402
from mmpretrain.models.peft import LoRAModel  # noqa: E402
from shapes_data import SOURCE_CLASSES, TRANSFER_CLASSES, make_images  # noqa: E402

import moppa_mm  # noqa: E402,F401
from moppa_mm.models.backbones.moppa_vit import MoPPAVisionTransformer  # noqa: E402
from moppa_mm.models.converters import plain_to_lora_keys  # noqa: E402
from moppa_mm.operators import moppa_units  # noqa: E402

SECTION_BEGIN = '<!-- transfer.py: begin -->'
SECTION_END = '<!-- transfer.py: end -->'

SETTINGS = {
    'full': dict(img_size=32, patch_size=4, embed_dims=64, num_layers=4, num_heads=4,
                 ffn=128, pretrain_per_class=320, pretrain_epochs=8,
                 pretrain_lr=3e-3, val_per_class=20, test_per_class=50, shots=10,
                 steps=60, batch=32, seeds=3),
    'quick': dict(img_size=16, patch_size=4, embed_dims=16, num_layers=2, num_heads=2,
                  ffn=32, pretrain_per_class=4, pretrain_epochs=1,
                  pretrain_lr=2e-3, val_per_class=2, test_per_class=2, shots=2,
                  steps=2, batch=8, seeds=2),
}
PRETRAIN_KEYS = ('img_size', 'patch_size', 'embed_dims', 'num_layers', 'num_heads', 'ffn',
                 'pretrain_per_class', 'pretrain_epochs', 'pretrain_lr', 'val_per_class')
# learning-rate grids (AdamW), one per family of methods
FULL_GRID = (1e-4, 3e-4, 1e-3)
ADAPTER_GRID = (1e-3, 1e-2, 1e-1)


# -------------------------------------------------------------------- models
class Classifier(nn.Module):
    """A backbone returning the class token, and a linear head."""

    def __init__(self, backbone: nn.Module, embed_dims: int, num_classes: int):
        super().__init__()
        self.backbone = backbone
        self.head = nn.Linear(embed_dims, num_classes)

    def features(self, images: torch.Tensor) -> torch.Tensor:
        return self.backbone(images)[-1]  # (B, C), the class token

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(images))


def vit_kwargs(s: dict) -> dict:
    arch = dict(embed_dims=s['embed_dims'], num_layers=s['num_layers'],
                num_heads=s['num_heads'], feedforward_channels=s['ffn'])
    return dict(arch=arch, img_size=s['img_size'], patch_size=s['patch_size'],
                drop_rate=0., drop_path_rate=0., out_type='cls_token')


def moppa_variants() -> List[Tuple[str, str]]:
    return [(init, heat) for init in ('paper', 'identity') for heat in ('raw', 'softplus')]


def build_backbone(method: str, s: dict, vit_state: dict, lora_rank: int = 1) -> nn.Module:
    """The pre-trained backbone prepared for ``method``, its trainable
    parameters set (the head is added by the caller)."""
    kwargs = vit_kwargs(s)
    if method in ('linear probe', 'full fine-tuning'):
        backbone = VisionTransformer(**kwargs)
        backbone.load_state_dict(vit_state)
        backbone.requires_grad_(method == 'full fine-tuning')
        return backbone
    if method.startswith('LoRA'):
        backbone = LoRAModel(module=dict(type='mmpretrain.VisionTransformer', **kwargs),
                             alpha=lora_rank, rank=lora_rank, targets=[dict(type='qkv')])
        missing, unexpected = backbone.module.load_state_dict(
            plain_to_lora_keys(vit_state, backbone.module), strict=False)
        assert not unexpected and all('lora_' in k for k in missing), (missing, unexpected)
        return backbone
    match = re.fullmatch(r'(MoPPA units|MoPPA \+ scale & shift|scale & shift)'
                         r'(?: \((\w+) init, (\w+) heat\))?', method)
    assert match, method
    family, init_mode, heat_param = match.groups()
    moppa_cfg = dict(init_mode=init_mode or 'paper', heat_param=heat_param or 'raw')
    backbone = MoPPAVisionTransformer(**kwargs, moppa_cfg=moppa_cfg,
                                      use_scale_shift=family != 'MoPPA units')
    missing, unexpected = backbone.load_state_dict(vit_state, strict=False)
    assert not unexpected and all('moppa' in k or 'ssf_' in k for k in missing), \
        (missing, unexpected)
    if family == 'scale & shift':
        for unit in moppa_units(backbone):
            unit.enabled = False
            unit.requires_grad_(False)
    return backbone


def method_names(s: dict, lora_rank: int) -> List[str]:
    names = ['linear probe', 'full fine-tuning', 'scale & shift', f'LoRA (rank {lora_rank})']
    for family in ('MoPPA units', 'MoPPA + scale & shift'):
        names += [f'{family} ({init} init, {heat} heat)' for init, heat in moppa_variants()]
    return names


def trainable_count(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters() if p.requires_grad)


def matched_lora_rank(s: dict, vit_state: dict) -> int:
    """The LoRA rank whose trainable count is closest to MoPPA + scale & shift's."""
    target = trainable_count(build_backbone(
        'MoPPA + scale & shift (identity init, softplus heat)', s, vit_state))
    per_rank = trainable_count(build_backbone('LoRA', s, vit_state, lora_rank=1))
    return max(1, round(target / per_rank))


# ------------------------------------------------------------------ training
def evaluate(model: Classifier, images: torch.Tensor, labels: torch.Tensor,
             batch: int = 256) -> float:
    model.eval()
    correct = 0
    with torch.no_grad():
        for start in range(0, len(images), batch):
            logits = model(images[start:start + batch])
            correct += (logits.argmax(1) == labels[start:start + batch]).sum().item()
    return 100.0 * correct / len(images)


def pretrain(s: dict, seed: int = 0) -> Tuple[dict, dict, Dict[str, float]]:
    """Plain ViT + head on the source classes. Returns the backbone's and the
    head's state dicts and the source train / val accuracy."""
    started = time.perf_counter()
    torch.manual_seed(seed)
    images, labels = make_images(SOURCE_CLASSES, s['pretrain_per_class'], s['img_size'], seed=100)
    val_images, val_labels = make_images(SOURCE_CLASSES, s['val_per_class'], s['img_size'],
                                         seed=101)
    model = Classifier(VisionTransformer(**vit_kwargs(s)), s['embed_dims'], len(SOURCE_CLASSES))
    model.backbone.init_weights()
    batch = 64
    steps = s['pretrain_epochs'] * math.ceil(len(images) / batch)
    optimizer = torch.optim.AdamW(model.parameters(), lr=s['pretrain_lr'], weight_decay=0.05)
    schedule = torch.optim.lr_scheduler.OneCycleLR(
        optimizer, max_lr=s['pretrain_lr'], total_steps=steps, pct_start=0.1)
    step = 0
    for _ in range(s['pretrain_epochs']):
        model.train()
        for idx in torch.randperm(len(images)).split(batch):
            loss = F.cross_entropy(model(images[idx]), labels[idx])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            schedule.step()
            step += 1
    accuracy = dict(train=evaluate(model, images[:2000], labels[:2000]),
                    val=evaluate(model, val_images, val_labels),
                    seconds=time.perf_counter() - started)
    return model.backbone.state_dict(), model.head.state_dict(), accuracy


def at_init(method: str, s: dict, vit_state: dict, head_state: dict, lora_rank: int,
            source_val: Tuple[torch.Tensor, torch.Tensor],
            reference: torch.Tensor) -> Dict[str, float]:
    """What inserting the method does before any step: source-task accuracy
    with the pre-trained head, and the class-token features' relative change."""
    torch.manual_seed(0)
    model = Classifier(build_backbone(method, s, vit_state, lora_rank), s['embed_dims'],
                       len(SOURCE_CLASSES))
    model.head.load_state_dict(head_state)
    accuracy = evaluate(model, *source_val)
    with torch.no_grad():
        features = model.eval().features(source_val[0])
    drift = ((features - reference).norm() / reference.norm()).item()
    return dict(source_acc=accuracy, drift=100.0 * drift)


def finetune(method: str, s: dict, vit_state: dict, lora_rank: int, lr: float, seed: int,
             data: dict) -> Dict[str, float]:
    """One run; ``diverged`` when a loss or a parameter turns non-finite."""
    torch.manual_seed(seed)
    model = Classifier(build_backbone(method, s, vit_state, lora_rank), s['embed_dims'],
                       len(TRANSFER_CLASSES))
    images, labels = make_images(TRANSFER_CLASSES, s['shots'], s['img_size'], seed=1000 + seed)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=1e-4)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, s['steps'])
    order = torch.empty(0, dtype=torch.long)
    model.train()
    losses = []
    for _ in range(s['steps']):
        if len(order) < s['batch']:
            order = torch.cat([order, torch.randperm(len(images))])
        idx, order = order[:s['batch']], order[s['batch']:]
        loss = F.cross_entropy(model(images[idx]), labels[idx])
        losses.append(loss.item())
        if not math.isfinite(losses[-1]):
            return dict(diverged=True, val=float('nan'), test=float('nan'), loss=losses[-1])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
    if not all(torch.isfinite(p).all() for p in params):
        return dict(diverged=True, val=float('nan'), test=float('nan'), loss=float('nan'))
    return dict(diverged=False, val=evaluate(model, *data['val']),
                test=evaluate(model, *data['test']), loss=statistics.mean(losses[-5:]))


# ------------------------------------------------------------------- report
def mean_std(values: List[float]) -> str:
    if any(math.isnan(v) for v in values):
        return 'diverged'
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return f'{statistics.mean(values):.1f} ± {std:.1f}'


def grid_of(method: str) -> Tuple[float, ...]:
    return FULL_GRID if method == 'full fine-tuning' else ADAPTER_GRID


def cached_pretrain(s: dict, cache_dir: Optional[str]) -> Tuple[dict, dict, Dict[str, float]]:
    """:func:`pretrain`, kept in ``cache_dir`` under a name derived from the
    settings (the file is this script's own output)."""
    if not cache_dir:
        return pretrain(s)
    used = {k: v for k, v in s.items() if k in PRETRAIN_KEYS}
    key = hashlib.sha1(repr(sorted(used.items())).encode()).hexdigest()[:12]
    path = osp.join(cache_dir, f'pretrained_{key}.pth')
    if osp.exists(path):
        saved = torch.load(path, weights_only=True)
        return saved['vit'], saved['head'], dict(saved['accuracy'], cached=path)
    vit_state, head_state, accuracy = pretrain(s)
    os.makedirs(cache_dir, exist_ok=True)
    torch.save(dict(vit=vit_state, head=head_state, accuracy=accuracy), path)
    return vit_state, head_state, accuracy


def run(s: dict, methods: Optional[List[str]], log=print,
        cache_dir: Optional[str] = None) -> dict:
    started = time.perf_counter()
    vit_state, head_state, pre_acc = cached_pretrain(s, cache_dir)
    log(f'pre-trained: source train {pre_acc["train"]:.1f}%, val {pre_acc["val"]:.1f}% '
        f'({time.perf_counter() - started:.0f} s)')
    lora_rank = matched_lora_rank(s, vit_state)
    names = method_names(s, lora_rank)
    if methods:
        names = [n for n in names if any(m.lower() in n.lower() for m in methods)]
    source_val = make_images(SOURCE_CLASSES, s['val_per_class'], s['img_size'], seed=101)
    reference_model = Classifier(VisionTransformer(**vit_kwargs(s)), s['embed_dims'],
                                 len(SOURCE_CLASSES))
    reference_model.backbone.load_state_dict(vit_state)
    with torch.no_grad():
        reference = reference_model.eval().features(source_val[0])
    data = dict(val=make_images(TRANSFER_CLASSES, s['val_per_class'], s['img_size'], seed=2000),
                test=make_images(TRANSFER_CLASSES, s['test_per_class'], s['img_size'], seed=3000))
    rows = []
    for name in names:
        t0 = time.perf_counter()
        torch.manual_seed(0)
        backbone = build_backbone(name, s, vit_state, lora_rank)
        row = dict(method=name, trainable=trainable_count(backbone),
                   init=at_init(name, s, vit_state, head_state, lora_rank, source_val, reference))
        row['grid'] = {lr: finetune(name, s, vit_state, lora_rank, lr, 0, data)
                       for lr in grid_of(name)}
        finite = {lr: r for lr, r in row['grid'].items() if not r['diverged']}
        row['lr'] = max(finite, key=lambda lr: finite[lr]['val']) if finite else None
        runs = [row['grid'][row['lr']]] if row['lr'] else []
        runs += [finetune(name, s, vit_state, lora_rank, row['lr'], seed, data)
                 for seed in range(1, s['seeds'])] if row['lr'] else []
        row['test'] = [r['test'] for r in runs]
        row['seed_diverged'] = sum(r['diverged'] for r in runs)
        rows.append(row)
        log(f'{name}: trainable {row["trainable"]}, lr {row["lr"]}, '
            f'test {mean_std(row["test"]) if runs else "-"}, '
            f'val per lr {[round(r["val"], 1) for r in row["grid"].values()]} '
            f'({time.perf_counter() - t0:.0f} s)')
    head_params = s['embed_dims'] * len(TRANSFER_CLASSES) + len(TRANSFER_CLASSES)
    return dict(settings=s, pretrain=pre_acc, rows=rows, lora_rank=lora_rank,
                head_params=head_params, seconds=time.perf_counter() - started)


def compare(rows: List[dict], family: str, key, a: str, b: str) -> Optional[str]:
    """Mean test accuracy of ``family`` variants grouped by ``key`` (a or b)."""
    groups = {a: [], b: []}
    for row in rows:
        if row['method'].startswith(family + ' (') and row['test'] \
                and not any(math.isnan(v) for v in row['test']):
            groups[key(row['method'])].append(statistics.mean(row['test']))
    if not groups[a] or not groups[b]:
        return None
    return (f'{family}: {a} {statistics.mean(groups[a]):.1f} vs {b} '
            f'{statistics.mean(groups[b]):.1f} (mean test accuracy over the other option)')


def markdown(result: dict) -> str:
    s = result['settings']
    lines = [
        SECTION_BEGIN,
        '## Few-shot transfer on generated shapes (`benchmarks/transfer.py`)',
        '',
        f'Machine: {platform.machine()}, {torch.get_num_threads()} threads, torch '
        f'{torch.__version__}; {result["seconds"] / 60:.1f} min in all.',
        '',
        f'Pre-training: plain mmpretrain ViT ({s["num_layers"]} layers, {s["embed_dims"]} dims, '
        f'{s["num_heads"]} heads, MLP {s["ffn"]}, {s["img_size"]} px, patch {s["patch_size"]}) '
        f'on {len(SOURCE_CLASSES)} shape classes x {s["pretrain_per_class"]} images, '
        f'{s["pretrain_epochs"]} epochs: source validation accuracy '
        f'**{result["pretrain"]["val"]:.1f}%** (train {result["pretrain"]["train"]:.1f}%)'
        + (f', {result["pretrain"]["seconds"]:.0f} s' if 'seconds' in result['pretrain'] else '')
        + (' (reused from `--cache-dir`, not in the total above)'
           if 'cached' in result['pretrain'] else '') + '.',
        '',
        f'Transfer: {len(TRANSFER_CLASSES)} unseen classes, {s["shots"]} shots each, '
        f'{s["steps"]} AdamW steps of batch {s["batch"]} (cosine, weight decay 1e-4), '
        f'a new linear head ({result["head_params"]} parameters, trainable in every '
        f'method and not counted below); validation {s["val_per_class"]} and test '
        f'{s["test_per_class"]} images per class. Learning rate chosen on validation '
        f'with seed 0 from {list(FULL_GRID)} (full fine-tuning) or {list(ADAPTER_GRID)} '
        f'(the others); test accuracy is the mean ± std over seeds 0-{s["seeds"] - 1} '
        f'at that rate. LoRA rank {result["lora_rank"]} on qkv (alpha = rank) matches '
        'MoPPA + scale & shift\'s trainable count.',
        '',
        '"At init" is measured before any step, on the source validation set with the '
        'pre-trained head: its accuracy, and how far the class-token features moved '
        '(|f - f_pretrained| / |f_pretrained|).',
        '',
        '| method | trainable (backbone) | source acc. at init | feature change at init '
        '| val. acc. per lr (seed 0) | chosen lr | test acc. (mean ± std) |',
        '|---|---:|---:|---:|---|---:|---:|',
    ]
    for row in result['rows']:
        per_lr = ', '.join(
            f'{lr:g}: ' + ('**diverged**' if r['diverged'] else f'{r["val"]:.1f}')
            for lr, r in row['grid'].items())
        test = mean_std(row['test']) if row['test'] else 'diverged at every lr'
        if row['seed_diverged']:
            test += f' ({row["seed_diverged"]} seed(s) diverged)'
        lines.append(
            f'| {row["method"]} | {row["trainable"]:,} | {row["init"]["source_acc"]:.1f} '
            f'| {row["init"]["drift"]:.1f}% | {per_lr} | {row["lr"] if row["lr"] else "-"} '
            f'| {test} |')
    diverged = [f'{row["method"]} at lr {lr:g}' for row in result['rows']
                for lr, r in row['grid'].items() if r['diverged']]
    lines += ['', 'Diverged (a non-finite loss or parameter): '
              + ('; '.join(diverged) if diverged else 'none') + '.', '']
    summaries = []
    for family in ('MoPPA units', 'MoPPA + scale & shift'):
        summaries.append(compare(result['rows'], family,
                                 lambda m: 'identity' if 'identity init' in m else 'paper',
                                 'identity', 'paper'))
        summaries.append(compare(result['rows'], family,
                                 lambda m: 'softplus' if 'softplus heat' in m else 'raw',
                                 'softplus', 'raw'))
    summaries = [f'- {line}' for line in summaries if line]
    if summaries:
        lines += ['Options compared:', ''] + summaries + ['']
    lines.append(SECTION_END)
    return '\n'.join(lines) + '\n'


def write_section(path: str, section: str) -> None:
    """Replace this script's section of ``path``, keeping the rest."""
    text = open(path).read() if osp.exists(path) else '# Accuracy\n\n'
    if SECTION_BEGIN in text and SECTION_END in text:
        head, rest = text.split(SECTION_BEGIN, 1)
        text = head + section.rstrip('\n') + rest.split(SECTION_END, 1)[1]
    else:
        text = text.rstrip('\n') + '\n\n' + section
    os.makedirs(osp.dirname(osp.abspath(path)), exist_ok=True)
    with open(path, 'w') as f:
        f.write(text)


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--quick', action='store_true',
                        help='minuscule sizes and 2 steps: checks the harness in seconds')
    parser.add_argument('--methods', nargs='+',
                        help='only the methods whose name contains one of these')
    parser.add_argument('--threads', type=int, help='torch threads (default: torch\'s)')
    parser.add_argument('--cache-dir', help='keep the pre-trained ViT here and reuse it '
                        'when the settings match (default: pre-train every run)')
    parser.add_argument('--out', default=osp.join(ROOT, 'docs', 'accuracy.md'))
    return parser.parse_args()


def main():
    args = parse_args()
    MMLogger.get_current_instance().setLevel(logging.WARNING)  # LoRAModel's init log
    if args.threads:
        torch.set_num_threads(args.threads)
    settings = copy.deepcopy(SETTINGS['quick' if args.quick else 'full'])
    result = run(settings, args.methods, log=lambda m: print(m, flush=True),
                 cache_dir=args.cache_dir)
    write_section(args.out, markdown(result))
    print(f'wrote {args.out}')


if __name__ == '__main__':
    main()

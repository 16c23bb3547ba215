"""Transfer on generated scenes: MoPPA side by side with the methods a user
would pick instead, the four ``init_mode`` x ``heat_param`` pairs of its unit,
the paper's ablations and the wave expert's start; writes its section of
docs/accuracy.md (or --out).

    .venv/bin/python benchmarks/transfer.py            # full, see below for the time
    .venv/bin/python benchmarks/transfer.py --quick    # minuscule: checks the harness
                                                       # (prints; writes only to --out)

No pre-trained weights or public data sets are needed. A small hybrid ViT (a
three-convolution stem, then mmpretrain's ``VisionTransformer`` on the 8x8
grid of its features) is pre-trained here on 16 silhouette classes of generated
scenes (textures, several scales and positions, clutter, occlusion:
:mod:`shapes_data`; new scenes every epoch) to a strong source accuracy (95%
on held-out scenes), then transferred to 10 unseen
classes in a changed domain (textured backgrounds, desaturated palette, other
fill textures, more noise) by each method:

- linear probe (the backbone frozen), full fine-tuning (everything, the stem
  included), LoRA on qkv (mmpretrain's ``LoRAModel``, rank matched to MoPPA +
  scale & shift's trainable count);
- MoPPA + scale & shift (the paper's set) with each of the four
  ``init_mode`` x ``heat_param`` pairs;
- the paper's ablations of the recipe (``--recipe``, by default the shipped
  unit options, ``MoPPAConfig``'s): without heat, wave or
  Poisson (the unit's ``experts``), without the MoPPA units (scale & shift
  alone: ``use_moppa=False``), without the route regularisation
  (``route_loss_weight=0``);
- the wave expert's start: ``coef_init=0.1`` (k and c start 10x larger), and
  the wave's ``c`` alone re-drawn in [0, 0.3).

Every method gets the same new linear head, batch, schedule (AdamW, cosine) and
the route regularisation of the shipped recipe (``route_loss_weight=1``, paper
Eq. 13 over the run's steps) where it has MoPPA units. Two budgets: ``steps``
and ``long_factor`` times as many. For each method and budget the learning
rate is chosen on a validation split with seed 0 from a grid of half-decade
steps that is extended until the chosen rate is interior (or a bound of the
grid is reached); the test accuracy is then the mean ± std over the seeds at
that rate (the seed draws the training images, the head and the order, the
same for every method: the "Δ" column is each row's per-seed difference to the
recipe's row).
Before any step the script also measures what inserting the method does to the
pre-trained function: the source accuracy with the pre-trained head and the
relative change of the class-token features. After training it records how far
the MoPPA units' k, c and t moved.

Time: see the section it writes (about 12 minutes on 2 idle cores: pre-training
with ``pretrain_threads`` intra-op threads, then ``--workers`` trainings at once,
one thread each; ``--cache-dir`` keeps the pre-trained model for the next run;
``--methods`` runs a subset). The fine-tuning runs are small: one thread each
in two processes uses 2 cores better than two threads in one.
"""
import argparse
import copy
import hashlib
import json
import logging
import math
import multiprocessing
import os
import os.path as osp
import platform
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
sys.path.append(osp.join(ROOT, 'tools'))  # appended: tools/test.py is no `test`

from mmengine.logging import MMLogger  # noqa: E402
from mmpretrain.models.backbones import VisionTransformer  # noqa: E402
from mmpretrain.models.peft import LoRAModel  # noqa: E402
from model_converters.vit_to_mmpretrain import plain_to_lora_keys  # noqa: E402
from transfer_tasks import TASKS, Task  # noqa: E402

import moppa_mm  # noqa: E402,F401
from moppa_mm.models.backbones.moppa_vit import MoPPAVisionTransformer  # noqa: E402
from moppa_mm.models.moppa_config import MoPPAConfig  # noqa: E402
from moppa_mm.operators import EXPERTS, moppa_units  # noqa: E402
from moppa_mm.operators.dct import dct_frequencies  # noqa: E402


def section_markers(task_key: str) -> Tuple[str, str]:
    """The comments around a task's section of docs/accuracy.md."""
    return f'<!-- transfer.py {task_key}: begin -->', f'<!-- transfer.py {task_key}: end -->'


PRETRAIN_KEYS = ('img_size', 'stem', 'patch_size', 'embed_dims', 'num_layers', 'num_heads',
                 'ffn', 'pretrain_per_class', 'source_per_class', 'pretrain_epochs',
                 'pretrain_lr', 'pretrain_batch', 'val_per_class')
# learning rates: half-decade steps (1, 3 x 10^k); each method starts from
# three of them and the grid grows until the chosen one is interior
LR_LADDER = tuple(m * 10.0**e for e in range(-6, 2) for m in (1, 3))[:-1]  # 1e-6 .. 10
START = {'full fine-tuning': (1e-4, 3e-4, 1e-3)}
ADAPTER_START = (3e-3, 1e-2, 3e-2)
MAX_EXTENSIONS = 4
PAIRS = [(init, heat) for init in ('paper', 'identity') for heat in ('raw', 'softplus')]
FAMILY = 'MoPPA + scale & shift'
# the unit options of the shipped configs (the backbones' defaults)
SHIPPED = (MoPPAConfig.init_mode, MoPPAConfig.heat_param)


# -------------------------------------------------------------------- models
def make_stem(s: dict) -> nn.Module:
    """The hybrid ViT's convolutional stem: (B, 3, S, S) -> (B, 4w, S/4, S/4)."""
    w = s['stem']
    return nn.Sequential(nn.Conv2d(3, w, 3, 1, 1), nn.BatchNorm2d(w), nn.GELU(),
                         nn.Conv2d(w, 2 * w, 3, 2, 1), nn.BatchNorm2d(2 * w), nn.GELU(),
                         nn.Conv2d(2 * w, 4 * w, 3, 2, 1), nn.BatchNorm2d(4 * w), nn.GELU())


class Classifier(nn.Module):
    """Stem, a ViT backbone returning the class token, and a linear head."""

    def __init__(self, stem: nn.Module, backbone: nn.Module, embed_dims: int,
                 num_classes: int):
        super().__init__()
        self.stem = stem
        self.backbone = backbone
        self.head = nn.Linear(embed_dims, num_classes)

    def features(self, images: torch.Tensor) -> torch.Tensor:
        return self.backbone(self.stem(images))[-1]  # (B, C), the class token

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(images))


def vit_kwargs(s: dict) -> dict:
    arch = dict(embed_dims=s['embed_dims'], num_layers=s['num_layers'],
                num_heads=s['num_heads'], feedforward_channels=s['ffn'])
    return dict(arch=arch, img_size=s['img_size'] // 4, patch_size=s['patch_size'],
                in_channels=4 * s['stem'], drop_rate=0., drop_path_rate=0.,
                out_type='cls_token')


def moppa_spec(init: str = 'paper', heat: str = 'raw', experts=EXPERTS, use_moppa=True,
               route=1.0, coef_init=1e-2, wave_init=None) -> dict:
    return dict(kind='moppa', init_mode=init, heat_param=heat, experts=tuple(experts),
                use_moppa=use_moppa, route_loss_weight=route, coef_init=coef_init,
                wave_init=wave_init)


def method_specs(lora_rank: int, recipe: Tuple[str, str]) -> Dict[str, dict]:
    """Every method of the table, in order: name -> how to build it."""
    specs = {'linear probe': dict(kind='linear'), 'full fine-tuning': dict(kind='full'),
             f'LoRA (rank {lora_rank})': dict(kind='lora', rank=lora_rank)}
    for init, heat in PAIRS:
        specs[f'{FAMILY} ({init} init, {heat} heat)'] = moppa_spec(init, heat)
    tag = f'{recipe[0]} init, {recipe[1]} heat'
    for expert in EXPERTS:
        specs[f'w/o {expert.capitalize()} ({tag})'] = moppa_spec(
            *recipe, experts=[e for e in EXPERTS if e != expert])
    specs[f'w/o MoPPA units (scale & shift, {tag})'] = moppa_spec(*recipe, use_moppa=False)
    specs[f'w/o route regularisation ({tag})'] = moppa_spec(*recipe, route=0.0)
    specs[f'coef_init 0.1 ({tag})'] = moppa_spec(*recipe, coef_init=0.1)
    specs[f'wave c init 0.3 ({tag})'] = moppa_spec(*recipe, wave_init=0.3)
    return specs


def build_backbone(spec: dict, s: dict, vit_state: dict) -> nn.Module:
    """The pre-trained ViT prepared for ``spec``, its trainable parameters set
    (the stem and head are added by the caller)."""
    kwargs = vit_kwargs(s)
    if spec['kind'] in ('linear', 'full'):
        backbone = VisionTransformer(**kwargs)
        backbone.load_state_dict(vit_state)
        backbone.requires_grad_(spec['kind'] == 'full')
        return backbone
    if spec['kind'] == 'lora':
        backbone = LoRAModel(module=dict(type='mmpretrain.VisionTransformer', **kwargs),
                             alpha=spec['rank'], rank=spec['rank'],
                             targets=[dict(type='qkv')])
        missing, unexpected = backbone.module.load_state_dict(
            plain_to_lora_keys(vit_state, backbone.module), strict=False)
        assert not unexpected and all('lora_' in k for k in missing), (missing, unexpected)
        return backbone
    moppa_cfg = dict(init_mode=spec['init_mode'], heat_param=spec['heat_param'],
                     experts=spec['experts'], coef_init=spec['coef_init'])
    backbone = MoPPAVisionTransformer(**kwargs, moppa_cfg=moppa_cfg, use_moppa=spec['use_moppa'],
                                      route_loss_weight=spec['route_loss_weight'],
                                      route_schedule='iter')
    missing, unexpected = backbone.load_state_dict(vit_state, strict=False)
    assert not unexpected and all('moppa' in k or 'ssf_' in k for k in missing), \
        (missing, unexpected)
    if spec['wave_init'] is not None:
        with torch.no_grad():
            for unit in moppa_units(backbone):
                unit.expert_maps('wave')[0].uniform_(0, spec['wave_init'])
    return backbone


def trainable_count(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters() if p.requires_grad)


def matched_lora_rank(s: dict, vit_state: dict) -> int:
    """The LoRA rank whose trainable count is closest to MoPPA + scale & shift's."""
    target = trainable_count(build_backbone(moppa_spec(), s, vit_state))
    per_rank = trainable_count(build_backbone(dict(kind='lora', rank=1), s, vit_state))
    return max(1, round(target / per_rank))


def build_model(spec: dict, s: dict, state: dict, num_classes: int) -> Classifier:
    stem = make_stem(s)
    stem.load_state_dict(state['stem'])
    stem.requires_grad_(spec['kind'] == 'full')
    return Classifier(stem, build_backbone(spec, s, state['vit']), s['embed_dims'],
                      num_classes)


# ------------------------------------------------------------------ training
def evaluate(model: Classifier, images: torch.Tensor, labels: torch.Tensor,
             batch: int = 500) -> float:
    model.eval()
    correct = 0
    with torch.no_grad():
        for start in range(0, len(images), batch):
            logits = model(images[start:start + batch])
            correct += (logits.argmax(1) == labels[start:start + batch]).sum().item()
    return 100.0 * correct / len(images)


def pretrain(task: Task, s: dict, seed: int = 0) -> Tuple[dict, Dict[str, float]]:
    """The hybrid ViT + head on the task's source classes: the images of
    ``task.source_epoch`` every epoch (flipped half the time where
    ``task.flip``), one-cycle AdamW, ``pretrain_threads`` intra-op threads.
    Returns the state dicts (stem, vit, head) and the source accuracy on the
    last epoch's images ("train") and on held-out ones ("val")."""
    started = time.perf_counter()
    threads = torch.get_num_threads()
    torch.set_num_threads(s['pretrain_threads'])
    torch.manual_seed(seed)
    val_images, val_labels = task.source_val(s)
    backbone = VisionTransformer(**vit_kwargs(s))
    backbone.init_weights()
    model = Classifier(make_stem(s), backbone, s['embed_dims'], len(task.source_classes))
    batch = s['pretrain_batch']
    per_epoch = len(task.source_epoch(s, 0)[1])
    steps = s['pretrain_epochs'] * math.ceil(per_epoch / batch)
    optimizer = torch.optim.AdamW(model.parameters(), lr=s['pretrain_lr'], weight_decay=0.05)
    schedule = torch.optim.lr_scheduler.OneCycleLR(
        optimizer, max_lr=s['pretrain_lr'], total_steps=steps, pct_start=0.1)
    for epoch in range(s['pretrain_epochs']):
        images, labels = task.source_epoch(s, epoch)
        model.train()
        for idx in torch.randperm(per_epoch).split(batch):
            flip = torch.rand(len(idx)) < (0.5 if task.flip else 0.0)
            batch_images = torch.where(flip[:, None, None, None], images[idx].flip(-1),
                                       images[idx])
            loss = F.cross_entropy(model(batch_images), labels[idx])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            schedule.step()
    accuracy = dict(train=evaluate(model, images, labels),
                    val=evaluate(model, val_images, val_labels),
                    seconds=time.perf_counter() - started)
    torch.set_num_threads(threads)
    state = dict(stem=model.stem.state_dict(), vit=model.backbone.state_dict(),
                 head=model.head.state_dict())
    return state, accuracy


def at_init(spec: dict, s: dict, state: dict, source_val, reference) -> Dict[str, float]:
    """What inserting the method does before any step: source-task accuracy
    with the pre-trained head, and the class-token features' relative change."""
    torch.manual_seed(0)
    model = build_model(spec, s, state, len(state['head']['bias']))
    model.head.load_state_dict(state['head'])
    accuracy = evaluate(model, *source_val)
    with torch.no_grad():
        features = model.eval().features(source_val[0])
    drift = ((features - reference).norm() / reference.norm()).item()
    return dict(source_acc=accuracy, drift=100.0 * drift)


def _physical(unit: nn.Module, expert: str) -> Tuple[torch.Tensor, torch.Tensor]:
    """Heat's (k, t) or wave's (c, t) of ``unit`` as its filter uses them
    (softplus applied to heat's under ``heat_param='softplus'``, and to a ``t``
    wave shares with heat)."""
    frequency, time = unit.expert_maps(expert)
    shared = expert == 'wave' and unit.share_time and 'heat' in unit.experts
    if unit.heat_param == 'softplus':
        frequency = F.softplus(frequency) if expert == 'heat' else frequency
        time = F.softplus(time) if expert == 'heat' or shared else time
    return frequency, time


def unit_snapshot(model: nn.Module) -> Dict[str, torch.Tensor]:
    """k, c, t of every unit as the filters use them (softplus applied),
    without the DC entries of k and c (they multiply w = 0 and never move)."""
    out = {}
    for unit in moppa_units(model):
        h, w = unit.grid_size
        dc = torch.zeros(h, w, dtype=torch.bool)
        dc[0, 0] = True
        for expert, coef in (('heat', 'k'), ('wave', 'c')):
            if expert in unit.experts:
                frequency, time = _physical(unit, expert)
                out.setdefault(coef, []).append(frequency[~dc].detach().flatten())
                out.setdefault(f't_{expert}', []).append(time.detach().flatten())
        if unit.init_mode == 'identity':
            out.setdefault('gate', []).append(unit.gate.detach().flatten())
    return {k: torch.cat(v).clone() for k, v in out.items()}


def heat_sharpening(model: nn.Module) -> Optional[Dict[str, float]]:
    """Where the heat expert amplifies instead of damping: the share of its
    ``k t`` products (per frequency, head and channel; DC left out) below zero,
    and its largest gain ``exp(-k w^2 t)`` over all units (1 = never
    amplifies). None without heat experts."""
    negative, total, gain = 0, 0, 1.0
    for unit in moppa_units(model):
        if 'heat' not in unit.experts:
            continue
        h, w = unit.grid_size
        k, t = (p.detach() for p in _physical(unit, 'heat'))
        omega_sq, _ = dct_frequencies(h, w, k.device, k.dtype)  # (H, W)
        exponent = k[..., None] * t * omega_sq[:, :, None, None]  # (H, W, N, C/N)
        dc = torch.zeros(h, w, dtype=torch.bool)
        dc[0, 0] = True
        kept = exponent[~dc]  # (H W - 1, N, C/N)
        negative += int((kept < 0).sum())
        total += kept.numel()
        gain = max(gain, float(torch.exp(-kept.min())))
    return dict(negative=100.0 * negative / total, gain=gain) if total else None


def movement(before: Dict[str, torch.Tensor], after: Dict[str, torch.Tensor]) -> dict:
    """Mean |change| of each of :func:`unit_snapshot`'s groups."""
    return {k: (after[k] - before[k]).abs().mean().item() for k in before}


def finetune(spec: dict, s: dict, state: dict, lr: float, seed: int, steps: int,
             task: Task, data: dict) -> Dict[str, float]:
    """One run; ``diverged`` when a loss or a parameter turns non-finite.

    Runs of one seed are paired across methods: the same training images, the
    same head initialisation and the same batch order (a generator of their
    own, untouched by what the method draws for its adapters)."""
    torch.manual_seed(seed)
    model = build_model(spec, s, state, len(task.target_classes))
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # nn.Linear's own init, drawn from the seed's generator
        bound = 1 / math.sqrt(s['embed_dims'])
        model.head.weight.uniform_(-bound, bound, generator=generator)
        model.head.bias.uniform_(-bound, bound, generator=generator)
    images, labels = task.target_train(s, seed)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=1e-4)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, steps)
    before = unit_snapshot(model)
    order = torch.empty(0, dtype=torch.long)
    model.train()
    model.stem.eval()  # the stem's BatchNorm keeps its pre-trained statistics
    route = getattr(model.backbone, 'route_loss', None)
    nan = float('nan')
    losses = []
    for step in range(steps):
        if len(order) < s['batch']:
            order = torch.cat([order, torch.randperm(len(images), generator=generator)])
        idx, order = order[:s['batch']], order[s['batch']:]
        loss = F.cross_entropy(model(images[idx]), labels[idx])
        losses.append(loss.item())
        if route is not None and model.backbone.use_moppa:  # paper Eq. 13, by step
            model.backbone.set_route_progress(step, steps)
            loss = loss + route()
        if not math.isfinite(loss.item()):
            return dict(diverged=True, val=nan, test=nan, loss=losses[-1])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
    if not all(torch.isfinite(p).all() for p in params):
        return dict(diverged=True, val=nan, test=nan, loss=nan)
    result = dict(diverged=False, val=evaluate(model, *data['val']),
                  test=evaluate(model, *data['test']), loss=statistics.mean(losses[-5:]))
    if before:
        result['moved'] = movement(before, unit_snapshot(model))
    sharpening = heat_sharpening(model)
    if sharpening:
        result['sharpening'] = sharpening
    return result


# ------------------------------------------------------- parallel execution
_WORKER: dict = {}


def _init_worker(context: dict) -> None:
    torch.set_num_threads(1)
    MMLogger.get_current_instance().setLevel(logging.WARNING)
    _WORKER.update(context)


def _run_job(job: Tuple[str, float, int, int]) -> Tuple[Tuple[str, float, int, int], dict]:
    name, lr, seed, steps = job
    w = _WORKER
    return job, finetune(w['specs'][name], w['settings'], w['state'], lr, seed, steps,
                         w['task'], w['data'])


class Runner:
    """Runs fine-tuning jobs, in ``workers`` processes (forked: they share the
    pre-trained state and the data) or in this one."""

    def __init__(self, context: dict, workers: int):
        self.context = context
        self.pool = None
        if workers > 1:
            self.pool = multiprocessing.get_context('fork').Pool(
                workers, initializer=_init_worker, initargs=(context, ))
        else:
            _WORKER.update(context)

    def map(self, jobs: List[tuple]) -> Dict[tuple, dict]:
        if self.pool is None:
            return dict(_run_job(job) for job in jobs)
        return dict(self.pool.imap_unordered(_run_job, jobs))

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()
            self.pool.join()


def neighbour(lr: float, step: int) -> Optional[float]:
    index = min(range(len(LR_LADDER)), key=lambda i: abs(math.log(LR_LADDER[i] / lr)))
    index += step
    return LR_LADDER[index] if 0 <= index < len(LR_LADDER) else None


def best_lr(grid: Dict[float, dict]) -> Optional[float]:
    """The rate with the best validation accuracy (ties: the one nearest the
    middle of the grid), None if every rate diverged."""
    finite = {lr: r for lr, r in grid.items() if not r['diverged']}
    if not finite:
        return None
    top = max(r['val'] for r in finite.values())
    tied = sorted(lr for lr, r in finite.items() if r['val'] == top)
    return tied[len(tied) // 2]


def edge_step(grid: Dict[float, dict], lr: Optional[float]) -> int:
    """-1 / +1 when the chosen rate is the grid's smallest / largest (and not
    bounded by a diverged neighbour), else 0."""
    rates = sorted(grid)
    if lr is None:  # all diverged: go down
        return -1
    if lr == rates[0] and len(rates) > 0:
        return -1
    if lr == rates[-1]:
        return 1
    return 0


def choose_rates(runner: Runner, names: List[str], starts: Dict[str, Tuple[float, ...]],
                 steps: int, log) -> Dict[str, Dict[float, dict]]:
    """Seed-0 grids, extended by one half-decade at the open edge until every
    method's chosen rate is interior (all methods' runs of a round at once)."""
    grids = {name: {} for name in names}
    pending = [(name, lr, 0, steps) for name in names for lr in starts[name]]
    for _ in range(MAX_EXTENSIONS + 1):
        for (name, lr, _, _), result in runner.map(pending).items():
            grids[name][lr] = result
        pending = []
        for name in names:
            step = edge_step(grids[name], best_lr(grids[name]))
            if step:
                edge = min(grids[name]) if step < 0 else max(grids[name])
                lr = neighbour(edge, step)
                if lr is not None and lr not in grids[name]:
                    pending.append((name, lr, 0, steps))
        if not pending:
            break
        log(f'  {steps} steps: extending {len(pending)} grid(s): '
            + ', '.join(f'{n} -> {lr:g}' for n, lr, _, _ in pending))
    return grids


def run_budget(runner: Runner, names: List[str], starts: Dict[str, Tuple[float, ...]],
               s: dict, steps: int, log) -> Dict[str, dict]:
    t0 = time.perf_counter()
    grids = choose_rates(runner, names, starts, steps, log)
    chosen = {name: best_lr(grids[name]) for name in names}
    jobs = [(name, chosen[name], seed, steps) for name in names if chosen[name]
            for seed in range(1, s['seeds'])]
    seeds = runner.map(jobs)
    out = {}
    for name in names:
        lr = chosen[name]
        runs = [grids[name][lr]] + [seeds[(name, lr, seed, steps)]
                                    for seed in range(1, s['seeds'])] if lr else []
        out[name] = dict(grid=dict(sorted(grids[name].items())), lr=lr,
                         interior=bool(lr) and edge_step(grids[name], lr) == 0,
                         test=[r['test'] for r in runs],
                         seed_diverged=sum(r['diverged'] for r in runs),
                         moved=[r['moved'] for r in runs if 'moved' in r],
                         sharpening=[r['sharpening'] for r in runs if 'sharpening' in r])
    log(f'  {steps} steps: {len(names)} methods in {time.perf_counter() - t0:.0f} s')
    return out


# ------------------------------------------------------------------- report
def mean_std(values: List[float]) -> str:
    if not values:
        return 'diverged at every lr'
    if any(math.isnan(v) for v in values):
        return 'diverged'
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return f'{statistics.mean(values):.1f} ± {std:.1f}'


def cached_pretrain(task: Task, s: dict,
                    cache_dir: Optional[str]) -> Tuple[dict, Dict[str, float]]:
    """:func:`pretrain`, kept in ``cache_dir`` under a name derived from the
    task, its settings and the code that draws its data (the file is this
    script's own output)."""
    if not cache_dir:
        return pretrain(task, s)
    used = {k: v for k, v in s.items() if k in PRETRAIN_KEYS}
    key = hashlib.sha1(repr(sorted(used.items())).encode() + task.cache_key()).hexdigest()[:12]
    path = osp.join(cache_dir, f'pretrained_hybrid_{task.key}_{key}.pth')
    if osp.exists(path):
        saved = torch.load(path, weights_only=True)
        return saved['state'], dict(saved['accuracy'], cached=path)
    state, accuracy = pretrain(task, s)
    os.makedirs(cache_dir, exist_ok=True)
    torch.save(dict(state=state, accuracy=accuracy), path)
    return state, accuracy


def run(task: Task, s: dict, methods: Optional[List[str]], log=print,
        cache_dir: Optional[str] = None, workers: int = 1,
        recipe: Tuple[str, str] = SHIPPED, long: bool = True) -> dict:
    started = time.perf_counter()
    state, pre_acc = cached_pretrain(task, s, cache_dir)
    log(f'pre-trained: source train {pre_acc["train"]:.1f}%, val {pre_acc["val"]:.1f}% '
        f'({time.perf_counter() - started:.0f} s)')
    lora_rank = matched_lora_rank(s, state['vit'])
    specs = method_specs(lora_rank, recipe)
    names = list(specs)
    if methods:
        names = [n for n in names if any(m.lower() in n.lower() for m in methods)]
    source_val = task.source_val(s)
    reference_model = build_model(dict(kind='linear'), s, state, len(task.source_classes))
    with torch.no_grad():
        reference = reference_model.eval().features(source_val[0])
    data = task.target_eval(s)
    rows = {}
    for name in names:
        torch.manual_seed(0)
        model = build_model(specs[name], s, state, len(task.target_classes))
        rows[name] = dict(method=name, trainable=trainable_count(model.stem)
                          + trainable_count(model.backbone),
                          init=at_init(specs[name], s, state, source_val, reference))
    runner = Runner(dict(specs=specs, settings=s, state=state, task=task, data=data), workers)
    try:
        short = s['steps']
        starts = {n: START.get(n, ADAPTER_START) for n in names}
        budgets = {short: run_budget(runner, names, starts, s, short, log)}
        if long:
            longer = short * s['long_factor']
            # the long budget's grid starts around the short budget's choice
            starts = {n: tuple(x for x in (neighbour(lr, -1), lr, neighbour(lr, 1)) if x)
                      if (lr := budgets[short][n]['lr']) else starts[n] for n in names}
            budgets[longer] = run_budget(runner, names, starts, s, longer, log)
    finally:
        runner.close()
    for name in names:
        rows[name]['budgets'] = {steps: b[name] for steps, b in budgets.items()}
        log(f'{name}: ' + '; '.join(
            f'{steps} steps: lr {b["lr"]}, test {mean_std(b["test"])}'
            for steps, b in rows[name]['budgets'].items()))
    classes = len(task.target_classes)
    head_params = s['embed_dims'] * classes + classes
    return dict(task=task, settings=s, pretrain=pre_acc, rows=list(rows.values()),
                lora_rank=lora_rank, head_params=head_params, recipe=recipe, workers=workers,
                seconds=time.perf_counter() - started)


def _lr_cell(budget: dict) -> str:
    if not budget['lr']:
        return '-'
    return f'{budget["lr"]:g}' + ('' if budget['interior'] else ' (edge)')


def _grid_cell(budget: dict) -> str:
    return ', '.join(f'{lr:g}: ' + ('**div.**' if r['diverged'] else f'{r["val"]:.0f}')
                     for lr, r in budget['grid'].items())


def _moved_cell(budget: dict) -> str:
    moved = budget['moved']
    if not moved:
        return '-'
    keys = [k for k in ('k', 't_heat', 'c', 't_wave', 'gate') if k in moved[0]]
    cell = ', '.join(f'{k} {statistics.mean(m[k] for m in moved):.2g}' for k in keys)
    sharpening = budget.get('sharpening')
    if sharpening:
        cell += (f'; k t < 0: {statistics.mean(x["negative"] for x in sharpening):.0f}%, '
                 f'gain up to {max(x["gain"] for x in sharpening):.3g}x')
    return cell


def paired_delta(tests: List[float], reference: Optional[List[float]]) -> str:
    """Mean ± std over seeds of ``tests[i] - reference[i]``: each seed's runs
    share their training images, head initialisation and batch order, so the
    seeds' common part of the noise cancels."""
    if not reference or len(tests) != len(reference) or tests is reference:
        return '-'
    if any(math.isnan(v) for v in tests + reference):
        return 'diverged'
    deltas = [a - b for a, b in zip(tests, reference)]
    std = statistics.stdev(deltas) if len(deltas) > 1 else 0.0
    return f'{statistics.mean(deltas):+.1f} ± {std:.1f}'


def markdown(result: dict) -> str:
    task, s = result['task'], result['settings']
    begin, end = section_markers(task.key)
    budgets = list(result['rows'][0]['budgets']) if result['rows'] else []
    recipe = result['recipe']
    reference = {row['method']: row for row in result['rows']}.get(
        f'{FAMILY} ({recipe[0]} init, {recipe[1]} heat)')
    lines = [
        begin,
        f'## {task.title} (`benchmarks/transfer.py --task {task.key}`)',
        '',
        f'Machine: {platform.machine()}, pre-training with {s["pretrain_threads"]} '
        f'thread(s), then {result["workers"]} worker process(es) of one thread, torch '
        f'{torch.__version__}; {result["seconds"] / 60:.1f} min in all.',
        '',
        f'Pre-training: a hybrid ViT (a stem of three 3x3 convolutions, {s["stem"]}, '
        f'{2 * s["stem"]} and {4 * s["stem"]} channels, the last two of stride 2; then '
        f'mmpretrain\'s `VisionTransformer`, {s["num_layers"]} layers, {s["embed_dims"]} '
        f'dims, {s["num_heads"]} heads, MLP {s["ffn"]}, patch {s["patch_size"]}: a token '
        f'grid of {s["img_size"] // 4}x{s["img_size"] // 4} from {s["img_size"]} px '
        f'images) on {task.source_text(s)}; {s["pretrain_epochs"]} epoch(s): source accuracy '
        f'**{result["pretrain"]["val"]:.1f}%** on {s["val_per_class"]} held-out images per '
        f'class ({result["pretrain"]["train"]:.1f}% on the last epoch\'s)'
        + (f', {result["pretrain"]["seconds"]:.0f} s' if 'seconds' in result['pretrain'] else '')
        + (' (reused from `--cache-dir`, not in the total above)'
           if 'cached' in result['pretrain'] else '') + '.',
        '',
        f'Transfer: to {task.target_text(s)}; batch {s["batch"]}, AdamW (cosine, weight decay '
        f'1e-4), budgets of {" and ".join(str(b) for b in budgets)} steps; a new linear head '
        f'({result["head_params"]} parameters, trainable in every method and not counted '
        f'below). Per method and budget the learning rate is chosen on validation with '
        f'seed 0 from a grid of half-decade steps extended until the choice is interior '
        f'("(edge)" where a bound stopped it); test accuracy is the mean ± std over seeds '
        f'0-{s["seeds"] - 1} at that rate. Route regularisation as shipped '
        f'(`route_loss_weight=1`, Eq. 13 by step) wherever there are MoPPA units. LoRA rank '
        f'{result["lora_rank"]} on qkv (alpha = rank) matches MoPPA + scale & shift\'s '
        f'trainable count. The ablations and the wave rows change one thing of the '
        f'`{recipe[0]}` init, `{recipe[1]}` heat recipe. "Δ": test accuracy minus that '
        f'recipe\'s, mean ± std over the seeds of the per-seed differences (a seed\'s runs '
        f'share their training images, head initialisation and batch order).',
        '',
        '"At init": before any step, on the source validation set with the pre-trained '
        'head: its accuracy, and how far the class-token features moved '
        '(|f - f_pretrained| / |f_pretrained|). "Moved": the mean |change| of the units\' '
        'k, t (heat), c, t (wave) and gate over the seeds at the chosen rate of the longer '
        'budget (k and t as the filter uses them; DC entries left out); "k t < 0": the '
        'share of the heat expert\'s k t products (per frequency, head and channel) that '
        'are negative after training, where heat sharpens instead of damping, and its '
        'largest gain exp(-k w^2 t) over the seeds (1x: it never amplifies).',
        '',
        '| method | trainable | source acc. at init | feature change at init | '
        + ' | '.join(f'{b} steps: val. acc. per lr (seed 0) | {b} steps: lr | '
                     f'**{b} steps: test acc.** | {b} steps: Δ' for b in budgets) + ' | moved |',
        '|---|---:|---:|---:|' + '---|---:|---:|---:|' * len(budgets) + '---|',
    ]
    for row in result['rows']:
        cells = []
        for b in budgets:
            budget = row['budgets'][b]
            test = mean_std(budget['test'])
            if budget['seed_diverged']:
                test += f' ({budget["seed_diverged"]} seed(s) diverged)'
            delta = paired_delta(budget['test'], reference and reference['budgets'][b]['test'])
            cells += [_grid_cell(budget), _lr_cell(budget), test, delta]
        lines.append(f'| {row["method"]} | {row["trainable"]:,} | '
                     f'{row["init"]["source_acc"]:.1f} | {row["init"]["drift"]:.1f}% | '
                     + ' | '.join(cells) + f' | {_moved_cell(row["budgets"][budgets[-1]])} |')
    diverged = [f'{row["method"]} at lr {lr:g} ({b} steps)' for row in result['rows']
                for b in budgets for lr, r in row['budgets'][b]['grid'].items()
                if r['diverged']]
    lines += ['', 'Diverged on a grid (a non-finite loss or parameter): '
              + ('; '.join(diverged) if diverged else 'none') + '.', '', end]
    return '\n'.join(lines) + '\n'


def write_section(path: str, section: str, task_key: str) -> None:
    """Replace the task's section of ``path``, keeping the rest."""
    begin, end = section_markers(task_key)
    text = open(path).read() if osp.exists(path) else '# Accuracy\n\n'
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        text = head + section.rstrip('\n') + rest.split(end, 1)[1]
    else:
        text = text.rstrip('\n') + '\n\n' + section
    os.makedirs(osp.dirname(osp.abspath(path)), exist_ok=True)
    with open(path, 'w') as f:
        f.write(text)


def save_result(path: str, result: dict) -> None:
    """The measured rows as JSON (this script's own output), so that a later
    run of a few ``--methods`` can ``--merge`` its rows into them."""
    plain = copy.deepcopy({k: v for k, v in result.items() if k != 'task'})
    plain['task'] = result['task'].key
    for row in plain['rows']:
        for budget in row['budgets'].values():
            budget['grid'] = [[lr, r] for lr, r in budget['grid'].items()]
    plain['rows'] = [dict(row, budgets=list(row['budgets'].items())) for row in plain['rows']]
    os.makedirs(osp.dirname(osp.abspath(path)), exist_ok=True)
    with open(path, 'w') as f:
        json.dump(plain, f)


def load_result(path: str) -> dict:
    """What :func:`save_result` wrote, with its numeric keys back."""
    with open(path) as f:
        result = json.load(f)
    result['task'] = TASKS[result['task']]()
    result['recipe'] = tuple(result['recipe'])
    for row in result['rows']:
        row['budgets'] = {int(steps): budget for steps, budget in row['budgets']}
        for budget in row['budgets'].values():
            budget['grid'] = {float(lr): r for lr, r in budget['grid']}
    return result


def merge_results(earlier: dict, now: dict) -> dict:
    """``earlier``'s rows with the ones measured ``now`` in their place (the
    same task, settings and recipe, or an error that says which differs)."""
    for key in ('settings', 'recipe', 'pretrain', 'lora_rank'):
        ours, theirs = now[key], earlier[key]
        if key == 'pretrain':
            ours, theirs = ours.get('val'), theirs.get('val')
        if ours != theirs:
            raise SystemExit(f'--merge: the earlier result has another {key} '
                             f'({theirs!r}, now {ours!r}); run every method again')
    measured = {row['method']: row for row in now['rows']}
    rows = [measured.pop(row['method'], row) for row in earlier['rows']] + list(
        measured.values())
    return dict(earlier, rows=rows, seconds=earlier['seconds'] + now['seconds'],
                workers=now['workers'])


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--task', nargs='+', choices=list(TASKS), default=list(TASKS),
                        help='the transfers to run, each its own section (default: all, '
                        'the real ones first)')
    parser.add_argument('--quick', action='store_true',
                        help='minuscule sizes and 2 steps: checks the harness in seconds')
    parser.add_argument('--methods', nargs='+',
                        help='only the methods whose name contains one of these')
    parser.add_argument('--workers', type=int, default=2,
                        help='trainings at once, one thread each (default 2)')
    parser.add_argument('--recipe', nargs=2, default=SHIPPED,
                        metavar=('INIT_MODE', 'HEAT_PARAM'),
                        help='the unit options the ablations start from and the other '
                        'rows are compared with (default: the shipped ones, %(default)s)')
    parser.add_argument('--short-only', action='store_true', help='skip the longer budget')
    parser.add_argument('--cache-dir', help='keep the pre-trained model here and reuse it '
                        'when the settings match (default: pre-train every run)')
    parser.add_argument('--merge', action='store_true',
                        help='keep the rows of the last run saved in --cache-dir and '
                        'replace only the methods measured now (same settings)')
    parser.add_argument('--out', help='the file whose section to write (default: '
                        'docs/accuracy.md; with --quick, none: the section is printed)')
    return parser.parse_args()


def main():
    args = parse_args()
    MMLogger.get_current_instance().setLevel(logging.WARNING)  # init logs
    torch.set_num_threads(1)
    out = args.out or (None if args.quick else osp.join(ROOT, 'docs', 'accuracy.md'))
    for key in args.task:
        task = TASKS[key]()
        settings = copy.deepcopy(task.settings['quick' if args.quick else 'full'])
        print(f'== {task.title}', flush=True)
        result = run(task, settings, args.methods, log=lambda m: print(m, flush=True),
                     cache_dir=args.cache_dir, workers=args.workers,
                     recipe=tuple(args.recipe), long=not args.short_only)
        saved = args.cache_dir and osp.join(args.cache_dir, f'result_{task.key}.json')
        if args.merge:
            if not saved or not osp.exists(saved):
                raise SystemExit(f'--merge needs the result of an earlier run of '
                                 f'{task.key!r} in --cache-dir ({saved or "not given"})')
            result = merge_results(load_result(saved), result)
        if saved:
            save_result(saved, result)
        section = markdown(result)
        if out is None:  # a check of the harness must not replace the measured section
            print(section)
            continue
        write_section(out, section, task.key)
        print(f'wrote {out}', flush=True)


if __name__ == '__main__':
    main()

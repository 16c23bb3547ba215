"""What MoPPA costs, side by side with the plain backbone, SSF-style scale &
shift, and LoRA, in ONE process; writes docs/benchmarks.md (or --out).

    .venv/bin/python benchmarks/run.py            # full: ~10 min on 2 CPU cores
    .venv/bin/python benchmarks/run.py --quick    # tiny sizes: checks the harness

Timings are medians of repeated runs after warm-up; ratios matter more than
absolute times, which depend on the machine. Memory is the allocator's peak on
CUDA and, on CPU (no allocator statistics), the activations saved for backward.
On CPU the run first keeps freed memory in the process
(:func:`moppa_mm.utils.malloc.keep_freed_memory`, as tools/train.py does):
without it page faults dominate; ``--default-malloc`` measures that. It also
flushes denormal floats to zero, as GPUs' fast paths do: x86 cores take a slow
path on every denormal operand, and how many a step meets depends on the
activations' values, not on the work (measured: the same Swin-B step's FFN GELU
backward took 151 ms in the plain backbone and 426 ms with the adapters, equal
with flushing); ``--keep-denormals`` measures without.
"""
import argparse
import os
import os.path as osp
import platform
import statistics
import sys
import time
from typing import Callable, Dict, List


import torch
import torch.nn as nn

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
sys.path.insert(0, ROOT)

import moppa_mm  # noqa: E402,F401
from moppa_mm.operators import MoPPAUnit, dct2d, idct2d  # noqa: E402
from moppa_mm.operators.dct import KRON_MAX_TOKENS  # noqa: E402
from dct_fft import dct2d_fft, idct2d_fft  # noqa: E402  (benchmarks/)


# ----------------------------------------------------------------- measuring
def _sync(device):
    if device.type == 'cuda':
        torch.cuda.synchronize(device)


class PeakMemory:
    """Peak CUDA memory allocated over the block, above what was allocated before."""

    def __init__(self, device):
        self.device = device
        self.peak = 0

    def __enter__(self):
        torch.cuda.reset_peak_memory_stats(self.device)
        self.base = torch.cuda.memory_allocated(self.device)
        return self

    def __exit__(self, *exc):
        self.peak = torch.cuda.max_memory_allocated(self.device) - self.base


def interleaved(steps: Dict[str, Callable], device, warmup: int, rounds: int
                ) -> Dict[str, List[float]]:
    """Time several variants in alternating rounds (one call of each per round,
    the order reversed every other round), so that drifts of a noisy machine
    hit all variants alike; ratios are then taken round by round."""
    for fn in steps.values():
        for _ in range(warmup):
            fn()
    times = {name: [] for name in steps}
    for round_idx in range(rounds):
        names = list(steps) if round_idx % 2 == 0 else list(reversed(steps))
        for name in names:
            _sync(device)
            start = time.perf_counter()
            steps[name]()
            _sync(device)
            times[name].append(time.perf_counter() - start)
    return times


def ratio(times: Dict[str, List[float]], name: str, base: str) -> float:
    """Median over rounds of ``name``'s time over ``base``'s in the same round."""
    return statistics.median(a / b for a, b in zip(times[name], times[base]))


def peak_memory(fn: Callable, device, model: nn.Module) -> int:
    """CUDA: the allocator's peak during a step. CPU (no allocator statistics):
    the bytes of activations saved for backward, the part of a step's memory
    that adapters change (parameters, which the backward also saves, are not
    counted; each storage once)."""
    if device.type == 'cuda':
        with PeakMemory(device) as mem:
            fn()
            _sync(device)
        return mem.peak
    params = {p.data_ptr() for p in model.parameters()}
    seen = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in params:
            seen[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sum(seen.values())


# ------------------------------------------------------------------ sections
def bench_dct(device, quick: bool) -> List[Dict]:
    """DCT + inverse, float32, three ways: one matmul with the Kronecker basis
    (small grids only), two matmuls with cached bases, and the FFT; with what
    ``method='auto'`` picks."""
    sizes = [(7, 7), (14, 14)] if quick else \
        [(7, 7), (8, 8), (10, 10), (12, 12), (14, 14), (28, 28), (56, 56),
         (100, 100), (200, 334)]
    channels = 16 if quick else 128
    rows = []
    for h, w in sizes:
        batch = max(1, (64 * 64 * 8) // (h * w)) if not quick else 2
        x = torch.randn(batch, h, w, channels, device=device)
        methods = {'separable': lambda: idct2d(dct2d(x, 'separable'), 'separable'),
                   'fft': lambda: idct2d_fft(dct2d_fft(x))}
        if h * w <= 400:  # the (HW, HW) basis grows as the grid squared
            methods['kron'] = lambda: idct2d(dct2d(x, 'kron'), 'kron')
        times = interleaved(methods, device, 2, 7)
        ms = {k: statistics.median(v) * 1e3 for k, v in times.items()}
        rows.append(dict(grid=f'{batch}x{h}x{w}x{channels}',
                         kron_ms=ms.get('kron', float('nan')),
                         separable_ms=ms['separable'], fft_ms=ms['fft'],
                         auto='kron' if h * w <= KRON_MAX_TOKENS else 'separable',
                         fastest=min(ms, key=ms.get)))
    return rows


def _block_step(block: nn.Module, x: torch.Tensor, train: bool) -> Callable:
    if train:
        x = x.detach().requires_grad_(True)
        with torch.no_grad():
            out = block(x)
        grad = torch.randn_like(out[0] if isinstance(out, tuple) else out)

        def step():  # forward + backward of a fixed upstream gradient
            out = block(x)
            (out[0] if isinstance(out, tuple) else out).backward(grad)
    else:
        def step():
            with torch.no_grad():
                block(x)
    return step


def bench_unit(device, quick: bool) -> List[Dict]:
    """The unit alone (train: fwd+bwd; eval: cached forward) against the block
    it sits in (a ViT-B layer; a Swin block on the same tokens)."""
    from mmdet.models.backbones.swin import SwinBlock
    from mmpretrain.models.backbones.vision_transformer import TransformerEncoderLayer
    cases = [
        # name, unit input (B, H, W, C), heads, block builder, block input
        ('ViT-B layer, 8 x 14x14x768', (8, 14, 14, 768), 12,
         lambda: TransformerEncoderLayer(768, 12, 3072), (8, 197, 768)),
    ]
    for stage, (grid, dims, heads) in enumerate(
            [(56, 128, 4), (28, 256, 8), (14, 512, 16), (7, 1024, 32)]):
        windows = (grid // 7)**2
        cases.append((f'Swin-B stage {stage + 1} @224 (window), 8 x {grid}x{grid}x{dims}',
                      (8 * windows, 7, 7, dims), heads,
                      lambda d=dims, h=heads: SwinBlock(d, h, 4 * d, window_size=7),
                      (8, grid * grid, dims, (grid, grid))))
    cases.append(('Swin-B stage 1 @800x1333 (window), 1 x 200x334x128',
                  (29 * 48, 7, 7, 128), 4,
                  lambda: SwinBlock(128, 4, 512, window_size=7), (1, 200 * 334, 128, (200, 334))))
    cases.append(('Swin-B stage 1 @800x1333 (global), 1 x 200x334x128',
                  (1, 200, 334, 128), 4,
                  lambda: SwinBlock(128, 4, 512, window_size=7), (1, 200 * 334, 128, (200, 334))))
    if quick:
        cases = [('ViT tiny layer, 2 x 4x4x32', (2, 4, 4, 32), 2,
                  lambda: TransformerEncoderLayer(32, 2, 64), (2, 17, 32))]
    rows = []
    for name, shape, heads, make_block, block_shape in cases:
        unit = MoPPAUnit(shape[-1], heads, shape[1:3]).to(device)
        x = torch.randn(*shape, device=device)
        block = make_block().to(device)
        for p in block.parameters():
            p.requires_grad_(False)  # frozen, as in PEFT
        if len(block_shape) == 4:  # SwinBlock(x, hw_shape)
            b, n, c, hw = block_shape
            tokens = torch.randn(b, n, c, device=device)
            wrapper = _SwinBlockCall(block, hw)
        else:
            tokens = torch.randn(*block_shape, device=device)
            wrapper = block
        rounds = 3 if quick else 7
        unit.train()
        train = interleaved(dict(unit=_block_step(unit, x, True),
                                 block=_block_step(wrapper, tokens, True)),
                            device, 2, rounds)
        unit.eval()
        infer = interleaved(dict(unit=_block_step(unit, x, False),
                                 block=_block_step(wrapper, tokens, False)),
                            device, 2, rounds)
        rows.append(dict(case=name, unit_train_ms=statistics.median(train['unit']) * 1e3,
                         block_train_ms=statistics.median(train['block']) * 1e3,
                         train_share=ratio(train, 'unit', 'block'),
                         unit_eval_ms=statistics.median(infer['unit']) * 1e3,
                         block_eval_ms=statistics.median(infer['block']) * 1e3,
                         eval_share=ratio(infer, 'unit', 'block')))
    return rows


class _SwinBlockCall(nn.Module):

    def __init__(self, block, hw_shape):
        super().__init__()
        self.block, self.hw_shape = block, hw_shape

    def forward(self, x):
        return self.block(x, self.hw_shape)


def _vit_variants(quick: bool):
    """name -> builder of (backbone, trainable head dims)."""
    from mmpretrain.models.backbones import VisionTransformer
    from mmpretrain.models.peft import LoRAModel

    from moppa_mm.models import MoPPAVisionTransformer
    arch = dict(embed_dims=64, num_layers=2, num_heads=4, feedforward_channels=128) \
        if quick else 'b'
    size = dict(img_size=64 if quick else 224, patch_size=16)

    def plain():
        model = VisionTransformer(arch=arch, **size)
        model.requires_grad_(False)
        return model

    def ssf_only():
        model = MoPPAVisionTransformer(arch=arch, **size)
        for layer in model.layers:
            layer.moppa.enabled = False
            layer.moppa.requires_grad_(False)
        return model

    def moppa():
        return MoPPAVisionTransformer(arch=arch, **size)

    def lora():
        rank = 1 if quick else 6  # 12 x 6 x (768 + 2304) = 221K, MoPPA: 218K
        return LoRAModel(module=dict(type='VisionTransformer', arch=arch, **size),
                         alpha=rank, rank=rank, targets=[dict(type='qkv')])

    return [('frozen ViT + head', plain), ('+ scale & shift only', ssf_only),
            ('+ MoPPA (ours)', moppa), ('+ LoRA on qkv, matched params', lora)]


def _train_step_fn(backbone, head, images, labels, optimizer):
    loss_fn = nn.CrossEntropyLoss()

    def step():
        feats = backbone(images)[-1]
        loss = loss_fn(head(feats), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    return step


def bench_vit_step(device, quick: bool) -> List[Dict]:
    batch = 2 if quick else 8
    size = 64 if quick else 224
    images = torch.randn(batch, 3, size, size, device=device)
    labels = torch.randint(0, 100, (batch, ), device=device)
    variants, train_steps, infer_steps = {}, {}, {}
    for name, build in _vit_variants(quick):
        torch.manual_seed(0)
        backbone = build().to(device)
        dims = 64 if quick else 768
        head = nn.Linear(dims, 100).to(device)
        params = [p for p in backbone.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(params + list(head.parameters()), lr=1e-4)
        variants[name] = (backbone, params)
        train_steps[name] = _train_step_fn(backbone, head, images, labels, optimizer)

        def infer(backbone=backbone, head=head):
            with torch.no_grad():
                head(backbone(images)[-1])

        infer_steps[name] = infer
    for backbone, _ in variants.values():
        backbone.train()
    train = interleaved(train_steps, device, 1 if quick else 2, 3 if quick else 9)
    memory = {name: peak_memory(train_steps[name], device, variants[name][0])
              for name in variants}
    for backbone, _ in variants.values():
        backbone.eval()
    infer = interleaved(infer_steps, device, 1 if quick else 2, 3 if quick else 9)
    ssf, lora = '+ scale & shift only', '+ LoRA on qkv, matched params'
    return [dict(variant=name, trainable=sum(p.numel() for p in params),
                 step_ms=statistics.median(train[name]) * 1e3,
                 step_vs_ssf=ratio(train, name, ssf), step_vs_lora=ratio(train, name, lora),
                 peak_mb=memory[name] / 2**20,
                 eval_img_s=batch / statistics.median(infer[name]),
                 eval_vs_ssf=1 / ratio(infer, name, ssf),
                 eval_vs_lora=1 / ratio(infer, name, lora))
            for name, (_, params) in variants.items()]


def bench_swin_step(device, quick: bool) -> List[Dict]:
    from mmdet.models.backbones import SwinTransformer

    from moppa_mm.models import MoPPASwinTransformer
    cfg = dict(embed_dims=32, depths=[1, 1, 1, 1], num_heads=[1, 2, 4, 8],
               window_size=7) if quick else \
        dict(embed_dims=128, depths=[2, 2, 18, 2], num_heads=[4, 8, 16, 32],
             window_size=7)
    shape = (1, 3, 128, 160) if quick else (1, 3, 800, 1333)
    images = torch.randn(*shape, device=device)
    variants = [
        ('frozen Swin, no backward into it', lambda: SwinTransformer(**cfg), False),
        ('frozen Swin, backward through it', lambda: SwinTransformer(**cfg), True),
        ('MoPPA + conv adapters (window)', lambda: MoPPASwinTransformer(**cfg), True),
        ('MoPPA + conv adapters (global)',
         lambda: MoPPASwinTransformer(**cfg, moppa_scope='global'), True),
    ]
    steps, models = {}, {}
    for name, build, through in variants:
        torch.manual_seed(0)
        model = build().to(device)
        if not isinstance(model, MoPPASwinTransformer):
            model.requires_grad_(False)
        params = [p for p in model.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(params, lr=1e-4) if params else None
        inputs = images.detach().requires_grad_(through and not params)
        model.train()

        def step(model=model, inputs=inputs, through=through, optimizer=optimizer):
            outs = model(inputs)
            if through:
                sum(o.float().square().mean() for o in outs).backward()
            if optimizer is not None:
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)

        steps[name], models[name] = step, (model, params)
    times = interleaved(steps, device, 1, 2 if quick else 5)
    base = 'frozen Swin, backward through it'
    return [dict(variant=name, trainable=sum(p.numel() for p in params),
                 step_ms=statistics.median(times[name]) * 1e3,
                 step_vs_through=ratio(times, name, base),
                 peak_mb=peak_memory(steps[name], device, model) / 2**20)
            for name, (model, params) in models.items()]


def _top_ops(fn: Callable, device, rows: int = 8) -> List[Dict]:
    from torch.profiler import ProfilerActivity, profile
    fn()  # warm
    activities = [ProfilerActivity.CPU] + (
        [ProfilerActivity.CUDA] if device.type == 'cuda' else [])
    with profile(activities=activities) as prof:
        fn()
        _sync(device)
    events = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total,
                    reverse=True)
    total = sum(e.self_cpu_time_total for e in events) or 1
    return [dict(op=e.key, calls=e.count, self_ms=e.self_cpu_time_total / 1e3,
                 share=e.self_cpu_time_total / total) for e in events[:rows]]


def _op_times(fn: Callable, device, repeats: int = 3) -> Dict[tuple, float]:
    """Seconds spent in each aten op (keyed by op and input shapes), summed over
    one call of ``fn``; the minimum over ``repeats`` calls. Each op is timed
    where it is dispatched (synchronised on CUDA), so no profiler overhead
    lands on one op and not another."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class OpTimer(TorchDispatchMode):

        def __init__(self):
            super().__init__()
            self.times = {}

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            start = time.perf_counter()
            out = func(*args, **(kwargs or {}))
            _sync(device)
            shapes = tuple(tuple(a.shape) for a in args if isinstance(a, torch.Tensor))
            key = (str(func.overloadpacket.__name__), shapes)
            self.times[key] = self.times.get(key, 0.0) + time.perf_counter() - start
            return out

    fn()  # warm
    best = {}
    for _ in range(repeats):
        with OpTimer() as timer:
            fn()
        for key, value in timer.times.items():
            best[key] = min(best.get(key, float('inf')), value)
    return best


def bench_swin_block(device, quick: bool) -> Dict:
    """Where the Swin adapters' time goes: one stage-3 block at 800x1333
    (50x84x512, 18 of Swin-B's 24 blocks are in stage 3), adapters on vs off,
    time per operator; and the FLOP shares the design implies."""
    from moppa_mm.models import MoPPASwinTransformer
    dims, heads, (h, w) = (32, 2, (16, 20)) if quick else (512, 16, (50, 84))
    torch.manual_seed(0)
    model = MoPPASwinTransformer(embed_dims=dims // 4, depths=[1, 1, 2, 1],
                                 num_heads=[1, 2, heads, 4], window_size=7).to(device)
    block = model.stages[2].blocks[1]  # shifted windows
    x = torch.randn(1, h * w, dims, device=device, requires_grad=True)
    grad = torch.randn(1, h * w, dims, device=device)

    def step():
        block(x, (h, w)).backward(grad)

    times = {}
    for enabled in (False, True):
        for adapter in (block.moppa, block.conv_adapter):
            adapter.enabled = enabled
            adapter.requires_grad_(enabled)
        times[enabled] = _op_times(step, device)
    plain, ours = times[False], times[True]
    extra = sorted(set(plain) | set(ours),
                   key=lambda k: plain.get(k, 0) - ours.get(k, 0))
    rows = [dict(op=f'{k[0]} ' + ', '.join('x'.join(map(str, shape)) or 'scalar'
                                           for shape in k[1][:3]),
                 plain_ms=plain.get(k, 0) * 1e3, ours_ms=ours.get(k, 0) * 1e3,
                 extra_ms=(ours.get(k, 0) - plain.get(k, 0)) * 1e3) for k in extra[:10]]
    # multiply-adds per token: the frozen block runs forward and input gradient
    # (2x), the adapters forward, input and weight gradients (3x)
    hidden = max(int(round(dims / 7.25)), 1)
    window = 49
    block_macs = 2 * (12 * dims**2 + 2 * window * dims)
    adapter_macs = 3 * (2 * dims * hidden + 9 * hidden**2)
    unit_macs = 2 * 2 * window * dims  # Kronecker DCT and inverse, fwd + input grad
    return dict(rows=rows, plain_ms=sum(plain.values()) * 1e3,
                ours_ms=sum(ours.values()) * 1e3,
                adapter_flops=adapter_macs / block_macs, unit_flops=unit_macs / block_macs,
                grid=f'{h}x{w}x{dims}')


def bench_profiles(device, quick: bool) -> Dict[str, List[Dict]]:
    """Where the time goes: the unit alone at ViT-B size, and a whole ViT-B
    MoPPA training step."""
    shape = (2, 4, 4, 32) if quick else (8, 14, 14, 768)
    unit = MoPPAUnit(shape[-1], 2 if quick else 12, shape[1:3]).to(device)
    x = torch.randn(*shape, device=device, requires_grad=True)
    grad = torch.randn(*shape, device=device)
    profiles = {'MoPPA unit forward+backward, ' + 'x'.join(map(str, shape)):
                _top_ops(lambda: unit(x).backward(grad), device)}
    name, build = _vit_variants(quick)[2]
    backbone = build().to(device)
    batch, size, dims = (2, 64, 64) if quick else (8, 224, 768)
    head = nn.Linear(dims, 100).to(device)
    params = [p for p in backbone.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params + list(head.parameters()), lr=1e-4)
    step = _train_step_fn(backbone, head, torch.randn(batch, 3, size, size, device=device),
                          torch.randint(0, 100, (batch, ), device=device), optimizer)
    profiles[f'ViT-B {name} training step'] = _top_ops(step, device, rows=12)
    return profiles


# ------------------------------------------------------------------- report
def _table(rows: List[Dict], formats: Dict[str, str]) -> str:
    keys = list(formats)
    lines = ['| ' + ' | '.join(keys) + ' |', '|' + '---|' * len(keys)]
    for row in rows:
        lines.append('| ' + ' | '.join(
            format(row[k], formats[k]) if formats[k] else str(row[k]) for k in keys) + ' |')
    return '\n'.join(lines)


def machine(device) -> str:
    if device.type == 'cuda':
        name = torch.cuda.get_device_name(device)
    else:
        name = f'{platform.processor() or platform.machine()}, ' \
               f'{os.cpu_count()} CPU cores, {torch.get_num_threads()} torch threads'
    return f'{name}; torch {torch.__version__}; python {platform.python_version()}'


def report(results: Dict, device, quick: bool, seconds: float, settings: str) -> str:
    vit = {r['variant']: r for r in results['vit']}
    swin = {r['variant']: r for r in results['swin']}
    ours, lora = vit['+ MoPPA (ours)'], vit['+ LoRA on qkv, matched params']
    through = swin['frozen Swin, backward through it']
    window = swin['MoPPA + conv adapters (window)']
    glob = swin['MoPPA + conv adapters (global)']
    frozen = swin['frozen Swin, no backward into it']

    def pct(value):
        return f'{100 * (value - 1):+.1f}%'

    summary = [
        f'- ViT-B training step, MoPPA over scale & shift only: '
        f'{pct(ours["step_vs_ssf"])} (target <= +3%); eval throughput '
        f'{pct(ours["eval_vs_ssf"])} (target >= -2%).',
        f'- ViT-B, MoPPA against LoRA at matched parameters ({ours["trainable"]:,} vs '
        f'{lora["trainable"]:,}): training step {pct(ours["step_vs_lora"])}, '
        f'eval throughput {pct(ours["eval_vs_lora"])}, '
        f'memory {ours["peak_mb"]:.0f} vs {lora["peak_mb"]:.0f} MB.',
        f'- Swin-B backbone training step, MoPPA + conv adapters (window) over the frozen '
        f'backbone with backward through it: {pct(window["step_vs_through"])} '
        f'(target <= +8%); memory {pct(window["peak_mb"] / max(through["peak_mb"], 1e-9))} '
        f'(target <= +10%). Global scope: {pct(glob["step_vs_through"])}, memory '
        f'{pct(glob["peak_mb"] / max(through["peak_mb"], 1e-9))}. '
        f'Against a frozen backbone that needs no backward at all (what full PEFT must pay '
        'to reach adapters in stage 1): '
        f'x{window["step_vs_through"] / frozen["step_vs_through"]:.2f}.',
    ]
    blk = results['swin_block']
    summary.append(
        f'- Where the Swin-B time goes: in a stage-3 block ({blk["grid"]}) the adapters add '
        f'{pct(blk["ours_ms"] / blk["plain_ms"])} (per-operator times below). By design their '
        f'multiply-adds are {100 * blk["adapter_flops"]:.1f}% (conv adapter, at the paper\'s '
        f'3.18M budget) and {100 * blk["unit_flops"]:.1f}% (MoPPA DCTs) of the frozen block\'s '
        'training multiply-adds, before any overhead.')
    picks = [f'{r["grid"]}: {r["fastest"]}' for r in results['dct']]
    misses = [r['grid'] for r in results['dct'] if r['fastest'] != r['auto']]
    summary.append('- DCT, fastest method per grid: ' + ', '.join(picks) + '. '
                   + ('`auto` picks the fastest everywhere.' if not misses else
                      f'`auto` misses the fastest at: {", ".join(misses)}.'))
    return '\n'.join([
        f'## {device.type.upper()}: {machine(device)}',
        '',
        f'Measured {time.strftime("%Y-%m-%d")} by `benchmarks/run.py'
        f'{" --quick" if quick else ""}` in {seconds:.0f} s. Settings: '
        f'{settings if device.type == "cpu" else "CUDA caching allocator"}. '
        'Memory: ' + ('peak allocated' if device.type == 'cuda'
                      else 'activations saved for backward') + ' (MB).',
        '',
        *summary,
        '',
        'Times are medians over alternating rounds; ratios are medians of the per-round '
        'ratios (the variants run one after another in each round, so the drifts of a '
        'shared machine hit them alike).',
        '',
        '### MoPPA unit alone vs the block it sits in (frozen block, fwd+bwd / eval fwd)',
        '',
        _table(results['unit'], dict(case='', unit_train_ms='.2f', block_train_ms='.1f',
                                     train_share='.2%', unit_eval_ms='.2f',
                                     block_eval_ms='.1f', eval_share='.2%')),
        '',
        '### DCT + inverse: Kronecker matmul vs separable matmuls vs FFT',
        '',
        _table(results['dct'], dict(grid='', kron_ms='.2f', separable_ms='.2f',
                                    fft_ms='.2f', auto='', fastest='')),
        '',
        '### ViT-B/16 training step (batch 8, 224, AdamW) and eval throughput',
        '',
        _table(results['vit'], dict(variant='', trainable=',', step_ms='.0f',
                                    step_vs_ssf='.3f', peak_mb='.0f', eval_img_s='.2f',
                                    eval_vs_ssf='.3f')),
        '',
        '### Swin-B backbone training step (batch 1, 800x1333)',
        '',
        _table(results['swin'], dict(variant='', trainable=',', step_ms='.0f',
                                     step_vs_through='.3f', peak_mb='.0f')),
        '',
        f'### Swin-B stage-3 block ({blk["grid"]}, shifted windows), adapters on vs off: '
        f'the operators with the most extra time (total {blk["plain_ms"]:.1f} -> '
        f'{blk["ours_ms"]:.1f} ms)',
        '',
        _table(blk['rows'], dict(op='', plain_ms='.2f', ours_ms='.2f', extra_ms='+.2f')),
        '',
        *[line for title, ops in results['profiles'].items() for line in (
            f'### Profile: {title} (top operators by self time)', '',
            _table(ops, dict(op='', calls='', self_ms='.1f', share='.1%')), '')],
    ])


def write_report(path: str, section: str, device) -> None:
    """Replace this device type's section in the report, keep the others."""
    header = '# Benchmarks\n\nRegenerate with `.venv/bin/python benchmarks/run.py`; ' \
             'each device type keeps its own section.\n\n'
    sections = {}
    if osp.exists(path):
        text = open(path).read()
        for chunk in text.split('\n## ')[1:]:
            sections[chunk.split(':', 1)[0].strip()] = '## ' + chunk.rstrip() + '\n'
    sections[device.type.upper()] = section
    os.makedirs(osp.dirname(osp.abspath(path)), exist_ok=True)
    with open(path, 'w') as f:
        f.write(header + '\n'.join(sections[k] for k in sorted(sections)))


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--quick', action='store_true', help='tiny sizes')
    parser.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu')
    parser.add_argument('--out', default=osp.join(ROOT, 'docs', 'benchmarks.md'))
    parser.add_argument('--default-malloc', action='store_true',
                        help="keep glibc's defaults (freed memory goes back to the OS)")
    parser.add_argument('--keep-denormals', action='store_true',
                        help='do not flush denormal floats to zero on CPU')
    args = parser.parse_args()
    device = torch.device(args.device)
    settings = 'glibc defaults'
    if device.type == 'cpu' and not args.default_malloc:
        from moppa_mm.utils.malloc import keep_freed_memory
        if keep_freed_memory():
            settings = 'glibc mmap/trim thresholds raised to 1 GiB (keep_freed_memory)'
    if device.type == 'cpu' and not args.keep_denormals and torch.set_flush_denormal(True):
        settings += '; denormal floats flushed to zero (torch.set_flush_denormal)'
    start = time.time()
    results = {}
    for name, fn in (('dct', bench_dct), ('unit', bench_unit),
                     ('vit', bench_vit_step), ('swin', bench_swin_step),
                     ('swin_block', bench_swin_block), ('profiles', bench_profiles)):
        section_start = time.time()
        results[name] = fn(device, args.quick)
        print(f'[benchmarks] {name}: {time.time() - section_start:.0f} s', flush=True)
    section = report(results, device, args.quick, time.time() - start, settings)
    write_report(args.out, section, device)
    print(section)
    print(f'[benchmarks] wrote {args.out}')


if __name__ == '__main__':
    main()

"""Each custom ``autograd.Function`` against the plain PyTorch it stands in
for, on the layer it serves: the time of a training step (forward + backward
of a fixed upstream gradient) and the activations saved for backward, both
variants in ONE process, in alternating rounds. A Function stays only where it
saves at least ``KEEP_IF_SAVES`` of one or the other (docs/benchmarks.md,
"Custom autograd Functions", has the numbers of the three this rule deleted:
the unit's ``_SpectralFilter`` and the ViT token sequence's ``_MatmulOfSuffix``
and ``_MatmulAfterPrefix``)."""
import statistics
from typing import Callable, Dict, List, NamedTuple, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from benchmarks.results import SectionResult, Table
from benchmarks.sections import SHIPPED_UNIT_OPTIONS
from benchmarks.timing import interleaved, median_ms, saved_activation_bytes
from moppa_mm.operators import MoPPAUnit

NAME = 'functions'
KEEP_IF_SAVES = 0.05  # of the layer's step time or of its saved activations
ROUNDS = 41  # a shared machine needs many: the per-round ratios spread widely


class Case(NamedTuple):
    id: str
    function: str  # the Function's name
    layer: str  # what is timed, in words
    # device, quick -> (the parameters' module, {variant: forward}, the input);
    # variants 'function' and 'plain'
    build: Callable[[torch.device, bool], Tuple[nn.Module, Dict[str, Callable], torch.Tensor]]


def _unit(channels: int, heads: int, grid: Tuple[int, int], device) -> MoPPAUnit:
    return MoPPAUnit(channels, heads, grid, **SHIPPED_UNIT_OPTIONS).to(device)


def _linear_scale_shift(in_features: int, out_features: int, then: Callable):
    """A frozen ViT-B linear layer with a scale & shift on its output, on
    (8, 197, in) tokens, and what reads its output (``then``)."""

    def build(device, quick):
        from moppa_mm.models.layers.scale_shift import LinearScaleShift
        (b, n), fin, fout = ((2, 5), 16, 4 * 16 if out_features > in_features else 16) \
            if quick else ((8, 197), in_features, out_features)
        linear = nn.Linear(fin, fout).to(device).requires_grad_(False)
        ssf = LinearScaleShift.convert(linear).ssf_out
        with torch.no_grad():  # away from the identity, as after some training
            ssf.scale.uniform_(0.5, 1.5)
            ssf.shift.normal_(0, 0.1)
        x = torch.randn(b, n, fin, device=device, requires_grad=True)

        def function():
            return then(linear(x))

        def plain():  # autograd's fold: a weight-gradient matmul, the input kept
            return then(F.linear(x, *linear.folded()))

        return linear, dict(function=function, plain=plain), x

    return build


def _conv_adapter(shape: Tuple[int, ...], hidden: int):
    """A Swin-B block's ``norm2`` and conv adapter on (B, H, W, C)."""

    def build(device, quick):
        from moppa_mm.models.layers import ConvAdapter
        b, h, w, c = (2, 7, 7, 32) if quick else shape
        r = 4 if quick else hidden
        adapter = ConvAdapter(c, r).to(device)
        with torch.no_grad():  # ``up`` starts at zero; a trained one is not
            adapter.up.weight.normal_(0, 0.02)
        norm = nn.LayerNorm(c).to(device).requires_grad_(False)
        source = torch.randn(b, h, w, c, device=device, requires_grad=True)

        def function():
            return adapter.forward_after_norm(norm(source), source, norm)

        def plain():
            return adapter(norm(source))

        return nn.ModuleList([adapter, norm]), dict(function=function, plain=plain), source

    return build


CASES = (
    Case('linear_scale_shift.vit_b_fc1', '_LinearScaleShift',
         'ViT-B fc1 768->3072 + GELU, 8 x 197 tokens', _linear_scale_shift(768, 3072, F.gelu)),
    Case('linear_scale_shift.vit_b_proj', '_LinearScaleShift',
         'ViT-B attention proj 768->768, 8 x 197 tokens',
         _linear_scale_shift(768, 768, lambda y: y)),
    Case('conv_adapter.swin_b_stage1', '_ConvAdapterFunction',
         'Swin-B stage-1 norm2 + conv adapter @224, 8 x 56x56x128, r=18',
         _conv_adapter((8, 56, 56, 128), 18)),
    Case('conv_adapter.swin_b_stage3', '_ConvAdapterFunction',
         'Swin-B stage-3 norm2 + conv adapter @800x1333, 1 x 50x84x512, r=71',
         _conv_adapter((1, 50, 84, 512), 71)),
)


def _quartiles(values: List[float]) -> Tuple[float, float]:
    if len(values) < 2:
        return values[0], values[0]
    q1, _, q3 = statistics.quantiles(values, n=4, method='inclusive')
    return q1, q3


def _train_step(forward: Callable, x: torch.Tensor) -> Callable:
    with torch.no_grad():
        grad = torch.randn_like(forward())

    def step():
        x.grad = None
        forward().backward(grad)

    return step


def _eval_cache(device: torch.device, quick: bool, rounds: int, metrics: dict) -> Table:
    """The unit's eval-mode filter cache: a ViT-B unit's eval forward with the
    filter and field kept vs built at every call."""
    b, h, w, c, heads = (2, 4, 4, 16, 2) if quick else (8, 14, 14, 768, 12)
    unit = _unit(c, heads, (h, w), device).eval()
    x = torch.randn(b, h, w, c, device=device)

    def cached():
        with torch.no_grad():
            unit(x)

    def built():
        with torch.no_grad():
            unit.clear_cache()
            unit(x)

    times = interleaved(dict(cached=cached, built=built), device, 1 if quick else 3, rounds)
    ratios = [a / b for a, b in zip(times['cached'], times['built'])]
    low, high = _quartiles(ratios)
    key = f'{NAME}.unit_eval_cache.vit_b'
    metrics.update({f'{key}.cached_ms': median_ms(times, 'cached'),
                    f'{key}.built_ms': median_ms(times, 'built'),
                    f'{key}.time_ratio': statistics.median(ratios)})
    row = dict(layer=f'ViT-B unit eval forward, {b} x {h}x{w}x{c}',
               cached_ms=metrics[f'{key}.cached_ms'], built_ms=metrics[f'{key}.built_ms'],
               time=f'{metrics[f"{key}.time_ratio"]:.3f} ({low:.3f}-{high:.3f})')
    return Table('The unit\'s eval-mode filter cache (time: cached / built per call, median of '
                 'per-round ratios (quartiles))', [row],
                 dict(layer='', cached_ms='.2f', built_ms='.2f', time=''))


def run(device: torch.device, quick: bool) -> SectionResult:
    result = SectionResult()
    metrics, rows = result.metrics, []
    rounds = 3 if quick else ROUNDS
    verdicts: Dict[str, bool] = {}
    for case in CASES:
        torch.manual_seed(0)
        module, forwards, x = case.build(device, quick)
        steps = {name: _train_step(fn, x) for name, fn in forwards.items()}
        times = interleaved(steps, device, 1 if quick else 3, rounds)
        ratios = [f / p for f, p in zip(times['function'], times['plain'])]
        saved = {name: saved_activation_bytes(fn, module) / 2**20
                 for name, fn in forwards.items()}
        key = f'{NAME}.{case.id}'
        low, high = _quartiles(ratios)
        metrics.update({
            f'{key}.function_ms': median_ms(times, 'function'),
            f'{key}.plain_ms': median_ms(times, 'plain'),
            f'{key}.time_ratio': statistics.median(ratios),
            f'{key}.time_ratio_q1': low,
            f'{key}.time_ratio_q3': high,
            # the least disturbed round of each: on a shared machine, what a step costs
            f'{key}.min_ratio': min(times['function']) / min(times['plain']),
            f'{key}.function_saved_mb': saved['function'],
            f'{key}.plain_saved_mb': saved['plain'],
            f'{key}.saved_ratio': saved['function'] / saved['plain'] if saved['plain'] else 1.0,
        })
        # time pays only where the medians and the fastest rounds agree
        pays = max(metrics[f'{key}.time_ratio'], metrics[f'{key}.min_ratio']) <= \
            1 - KEEP_IF_SAVES or metrics[f'{key}.saved_ratio'] <= 1 - KEEP_IF_SAVES
        verdicts[case.function] = verdicts.get(case.function, False) or pays
        rows.append(dict(
            function=f'`{case.function}`', layer=case.layer + (' (--quick: tiny)' if quick else ''),
            function_ms=metrics[f'{key}.function_ms'], plain_ms=metrics[f'{key}.plain_ms'],
            time=f'{metrics[f"{key}.time_ratio"]:.3f} ({low:.3f}-{high:.3f})',
            min_ratio=metrics[f'{key}.min_ratio'],
            function_saved_mb=saved['function'], plain_saved_mb=saved['plain'],
            saved=metrics[f'{key}.saved_ratio'], pays='yes' if pays else 'no'))
    for function, pays in verdicts.items():
        metrics[f'{NAME}.{function}.pays'] = 'yes' if pays else 'no'
    result.summary.append(
        'Custom autograd Functions vs the plain path, on their layers\' training step: '
        + ', '.join(f'{f} {"pays" if p else "does not pay"}' for f, p in verdicts.items())
        + f' (at least {KEEP_IF_SAVES:.0%} of time or saved activations).')
    result.tables.append(Table(
        f'Custom autograd Functions vs the plain path (fwd+bwd, {rounds} alternating rounds; '
        'time: Function / plain, median of per-round ratios (quartiles); min_ratio: of the '
        'fastest rounds; saved: Function / plain activations saved for backward)', rows,
        dict(function='', layer='', function_ms='.2f', plain_ms='.2f', time='', min_ratio='.3f',
             function_saved_mb='.2f', plain_saved_mb='.2f', saved='.3f', pays='')))
    result.tables.append(_eval_cache(device, quick, rounds, metrics))
    return result

"""DCT + inverse, float32, three ways: one matmul with the Kronecker basis,
two matmuls with cached bases (separable), and the FFT; with what
``method='auto'`` picks, and where the fastest method changes with the grid."""
import torch

from benchmarks.dct_fft import dct2d_fft, idct2d_fft
from benchmarks.results import SectionResult, Table
from benchmarks.timing import interleaved, median_ms
from moppa_mm.operators import dct2d, idct2d
from moppa_mm.operators.dct import dct_method

NAME = 'dct'
GRIDS = [(7, 7), (8, 8), (10, 10), (12, 12), (14, 14), (28, 28), (56, 56), (100, 100),
         (200, 334)]
QUICK_GRIDS = [(7, 7), (14, 14)]
# The Kronecker basis is (HW, HW): on CPU it is timed up to 20x20 tokens (a
# 0.6 MB basis); on CUDA up to 100x100 (0.4 GB), so that the table shows
# where it stops paying there too.
KRON_TIMED_MAX_TOKENS = dict(cpu=400, cuda=10_000)


def run(device: torch.device, quick: bool) -> SectionResult:
    channels = 16 if quick else 128
    kron_max = KRON_TIMED_MAX_TOKENS.get(device.type, 400)
    result = SectionResult()
    metrics, rows, fastest_by_tokens = result.metrics, [], []
    for h, w in QUICK_GRIDS if quick else GRIDS:
        batch = max(1, (64 * 64 * 8) // (h * w)) if not quick else 2
        x = torch.randn(batch, h, w, channels, device=device)
        methods = {
            'separable': lambda: idct2d(dct2d(x, 'separable'), 'separable'),
            'fft': lambda: idct2d_fft(dct2d_fft(x))
        }
        if h * w <= kron_max:
            methods['kron'] = lambda: idct2d(dct2d(x, 'kron'), 'kron')
        times = interleaved(methods, device, 2, 7)
        ms = {method: median_ms(times, method) for method in times}
        grid = f'{h}x{w}'
        for method in ('kron', 'separable', 'fft'):
            metrics[f'dct.{grid}.{method}_ms'] = ms.get(method, float('nan'))
        metrics[f'dct.{grid}.auto'] = dct_method(h, w, device)
        metrics[f'dct.{grid}.fastest'] = min(ms, key=ms.get)
        fastest_by_tokens.append((h * w, metrics[f'dct.{grid}.fastest']))
        rows.append(dict(grid=f'{batch}x{grid}x{channels}',
                         kron_ms=metrics[f'dct.{grid}.kron_ms'],
                         separable_ms=metrics[f'dct.{grid}.separable_ms'],
                         fft_ms=metrics[f'dct.{grid}.fft_ms'],
                         auto=metrics[f'dct.{grid}.auto'],
                         fastest=metrics[f'dct.{grid}.fastest']))
    kron_wins = [tokens for tokens, fastest in fastest_by_tokens if fastest == 'kron']
    fft_wins = [tokens for tokens, fastest in fastest_by_tokens if fastest == 'fft']
    metrics['dct.kron_fastest_max_tokens'] = max(kron_wins, default=0)
    metrics['dct.fft_fastest_min_tokens'] = min(fft_wins, default=float('nan'))
    misses = [r['grid'] for r in rows if r['fastest'] != r['auto']]
    picks = ', '.join(f'{r["grid"]}: {r["fastest"]}' for r in rows)
    auto = '`auto` picks the fastest everywhere.' if not misses else \
        f'`auto` misses the fastest at: {", ".join(misses)}.'
    kron = f'up to {max(kron_wins)} tokens' if kron_wins else 'at no grid'
    fft = f'from {min(fft_wins)} tokens' if fft_wins else 'at no grid'
    result.summary.append(f'DCT, fastest method per grid: {picks}. {auto} '
                          f'Kronecker fastest {kron}; FFT fastest {fft}.')
    result.tables.append(Table(
        'DCT + inverse: Kronecker matmul vs separable matmuls vs FFT', rows,
        dict(grid='', kron_ms='.2f', separable_ms='.2f', fft_ms='.2f', auto='', fastest='')))
    return result

"""Where the Swin adapters' time goes: one stage-3 block at 800x1333
(50x84x512; 18 of Swin-B's 24 blocks are in stage 3), adapters on vs off, time
per operator; and the multiply-add shares the design implies."""
import torch

from benchmarks.results import SectionResult, Table, pct
from benchmarks.sections import SHIPPED_UNIT_OPTIONS
from benchmarks.timing import op_times

NAME = 'swin_block'
PREFIX = 'swin_block'
WINDOW = 7


def run(device: torch.device, quick: bool) -> SectionResult:
    from moppa_mm.models import MoPPASwinTransformer
    dims, heads, (h, w) = (32, 2, (16, 20)) if quick else (512, 16, (50, 84))
    torch.manual_seed(0)
    model = MoPPASwinTransformer(embed_dims=dims // 4, depths=[1, 1, 2, 1],
                                 num_heads=[1, 2, heads, 4], window_size=WINDOW,
                                 moppa_cfg=SHIPPED_UNIT_OPTIONS).to(device)
    block = model.stages[2].blocks[1]  # shifted windows
    x = torch.randn(1, h * w, dims, device=device, requires_grad=True)
    grad = torch.randn(1, h * w, dims, device=device)

    def step():
        block(x, (h, w)).backward(grad)

    times = {}
    for enabled in (False, True):
        for adapter in (block.attn.w_msa.moppa, block.conv_adapter):
            adapter.enabled = enabled
            adapter.requires_grad_(enabled)
        times[enabled] = op_times(step, device)
    plain, ours = times[False], times[True]
    extra = sorted(set(plain) | set(ours), key=lambda k: plain.get(k, 0) - ours.get(k, 0))
    rows = [dict(op=f'{k[0]} ' + ', '.join('x'.join(map(str, shape)) or 'scalar'
                                           for shape in k[1][:3]),
                 plain_ms=plain.get(k, 0) * 1e3, ours_ms=ours.get(k, 0) * 1e3,
                 extra_ms=(ours.get(k, 0) - plain.get(k, 0)) * 1e3) for k in extra[:10]]
    # multiply-adds per token: the frozen block runs forward and input gradient
    # (2x), the adapters forward, input and weight gradients (3x)
    hidden = block.conv_adapter.hidden_dims  # the bottleneck the backbone chose
    window = WINDOW**2
    block_macs = 2 * (12 * dims**2 + 2 * window * dims)
    adapter_macs = 3 * (2 * dims * hidden + 9 * hidden**2)
    unit_macs = 2 * 2 * window * dims  # Kronecker DCT and inverse, fwd + input grad
    grid = f'{h}x{w}x{dims}'
    result = SectionResult()
    m = result.metrics
    m.update({
        f'{PREFIX}.plain_ms': sum(plain.values()) * 1e3,
        f'{PREFIX}.ours_ms': sum(ours.values()) * 1e3,
        f'{PREFIX}.conv_adapter_mac_share': adapter_macs / block_macs,
        f'{PREFIX}.unit_mac_share': unit_macs / block_macs,
    })
    m[f'{PREFIX}.ours_over_plain'] = m['swin_block.ours_ms'] / m['swin_block.plain_ms']
    result.summary.append(
        f'Where the Swin-B time goes: in a stage-3 block ({grid}) the adapters add '
        f'{pct(m["swin_block.ours_over_plain"])} (per-operator times below). By design their '
        f'multiply-adds are {100 * m["swin_block.conv_adapter_mac_share"]:.1f}% (conv '
        f'adapter, at the paper\'s 3.18M budget) and {100 * m["swin_block.unit_mac_share"]:.1f}%'
        ' (MoPPA DCTs) of the frozen block\'s training multiply-adds, before any overhead.')
    result.tables.append(Table(
        f'Swin-B stage-3 block ({grid}, shifted windows), adapters on vs off: the operators '
        f'with the most extra time (total {m["swin_block.plain_ms"]:.1f} -> '
        f'{m["swin_block.ours_ms"]:.1f} ms)', rows,
        dict(op='', plain_ms='.2f', ours_ms='.2f', extra_ms='+.2f')))
    return result

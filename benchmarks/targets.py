"""The performance targets: ONE table, checked by the report against the
results of the same run (result ids as the sections write them)."""
import math
import operator
from typing import Dict, List, Mapping, NamedTuple, Optional

from benchmarks.results import Value, pct


class Target(NamedTuple):
    """A bound on one result, a ratio of two variants measured in one run.

    Attributes:
        id: the result id it checks (e.g. ``vit_b.step.moppa_over_lora``).
        description: what is measured.
        comparison: the ratio, in words ('MoPPA / LoRA').
        direction: '<=' (a cost) or '>=' (a throughput).
        threshold: the bound on the ratio (1.05 = +5%).
        style: 'ratio' prints 1.05x, 'change' prints +5.0%.
    """
    id: str
    description: str
    comparison: str
    direction: str
    threshold: float
    style: str = 'change'

    def met_by(self, value: float) -> bool:
        return _COMPARE[self.direction](value, self.threshold)

    def show(self, value: float) -> str:
        return f'{value:.3f}x' if self.style == 'ratio' else pct(value)


_COMPARE = {'<=': operator.le, '>=': operator.ge}

TARGETS = (
    Target('vit_b.step.moppa_over_lora',
           'ViT-B/16 training step (batch 8, 224, AdamW)',
           'MoPPA (units + scale & shift) / LoRA on qkv, matched parameters', '<=', 1.05,
           'ratio'),
    Target('vit_b.saved.moppa_over_lora', 'ViT-B/16 activations saved for backward',
           'MoPPA / LoRA on qkv, matched parameters', '<=', 1.30, 'ratio'),
    Target('vit_b.step.moppa_over_ssf', 'ViT-B/16 training step',
           'MoPPA / scale & shift only', '<=', 1.03),
    Target('vit_b.eval.moppa_over_ssf', 'ViT-B/16 eval throughput',
           'MoPPA / scale & shift only', '>=', 0.98),
    Target('swin_b.step.moppa_window_over_frozen_backward',
           'Swin-B backbone training step (batch 1, 800x1333)',
           'MoPPA + conv adapters (window) / frozen Swin with backward through it', '<=', 1.08),
    Target('swin_b.saved.moppa_window_over_frozen_backward',
           'Swin-B activations saved for backward (800x1333)',
           'MoPPA + conv adapters (window) / frozen Swin with backward through it', '<=', 1.10),
    # bfloat16 at GPU sizes (section amp; a full-size run on CUDA only)
    Target('amp.vit_b.step.moppa_over_lora',
           'ViT-B/16 bfloat16 training step (batch 64, 224, AdamW)',
           'MoPPA / LoRA on qkv, matched parameters', '<=', 1.10, 'ratio'),
    Target('amp.vit_b.step.moppa_over_full', 'ViT-B/16 bfloat16 training step',
           'MoPPA / full fine-tuning', '<=', 1.00, 'ratio'),
    Target('amp.vit_b.memory.moppa_over_full',
           "ViT-B/16 bfloat16 step memory (CUDA: the allocator's peak)",
           'MoPPA / full fine-tuning', '<=', 1.00, 'ratio'),
    Target('amp.swin_b.step.moppa_window_over_frozen_backward',
           'Swin-B backbone bfloat16 training step (batch 2, 800x1333)',
           'MoPPA + conv adapters (window) / frozen Swin with backward through it', '<=', 1.15),
    Target('amp.swin_b.step.moppa_window_over_full', 'Swin-B backbone bfloat16 training step',
           'MoPPA + conv adapters (window) / full fine-tuning', '<=', 1.00, 'ratio'),
    Target('infer.vit_b.merged_over_plain', 'ViT-B/16 eval forward (batch 8, 224)',
           'MoPPA merged / plain frozen ViT', '<=', 1.01),
    Target('infer.vit_b.compiled_over_merged', 'ViT-B/16 eval forward',
           'merged + torch.compile / merged, eager', '<=', 1.00),
    Target('infer.swin_b.merged_over_plain', 'Swin-B backbone eval forward (800x1333)',
           'MoPPA merged / plain frozen Swin', '<=', 1.01),
    Target('infer.swin_b.compiled_over_merged', 'Swin-B backbone eval forward',
           'merged + torch.compile / merged, eager', '<=', 1.00),
)


class Check(NamedTuple):
    target: Target
    value: Optional[float]  # None: its section did not run
    status: str  # 'PASS', 'MISS' or 'not run'


def check(metrics: Mapping[str, Value], targets=TARGETS) -> List[Check]:
    """Each target against ``metrics``; a NaN result is a MISS."""
    checks = []
    for target in targets:
        value = metrics.get(target.id)
        if value is None:
            status = 'not run'
        elif isinstance(value, float) and math.isnan(value):
            status = 'MISS'
        else:
            status = 'PASS' if target.met_by(value) else 'MISS'
        checks.append(Check(target, value, status))
    return checks


def table_rows(checks: List[Check]) -> List[Dict[str, str]]:
    """The rows of the report's targets table."""
    return [dict(target=c.target.description, ratio=c.target.comparison,
                 measured='-' if c.value is None else c.target.show(c.value),
                 limit=f'{c.target.direction} {c.target.show(c.target.threshold)}',
                 status=c.status, id=f'`{c.target.id}`') for c in checks]

"""The benchmark report: one markdown section per device type (CPU, CUDA), with
the targets checked, and its merge into docs/benchmarks.md."""
import os
import os.path as osp
import platform
import time
from typing import List, Mapping, Optional

import torch

from benchmarks.results import SectionResult, Table, all_metrics
from benchmarks.sections import SHIPPED_UNIT_OPTIONS
from benchmarks.targets import TARGETS, check, table_rows

HEADER = ('# Benchmarks\n\nRegenerate with `.venv/bin/python benchmarks/run.py`; '
          'each device type keeps its own section.\n\n')
# the report's order, which is not the order the sections run in
SUMMARY_ORDER = ('vit', 'swin', 'amp', 'swin_block', 'inference', 'dct', 'unit', 'functions',
                 'profiles')
TABLE_ORDER = ('unit', 'functions', 'dct', 'vit', 'swin', 'amp', 'swin_block', 'inference',
               'profiles')


def machine(device: torch.device) -> str:
    """The device in words: the GPU's name, or the CPU, its cores and threads."""
    if device.type == 'cuda':
        name = f'{torch.cuda.get_device_name(device)}, CUDA {torch.version.cuda}'
    else:
        name = f'{platform.processor() or platform.machine()}, ' \
               f'{os.cpu_count()} CPU cores, {torch.get_num_threads()} torch threads'
    return f'{name}; torch {torch.__version__}; python {platform.python_version()}'


def targets_table(results: Mapping[str, SectionResult], quick: bool) -> Table:
    """Every target with this run's value and PASS / MISS ('not run' where its
    section did not run)."""
    rows = table_rows(check(all_metrics(results), TARGETS))
    title = 'Targets' + (' (--quick: tiny models, the values mean nothing)' if quick else '')
    return Table(title, rows, dict(target='', ratio='', measured='', limit='', status='',
                                   id=''))


def render(results: Mapping[str, SectionResult], device: torch.device, quick: bool,
           command: str, seconds: float, settings: str) -> str:
    """The report section of one run.

    Args:
        results: section name -> its results (the sections that ran).
        quick: whether the run used the tiny sizes.
        command: how the run was started, e.g. ``benchmarks/run.py --quick``.
        seconds: how long the run took.
        settings: the process settings the run made (allocator, denormals).
    """
    memory = 'activations saved for backward (MB)' + (
        '; on CUDA also the allocator\'s peak over a step above what was allocated before '
        'it, `peak_alloc_mb`' if device.type == 'cuda' else '')
    summary = [f'- {line}' for name in SUMMARY_ORDER if name in results
               for line in results[name].summary]
    tables = [targets_table(results, quick)]
    tables += [table for name in TABLE_ORDER if name in results for table in results[name].tables]
    lines = [
        f'## {device.type.upper()}: {machine(device)}',
        '',
        f'Measured {time.strftime("%Y-%m-%d")} by `{command}` in {seconds:.0f} s. '
        f'Settings: {settings}. MoPPA unit options: '
        + ', '.join(f'{k}={v!r}' for k, v in SHIPPED_UNIT_OPTIONS.items())
        + f' (the shipped ones). Memory: {memory}.',
        '',
        *summary,
        '',
        'Times are medians over alternating rounds; ratios are medians of the per-round '
        'ratios (the variants run one after another in each round, so the drifts of a '
        'shared machine hit them alike). Targets are checked against this run\'s ratios '
        '(`benchmarks/targets.py`).',
        '',
    ]
    for table in tables:
        lines += [f'### {table.title}', '', table.markdown(), '']
    return '\n'.join(lines)


def merge(path: str, section: str, device: Optional[torch.device] = None,
          key: Optional[str] = None) -> None:
    """Replace this device type's section (or the one under ``key``, e.g.
    ``'Adapter bank'``) of the report at ``path``, keep the others (a section
    starts at a '## ' heading and is keyed by the text before its first ':')."""
    sections = {}
    if osp.exists(path):
        with open(path) as f:
            text = f.read()
        for chunk in text.split('\n## ')[1:]:
            sections[chunk.split(':', 1)[0].strip()] = '## ' + chunk.rstrip() + '\n'
    sections[key or device.type.upper()] = section
    os.makedirs(osp.dirname(osp.abspath(path)), exist_ok=True)
    with open(path, 'w') as f:
        f.write(HEADER + '\n'.join(sections[k] for k in sorted(sections)))


def checks_text(results: Mapping[str, SectionResult]) -> List[str]:
    """One line per target for the console: status, measured, limit, id."""
    return [f'[targets] {c.status:7s} {c.target.id}: '
            + ('-' if c.value is None else c.target.show(c.value))
            + f' (target {c.target.direction} {c.target.show(c.target.threshold)})'
            for c in check(all_metrics(results), TARGETS)]

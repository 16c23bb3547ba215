"""What MoPPA costs, side by side with the plain backbone, SSF-style scale &
shift, and LoRA, in ONE process; checks the targets of benchmarks/targets.py
and writes this device type's section of docs/benchmarks.md (or --out).

    .venv/bin/python benchmarks/run.py                  # full: ~20 min on 2 idle CPU cores
    .venv/bin/python benchmarks/run.py --sections vit   # one section (see --help)
    .venv/bin/python benchmarks/run.py --quick          # tiny sizes: checks the harness
    python benchmarks/run.py --device cuda              # the CUDA section, beside the CPU one

``--device`` defaults to cuda where torch sees a GPU. A run of some sections
only prints its report (and writes --out or --json if given); it does not
touch docs/benchmarks.md, whose device section holds all sections of one run.

Timings are medians of repeated runs after warm-up; ratios matter more than
absolute times, which depend on the machine. Memory is the activations saved
for backward, on every device, and on CUDA also the allocator's peak. On CPU
the run first keeps freed memory in the process
(:func:`moppa_mm.utils.malloc.keep_freed_memory`, as tools/train.py does):
without it page faults dominate; ``--default-malloc`` measures that. It also
flushes denormal floats to zero, as GPUs' fast paths do: x86 cores take a slow
path on every denormal operand, and how many a step meets depends on the
activations' values, not on the work (measured: the same Swin-B step's FFN GELU
backward took 151 ms in the plain backbone and 426 ms with the adapters, equal
with flushing); ``--keep-denormals`` measures without.
"""
import argparse
import json
import os.path as osp
import sys
import time

import torch

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
sys.path.insert(0, ROOT)

import moppa_mm  # noqa: E402,F401
from benchmarks import report  # noqa: E402
from benchmarks.results import all_metrics  # noqa: E402
from benchmarks.sections import SECTIONS  # noqa: E402

DEFAULT_OUT = osp.join(ROOT, 'docs', 'benchmarks.md')


def configure(device: torch.device, default_malloc: bool, keep_denormals: bool) -> str:
    """Set up the process for timing; returns the settings, in words."""
    if device.type == 'cuda':
        tf32 = 'on' if torch.backends.cuda.matmul.allow_tf32 else 'off'
        return f'CUDA caching allocator; TF32 matmuls {tf32}'
    settings = 'glibc defaults'
    if not default_malloc:
        from moppa_mm.utils.malloc import keep_freed_memory
        if keep_freed_memory():
            settings = 'glibc mmap/trim thresholds raised to 1 GiB (keep_freed_memory)'
    if not keep_denormals and torch.set_flush_denormal(True):
        settings += '; denormal floats flushed to zero (torch.set_flush_denormal)'
    return settings


def run_sections(names, device: torch.device, quick: bool) -> dict:
    """Run the named sections in their order; section name -> SectionResult."""
    results = {}
    for name in SECTIONS:
        if name not in names:
            continue
        start = time.time()
        results[name] = SECTIONS[name].run(device, quick)
        print(f'[benchmarks] {name}: {time.time() - start:.0f} s', flush=True)
    all_metrics(results)  # an id written by two sections fails here, before any report
    return results


def report_path(sections, out, quick=False):
    """Where the report goes: ``out`` if given, else docs/benchmarks.md for a
    full-size run of every section, else nowhere (a partial section would
    replace the device's whole section; tiny ``--quick`` sizes measure
    nothing worth keeping)."""
    if out:
        return out
    return DEFAULT_OUT if set(sections) == set(SECTIONS) and not quick else None


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--quick', action='store_true',
                        help='tiny sizes (checks the harness; writes only an --out you name)')
    parser.add_argument('--sections', nargs='+', choices=list(SECTIONS), default=list(SECTIONS),
                        metavar='NAME', help=f'run these only, of: {" ".join(SECTIONS)}')
    parser.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu')
    parser.add_argument('--out', default=None,
                        help='the report to update (default: docs/benchmarks.md for a full-size '
                        'run of all sections, none for a run of some or a --quick one)')
    parser.add_argument('--json', default=None, help='also write every result by id here')
    parser.add_argument('--default-malloc', action='store_true',
                        help="keep glibc's defaults (freed memory goes back to the OS)")
    parser.add_argument('--keep-denormals', action='store_true',
                        help='do not flush denormal floats to zero on CPU')
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    device = torch.device(args.device)
    if device.type == 'cuda' and not torch.cuda.is_available():
        raise SystemExit(f'--device {args.device}: torch {torch.__version__} sees no CUDA '
                         'device here; use --device cpu')
    settings = configure(device, args.default_malloc, args.keep_denormals)
    out = report_path(args.sections, args.out, args.quick)
    start = time.time()
    results = run_sections(args.sections, device, args.quick)
    command = 'benchmarks/run.py' + (' --quick' if args.quick else '') + (
        '' if set(results) == set(SECTIONS) else ' --sections ' + ' '.join(results))
    section = report.render(results, device, args.quick, command, time.time() - start, settings)
    print(section)
    print('\n'.join(report.checks_text(results)))
    if args.quick:
        print('[benchmarks] --quick: tiny models, the targets above mean nothing')
    if out:
        report.merge(out, section, device)
        print(f'[benchmarks] wrote {out}')
    if args.json:
        with open(args.json, 'w') as f:
            json.dump(dict(device=device.type, machine=report.machine(device),
                           quick=args.quick, results=all_metrics(results)), f, indent=1)
        print(f'[benchmarks] wrote {args.json}')


if __name__ == '__main__':
    main()

"""What many tasks on one base cost: :class:`moppa_mm.AdapterBank` with the 19
VTAB-1K tasks of MoPPA ViT-B/16 (the shipped configs, each task's head), beside
the usual ways to change task; writes its section of docs/benchmarks.md (or
--out).

    .venv/bin/python benchmarks/adapter_bank.py             # ~1-2 min on 2 CPU cores
    .venv/bin/python benchmarks/adapter_bank.py --quick     # tiny ViT: checks the script

No download: the pre-trained base is random (its values change no time and no
byte), saved to a temporary file that the configs' ``init_cfg`` point at, as a
converted release would be; each task's adapter-only checkpoint holds its
adapters (moved off their init) and a head of its class count. Measured:

* the bank: building the model and loading the base once; per task, reading
  and checking its checkpoint and building its head (``add``), the bytes it
  holds, and the median time of ``use`` over switches through every task;
* the usual ways: ``load_state_dict(adapter-only, strict=False)`` into the
  loaded model (same head; it copies every base tensor onto itself), and what
  ``tools/test.py`` does per task (build the model, load the checkpoint: the
  base is read back from its file and fingerprinted).
"""
import argparse
import os
import os.path as osp
import statistics
import sys
import tempfile
import time

import torch

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
sys.path.insert(0, ROOT)

from mmengine.config import Config  # noqa: E402
from mmengine.runner.checkpoint import load_checkpoint  # noqa: E402

from benchmarks import report  # noqa: E402
from benchmarks.run import configure  # noqa: E402
from benchmarks.timing import sync  # noqa: E402
from moppa_mm import AdapterBank  # noqa: E402
from moppa_mm.apis.adapter_bank import build_model  # noqa: E402
from moppa_mm.datasets import VTAB_TASKS  # noqa: E402
from moppa_mm.models import full_state_dict  # noqa: E402
from moppa_mm.models.backbones.adapter_params import is_adapter_key  # noqa: E402
from moppa_mm.models.backbones.adapter_record import redigest  # noqa: E402

CONFIG = 'configs/vtab1k/moppa_vit-b-p16_in21k-augreg-pre_vtab1k-{}.py'
DEFAULT_OUT = osp.join(ROOT, 'docs', 'benchmarks.md')
SECTION = 'Adapter bank'
QUICK_ARCH = dict(embed_dims=64, num_layers=2, num_heads=4, feedforward_channels=128)
MIB = 2 ** 20


def task_config(task: str, pretrained: str, quick: bool) -> Config:
    cfg = Config.fromfile(osp.join(ROOT, CONFIG.format(task)))
    cfg.model.backbone.init_cfg.checkpoint = pretrained
    if quick:
        cfg.model.backbone.update(arch=QUICK_ARCH, img_size=32, patch_size=8)
        cfg.model.head.in_channels = QUICK_ARCH['embed_dims']
    return cfg


def save_random_base(cfg: Config, path: str) -> None:
    """The backbone's frozen tensors, as a converted release holds them."""
    cfg = cfg.copy()
    cfg.model.backbone.init_cfg = None
    model = build_model(cfg)
    model.init_weights()
    state = {k: v for k, v in full_state_dict(model).items() if k.startswith('backbone.')
             and not is_adapter_key(k[len('backbone.'):]) and '_extra_state' not in k}
    torch.save({'state_dict': state}, path)


def save_tasks(cfg: Config, folder: str, tasks) -> dict:
    """One adapter-only checkpoint per task, from a model on the saved base:
    adapters moved off their init, a head of the task's class count."""
    model = build_model(cfg)
    model.init_weights()
    template = model.state_dict()  # adapter-only: the base came from a file
    paths = {}
    for seed, task in enumerate(tasks):
        generator = torch.Generator().manual_seed(seed)
        state = {}
        for key, value in template.items():
            if key.startswith('head.'):  # (classes, dims) / (classes, )
                shape = (VTAB_TASKS[task], ) + tuple(value.shape[1:])
                value = 0.02 * torch.randn(shape, generator=generator)
            elif value.is_floating_point():
                value = value + 0.01 * torch.randn(value.shape, generator=generator)
            state[key] = value
        redigest(state, 'backbone.')  # its digest: of these tensors
        paths[task] = osp.join(folder, f'{task}.pth')
        torch.save({'state_dict': state}, paths[task])
    return paths


def seconds(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def measure(quick: bool, device: torch.device, folder: str) -> dict:
    tasks = list(VTAB_TASKS)[:3] if quick else list(VTAB_TASKS)
    pretrained = osp.join(folder, 'base.pth')
    save_random_base(task_config(tasks[0], pretrained, quick), pretrained)
    configs = {t: task_config(t, pretrained, quick) for t in tasks}
    checkpoints = save_tasks(configs['cifar'], folder, tasks)

    sync(device)
    start = time.perf_counter()
    bank = AdapterBank.from_config(configs[tasks[0]], device=device)
    sync(device)
    base_load = time.perf_counter() - start
    added = [seconds(lambda: bank.add(t, checkpoints[t], cfg=configs[t])) for t in tasks]
    switches = []
    for round_idx in range(3 if quick else 20):
        for task in tasks if round_idx % 2 == 0 else reversed(tasks):
            sync(device)
            switches.append(seconds(lambda: bank.use(task)))
            sync(device)
    image = torch.randn(1, 3, *bank.backbone.patch_embed.init_input_size, device=device)
    with torch.no_grad():
        forward = statistics.median(
            seconds(lambda: bank.model(image, mode='tensor')) for _ in range(3))

    # the usual ways: load_state_dict into the loaded model (cifar's head)
    model = bank.use('cifar')
    state = torch.load(checkpoints['cifar'], weights_only=True)['state_dict']
    state = {k: v.to(device) for k, v in state.items()}
    reload = statistics.median(
        seconds(lambda: model.load_state_dict(state, strict=False)) for _ in range(3))
    per_task_tool = statistics.median(
        seconds(lambda: load_checkpoint(build_model(configs[t]).to(device), checkpoints[t],
                                        map_location=device, logger='silent'))
        for t in tasks[:3])
    task_bytes = [bank.task_bytes(t) for t in tasks]
    return dict(
        tasks=len(tasks), base_load=base_load, base_bytes=bank.base_bytes(),
        task_bytes_min=min(task_bytes), task_bytes_max=max(task_bytes),
        task_bytes_mean=sum(task_bytes) / len(task_bytes),
        file_bytes=sum(osp.getsize(p) for p in checkpoints.values()) / len(checkpoints),
        add=statistics.median(added), use=statistics.median(switches), switches=len(switches),
        forward=forward, reload=reload, per_task_tool=per_task_tool)


def render(m: dict, device: torch.device, quick: bool, total: float, settings: str) -> str:
    model = 'tiny ViT (--quick: the values mean nothing)' if quick else 'MoPPA ViT-B/16'
    rows = [
        ('one base: build the model, load its weights (once)', f'{m["base_load"]:.2f} s',
         f'{m["base_bytes"] / MIB:.1f} MiB'),
        (f'per task: `add` (read + check the checkpoint, build its head), median of '
         f'{m["tasks"]}', f'{m["add"] * 1e3:.1f} ms',
         f'{m["task_bytes_mean"] / MIB:.3f} MiB ({m["task_bytes_min"] / MIB:.3f}-'
         f'{m["task_bytes_max"] / MIB:.3f}; file {m["file_bytes"] / MIB:.3f} MiB)'),
        (f'switch: `use(task)`, median of {m["switches"]}', f'{m["use"] * 1e3:.3f} ms', '0'),
        ('the usual switch: `load_state_dict(adapter-only, strict=False)` into the loaded '
         'model (same head)', f'{m["reload"] * 1e3:.1f} ms', '0'),
        ('the usual task change, as `tools/test.py`: build the model, load the checkpoint '
         '(its base from the file)', f'{m["per_task_tool"]:.2f} s', f'{m["base_bytes"] / MIB:.1f} '
         'MiB per model'),
        ('for scale: one forward of a 224x224 image (batch 1)' if not quick else
         'for scale: one forward (batch 1)', f'{m["forward"] * 1e3:.1f} ms', ''),
    ]
    table = '\n'.join(['| step | time | memory |', '|---|---|---|']
                      + [f'| {a} | {b} | {c} |' for a, b, c in rows])
    share = 100 * m['task_bytes_mean'] / m['base_bytes']
    all_tasks = m['base_bytes'] + m['tasks'] * m['task_bytes_mean']
    return '\n'.join([
        f'## {SECTION}: {model}, {m["tasks"]} VTAB-1K tasks; {report.machine(device)}',
        '',
        f'Measured {time.strftime("%Y-%m-%d")} by `benchmarks/adapter_bank.py'
        f'{" --quick" if quick else ""}` in {total:.0f} s (`moppa_mm.AdapterBank`; random '
        'base weights, adapter-only task checkpoints with each task\'s head). Settings: '
        f'{settings}. Times are medians. A task holds '
        f'{share:.2f}% of the base\'s bytes: the base and all {m["tasks"]} tasks take '
        f'{all_tasks / MIB:.1f} MiB, against {m["tasks"] * m["base_bytes"] / MIB:.0f} MiB for '
        f'{m["tasks"]} models. A switch copies the active task\'s adapters back into it, '
        'writes the next task\'s in place and swaps the head module; no base tensor is read '
        'or written.',
        '',
        table,
        '',
    ])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--quick', action='store_true',
                        help='a tiny ViT and 3 tasks (writes only an --out you name)')
    parser.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu')
    parser.add_argument('--out', default=None,
                        help='the report to update (default: docs/benchmarks.md, none for '
                        '--quick)')
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    settings = configure(device, default_malloc=False, keep_denormals=False)
    start = time.time()
    with tempfile.TemporaryDirectory() as folder:
        measured = measure(args.quick, device, folder)
    section = render(measured, device, args.quick, time.time() - start, settings)
    print(section)
    out = args.out or (None if args.quick else DEFAULT_OUT)
    if out:
        report.merge(out, section, key=SECTION)
        print(f'[adapter bank] wrote {out}')


if __name__ == '__main__':
    os.chdir(ROOT)  # the configs' relative paths
    main()

"""The benchmark harness (benchmarks/run.py and its modules): results keyed by
ids, the targets table checked, the report rendered and merged. No timing is
asserted: speed targets are checked by the benchmark itself, not by tests."""
import json
import math
import subprocess

import pytest
import torch

from benchmarks import report, run
from benchmarks.results import SectionResult, Table, all_metrics
from benchmarks.sections import SECTIONS
from benchmarks.targets import TARGETS, Target, check
from benchmarks.timing import peak_allocated_bytes, saved_activation_bytes, step_memory_mb
from moppa_mm.models.moppa_config import MoPPAConfig
from tests.conftest import PYTHON, REPO, child_env

CPU = torch.device('cpu')


@pytest.fixture(scope='module')
def quick_results():
    """Every section once, on tiny models (a few seconds)."""
    torch.manual_seed(0)
    return {name: section.run(CPU, quick=True) for name, section in SECTIONS.items()}


def test_a_bound_that_is_not_met_is_a_miss():
    cost = Target('x.step', 'a step', 'ours / theirs', '<=', 1.05, 'ratio')
    speed = Target('x.eval', 'eval throughput', 'ours / theirs', '>=', 0.98)
    metrics = {'x.step': 1.12, 'x.eval': 0.99}
    assert [c.status for c in check(metrics, (cost, speed))] == ['MISS', 'PASS']
    metrics = {'x.step': 1.05, 'x.eval': 0.966}
    assert [c.status for c in check(metrics, (cost, speed))] == ['PASS', 'MISS']
    assert [c.status for c in check({'x.step': math.nan}, (cost, speed))] == ['MISS', 'not run']
    assert cost.show(1.12) == '1.120x' and speed.show(0.966) == '-3.4%'


def test_targets_table_is_well_formed():
    ids = [t.id for t in TARGETS]
    assert len(ids) == len(set(ids)), ids
    for target in TARGETS:
        assert target.direction in ('<=', '>='), target
        assert target.style in ('ratio', 'change'), target
        assert target.id.split('.')[0] in ('vit_b', 'swin_b', 'infer', 'amp'), target


def test_every_section_is_in_the_report():
    assert set(report.SUMMARY_ORDER) == set(SECTIONS) == set(report.TABLE_ORDER)


def test_every_section_runs_and_every_target_is_measured(quick_results):
    metrics = all_metrics(quick_results)  # raises if two sections write one id
    for target in TARGETS:
        assert isinstance(metrics.get(target.id), float), target.id
    assert metrics['vit_b.trainable.moppa'] > metrics['vit_b.trainable.ssf'] > 0
    assert metrics['vit_b.step.ssf_over_ssf'] == 1.0
    assert metrics['swin_b.saved_mb.frozen_no_backward'] == 0  # nothing saved without grad
    assert metrics['swin_b.saved_mb.moppa_window'] > 0
    assert metrics['dct.7x7.auto'] == 'kron' and metrics['dct.14x14.auto'] == 'separable'
    for kind in ('vit_b', 'swin_b'):  # the compiled merged model computes the unmerged one
        assert metrics[f'infer.{kind}.compiled_max_abs_diff'] < 1e-4
        assert metrics[f'infer.{kind}.merged_over_merged'] == 1.0
    assert 0 < metrics['swin_b.mac_floor.moppa_window'] < 1
    # bfloat16 at GPU sizes: every variant timed, what it launches counted (aten calls on
    # CPU), full fine-tuning trains every weight, the frozen Swin none
    for kind in ('vit_b', 'swin_b'):
        assert metrics[f'amp.{kind}.step.full_over_full'] == 1.0
        assert metrics[f'amp.{kind}.memory.full_over_full'] == 1.0
        moppa = f'amp.{kind}.launches.moppa' + ('_window' if kind == 'swin_b' else '')
        assert metrics[moppa] > 0 and metrics[f'amp.{kind}.launches.full'] > 0
    assert metrics['amp.vit_b.trainable.full'] > metrics['amp.vit_b.trainable.lora'] > 0
    assert metrics['amp.swin_b.trainable.frozen_backward'] == 0
    assert metrics['amp.swin_b.saved_mb.frozen_backward'] > 0  # backward through it
    # the conv adapter's bottleneck comes from the model: round(32 / 7.25) = 4 channels
    hidden, dims, window = 4, 32, 49
    assert metrics['swin_block.conv_adapter_mac_share'] == pytest.approx(
        3 * (2 * dims * hidden + 9 * hidden**2) / (2 * (12 * dims**2 + 2 * window * dims)))
    # each custom autograd Function is timed against the plain path it stands in for
    from benchmarks.sections.functions import CASES
    for case in CASES:
        key = f'functions.{case.id}'
        assert metrics[f'{key}.function_ms'] > 0 and metrics[f'{key}.plain_ms'] > 0
        assert metrics[f'{key}.plain_saved_mb'] > 0
        assert metrics[f'functions.{case.function}.pays'] in ('yes', 'no')


def test_an_id_written_by_two_sections_is_an_error():
    results = dict(a=SectionResult(metrics={'x.y': 1.0}), b=SectionResult(metrics={'x.y': 2.0}))
    with pytest.raises(ValueError, match="'x.y' comes from both section 'a' and section 'b'"):
        all_metrics(results)


def test_report_shows_each_target_with_its_status(quick_results):
    text = report.render(quick_results, CPU, True, 'benchmarks/run.py --quick', 1.0, 'none')
    for heading in ('### Targets', 'MoPPA unit alone', 'Kronecker matmul vs separable',
                    'Custom autograd Functions vs the plain path',
                    'ViT-B/16 training step', 'Swin-B backbone training step',
                    'Swin-B stage-3 block', 'Where the Swin-B time goes', '### Profile:',
                    'Inference: ViT-B/16 eval forward', 'Inference: Swin-B backbone',
                    'bfloat16 ViT-B/16 training step', 'bfloat16 Swin-B backbone training step'):
        assert heading in text, heading
    # the unit options timed are the shipped ones, and the report says which
    assert (f"MoPPA unit options: init_mode={MoPPAConfig.init_mode!r}, "
            f"heat_param={MoPPAConfig.heat_param!r} (the shipped ones)") in text
    rows = {line.split('| `')[1].split('`')[0]: line for line in text.splitlines()
            if line.startswith('| ') and '| `' in line}
    metrics = all_metrics(quick_results)
    for target in TARGETS:
        status = 'PASS' if target.met_by(metrics[target.id]) else 'MISS'
        assert f'| {target.show(metrics[target.id])} |' in rows[target.id]
        assert f'| {status} |' in rows[target.id]
    # a section that did not run leaves its targets 'not run'
    swin_only = report.render({'swin': quick_results['swin']}, CPU, True, 'x', 1.0, 'none')
    not_run = sum(1 for target in TARGETS if not target.id.startswith('swin_b.'))
    assert swin_only.count('| not run |') == not_run and \
        '### ViT-B/16 training step' not in swin_only


def test_a_miss_is_rendered_as_miss():
    results = dict(vit=SectionResult(metrics={'vit_b.step.moppa_over_lora': 1.12},
                                     tables=[Table('t', [dict(a=1.0)], dict(a='.1f'))]))
    text = report.render(results, CPU, False, 'benchmarks/run.py', 1.0, 'none')
    assert '| 1.120x | <= 1.050x | MISS | `vit_b.step.moppa_over_lora` |' in text
    assert '### t\n\n| a |\n|---|\n| 1.0 |' in text


def test_memory_is_what_backward_saves_on_cpu():
    linear = torch.nn.Linear(8, 8)
    x = torch.randn(4, 8, requires_grad=True)
    # linear saves its input (the weight is a parameter and not counted)
    assert saved_activation_bytes(lambda: linear(x), linear) == 4 * 8 * 4
    assert step_memory_mb(lambda: linear(x), CPU, linear) == dict(saved_mb=128 / 2**20)
    with pytest.raises(ValueError, match='needs a CUDA device'):
        peak_allocated_bytes(lambda: None, CPU)


def test_one_section_through_the_cli_keeps_the_other_device_sections(tmp_path, capsys):
    out, results = tmp_path / 'benchmarks.md', tmp_path / 'results.json'
    out.write_text('# Benchmarks\n\n## CUDA: an earlier GPU run\n\nkept\n')
    # in this process: --keep-denormals leaves the flush-to-zero flag alone
    run.main(['--quick', '--device', 'cpu', '--sections', 'dct', '--keep-denormals', '--out',
              str(out), '--json', str(results)])
    text = out.read_text()
    assert '## CPU:' in text and '## CUDA: an earlier GPU run\n\nkept' in text
    assert '`benchmarks/run.py --quick --sections dct`' in text
    assert 'Kronecker matmul vs separable' in text and '### ViT-B/16 training step' not in text
    assert '[targets] not run vit_b.step.moppa_over_lora' in capsys.readouterr().out
    saved = json.loads(results.read_text())
    assert saved['device'] == 'cpu' and saved['results']['dct.7x7.auto'] == 'kron'
    # a second run replaces the CPU section instead of adding one
    report.merge(str(out), '## CPU: again\n\nnew\n', CPU)
    text = out.read_text()
    assert text.count('## CPU:') == 1 and 'new' in text and 'kept' in text


def test_a_full_size_cpu_run_skips_the_gpu_sizes():
    """ViT-B at batch 64 would take minutes a step on CPU; the section says so."""
    result = SECTIONS['amp'].run(CPU, quick=False)
    assert result.metrics == {} and result.tables == []
    assert 'not run on CPU' in result.summary[0] and '--device cuda' in result.summary[0]


def test_launches_are_counted_per_call():
    from benchmarks.timing import launches_per_call
    x = torch.randn(4, 4)
    assert launches_per_call(lambda: x.mm(x).relu(), CPU) == 2  # mm, relu


def test_a_run_of_some_sections_writes_no_report_unless_asked():
    assert run.report_path(['dct'], None) is None
    assert run.report_path(list(SECTIONS), None) == run.DEFAULT_OUT
    assert run.report_path(['dct'], 'x.md') == 'x.md'
    assert run.report_path(list(SECTIONS), None, quick=True) is None  # tiny sizes
    assert run.report_path(list(SECTIONS), 'x.md', quick=True) == 'x.md'


@pytest.mark.slow  # a new process imports torch, mmdet and mmpretrain: 6-15 s here
def test_the_script_runs_from_the_repository_root(tmp_path):
    out = tmp_path / 'benchmarks.md'
    result = subprocess.run([PYTHON, 'benchmarks/run.py', '--quick', '--device', 'cpu',
                             '--sections', 'dct', '--out', str(out)], cwd=REPO,
                            env=child_env(), capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert '### Targets' in out.read_text()

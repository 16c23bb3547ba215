"""The transfer benchmark and the adaptation analysis run end to end on
minuscule settings and report what they measured (no accuracy is asserted)."""
import pathlib
import subprocess

from moppa_mm.models.moppa_config import MoPPAConfig
from tests.conftest import PYTHON, REPO, child_env


def section(text: str, task: str) -> str:
    begin, end = f'<!-- transfer.py {task}: begin -->', f'<!-- transfer.py {task}: end -->'
    assert text.count(begin) == 1 and text.count(end) == 1, task
    return text.split(begin)[1].split(end)[0]


def test_quick_transfer_writes_its_sections_and_keeps_the_rest(tmp_path):
    out = tmp_path / 'accuracy.md'
    out.write_text('# Accuracy\n\nwritten by hand, kept\n')
    result = subprocess.run([PYTHON, 'benchmarks/transfer.py', '--quick', '--out', str(out)],
                            cwd=REPO, env=child_env(), capture_output=True, text=True,
                            timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    whole = out.read_text()
    assert 'written by hand, kept' in whole
    # the real transfers first (scans, then photographs -> scans), generated scenes last
    order = [whole.index(f'<!-- transfer.py {task}: begin -->')
             for task in ('digits', 'photos-digits', 'scenes')]
    assert order == sorted(order)
    assert 'real handwritten digits 0-4' in section(whole, 'digits')
    assert 'real photographs and textures' in section(whole, 'photos-digits')
    for task in ('digits', 'photos-digits', 'scenes'):
        check_table(section(whole, task))


def check_table(text: str) -> None:
    for method in ('| linear probe |', '| full fine-tuning |', 'LoRA (rank',
                   'MoPPA + scale & shift (paper init, raw heat)',
                   'MoPPA + scale & shift (identity init, softplus heat)',
                   '| w/o Heat (', '| w/o Wave (', '| w/o Poisson (',
                   '| w/o MoPPA units (scale & shift', '| w/o route regularisation (',
                   '| coef_init 0.1 (', '| wave c init 0.3 ('):
        assert method in text, method
    rows = [line for line in text.splitlines() if line.startswith('| ') and '---' not in line]
    # header, three baselines, four init x heat pairs, five ablations, two wave starts
    assert len(rows) == 1 + 3 + 4 + 5 + 2
    assert '2 steps: lr' in rows[0] and '4 steps: lr' in rows[0]  # both budgets
    # every row is compared with the shipped recipe, seed by seed (paired)
    header = rows[0].split(' | ')
    delta_columns = [i for i, cell in enumerate(header) if cell.endswith('steps: Δ')]
    assert len(delta_columns) == 2, header
    init_mode, heat_param = MoPPAConfig.init_mode, MoPPAConfig.heat_param
    (shipped, ) = [r for r in rows if f'({init_mode} init, {heat_param} heat) |' in r
                   and r.startswith('| MoPPA + scale & shift')]
    assert all(shipped.split(' | ')[i] == '-' for i in delta_columns), shipped
    for row in rows[1:]:
        if row is not shipped:
            assert all(' ± ' in row.split(' | ')[i] for i in delta_columns), row
    # the identity init leaves the pre-trained features exactly where they were
    identity = [r for r in rows if 'identity init' in r]
    assert all('| 0.0% |' in r for r in identity), identity
    # the units' parameters are tracked: the full recipe moves all of them
    (paper, ) = [r for r in rows if r.startswith('| MoPPA + scale & shift (paper init, raw')]
    assert all(f'{key} ' in paper.split(' | ')[-1] for key in ('k', 't_heat', 'c', 't_wave'))
    # the heat expert's sharpening is reported where there is heat
    (raw, ) = [r for r in rows if r.startswith('| MoPPA + scale & shift (paper init, raw')]
    assert 'k t < 0: ' in raw.split(' | ')[-1] and 'gain up to ' in raw


def test_quick_transfer_replaces_only_its_own_section(tmp_path):
    out = tmp_path / 'accuracy.md'
    out.write_text('# Accuracy\n\n<!-- transfer.py digits: begin -->\nold digits\n'
                   '<!-- transfer.py digits: end -->\n\n<!-- transfer.py scenes: begin -->\n'
                   'old scenes\n<!-- transfer.py scenes: end -->\n')
    subprocess.run([PYTHON, 'benchmarks/transfer.py', '--quick', '--task', 'digits',
                    '--methods', 'linear', '--out', str(out)], cwd=REPO, env=child_env(),
                   check=True, capture_output=True, timeout=600)
    text = out.read_text()
    assert 'old digits' not in text and '| linear probe |' in section(text, 'digits')
    assert '| full fine-tuning |' not in text and 'old scenes' in section(text, 'scenes')
    # without --out a check of the harness prints its section and writes nothing
    docs_path = pathlib.Path(REPO, 'docs', 'accuracy.md')
    docs = docs_path.read_bytes()
    printed = subprocess.run([PYTHON, 'benchmarks/transfer.py', '--quick', '--task', 'scenes',
                              '--methods', 'linear'], cwd=REPO, env=child_env(), check=True,
                             capture_output=True, text=True, timeout=600).stdout
    assert '| linear probe |' in printed and 'wrote' not in printed
    assert docs_path.read_bytes() == docs


def test_adaptation_analysis_prints_the_table(tmp_path):
    fig = tmp_path / 'fig1.png'
    result = subprocess.run([PYTHON, 'tools/analysis/adaptation_analysis.py', '--depth', '1',
                             '--iters', '2', '--trials', '2', '--fig', str(fig)],
                            cwd=REPO, env=child_env(), capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert '| mean ± std |' in result.stdout and 'LoRA (rank 6' in result.stdout
    assert result.stdout.count('MoPPA: MSE') == 2
    assert fig.stat().st_size > 0


def test_merge_replaces_the_rows_measured_again_and_keeps_the_others(tmp_path):
    out, cache = tmp_path / 'accuracy.md', tmp_path / 'cache'
    command = [PYTHON, 'benchmarks/transfer.py', '--quick', '--task', 'digits',
               '--cache-dir', str(cache), '--out', str(out)]
    subprocess.run(command + ['--methods', 'linear', 'full'], cwd=REPO, env=child_env(),
                   check=True, capture_output=True, timeout=600)
    first = section(out.read_text(), 'digits')
    merged = subprocess.run(command + ['--methods', 'LoRA', '--merge'], cwd=REPO,
                            env=child_env(), capture_output=True, text=True, timeout=600)
    assert merged.returncode == 0, merged.stderr[-3000:]
    text = section(out.read_text(), 'digits')
    rows = [line.split(' | ')[0] for line in text.splitlines() if line.startswith('| ')]
    assert rows[1:3] == ['| linear probe', '| full fine-tuning'] and rows[3].startswith(
        '| LoRA (rank '), rows
    (linear, ) = [line for line in first.splitlines() if line.startswith('| linear probe')]
    assert linear in text  # kept as it was measured
    # without an earlier result there is nothing to merge into: a clear stop
    alone = subprocess.run(command[:-4] + ['--cache-dir', str(tmp_path / 'none'), '--merge'],
                           cwd=REPO, env=child_env(), capture_output=True, text=True,
                           timeout=600)
    assert alone.returncode != 0 and '--merge needs the result of an earlier run' in alone.stderr

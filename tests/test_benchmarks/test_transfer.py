"""The transfer benchmark and the adaptation analysis run end to end on
minuscule settings and report what they measured (no accuracy is asserted)."""
import pathlib
import subprocess

from moppa_mm.models.moppa_config import MoPPAConfig
from tests.conftest import PYTHON, REPO, child_env


def test_quick_transfer_writes_its_section_and_keeps_the_rest(tmp_path):
    out = tmp_path / 'accuracy.md'
    out.write_text('# Accuracy\n\nwritten by hand, kept\n')
    result = subprocess.run([PYTHON, 'benchmarks/transfer.py', '--quick', '--out', str(out)],
                            cwd=REPO, env=child_env(), capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    text = out.read_text()
    assert 'written by hand, kept' in text
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
    (paper, ) = [r for r in rows if '(paper init, raw heat)' in r]
    assert all(f'{key} ' in paper.split(' | ')[-1] for key in ('k', 't_heat', 'c', 't_wave'))
    # a second run replaces the section instead of appending one
    subprocess.run([PYTHON, 'benchmarks/transfer.py', '--quick', '--methods', 'linear',
                    '--out', str(out)], cwd=REPO, env=child_env(), check=True,
                   capture_output=True, timeout=600)
    text = out.read_text()
    assert text.count('transfer.py: begin') == 1 and '| full fine-tuning |' not in text
    # without --out a check of the harness prints its section and writes nothing
    docs_path = pathlib.Path(REPO, 'docs', 'accuracy.md')
    docs = docs_path.read_bytes()
    printed = subprocess.run([PYTHON, 'benchmarks/transfer.py', '--quick', '--methods',
                              'linear'], cwd=REPO, env=child_env(), check=True,
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

"""The benchmark harness runs and writes its report (no timing is asserted:
speed targets live in docs/benchmarks.md, not in tests)."""
import subprocess

from tests.conftest import PYTHON, REPO, child_env


def test_quick_benchmark_writes_a_report_and_keeps_other_sections(tmp_path):
    out = tmp_path / 'benchmarks.md'
    out.write_text('# Benchmarks\n\n## CUDA: an earlier GPU run\n\nkept\n')
    result = subprocess.run([PYTHON, 'benchmarks/run.py', '--quick', '--device', 'cpu',
                             '--out', str(out)], cwd=REPO, env=child_env(),
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    text = out.read_text()
    assert '## CPU:' in text and '## CUDA: an earlier GPU run' in text and 'kept' in text
    for heading in ('MoPPA unit alone', 'Kronecker matmul vs separable matmuls vs FFT',
                    'ViT-B/16 training step', 'Swin-B backbone training step',
                    'Swin-B stage-3 block', 'Where the Swin-B time goes'):
        assert heading in text
    assert '+ LoRA on qkv, matched params' in text

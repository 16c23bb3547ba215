"""benchmarks/adapter_bank.py on a tiny ViT: it measures every row and merges
its section into a report beside the device sections. No timing is asserted."""
from benchmarks import adapter_bank


def test_quick_run_writes_its_section_and_keeps_the_others(tmp_path, capsys):
    out = tmp_path / 'benchmarks.md'
    out.write_text('# Benchmarks\n\n## CPU: x86_64\n\nthe CPU section\n')
    adapter_bank.main(['--quick', '--out', str(out)])
    text = out.read_text()
    assert 'the CPU section' in text
    section = text[text.index('## Adapter bank: tiny ViT'):text.index('## CPU')]
    assert '3 VTAB-1K tasks' in section and '`use(task)`, median of 9' in section
    assert section.count('\n| ') == 7  # the header and six steps
    assert 'nan' not in section
    adapter_bank.main(['--quick', '--out', str(out)])  # replaced, not added
    assert out.read_text().count('## Adapter bank') == 1

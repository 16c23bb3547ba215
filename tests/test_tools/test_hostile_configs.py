"""Config files that would hang or crash mmengine's parsers unnamed are refused,
naming the file, by tools/train.py and tools/test.py (tools/preflight.py)."""
import json
import re
import subprocess
import time

import pytest
import torch
from preflight import load_config  # tools/

from tests.conftest import PYTHON, REPO, child_env


def alias_bomb(levels, width=10):
    """``levels`` lines of ``width`` aliases: ``width ** levels`` nodes expanded."""
    lines = [f'a0: &a0 [{", ".join(["x"] * width)}]']
    lines += [f'a{i}: &a{i} [{", ".join([f"*a{i - 1}"] * width)}]'
              for i in range(1, levels)]
    return '\n'.join(lines) + '\n'


def test_yaml_alias_bomb_is_refused_by_train_naming_the_file(tmp_path):
    config = tmp_path / 'bomb.yaml'
    config.write_text('default_scope: mmpretrain\n' + alias_bomb(9))  # 1e9 nodes
    start = time.time()
    # mmengine copies the expanded tree node by node: ~5 us a node, hours here
    run = subprocess.run([PYTHON, 'tools/train.py', str(config)], cwd=REPO,
                         env=child_env(), capture_output=True, text=True, timeout=90)
    assert run.returncode != 0
    assert f'{config}: refused: its YAML aliases expand to more than 1,000,000 ' \
           'nodes (line 7)' in run.stderr, run.stderr[-3000:]
    assert time.time() - start < 60


def test_yaml_base_file_and_deep_nesting_are_named(tmp_path):
    (tmp_path / 'bomb.yaml').write_text(alias_bomb(7))
    (tmp_path / 'child.yaml').write_text("_base_: ['./bomb.yaml']\nlr: 0.1\n")
    with pytest.raises(ValueError, match=r'bomb.yaml: refused: its YAML aliases '
                                         r'expand to more than'):
        load_config(str(tmp_path / 'child.yaml'))
    (tmp_path / 'deep.yml').write_text('a: ' + '[' * 100000 + ']' * 100000 + '\n')
    with pytest.raises(ValueError, match=r'deep.yml: refused: nested more than 500 '
                                         r'levels deep \(line 1\)'):
        load_config(str(tmp_path / 'deep.yml'))
    (tmp_path / 'deep.json').write_text('{"a":\n' + '[' * 100000 + ']' * 100000 + '}')
    with pytest.raises(ValueError, match=r'deep.json: refused: nested more than 500 '
                                         r'levels deep \(line 2\)'):
        load_config(str(tmp_path / 'deep.json'))


@pytest.mark.parametrize('child', ['child.py', 'child.json', 'child.yaml'])
@pytest.mark.parametrize('base', ['bomb.yaml', 'deep.json'])
def test_a_hostile_base_of_any_config_format_is_named(tmp_path, child, base):
    """A Python (or JSON) config whose ``_base_`` is a YAML alias bomb once hung
    tools/train.py; a deep JSON base gave a bare RecursionError. The base is
    found (a Python config's ``_base_`` line is read, not run), through a
    config in between too, and named."""
    (tmp_path / 'bomb.yaml').write_text(alias_bomb(7))  # 10 million nodes
    (tmp_path / 'deep.json').write_text('{"a": ' + '[' * 5000 + ']' * 5000 + '}')
    (tmp_path / 'sub').mkdir()
    (tmp_path / 'sub/middle.py').write_text(f"_base_ = '../{base}'\nlr = 0.1\n")
    text = {'child.py': "_base_ = ['./sub/middle.py']\nlr = 0.2\n",
            'child.json': '{"_base_": "./sub/middle.py", "lr": 0.2}',
            'child.yaml': '_base_: ./sub/middle.py\nlr: 0.2\n'}[child]
    (tmp_path / child).write_text(text)
    problem = ('its YAML aliases expand to more than 1,000,000 nodes' if base == 'bomb.yaml'
               else 'nested more than 500 levels deep')
    with pytest.raises(ValueError, match=rf'sub/\.\./{base}: refused: {problem}'):
        load_config(str(tmp_path / child))


def test_json_brackets_in_strings_are_not_nesting(tmp_path):
    (tmp_path / 'base.json').write_text(json.dumps({'pattern': '[' * 600 + '\\"{' * 300}))
    (tmp_path / 'child.py').write_text("_base_ = './base.json'\nlr = 0.1\n")
    cfg = load_config(str(tmp_path / 'child.py'))
    assert cfg.pattern.startswith('[' * 600) and cfg.lr == 0.1


def test_yaml_with_anchors_within_bounds_loads(tmp_path):
    (tmp_path / 'base.yaml').write_text('lr: 0.1\nsizes: &s [1, 2]\n')
    (tmp_path / 'child.yaml').write_text(
        "_base_: ['./base.yaml']\nopt: &o {type: SGD, lr: 0.01}\nopt2: *o\n"
        f'{alias_bomb(3)}')
    cfg = load_config(str(tmp_path / 'child.yaml'))
    assert cfg.lr == 0.1 and cfg.opt2.type == 'SGD' and len(cfg.a2) == 10


def test_every_tool_that_reads_a_users_config_bounds_it(tmp_path):
    """tools/train.py and test.py are not the only readers of a user's config:
    the analysis tools, publish_model.py --config and the adapter bank read it
    through the same bounded check."""
    from moppa_mm.apis import AdapterBank
    (tmp_path / 'bomb.yaml').write_text(alias_bomb(7))  # 10 million nodes
    config = tmp_path / 'child.py'
    config.write_text("_base_ = './bomb.yaml'\n")
    refused = r'bomb.yaml: refused: its YAML aliases expand to more than'
    with pytest.raises(ValueError, match=refused):
        AdapterBank.from_config(str(config))
    torch.save({'state_dict': {}, 'meta': {}}, tmp_path / 'in.pth')
    (tmp_path / 'empty.pth').write_bytes(b'')
    publish = ['tools/model_converters/publish_model.py']
    for tool, message in (
            (['tools/analysis/param_breakdown.py', str(config)], refused),
            (publish + [str(tmp_path / 'in.pth'), str(tmp_path / 'out.pth'), '--merge-base',
                        '--config', str(config)], refused),
            (publish + [str(tmp_path / 'empty.pth'), str(tmp_path / 'out.pth')],
             r"empty.pth' is empty \(0 bytes\)")):
        run = subprocess.run([PYTHON] + tool, cwd=REPO, env=child_env(),
                             capture_output=True, text=True, timeout=120)
        assert run.returncode == 1, (tool, run.stderr[-2000:])
        assert 'Traceback' not in run.stderr, run.stderr[-2000:]
        assert re.search(message, run.stderr), run.stderr[-2000:]

"""The priors' point-source responses are the physics they are named after."""
import os.path as osp
import subprocess

import numpy as np
import pytest
from analysis.visualize_moppa import point_source_responses  # tools/

from tests.conftest import PYTHON, REPO, child_env

SIZE, TIME = 65, 12.0


@pytest.fixture(scope='module')
def responses():
    return point_source_responses(SIZE, TIME)


def _radius():
    yy, xx = np.mgrid[:SIZE, :SIZE] - SIZE // 2
    return yy, xx, np.hypot(yy, xx)


def test_heat_is_a_gaussian_of_variance_2t(responses):
    heat = responses['heat']
    yy, xx, _ = _radius()
    assert heat.sum() == pytest.approx(1.0, abs=1e-5)  # heat is conserved
    assert (heat * xx ** 2).sum() == pytest.approx(2 * TIME, rel=0.02)
    assert (heat * yy ** 2).sum() == pytest.approx(2 * TIME, rel=0.02)
    assert np.unravel_index(heat.argmax(), heat.shape) == (SIZE // 2, SIZE // 2)


def test_wave_is_a_ring_of_radius_t(responses):
    wave = np.abs(responses['wave'])
    _, _, radius = _radius()
    profile = [wave[np.abs(radius - r) < 0.5].mean() for r in range(SIZE // 2)]
    assert abs(int(np.argmax(profile)) - TIME) <= 1
    assert wave[SIZE // 2, SIZE // 2] < 0.25 * max(profile)  # the centre is left


def test_poisson_potential_falls_off_from_the_source(responses):
    row = responses['poisson'][SIZE // 2, SIZE // 2:]  # centre outwards
    assert np.all(np.diff(row[:20]) < 0)


def test_priors_tool_writes_a_png(tmp_path):
    result = subprocess.run(
        [PYTHON, 'tools/analysis/visualize_moppa.py', '--priors', '--out-dir',
         str(tmp_path)], cwd=REPO, env=child_env(), capture_output=True, text=True,
        timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    with open(osp.join(str(tmp_path), 'priors_point_source.png'), 'rb') as f:
        assert f.read(8) == b'\x89PNG\r\n\x1a\n'

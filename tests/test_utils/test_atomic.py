import os

import pytest

from moppa_mm.utils.atomic import atomic_write, remove_stale_partials


def test_a_failed_write_keeps_the_old_file_and_leaves_no_partial(tmp_path):
    path = tmp_path / 'epoch_1.pth'
    atomic_write(str(path), b'old')

    def fails_half_way(f):
        f.write(b'new, half')
        raise OSError(28, 'No space left on device')

    with pytest.raises(OSError, match=r"epoch_1.pth.*the disk is full.*nothing was left"):
        atomic_write(str(path), fails_half_way)
    assert path.read_bytes() == b'old'
    assert os.listdir(tmp_path) == ['epoch_1.pth']


def test_stale_partials_of_dead_processes_are_removed(tmp_path):
    dead = tmp_path / '.epoch_2.pth.999999999.partial'  # no such pid
    alive = tmp_path / f'.epoch_2.pth.{os.getppid()}.partial'
    dead.write_bytes(b'x')
    alive.write_bytes(b'x')
    assert remove_stale_partials(str(tmp_path)) == [str(dead)]
    assert alive.exists()

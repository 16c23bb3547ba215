"""The stored config of a checkpoint is read as data, never run."""
from moppa_mm.engine.hooks.resume_config_hook import _differences, config_values


def test_config_values_reads_literals_and_runs_nothing(tmp_path):
    marker = tmp_path / 'ran'
    text = (f"import os\nos.system('touch {marker}')\n"
            f"hook = __import__('os').system('touch {marker}')\n"
            "optim_wrapper = dict(optimizer=dict(type='AdamW', lr=1e-3, "
            "betas=(0.9, 0.999), eps=-1), paramwise_cfg={'a.b': 2})\n"
            "train_cfg = dict(max_epochs=3, **other)\n")
    values = config_values(text)
    assert not marker.exists()
    assert values == {'optim_wrapper': dict(
        optimizer=dict(type='AdamW', lr=1e-3, betas=(0.9, 0.999), eps=-1),
        paramwise_cfg={'a.b': 2})}
    assert config_values('[' * 100000) == {}


def test_differences_name_each_leaf():
    old = [dict(type='LinearLR', end=10), dict(type='CosineAnnealingLR', T_max=100)]
    new = [dict(type='LinearLR', end=10), dict(type='CosineAnnealingLR', T_max=50)]
    assert list(_differences('param_scheduler', old, new)) == [
        ('param_scheduler[1].T_max', 100, 50)]

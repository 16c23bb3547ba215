"""The stored config of a checkpoint is read as data, never run; when it
cannot be read, the resumed run says so (a real mmengine Runner)."""
import pytest
import torch
from mmengine.model import BaseModel
from mmengine.runner import Runner

from moppa_mm.engine.hooks.resume_config_hook import _differences, config_values
from moppa_mm.utils.errors import InputValueError


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


@pytest.mark.parametrize('text, problem', [
    ('[' * 100000, r'it (is not Python \(too many nested parentheses, line 1\)|cannot be '
                   r'parsed: nested too deeply to parse)'),
    ("lr = 0.1\noptim_wrapper = dict(optimizer=dict(type='SGD', lr=0.1)\n",
     r"it is not Python \('\(' was never closed, line 2\)"),
    ('x' * 8_000_001, r'it is 8,000,001 characters long, more than the 8,000,000'),
])
def test_config_values_names_why_a_text_cannot_be_read(text, problem):
    with pytest.raises(InputValueError, match=problem):
        config_values(text)


def test_differences_name_each_leaf():
    old = [dict(type='LinearLR', end=10), dict(type='CosineAnnealingLR', T_max=100)]
    new = [dict(type='LinearLR', end=10), dict(type='CosineAnnealingLR', T_max=50)]
    assert list(_differences('param_scheduler', old, new)) == [
        ('param_scheduler[1].T_max', 100, 50)]


class Regression(BaseModel):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 1)

    def forward(self, inputs, targets, mode='tensor'):
        return dict(loss=((self.linear(inputs) - targets) ** 2).mean())


def run(work_dir, name, max_epochs, resume=False, load_from=None):
    samples = [dict(inputs=torch.randn(4), targets=torch.randn(1)) for _ in range(4)]
    settings = dict(
        optim_wrapper=dict(optimizer=dict(type='SGD', lr=0.1)),
        param_scheduler=[dict(type='ConstantLR', factor=1.0)],
        train_cfg=dict(by_epoch=True, max_epochs=max_epochs))
    runner = Runner(
        model=Regression(), work_dir=str(work_dir), experiment_name=name,
        train_dataloader=dict(dataset=samples, batch_size=2,
                              sampler=dict(type='DefaultSampler', shuffle=False),
                              collate_fn=dict(type='default_collate')),
        default_hooks=dict(checkpoint=dict(type='CheckpointHook', interval=1)),
        custom_hooks=[dict(type='ResumeConfigCheckHook')],
        resume=resume, load_from=load_from, cfg=settings, **settings)
    runner.train()
    return runner


@pytest.mark.parametrize('stored, warning', [
    ("optim_wrapper = dict(optimizer=dict(type='SGD', lr=0.1)\n",
     r"the config stored in the checkpoint \(meta\['cfg'\]\) cannot be read: it is not "
     r"Python \('\(' was never closed, line 1\)\. The values it restores \(optimizer and "
     r'scheduler states: learning rate, schedule\) are not compared with the config'),
    ("lr = 0.1\noptim_wrapper = dict(optimizer=dict(type='SGD', lr=lr))\n"
     "param_scheduler = [dict(type='ConstantLR', factor=1.0)]\n"
     "train_cfg = dict(by_epoch=True, max_epochs=1)\n",
     r'the config stored in the checkpoint has no literal value of optim_wrapper \(an '
     r'expression that needs code to evaluate, or no assignment\): not compared'),
])
def test_a_stored_config_that_cannot_be_read_is_named_on_resume(tmp_path, stored, warning):
    """It once compared nothing and said nothing."""
    import re
    run(tmp_path / 'first', f'first_{tmp_path.name}', max_epochs=1)
    checkpoint = torch.load(tmp_path / 'first/epoch_1.pth', weights_only=True)
    checkpoint['meta']['cfg'] = stored
    path = str(tmp_path / 'stored.pth')
    torch.save(checkpoint, path)
    resumed = run(tmp_path / 'resumed', f'resumed_{tmp_path.name}', max_epochs=2,
                  resume=True, load_from=path)
    assert resumed.epoch == 2
    log = open(resumed.logger.log_file).read()
    assert re.search(rf'ResumeConfigCheckHook: --resume from {re.escape(path)}: {warning}',
                     log), log[-3000:]

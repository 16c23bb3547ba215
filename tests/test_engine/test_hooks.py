import math
import socket

import pytest
import torch
import torch.distributed as torch_dist
from cpu_distributed import setup_distributed  # tools/
from mmengine.hooks import Hook
from mmengine.runner import Runner

from moppa_mm.utils.params import NORM_TYPES
from tests.conftest import tiny_detection_cfg


def adapter_or_new(name):
    """What must train: backbone adapters and the parts the detector adds."""
    if name.startswith('backbone.'):
        return '.moppa.' in name or '.conv_adapter.' in name
    return True


def test_trainable_set_is_adapters_neck_and_heads(shapes_data, tmp_path):
    cfg = tiny_detection_cfg(shapes_data, tmp_path)
    runner = Runner.from_cfg(cfg)
    model = runner.model
    model.init_weights()
    for name, param in model.named_parameters():
        assert param.requires_grad == adapter_or_new(name), name
    assert any('.moppa.' in n for n, p in model.named_parameters() if p.requires_grad)
    assert any(n.startswith('neck.') for n, p in model.named_parameters()
               if p.requires_grad)
    # gradients reach exactly the trainable set
    data = next(iter(runner.build_dataloader(cfg.train_dataloader)))
    data = model.data_preprocessor(data, True)
    model.train()
    losses = model(**data, mode='loss')
    total, _ = model.parse_losses(losses)
    total.backward()
    grads = {n for n, p in model.named_parameters() if p.grad is not None}
    assert grads == {n for n, p in model.named_parameters() if p.requires_grad}
    assert any('conv_adapter.up' in n for n in grads)
    assert any('.moppa.route_logits' in n for n in grads)


class NormModeProbe(Hook):
    """Records, at every iteration, whether frozen norms are in train mode."""

    priority = 'LOWEST'

    def __init__(self):
        self.frozen_norm_training = []

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None):
        model = runner.model
        self.frozen_norm_training.append(any(
            m.training for m in model.modules() if isinstance(m, NORM_TYPES)
            and not any(p.requires_grad for p in m.parameters())))


def test_runner_trains_with_route_loss_and_coco_metric(shapes_data, tmp_path):
    cfg = tiny_detection_cfg(shapes_data, tmp_path, max_iters=2)
    runner = Runner.from_cfg(cfg)
    probe = NormModeProbe()
    runner.register_hook(probe)
    runner.train()

    hub = runner.message_hub
    weights = hub.get_scalar('train/route_weight').data[0]
    route = hub.get_scalar('train/loss_route').data[0]
    # w * max(1 - 2T/T_total, 0) on iterations T = 0, 1 of 2
    assert list(weights) == [1.0, 0.0]
    assert math.isclose(route[0], math.log(1 / 3), rel_tol=1e-4)  # uniform router
    assert route[1] == 0.0  # weight 0 after half of training
    assert 'train/loss' in hub.log_scalars
    # bbox and segm AP from pycocotools through CocoMetric
    for key in ('coco/bbox_mAP', 'coco/segm_mAP'):
        value = hub.get_scalar(f'val/{key}').current()
        assert 0.0 <= value <= 1.0
    assert probe.frozen_norm_training == [False, False]


def test_route_loss_reaches_any_model_that_holds_a_moppa_backbone():
    """Any model whose forward(mode='loss') returns a loss dict gets
    loss_route from its MoPPA backbone: no hook, no subclass."""
    from mmengine.model import BaseModel

    from moppa_mm.models import MoPPAVisionTransformer

    class TinyClassifier(BaseModel):

        def __init__(self):
            super().__init__()
            self.backbone = MoPPAVisionTransformer(
                arch=dict(embed_dims=8, num_layers=1, num_heads=2,
                          feedforward_channels=8),
                img_size=8, patch_size=4, route_loss_weight=0.5, random_base=True)

        def forward(self, inputs, data_samples=None, mode='tensor'):
            out = self.backbone(inputs)[0]
            return dict(loss_cls=out.square().mean()) if mode == 'loss' else out

    model = TinyClassifier()
    losses = model(torch.randn(2, 3, 8, 8), mode='loss')
    assert set(losses) == {'loss_cls', 'loss_route'}
    # uniform router: L_reg = log(1/3); no run in progress: the weight is w
    assert math.isclose(losses['loss_route'].item(), 0.5 * math.log(1 / 3),
                        rel_tol=1e-5)
    losses['loss_route'].backward()
    assert model.backbone.layers[0].moppa.route_logits.grad is not None
    out = model(torch.randn(1, 3, 8, 8))  # mode='tensor': output untouched
    assert isinstance(out, torch.Tensor)
    assert 'loss_route' in model(torch.randn(2, 3, 8, 8), None, 'loss')  # mode by position
    model.backbone.set_route_progress(1, 4)  # plain PyTorch: T, T_total
    losses = model(torch.randn(2, 3, 8, 8), mode='loss')
    assert math.isclose(losses['loss_route'].item(), 0.25 * math.log(1 / 3),
                        rel_tol=1e-5)
    model.eval()
    assert set(model(torch.randn(2, 3, 8, 8), mode='loss')) == {'loss_cls'}
    model.train()
    model.backbone.route_loss_weight = 0.0  # off, and logged as 0
    assert model(torch.randn(2, 3, 8, 8), mode='loss')['loss_route'].item() == 0.0


def test_freeze_hook_applies_patterns_without_ddp(shapes_data, tmp_path):
    cfg = tiny_detection_cfg(shapes_data, tmp_path, max_iters=1)
    cfg.model.backbone.freeze_pretrained = False  # built fully trainable
    cfg.custom_hooks.append(dict(type='PEFTFreezeHook'))  # opt-in audit
    runner = Runner.from_cfg(cfg)
    assert all(p.requires_grad for p in runner.model.backbone.parameters())
    runner.train()
    for name, param in runner.model.named_parameters():
        assert param.requires_grad == adapter_or_new(name), name


def _free_port():
    with socket.socket() as sock:
        sock.bind(('127.0.0.1', 0))
        return sock.getsockname()[1]


def test_freeze_hook_refuses_to_change_a_ddp_model(shapes_data, tmp_path,
                                                   monkeypatch):
    for key, value in dict(RANK='0', WORLD_SIZE='1', LOCAL_RANK='0',
                           MASTER_ADDR='127.0.0.1',
                           MASTER_PORT=str(_free_port())).items():
        monkeypatch.setenv(key, value)
    # the CPU (gloo) path on any host, a CUDA one included
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: False)
    cfg = tiny_detection_cfg(shapes_data, tmp_path, max_iters=1)
    cfg.model.backbone.freeze_pretrained = False
    cfg.custom_hooks.append(dict(type='PEFTFreezeHook'))  # opt-in audit
    cfg.launcher = 'pytorch'
    try:
        assert setup_distributed(cfg, 'pytorch')
        runner = Runner.from_cfg(cfg)
        assert type(runner.model).__name__ == 'CPUDistributedDataParallel'
        with pytest.raises(RuntimeError, match='already wrapped for distributed'):
            runner.train()
    finally:
        if torch_dist.is_initialized():
            torch_dist.destroy_process_group()

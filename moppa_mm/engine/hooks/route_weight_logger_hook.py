"""Logs the routers' weights per stage to the visualizer's backends (the
route regularisation itself is the MoPPA backbones' own: ``loss_route``)."""
import re
from collections import defaultdict
from typing import Dict, List, Optional

import torch
from mmengine.hooks import Hook, LoggerHook
from mmengine.model import is_model_wrapper
from mmengine.registry import HOOKS

from moppa_mm.operators import MoPPAUnit


def stage_of(unit_name: str) -> str:
    """``'stage2'`` for a unit under ``...stages.2...`` (Swin); ``'all'`` for
    backbones without stages (ViT)."""
    match = re.search(r'(?:^|\.)stages\.(\d+)\.', unit_name)
    return f'stage{match.group(1)}' if match else 'all'


def mean_route_weights(model: torch.nn.Module) -> Dict[str, float]:
    """``{'route/<stage>/<expert>': mean softmax weight}`` over the MoPPA units
    of each stage."""
    weights: Dict[str, List[float]] = defaultdict(list)
    with torch.no_grad():
        for name, module in model.named_modules():
            if isinstance(module, MoPPAUnit):
                for expert, a in zip(module.experts, module.route_weights().tolist()):
                    weights[f'route/{stage_of(name)}/{expert}'].append(a)
    return {key: sum(v) / len(v) for key, v in weights.items()}


@HOOKS.register_module()
class RouteWeightLoggerHook(Hook):
    """Logs the mean route weights per stage and expert (``route/stage0/heat``,
    ...; ``route/all/...`` for a ViT) every ``log_interval`` iterations through
    ``runner.visualizer.add_scalars``: they land in ``vis_data/scalars.json``
    and in TensorBoard / W&B when the config's ``visualizer`` has those
    backends, not in the text log. The route regularisation (paper Eq. 13) is
    the backbone's, under any runner (``model.backbone.route_loss_weight``).

    Args:
        log_interval (int, optional): Iterations between route-weight logs.
            Defaults to the LoggerHook's interval (50 without one); 0 disables.
    """

    def __init__(self, log_interval: Optional[int] = None) -> None:
        assert log_interval is None or log_interval >= 0, \
            f'log_interval must be >= 0, got {log_interval}'
        self.log_interval = log_interval

    def before_train(self, runner) -> None:
        if self.log_interval is None:
            loggers = [h for h in runner.hooks if isinstance(h, LoggerHook)]
            self.log_interval = loggers[0].interval if loggers else 50

    def after_train_iter(self, runner, batch_idx: int, data_batch=None,
                         outputs=None) -> None:
        if self.log_interval and self.every_n_train_iters(runner, self.log_interval):
            model = runner.model.module if is_model_wrapper(runner.model) else runner.model
            weights = mean_route_weights(model)
            if weights:  # none without MoPPA units (use_moppa=False)
                runner.visualizer.add_scalars(weights, step=runner.iter + 1)

"""Adds the scheduled route regularisation to any model's loss dict, and logs
the routers' weights per stage to the visualizer's backends."""
import re
from collections import defaultdict
from typing import Dict, List, Optional

import torch
from mmengine.hooks import Hook, LoggerHook
from mmengine.model import is_model_wrapper
from mmengine.registry import HOOKS
from mmengine.runner import EpochBasedTrainLoop

from moppa_mm.operators import MoPPAUnit, moppa_units, route_loss_weight, route_regularization


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
class RouteRegularizationHook(Hook):
    """Adds ``loss_route = w * max(1 - 2T / T_total, 0) * L_reg`` (paper Eq. 13).

    ``L_reg`` is ``sum_i a_i log a_i`` averaged over every MoPPA unit of the
    model. ``T`` is the epoch for epoch-based loops and the iteration for
    iteration-based ones. The loss reaches the loss dict through a forward hook
    on the unwrapped model (``mode='loss'``), so any mmdet detector or mmpretrain
    classifier works without subclassing; mmengine sums every ``loss*`` key.

    Every ``log_interval`` iterations it also hands the mean route weights per
    stage and expert (``route/stage0/heat``, ...; ``route/all/...`` for a ViT)
    to ``runner.visualizer.add_scalars``: they land in ``vis_data/scalars.json``
    and in TensorBoard / W&B when the config's ``visualizer`` has those
    backends, not in the text log.

    ``w`` is the config's top-level ``route_loss_weight`` (1.0 if it has
    none) unless ``loss_weight`` is given: the hook reads it from
    ``runner.cfg`` when training starts, so ``--cfg-options
    route_loss_weight=0.5`` and a child config's ``route_loss_weight = 0.5``
    take effect (a top-level variable used inside ``custom_hooks`` would have
    been substituted when the base was parsed). A model without MoPPA units (a
    backbone built with ``use_moppa=False``) gets no loss term: the hook warns
    and does nothing.

    Args:
        loss_weight (float, optional): ``w``. Defaults to the config's
            ``route_loss_weight``, else 1.0. Given together with a different
            ``route_loss_weight``, it is an error.
        by_epoch (bool, optional): Schedule on epochs (True) or iterations
            (False). Defaults to the train loop's own kind.
        log_interval (int, optional): Iterations between route-weight logs.
            Defaults to the LoggerHook's interval (50 without one); 0 disables.
    """

    priority = 'NORMAL'

    def __init__(self, loss_weight: Optional[float] = None,
                 by_epoch: Optional[bool] = None,
                 log_interval: Optional[int] = None) -> None:
        assert loss_weight is None or loss_weight >= 0, \
            f'loss_weight must be >= 0, got {loss_weight}'
        assert log_interval is None or log_interval >= 0, \
            f'log_interval must be >= 0, got {log_interval}'
        self.loss_weight = loss_weight
        self.by_epoch = by_epoch
        self.log_interval = log_interval
        self.current_weight = loss_weight
        self.active = False  # set when training starts on a model with units
        self._handle = None

    def _resolve_loss_weight(self, runner) -> float:
        config_weight = runner.cfg.get('route_loss_weight')
        if self.loss_weight is None:
            weight = 1.0 if config_weight is None else config_weight
        elif config_weight is not None and config_weight != self.loss_weight:
            raise ValueError(
                f'RouteRegularizationHook: loss_weight={self.loss_weight} in '
                f'custom_hooks and route_loss_weight={config_weight} in the '
                'config disagree; set only route_loss_weight (the hook reads it)')
        else:
            weight = self.loss_weight
        if not isinstance(weight, (int, float)) or weight < 0:
            raise ValueError(f'route_loss_weight must be a number >= 0, got {weight!r}')
        return float(weight)

    def before_train(self, runner) -> None:
        model = runner.model.module if is_model_wrapper(runner.model) else runner.model
        self.loss_weight = self._resolve_loss_weight(runner)
        self.current_weight = self.loss_weight
        num_units = len(moppa_units(model))
        if num_units == 0:
            runner.logger.warning(
                f'RouteRegularizationHook: {type(model).__name__} holds no MoPPA '
                'unit (use_moppa=False?): no route regularisation is added')
            return
        self.active = True
        if self.by_epoch is None:
            self.by_epoch = isinstance(runner.train_loop, EpochBasedTrainLoop)
        if self.log_interval is None:
            loggers = [h for h in runner.hooks if isinstance(h, LoggerHook)]
            self.log_interval = loggers[0].interval if loggers else 50
        self._handle = model.register_forward_hook(self._add_loss, with_kwargs=True)
        runner.logger.info(f'RouteRegularizationHook: {num_units} MoPPA units, '
                           f'w={self.loss_weight}, scheduled by '
                           f'{"epoch" if self.by_epoch else "iteration"}')

    def _update_weight(self, runner) -> None:
        if self.by_epoch:
            progress, total = runner.epoch, runner.max_epochs
        else:
            progress, total = runner.iter, runner.max_iters
        self.current_weight = route_loss_weight(self.loss_weight, progress, total)
        runner.message_hub.update_scalar('train/route_weight', self.current_weight)

    def before_train_iter(self, runner, batch_idx: int, data_batch=None) -> None:
        if self.active:
            self._update_weight(runner)

    def after_train_iter(self, runner, batch_idx: int, data_batch=None,
                         outputs=None) -> None:
        if self.active and self.log_interval and \
                self.every_n_train_iters(runner, self.log_interval):
            model = runner.model.module if is_model_wrapper(runner.model) \
                else runner.model
            runner.visualizer.add_scalars(mean_route_weights(model),
                                          step=runner.iter + 1)

    def _add_loss(self, module, args, kwargs, output):
        if kwargs.get('mode') != 'loss' or not module.training:
            return output
        assert isinstance(output, dict), (
            f'expected a loss dict from {type(module).__name__}, got {type(output)}')
        output['loss_route'] = self.current_weight * route_regularization(module)
        return output

    def after_train(self, runner) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None
        self.active = False

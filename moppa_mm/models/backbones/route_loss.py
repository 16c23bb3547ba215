"""The route regularisation (paper Eqs. 12-13) as part of the model, ``loss_route``
in the loss dict of the model holding the backbone (:func:`.model_hooks.add_route_loss`)."""
from typing import Optional, Tuple

import torch
from mmengine.logging import MessageHub

from moppa_mm.operators import moppa_units, route_loss_weight, route_regularization

SCHEDULES = ('auto', 'epoch', 'iter')


def running_hub() -> Optional[MessageHub]:
    """The message hub of a runner whose train loop is running (``loop_stage``),
    None otherwise (plain PyTorch gets mmengine's default hub)."""
    hub = MessageHub.get_current_instance()
    return hub if hub.get_info('loop_stage') == 'train' else None


def _hub_progress(by: str) -> Optional[Tuple[int, int]]:
    """``(T, T_total)`` from the running train loop's message hub, or None."""
    hub = running_hub()
    if hub is None:
        return None
    max_epochs, max_iters = hub.get_info('max_epochs'), hub.get_info('max_iters')
    if by == 'epoch' or (by == 'auto' and (max_epochs or 0) > 1):
        return hub.get_info('epoch', 0), max_epochs
    return hub.get_info('iter', 0), max_iters


class RouteLossMixin:
    """The route-regularisation contract of a MoPPA backbone.

    Args of the backbones:
        route_loss_weight (float): ``w`` of Eq. 13. 0 switches the
            regularisation off (paper Fig. 5's ablation). Defaults to 1.0.
        route_schedule (str): What ``T`` counts: ``'epoch'``, ``'iter'`` or
            ``'auto'`` (default: epochs when the run has more than one, else
            iterations).
    """

    def _init_route_loss(self, route_loss_weight: float, route_schedule: str) -> None:
        """Both checked with the backbone's other arguments (``BACKBONE_ARGS``)."""
        self.route_loss_weight = float(route_loss_weight)
        self.route_schedule = route_schedule
        self._route_progress: Optional[Tuple[float, float]] = None

    def set_route_progress(self, progress: float, total: float) -> None:
        """For training outside an mmengine runner: ``T`` and ``T_total`` of
        Eq. 13 (e.g. the epoch and the number of epochs)."""
        if total <= 0:
            raise ValueError(f'total must be > 0, got {total}')
        self._route_progress = (progress, total)

    def current_route_weight(self) -> float:
        """``w * max(1 - 2T / T_total, 0)`` at the run's current progress."""
        progress = self._route_progress or _hub_progress(self.route_schedule)
        if progress is None or not progress[1]:
            return self.route_loss_weight
        return route_loss_weight(self.route_loss_weight, *progress)

    def route_loss(self) -> Optional[torch.Tensor]:
        """The weighted route regularisation, or None without MoPPA units: added
        as ``loss_route`` to a model's loss dict; in plain PyTorch add it yourself."""
        if not moppa_units(self):
            return None
        self._refuse_if_merged('cannot train')
        return self.current_route_weight() * route_regularization(self)

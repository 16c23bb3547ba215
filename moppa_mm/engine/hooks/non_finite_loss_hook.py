"""Stops training at the first non-finite loss, before anything is saved."""
import math
from typing import Dict, Optional

import torch
from mmengine.dist import all_reduce
from mmengine.hooks import Hook
from mmengine.optim import AmpOptimWrapper, OptimWrapperDict
from mmengine.registry import HOOKS

from moppa_mm.operators import moppa_units


def _as_float(value) -> float:
    if isinstance(value, torch.Tensor):
        return value.detach().float().sum().item()
    return float(value)


def _learning_rates(runner) -> str:
    """``', lr 0.01'``: the optimizer's current rate(s), or ``''``."""
    try:
        rates = runner.optim_wrapper.get_lr()
    except (AttributeError, KeyError, IndexError, TypeError):
        return ''
    values = sorted({f'{lr:.3g}' for group in rates.values() for lr in group})
    return f', lr {" / ".join(values)}' if values else ''


def _float16_moppa_cause(runner) -> str:
    """The likely cause where the run autocasts to float16 (``--amp``'s
    default on CUDA) and the model holds MoPPA units, or ``''``."""
    wrappers = runner.optim_wrapper.values() if isinstance(
        runner.optim_wrapper, OptimWrapperDict) else [runner.optim_wrapper]
    float16 = any(isinstance(w, AmpOptimWrapper) and w.cast_dtype in (None, torch.float16)
                  for w in wrappers)  # None: autocast's default, float16 on CUDA
    if not float16 or not moppa_units(runner.model):
        return ''
    return ('Likely cause: float16 autocast (AmpOptimWrapper) with MoPPA units, whose '
            'Poisson term a3 H1 / (w^2 + eta) grows as 1 / eta at the DC frequency and '
            "can exceed float16's range (65504). Use bfloat16 (--amp with "
            "optim_wrapper.dtype='bfloat16') or float32, or a larger eta "
            '(model.backbone.moppa_cfg.eta). ')


@HOOKS.register_module()
class NonFiniteLossHook(Hook):
    """Raise ``FloatingPointError`` at the first iteration whose loss is NaN or
    infinite, naming the iteration and every non-finite loss term.

    mmengine trains on through NaN losses (and the optimizer step then writes
    NaN into every trainable weight); mmdet's ``CheckInvalidLossHook`` is
    mmdet-only, checks every ``interval`` iterations and names nothing. This
    hook checks each iteration's log variables (the parsed loss dict the model's
    ``train_step`` returns: ``loss`` and every ``loss_*`` term) and runs with a
    priority above ``CheckpointHook``, so the
    failing iteration's weights are never saved.

    Under distributed training the ranks agree through one ``all_reduce`` of a
    flag per iteration, so every rank stops at the same iteration (a rank that
    stopped alone would leave the others waiting in their next gradient
    all-reduce). Where the run autocasts to float16 and the model holds MoPPA
    units, the error names that as the likely cause: the diagnosis is made here,
    once a loss is bad, not by a check in the units' forward, which would stall
    the GPU at every step.
    """

    priority = 'ABOVE_NORMAL'

    def after_train_iter(self, runner, batch_idx: int, data_batch=None,
                         outputs: Optional[Dict] = None) -> None:
        values = {name: _as_float(value) for name, value in (outputs or {}).items()
                  if 'loss' in name}
        bad = {name: value for name, value in values.items()
               if not math.isfinite(value)}
        ranks_with_bad_loss = torch.tensor([float(bool(bad))])
        all_reduce(ranks_with_bad_loss)  # sum over ranks; no-op in one process
        if ranks_with_bad_loss.item() == 0:
            return
        if not bad:
            raise FloatingPointError(
                f'non-finite loss on another rank at iteration {runner.iter + 1} '
                f'(epoch {runner.epoch + 1}); that rank names the loss terms')
        terms = ', '.join(f'{name}={value}' for name, value in bad.items())
        lr = _learning_rates(runner)
        finite = ', '.join(f'{name}={value:.4g}' for name, value in values.items()
                           if name not in bad) or 'none'
        raise FloatingPointError(
            f'non-finite loss at iteration {runner.iter + 1} (epoch '
            f'{runner.epoch + 1}{lr}): {terms}; finite terms: {finite}. Training '
            f'stopped before this iteration could be checkpointed. '
            f'{_float16_moppa_cause(runner)}Check the '
            f'learning rate (a rate too high for the model diverges: lower it, e.g. '
            f'optim_wrapper.optimizer.lr), the data preprocessor (std must be '
            f'non-zero), the input data and, at the first iterations, the checkpoints '
            f'the run started from (our tools refuse NaN weights; other loaders may not).')

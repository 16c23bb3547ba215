"""torch.distributed through mmengine on machines without CUDA (gloo).

mmengine's ``_init_dist_pytorch`` calls ``torch.cuda.set_device`` and its
Runner hands ``device_ids=[LOCAL_RANK]`` to DDP; both fail without CUDA.
:func:`setup_distributed` starts the gloo process group itself (the Runner then
skips ``init_dist``) and selects :class:`CPUDistributedDataParallel`, which drops
``device_ids``. With CUDA both are no-ops. Importing this module registers the wrapper.
"""
import os

import torch
import torch.distributed as torch_dist
from mmengine.model import MMDistributedDataParallel
from mmengine.registry import MODEL_WRAPPERS


@MODEL_WRAPPERS.register_module()
class CPUDistributedDataParallel(MMDistributedDataParallel):
    """``MMDistributedDataParallel`` that keeps the module on the CPU (DDP
    needs ``device_ids=None`` there; the Runner passes ``[LOCAL_RANK]``)."""

    def __init__(self, module, device_ids=None, broadcast_buffers=False, **kwargs):
        if next(module.parameters()).device.type == 'cpu':
            device_ids = None
        super().__init__(module=module, device_ids=device_ids,
                         broadcast_buffers=broadcast_buffers, **kwargs)


def setup_distributed(cfg, launcher: str) -> bool:
    """Prepare ``cfg`` (in place) and the process group for a CPU-only
    distributed run of ``launcher``; True if the CPU path was taken."""
    if launcher == 'none' or torch.cuda.is_available():
        return False
    if launcher != 'pytorch':
        raise RuntimeError(
            f'launcher={launcher!r} without CUDA is not supported; on CPU use '
            'torchrun (tools/dist_train.sh), which sets --launcher pytorch')
    for var in ('RANK', 'WORLD_SIZE', 'LOCAL_RANK', 'MASTER_ADDR', 'MASTER_PORT'):
        if var not in os.environ:
            raise RuntimeError(f'--launcher pytorch needs ${var}; start the run '
                               'with torchrun or tools/dist_train.sh')
    cfg.setdefault('env_cfg', {}).setdefault('dist_cfg', {})['backend'] = 'gloo'
    if cfg.get('model_wrapper_cfg') is None:
        cfg.model_wrapper_cfg = dict(type='CPUDistributedDataParallel')
    if not torch_dist.is_initialized():
        torch_dist.init_process_group(backend='gloo')
    return True


def shutdown_distributed() -> None:
    """Destroy the default process group at the end of a run, if there is one:
    mmengine never does, and gloo's threads left to interpreter shutdown can
    abort the process after the work is done (docs/cpu_quirks.md)."""
    if torch_dist.is_available() and torch_dist.is_initialized():
        torch_dist.barrier()  # no rank tears down while another still talks
        torch_dist.destroy_process_group()

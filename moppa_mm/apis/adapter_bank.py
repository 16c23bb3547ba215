"""Many tasks on one frozen base: :class:`AdapterBank`.

Every task's checkpoint of a MoPPA model is adapter-only (the adapters, the
heads, the record); the usual load checks it and copies the base onto itself
each time. A bank loads the base once and keeps, per task, only what differs::

    bank = AdapterBank.from_config('configs/vtab1k/moppa_..._vtab1k-cifar.py')
    bank.add('cifar', 'work_dirs/cifar/epoch_100.pth')
    bank.add('dtd', 'work_dirs/dtd/epoch_100.pth', cfg=dtd_config)  # 47 classes
    model = bank.use('dtd')        # the same model object, now dtd's
    bank.runner('dtd', dtd_config).test()   # mmengine's Runner on it

* **A task** holds the backbone's adapter tensors and one module per other
  child of the model (heads, neck, data preprocessor): built from the task's
  config when given (another number of classes), else copies of the bank
  model's, with the checkpoint's tensors loaded strictly. :meth:`AdapterBank.add`
  runs the backbones' own load check
  (:func:`~moppa_mm.models.backbones.load_check.checkpoint_problems`, no
  override), and a self-contained checkpoint's base must equal the bank's.
* **Switching** copies the task's adapter tensors into the backbone's
  (megabytes) and assigns its modules as the model's children; no base tensor
  is read or written.
* **While a task is active the model is the task**: what is done to the model
  (``bank.runner(name, cfg).train()``, a fine-tuning of ``bank.use(name)``) is
  the task's, its adapters copied back when the bank switches away. The runner
  trains from the task's weights (no ``init_weights``) and refuses a base with
  trainable parameters (every task shares it).
"""
import copy
import os.path as osp
from collections import OrderedDict
from typing import Any, Dict, List, Mapping, Optional, Union

import torch
import torch.nn as nn
from mmengine.config import Config

from moppa_mm.models.backbones.adapter_mixin import AdapterMixin
from moppa_mm.models.backbones.adapter_params import RECORD_KEY, is_adapter_key
from moppa_mm.models.backbones.load_check import (AdapterRecordMismatchError,
                                                  PretrainedMismatchError, checkpoint_problems)
from moppa_mm.utils.checkpoints import load_checkpoint_file
from moppa_mm.utils.config_files import read_config
from moppa_mm.utils.params import few, state_tensors

Checkpoint = Union[str, Mapping[str, Any]]


def _tensor_bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _read_config(cfg: Union[str, Config]) -> Config:
    return read_config(cfg) if isinstance(cfg, str) else cfg


def build_model(cfg: Union[str, Config], backbone: Optional[dict] = None) -> nn.Module:
    """The model of ``cfg`` as mmengine's Runner builds it (the config's
    default scope, ``cfg.data_preprocessor`` merged into ``cfg.model``);
    ``backbone`` replaces the backbone's config."""
    from mmengine.registry import MODELS, init_default_scope
    cfg = _read_config(cfg)
    init_default_scope(cfg.get('default_scope', 'mmengine'))
    model_cfg = copy.deepcopy(cfg.model)
    if cfg.get('data_preprocessor') is not None:
        model_cfg.setdefault('data_preprocessor', copy.deepcopy(cfg.data_preprocessor))
    if backbone is not None:
        model_cfg.backbone = backbone
    return MODELS.build(model_cfg)


class _Task:
    """One task of the bank: its adapter tensors and its modules."""

    def __init__(self, source: str, adapters: Dict[str, torch.Tensor],
                 modules: Dict[str, nn.Module]) -> None:
        self.source = source
        self.adapters = adapters
        self.modules = modules

    def to(self, device: torch.device) -> None:
        self.adapters = {k: v.to(device) for k, v in self.adapters.items()}
        for module in self.modules.values():
            module.to(device)

    @property
    def device(self) -> Optional[torch.device]:
        return next((v.device for v in self.adapters.values()), None)

    def nbytes(self) -> int:
        module_tensors = [t for m in self.modules.values()
                          for t in m.state_dict().values() if isinstance(t, torch.Tensor)]
        return _tensor_bytes(self.adapters.values()) + _tensor_bytes(module_tensors)


class AdapterBank:
    """One model with a MoPPA backbone whose pre-trained base is loaded once,
    and the adapters and heads of many tasks, switched by name.

    Args:
        model (nn.Module): an mmpretrain classifier or mmdet detector whose
            MoPPA backbone is one of its children, with its pre-trained base
            loaded (the backbone loads the one its ``init_cfg`` names when
            built).
        cfg (str | Config, optional): the config the model was built from;
            :meth:`add` then checks that a task's config builds the same
            backbone.

    The bank switches ``model`` itself: :meth:`use` returns it. Task tensors
    live on the device of the base; after ``model.to(device)`` the next
    :meth:`use` moves the task's tensors once.
    """

    def __init__(self, model: nn.Module, cfg: Union[str, Config, None] = None) -> None:
        backbones = [(n, m) for n, m in model.named_children() if isinstance(m, AdapterMixin)]
        if len(backbones) != 1:
            nested = [n for n, m in model.named_modules() if isinstance(m, AdapterMixin)]
            raise TypeError(
                f'AdapterBank needs a model with one MoPPA backbone among its children; '
                f'{type(model).__name__} has {len(backbones)}'
                + (f' (MoPPA backbones deeper in: {nested})' if nested else ''))
        self.model = model
        self.backbone_name, self.backbone = backbones[0]
        self._backbone_cfg = _read_config(cfg).model.backbone if cfg is not None else None
        # the model's own other children: what a task without a config copies
        self._template = OrderedDict((n, m) for n, m in model.named_children()
                                     if n != self.backbone_name)
        own = self.backbone.state_dict(keep_vars=True)  # whole: the backbone's own
        own.pop(RECORD_KEY, None)
        # the tensors a switch writes into (parameters and persistent buffers)
        self._adapter_slots = OrderedDict((k, v) for k, v in own.items() if is_adapter_key(k))
        # the frozen base: never written; read only to compare a full checkpoint's
        self._base = OrderedDict((k, v) for k, v in own.items() if not is_adapter_key(k))
        self._tasks: Dict[str, _Task] = OrderedDict()
        self._active: Optional[str] = None

    @classmethod
    def from_config(cls, cfg: Union[str, Config],
                    device: Union[str, torch.device, None] = None) -> 'AdapterBank':
        """Build ``cfg``'s model (its backbone loads the pre-trained base
        ``init_cfg`` names), put it on ``device`` in eval mode, and wrap it in
        a bank."""
        cfg = _read_config(cfg)
        model = build_model(cfg)
        if device is not None:
            model.to(device)
        model.eval()
        return cls(model, cfg)

    # ------------------------------------------------------------ queries
    def names(self) -> List[str]:
        """The tasks, in the order they were added."""
        return list(self._tasks)

    @property
    def active(self) -> Optional[str]:
        """The task the model holds now (None before the first :meth:`use`)."""
        return self._active

    def base_bytes(self) -> int:
        """Bytes of the frozen base, held once."""
        return _tensor_bytes(self._base.values())

    def task_bytes(self, name: str) -> int:
        """Bytes the bank holds for task ``name``: adapters and modules."""
        return self._task(name).nbytes()

    def base_fingerprint(self) -> Optional[str]:
        """The fingerprint the backbone recorded when its base was loaded."""
        base = self.backbone.pretrained_base
        return base.get('fingerprint') if base else None

    def _task(self, name: str) -> _Task:
        if name not in self._tasks:
            raise KeyError(f'no task {name!r} in the adapter bank; it holds: '
                           f'{", ".join(map(repr, self._tasks)) or "none"}')
        return self._tasks[name]

    def _device(self) -> torch.device:
        return next(iter(self._base.values())).device

    # ------------------------------------------------------------ changes
    def add(self, name: str, checkpoint: Checkpoint,
            cfg: Union[str, Config, None] = None) -> None:
        """Keep task ``name``'s adapters and heads from ``checkpoint`` (a path,
        a Runner checkpoint dict or a state dict). The model is not changed.

        Args:
            name: the task's name.
            checkpoint: its fine-tuned checkpoint: adapter-only, or full with
                the bank's base.
            cfg: the task's config: its heads are built from it (another
                number of classes than the bank's model). Without it, the
                heads are copies of the bank model's and must fit.

        Raises:
            ValueError: ``name`` is in the bank already.
            CheckpointLoadError: unsafe, NaN / infinite, or damaged.
            PretrainedMismatchError: it does not fit the bank's model or base
                (:class:`AdapterRecordMismatchError` where a model's load
                would take ``strict_adapter_record=False``: the bank does not).
        """
        if name in self._tasks:
            raise ValueError(f'task {name!r} is in the adapter bank already; '
                             'remove() it first to replace it')
        source = checkpoint if isinstance(checkpoint, str) else '<state dict>'
        what = f'AdapterBank: task {name!r} ({source})'
        if isinstance(checkpoint, str):  # weights_only; NaN / inf refused
            checkpoint = load_checkpoint_file(checkpoint, what=f'task {name!r} checkpoint')
        state = dict(checkpoint.get('state_dict', checkpoint))
        if state and all(k.startswith('module.') for k in state):  # a wrapped model's
            state = {k[len('module.'):]: v for k, v in state.items()}
        modules = self._task_modules(cfg, what)
        around = {f'{child}.{k}': v for child, module in modules.items()
                  for k, v in state_tensors(module).items()}
        inside = f'{self.backbone_name}.'
        problems = checkpoint_problems(state, self.backbone, inside, around, what)
        if problems:
            raise problems[0]
        self._check_base({k[len(inside):]: v for k, v in state.items()
                          if k.startswith(inside) and k != inside + RECORD_KEY}, what)
        device = self._device()
        adapters = OrderedDict(
            (k, state[inside + k].to(device=device, dtype=slot.dtype).clone())
            for k, slot in self._adapter_slots.items())
        for child, module in modules.items():
            module.load_state_dict({k[len(child) + 1:]: v for k, v in state.items()
                                    if k.startswith(f'{child}.')}, strict=True)
            module.to(device)
        self._tasks[name] = _Task(source, adapters, modules)

    def remove(self, name: str) -> None:
        """Forget task ``name``. If it is the active one, the model keeps its
        tensors until the next :meth:`use`."""
        self._task(name)
        del self._tasks[name]
        if self._active == name:
            self._active = None

    def use(self, name: str) -> nn.Module:
        """Switch the model to task ``name`` and return it: the active task
        first takes the model's adapters and modules back (what training did
        to them is the task's), then task ``name``'s adapter tensors are copied
        into the backbone's adapters and its modules become the model's
        children (in the model's train / eval mode). No base tensor is
        touched."""
        task = self._task(name)
        self._keep_active()
        device = self._device()
        if task.device != device:
            task.to(device)
        slots, values = list(self._adapter_slots.values()), list(task.adapters.values())
        with torch.no_grad():  # one fused copy (the slots' order is the task's)
            torch._foreach_copy_(slots, values)
        for child, module in task.modules.items():
            module.train(self.model.training)
            setattr(self.model, child, module)
        self._active = name
        return self.model

    def _keep_active(self) -> None:
        """Copy the backbone's adapter tensors into the active task and take
        the model's children as its modules: the task is what the model holds
        now, trained or not."""
        if self._active is None:
            return
        task = self._tasks[self._active]
        device = self._device()
        if task.device != device:  # the model moved while the task was active
            task.to(device)
        with torch.no_grad():
            torch._foreach_copy_(list(task.adapters.values()),
                                 list(self._adapter_slots.values()))
        task.modules = OrderedDict((child, getattr(self.model, child))
                                   for child in task.modules)

    def _refuse_trainable_base(self, name: str) -> None:
        trainable = [k for k, v in self._base.items()
                     if isinstance(v, nn.Parameter) and v.requires_grad]
        if trainable:
            raise ValueError(
                f'AdapterBank: training task {name!r} would change the base every task '
                f'shares: {len(trainable)} base parameters are trainable: '
                f'{few([self.backbone_name + "." + k for k in trainable], 3)}; freeze them '
                '(the adapters and the modules around the backbone are the task\'s)')

    def runner(self, name: str, cfg: Union[str, Config]):
        """mmengine's ``Runner.from_cfg(cfg)`` on the bank's model switched to
        task ``name``: ``cfg.model`` is neither built nor loaded (it stays in
        the dumped config). Without ``cfg.work_dir``: ``work_dirs/<config
        name>``, as the tools choose it. Its ``train()``, ``val()`` and
        ``test()`` switch the bank to task ``name`` first; ``train()``
        fine-tunes it from the task's weights (no ``init_weights``), and the
        bank's task ``name`` is then the trained one, adapters and modules
        (see :meth:`use`)."""
        from mmengine.runner import Runner
        cfg = copy.deepcopy(_read_config(cfg))
        for key, loads in (('load_from', 'it'), ('resume', "the work_dir's last checkpoint")):
            if cfg.get(key):
                raise ValueError(
                    f'cfg.{key} = {cfg[key]!r}: the Runner would load {loads} into the '
                    f'bank\'s model, over task {name!r}; unset it (the bank holds the '
                    'weights)')
        if cfg.get('work_dir') is None:
            stem = osp.splitext(osp.basename(cfg.filename))[0] if cfg.filename else name
            cfg.work_dir = osp.join('./work_dirs', stem)
        model = self.use(name)
        bank = self

        class BankRunner(Runner):
            """A Runner on the bank's model, built already, for task ``name``:
            each run switches the bank back to it first."""

            def build_model(self, _model_cfg) -> nn.Module:
                return model

            def train(self) -> nn.Module:
                bank.use(name)
                bank._refuse_trainable_base(name)
                return super().train()

            def val(self) -> dict:
                bank.use(name)
                return super().val()

            def test(self) -> dict:
                bank.use(name)
                return super().test()

            def _init_model_weights(self) -> None:
                """Nothing to initialise: ``init_weights`` would reset the
                task's adapters and head."""
                self.logger.info(f'AdapterBank: training task {name!r} from its weights '
                                 '(init_weights not called)')

        return BankRunner.from_cfg(cfg)

    # ------------------------------------------------------------- checks
    def _check_base(self, given: Dict[str, torch.Tensor], what: str) -> None:
        """The base tensors a checkpoint holds (a self-contained one) must be
        the bank's: every task shares its base."""
        base = {k: v for k, v in given.items() if not is_adapter_key(k)}
        unknown = sorted(k for k in base if k not in self._base)
        differ = sorted(k for k in base if k in self._base and not torch.equal(
            base[k].to(self._base[k].device), self._base[k].detach()))
        if unknown or differ:
            raise AdapterRecordMismatchError(
                f'{what} holds {len(base)} base tensors; {len(differ)} differ from the '
                f'bank\'s base (e.g. {few(differ, 3, sep="; ") or "none"}) and '
                f'{len(unknown)} it does not have (e.g. {few(unknown, 3, sep="; ") or "none"})'
                ': a checkpoint of another pre-trained base (or with its base fine-tuned) '
                'cannot share it')

    def _task_modules(self, cfg: Union[str, Config, None], what: str) -> Dict[str, nn.Module]:
        """The task's own copy of every child of the model but the backbone:
        copies of the bank model's, or built from the task's config (with a
        stand-in backbone; the config must build the bank's backbone)."""
        if cfg is None:
            return OrderedDict((n, copy.deepcopy(m)) for n, m in self._template.items())
        cfg = _read_config(cfg)
        if self._backbone_cfg is not None:
            ours, theirs = ({k: v for k, v in c.to_dict().items() if k != 'init_cfg'}
                            for c in (self._backbone_cfg, cfg.model.backbone))
            differ = [f'model.backbone.{k}: {theirs.get(k, "(unset)")!r} in the task\'s '
                      f'config, {ours.get(k, "(unset)")!r} in the bank\'s'
                      for k in sorted(set(ours) | set(theirs)) if ours.get(k) != theirs.get(k)]
            if differ:
                raise AdapterRecordMismatchError(
                    f'{what}: the task\'s config builds another backbone than the '
                    f'bank\'s: {few(differ, 3, sep="; ")}')
        model = build_model(cfg, backbone=dict(type=nn.Identity))
        children = OrderedDict((n, m) for n, m in model.named_children()
                               if n != self.backbone_name)
        if list(children) != list(self._template):
            raise PretrainedMismatchError(
                f'{what}: the task\'s config builds a {type(model).__name__} with the '
                f'parts {list(children)} around its backbone; the bank\'s model, a '
                f'{type(self.model).__name__}, has {list(self._template)}')
        return children

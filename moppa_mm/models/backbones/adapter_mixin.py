"""What the MoPPA backbones share: switching adapters off, re-initialising them
after the base class's ``init_weights``, checking every state dict loaded into
them, checking the fused scale & shift layers' scales once per forward, and the
parameter breakdown."""
import os.path as osp
from typing import Dict, Optional, Sequence, Tuple

import torch
from mmengine.config import ConfigDict
from mmengine.logging import print_log

from moppa_mm.operators import MoPPAUnit
from moppa_mm.operators.moppa_unit import FREQ_PARAMS
from moppa_mm.utils.checkpoints import check_finite, load_checkpoint_file, naming_checkpoint
from moppa_mm.utils.params import matches, parameter_table
from ..converters import check_converted
from ..layers.scale_shift import ScaleShift, check_scale_floors

# The adapters' parameter names (relative to the backbone), by kind: the one
# place they are spelled. Everything else in a MoPPA backbone is the frozen
# pre-trained base. (kind, fnmatch patterns, label of the parameter tables)
ADAPTER_GROUPS: Tuple[Tuple[str, Tuple[str, ...], str], ...] = (
    ('moppa', ('*moppa*', ), 'moppa units'),
    ('conv_adapter', ('*conv_adapter*', ), 'conv adapters'),
    ('scale_shift', ('*ssf_*', ), 'scale & shift'),
)
ADAPTER_PATTERNS = tuple(p for _, patterns, _ in ADAPTER_GROUPS for p in patterns)


def adapter_patterns(prefix: str = '') -> Tuple[str, ...]:
    """The adapter patterns for names under ``prefix`` (e.g. ``'backbone.'``
    for a whole detector's or classifier's parameters)."""
    return tuple(prefix + p for p in ADAPTER_PATTERNS)


def adapter_components(prefix: str = '') -> Tuple[Tuple[str, Tuple[str, ...]], ...]:
    """``(name, patterns)`` per adapter kind under ``prefix``, for
    :func:`~moppa_mm.utils.params.parameter_table`."""
    return tuple((prefix + kind, tuple(prefix + p for p in patterns))
                 for kind, patterns, _ in ADAPTER_GROUPS)


def is_adapter_key(name: str) -> bool:
    """Whether a backbone parameter / state-dict key belongs to an adapter."""
    return matches(name, ADAPTER_PATTERNS)


class PretrainedMismatchError(RuntimeError):
    """A state dict does not fit the MoPPA backbone it is loaded into."""


def _few(keys: Sequence[str], n: int = 5) -> str:
    keys = sorted(keys)
    return ', '.join(keys[:n]) + (f', ... ({len(keys)} in all)' if len(keys) > n else '')


class AdapterMixin:
    """Mixed into a backbone subclass (before the base class).

    Subclasses set ``ADAPTER_TYPES`` (modules with ``enabled`` and
    ``reset_parameters``) and ``PRETRAINED_LABEL``, the name of the frozen
    rest in the parameter table (the adapter rows are :data:`ADAPTER_GROUPS`).
    """

    ADAPTER_TYPES: Tuple[type, ...] = ()
    PRETRAINED_LABEL: str = 'pre-trained backbone'
    # base parameters that pre-trained releases legitimately lack (fnmatch)
    PRETRAINED_MAY_LACK: Tuple[str, ...] = ()
    # whether the units' frequency maps saved on another grid are resized on
    # load (the grid follows the image size) or refused (the grid is the scope's:
    # a window, or a stage's map)
    RESIZES_FREQUENCY_MAPS: bool = False

    def _register_state_dict_check(self) -> None:
        """Call at the end of ``__init__``: after the base classes' own pre-hooks
        (mmpretrain's ViT resizes ``pos_embed`` in one), so that shapes are
        compared as they will be loaded. Also registers the forward pre-hook
        that checks every scale & shift layer's scale at once."""
        # the scale & shift layers, found once (a plain list: deepcopy remaps it)
        self._scale_shifts = [m for m in self.modules() if isinstance(m, ScaleShift)]
        if self._scale_shifts:
            self.register_forward_pre_hook(self._check_scale_floors)
        self._pretrained_loaded = False
        self._checkpoint_source: Optional[str] = None
        self._register_load_state_dict_pre_hook(self._check_incoming_state,
                                                with_module=False)

    def _check_scale_floors(self, module, args) -> None:
        """Before a forward that will need gradients: the fused scale & shift
        layers' scale-floor checks, all at once (one device read-back per
        optimizer step instead of one per layer)."""
        if torch.is_grad_enabled():
            check_scale_floors(self._scale_shifts)

    def _check_incoming_state(self, state_dict, prefix, local_metadata, strict,
                              missing_keys, unexpected_keys, error_msgs) -> None:
        """Every loader ends here (torch's and mmengine's ``load_state_dict``,
        the ``Pretrained`` init, mmdet's Swin ``init_weights``).

        * a NaN or infinite tensor is an error (``NonFiniteCheckpointError``);

        * no adapter keys: a pre-trained base; every base parameter must be
          there (except ``PRETRAINED_MAY_LACK``);
        * adapter keys: a fine-tuned checkpoint; all of the model's adapters
          must be there, and what it lacks of the base comes from the
          pre-trained weights named by ``init_cfg`` (loaded first if they were
          not yet), filled into ``state_dict`` so loaders do not report them;
        * any shape that differs from the model's is an error.
        """
        own = self.state_dict()  # keys without the prefix
        incoming = {k[len(prefix):]: v for k, v in state_dict.items()
                    if k.startswith(prefix)}
        where = f' from {self._checkpoint_source!r}' if self._checkpoint_source else ''
        name = type(self).__name__
        check_finite(incoming, f'{name}: the state dict{where or " being loaded"}')
        # where the units' grid follows the image size (RESIZES_FREQUENCY_MAPS), a
        # frequency map (grid, grid, heads) saved on another grid is resized by
        # the unit itself when it loads it: only the heads must agree
        resized_on_load = {f'{name}.{param}' for name, unit in self.named_modules()
                           if isinstance(unit, MoPPAUnit)
                           for param in FREQ_PARAMS if hasattr(unit, param)
                           } if self.RESIZES_FREQUENCY_MAPS else set()

        def fits(key, value):
            if value.shape == own[key].shape:
                return True
            return key in resized_on_load and value.dim() == 3 and \
                value.shape[2] == own[key].shape[2]

        mismatched = [f'{k}: {tuple(v.shape)} in the checkpoint, {tuple(own[k].shape)} '
                      'in the model' for k, v in incoming.items()
                      if k in own and hasattr(v, 'shape') and not fits(k, v)]
        if mismatched:
            raise PretrainedMismatchError(
                f'{name}: {len(mismatched)} tensors of the state dict{where} do not '
                f'fit the model (a checkpoint of another architecture, scope '
                f'or window size?): {_few(mismatched, 3)}')
        params = [k for k, _ in self.named_parameters()]
        base = [k for k in params if not is_adapter_key(k)]
        adapters = [k for k in params if is_adapter_key(k)]
        given_adapters = [k for k in incoming if is_adapter_key(k)]
        if not given_adapters:  # a pre-trained base
            required = [k for k in base if not matches(k, self.PRETRAINED_MAY_LACK)]
            lacking = [k for k in required if k not in incoming]
            if lacking:
                raise PretrainedMismatchError(
                    f'{name}: the pre-trained state dict{where} restores '
                    f'{len(required) - len(lacking)} of the {len(required)} frozen base '
                    f'parameters; missing: {_few(lacking)}. The frozen backbone '
                    'would stay random: is it a checkpoint of this backbone, with '
                    f'its keys (given {len(incoming)} keys, e.g. '
                    f'{_few(list(incoming), 3) or "none"})?')
            self._pretrained_loaded = True
            return
        lacking_adapters = [k for k in adapters if k not in incoming]
        if len(lacking_adapters) == len(adapters):
            raise PretrainedMismatchError(
                f'{name}: the state dict{where} holds adapter tensors, but none of '
                f'this model\'s {len(adapters)}: a checkpoint of another model or '
                f'config? (it has e.g. {_few(given_adapters, 3)}; the model expects '
                f'e.g. {_few(adapters, 3)})')
        if lacking_adapters:
            raise PretrainedMismatchError(
                f'{name}: the state dict{where} holds adapters but lacks '
                f'{len(lacking_adapters)} of the model\'s {len(adapters)} adapter '
                f'parameters: {_few(lacking_adapters)}')
        lacking = [k for k in own if k not in incoming]
        if not lacking:
            self._pretrained_loaded = True
            return
        if not self._pretrained_loaded:
            self._load_pretrained_base(where)
            own = self.state_dict()
        for key in lacking:  # keep the base as loaded: copy it onto itself
            state_dict[prefix + key] = own[key]
        print_log(f'{name}: {len(incoming)} tensors{where} (adapter-only); '
                  f'{len(lacking)} frozen ones come from the pre-trained weights',
                  logger='current')

    def _load_pretrained_base(self, where: str) -> None:
        init_cfg = self.init_cfg if isinstance(self.init_cfg, dict) else {}
        if init_cfg.get('type') != 'Pretrained' or not init_cfg.get('checkpoint'):
            raise PretrainedMismatchError(
                f'{type(self).__name__}: the checkpoint{where} is adapter-only: '
                'it does not hold the frozen pre-trained weights, and '
                'model.backbone.init_cfg names no Pretrained checkpoint to take '
                'them from (mmdet\'s init_detector / DetInferencer and '
                'mmpretrain\'s get_model clear it). Set '
                'model.backbone.init_cfg.checkpoint, or make a self-contained '
                'checkpoint with tools/model_converters/publish_model.py '
                '--merge-base.')
        print_log(f'{type(self).__name__}: adapter-only checkpoint{where}; loading '
                  f'the pre-trained weights {init_cfg["checkpoint"]!r} first',
                  logger='current')
        source = self._checkpoint_source
        self._is_init = False  # mmengine skips a module initialised before
        self.init_weights()
        self._checkpoint_source = source
        if not self._pretrained_loaded:  # a loader that bypassed the check
            raise PretrainedMismatchError(
                f'{type(self).__name__}: loading {init_cfg["checkpoint"]!r} did '
                'not restore the pre-trained base')

    @staticmethod
    def _check_moppa_cfg(moppa_cfg: Optional[dict], kwargs: dict) -> dict:
        """Validate the unit's extra arguments (the backbone derives the dims,
        heads and grid) and give the base class an attribute-style
        ``init_cfg`` (mmdet's Swin reads ``init_cfg.checkpoint``)."""
        moppa_cfg = dict(moppa_cfg or {})
        for reserved in ('embed_dims', 'num_heads', 'grid_size'):
            if reserved in moppa_cfg:
                raise ValueError(f'moppa_cfg must not set {reserved!r}: the '
                                 'backbone derives it')
        if isinstance(kwargs.get('init_cfg'), dict):
            kwargs['init_cfg'] = ConfigDict(kwargs['init_cfg'])
        return moppa_cfg

    def _adapters(self):
        return [m for m in self.modules() if isinstance(m, self.ADAPTER_TYPES)]

    @property
    def adapters_enabled(self) -> bool:
        """Whether the adapters run (False: exactly the plain backbone)."""
        return all(m.enabled for m in self._adapters())

    @adapters_enabled.setter
    def adapters_enabled(self, enabled: bool) -> None:
        for module in self._adapters():
            module.enabled = enabled

    def init_weights(self) -> None:
        """The base classes re-initialise every Linear when no checkpoint is
        given: re-initialise the adapters after them. Errors while reading the
        pre-trained checkpoint name the file; an unconverted release (no keys
        under ``init_cfg.prefix``) is named with its converter command."""
        init_cfg = self.init_cfg if isinstance(self.init_cfg, dict) else {}
        checkpoint = init_cfg.get('checkpoint') if init_cfg.get('type') == 'Pretrained' \
            else None
        if checkpoint is None:
            super().init_weights()
        else:
            self._checkpoint_source = checkpoint
            what = 'pre-trained checkpoint model.backbone.init_cfg.checkpoint ='
            try:
                with naming_checkpoint(checkpoint, what):
                    super().init_weights()
            except AssertionError as error:  # mmengine: "<prefix> is not in the ..."
                if 'is not in the pretrained model' in str(error) and init_cfg.get('prefix') \
                        and osp.isfile(checkpoint):
                    check_converted(checkpoint, load_checkpoint_file(checkpoint, what),
                                    init_cfg['prefix'])
                raise
            finally:
                self._checkpoint_source = None
        for module in self._adapters():
            module.reset_parameters()

    def _breakdown(self) -> Tuple[Tuple[str, Tuple[str, ...], str], ...]:
        return ADAPTER_GROUPS + (('pretrained', ('*', ), self.PRETRAINED_LABEL), )

    def parameter_breakdown(self) -> Dict[str, Dict[str, int]]:
        """``{kind: {'total': n, 'trainable': n}}`` for each adapter kind of
        :data:`ADAPTER_GROUPS`, ``'pretrained'`` and ``'total'``."""
        _, counts = parameter_table(self, [(k, p) for k, p, _ in self._breakdown()])
        return counts

    def parameter_report(self) -> str:
        table, _ = parameter_table(self, [(label, p) for _, p, label in self._breakdown()],
                                   title=type(self).__name__)
        return table

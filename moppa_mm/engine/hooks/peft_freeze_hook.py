"""Audits, and where safe applies, which parameters a PEFT run trains."""
from typing import Optional, Sequence, Tuple

from mmengine.hooks import Hook
from mmengine.model import is_model_wrapper
from mmengine.registry import HOOKS

from moppa_mm.models.backbones.adapter_params import ADAPTER_PATTERNS, adapter_components
from moppa_mm.utils.params import frozen_norms, matches, parameter_table

DEFAULT_COMPONENTS = adapter_components('backbone.') + (
    ('backbone (pre-trained)', ('backbone.*', )),
    ('neck', ('neck.*', )),
    ('head', ('*head.*', )),
)


@HOOKS.register_module()
class PEFTFreezeHook(Hook):
    """Optional: audits (and where safe applies) which parameters train, for a
    whole model (neck and heads included) or one that does not freeze itself
    (the MoPPA backbones freeze their base when built and need no hook).

    A parameter may train unless it matches ``frozen`` and none of
    ``trainable``; the hook only freezes. Where the model is wrapped for DDP
    (set up before any hook runs) ``requires_grad`` can no longer change: it
    fails, listing the offending parameters. At train start it logs the
    parameter table and keeps every norm whose parameters are all frozen in
    eval mode.

    Args:
        trainable (Sequence[str]): fnmatch patterns that stay trainable.
        frozen (Sequence[str]): fnmatch patterns to freeze. Defaults to the
            whole backbone.
        components (Sequence[tuple], optional): ``(name, patterns)`` groups of
            the table. Defaults to the adapters, the pre-trained backbone, the
            neck and the head.
    """

    priority = 'VERY_HIGH'

    def __init__(self,
                 trainable: Sequence[str] = tuple('backbone.' + p for p in ADAPTER_PATTERNS),
                 frozen: Sequence[str] = ('backbone.*', ),
                 components: Optional[Sequence[Tuple[str, Sequence[str]]]] = None
                 ) -> None:
        assert isinstance(trainable, (list, tuple)), \
            f'trainable must be a list of patterns, got {type(trainable)}'
        assert isinstance(frozen, (list, tuple)), \
            f'frozen must be a list of patterns, got {type(frozen)}'
        self.trainable = tuple(trainable)
        self.frozen = tuple(frozen)
        self.components = tuple(components or DEFAULT_COMPONENTS)
        self._frozen_norms = []

    def _wanted(self, name: str) -> bool:
        return not matches(name, self.frozen) or matches(name, self.trainable)

    def before_train(self, runner) -> None:
        wrapped = is_model_wrapper(runner.model)
        model = runner.model.module if wrapped else runner.model
        wrong = [n for n, p in model.named_parameters()
                 if p.requires_grad and not self._wanted(n)]
        if wrong:
            if wrapped:
                raise RuntimeError(
                    f'PEFTFreezeHook: {len(wrong)} parameters are trainable '
                    f'against the patterns (first: {wrong[:5]}) but the model is already '
                    'wrapped for distributed training, where requires_grad can '
                    'no longer change. Settle it when the model is built (the '
                    'MoPPA backbones freeze themselves) or fix the patterns.')
            params = dict(model.named_parameters())
            for name in wrong:
                params[name].requires_grad_(False)
            runner.logger.info(f'PEFTFreezeHook: froze {len(wrong)} parameters')
        trainable = [n for n, p in model.named_parameters() if p.requires_grad]
        assert trainable, 'PEFTFreezeHook: no parameter is left trainable'
        self._frozen_norms = frozen_norms(model)
        self._set_frozen_norms_eval()
        table, _ = parameter_table(model, self.components,
                                   title=f'Trainable parameters of '
                                   f'{type(model).__name__}')
        runner.logger.info('\n' + table)

    def _set_frozen_norms_eval(self) -> None:
        for norm in self._frozen_norms:
            norm.eval()

    def before_train_iter(self, runner, batch_idx: int, data_batch=None) -> None:
        # loops call model.train() at each epoch and after validation
        self._set_frozen_norms_eval()

"""Fail a CPU test where a CUDA kernel would refuse its inputs' dtypes.

CPU kernels accept some mixes of floating dtypes that CUDA's refuse: a
LayerNorm of a bfloat16 input with float32 weights runs on CPU and raises
"expected scalar type BFloat16 but found Float" on CUDA. Under autocast this
only matters where autocast does not cast for us, so a model can pass every
CPU test and crash at its first step on a GPU (the MoPPA Swin's conv adapter
did). :func:`cuda_dtype_rules` runs a block under a
:class:`~torch.utils._python_dispatch.TorchDispatchMode` that raises
:class:`MixedDtypeError` on

- matmuls and convolutions (forward and backward) whose floating inputs have
  more than one dtype, anywhere: autocast casts those on both devices, so a
  mix is a call autocast did not see (a region that turns autocast off, a
  custom ``autograd.Function``'s backward);
- layer and group norms with mixed floating inputs where autocast is off (in
  a backward pass, a custom Function's recomputation, a region that disables
  autocast). Under autocast a mix is no fault: CPU autocast leaves
  ``layer_norm`` in its input's dtype with float32 weights (CPU accepts it),
  CUDA autocast runs it in float32. Their backward kernels mirror the forward
  and are not checked;
- batch norm's backward (the scale & shift gradients' reduction), anywhere:
  CUDA takes the gradient and the input in one dtype, the saved mean and
  inverse std in its accumulation dtype (float32 for bfloat16, float16 and
  float32 inputs), and a weight in the input's dtype or that one; CPU's
  kernel takes more mixes.

Inside ``__torch_dispatch__`` torch has excluded every dispatch key above the
Python one, autocast's too (``torch.is_autocast_enabled`` reads False there
whatever the caller set), so a companion
:class:`~torch.overrides.TorchFunctionMode` records the autocast state of the
innermost Python-level torch call in flight (``F.layer_norm``,
``Tensor.backward``, ...): the state the aten calls under it run with. While
a backward runs, the modes see no Python-level call, so the state is the one
``backward()`` was called with, which is the one the autograd engine gives the
backward functions; a custom backward that turns autocast back on
(``torch.amp.custom_bwd``) would be checked as if it stayed off (nothing in
this project uses it).
"""
import collections
import contextlib
import os.path as osp
import traceback
from typing import List, Optional

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

import moppa_mm

aten = torch.ops.aten

# CUDA refuses mixed floating dtypes here whatever autocast does (the aten ops
# a dispatch mode sees: ``linear``, ``matmul``, ``conv2d``, ``layer_norm``... are
# decomposed into these before it)
MATMULS_AND_CONVS = frozenset((
    aten.mm, aten.bmm, aten.addmm, aten.baddbmm, aten.addbmm, aten.addmv, aten.mv,
    aten.addr, aten.dot, aten.vdot, aten._addmm_activation, aten.convolution,
    aten.convolution_backward, aten._scaled_dot_product_flash_attention_for_cpu,
    aten._scaled_dot_product_flash_attention_for_cpu_backward))
# attention's operands that share a dtype (q, k, v; in backward also the
# output's gradient and the output): its logsumexp is float32 by design
LEADING_OPERANDS = {aten._scaled_dot_product_flash_attention_for_cpu: 3,
                    aten._scaled_dot_product_flash_attention_for_cpu_backward: 5}
# ... and here where autocast is off (CUDA autocast runs them in float32)
NORMS = frozenset((aten.native_layer_norm, aten.native_group_norm))
# CUDA's accumulation dtype of a floating input (at::acc_type<scalar_t, is_cuda=true>)
CUDA_ACCUMULATION = {torch.bfloat16: torch.float32, torch.float16: torch.float32,
                     torch.float32: torch.float32, torch.float64: torch.float64}


def batch_norm_backward_fault(args) -> Optional[str]:
    """What CUDA's ``native_batch_norm_backward`` would refuse in ``args``
    (grad, input, weight, running mean and var, save mean and invstd, ...)."""
    grad, inputs, weight, _, _, save_mean, save_invstd = args[:7]
    if grad.dtype != inputs.dtype:
        return f'the gradient is {grad.dtype} and the input {inputs.dtype}'
    accumulation = CUDA_ACCUMULATION[inputs.dtype]
    for name, stat in (('save_mean', save_mean), ('save_invstd', save_invstd)):
        if stat is not None and stat.numel() and stat.dtype != accumulation:
            return f'{name} is {stat.dtype}, CUDA reads it as {accumulation}'
    if weight is not None and weight.dtype not in (inputs.dtype, accumulation):
        return f'the weight is {weight.dtype} for a {inputs.dtype} input'
    return None


class MixedDtypeError(AssertionError):
    """A call CUDA's kernels would refuse for its mix of floating dtypes."""


def floating_dtypes(args, kwargs) -> List[torch.dtype]:
    """The distinct floating dtypes of the tensors among ``args`` and ``kwargs``."""
    dtypes = []
    for leaf in tree_flatten((args, kwargs or {}))[0]:
        if isinstance(leaf, torch.Tensor) and leaf.is_floating_point() \
                and leaf.dtype not in dtypes:
            dtypes.append(leaf.dtype)
    return dtypes


# the package's and the tests' folders (not a path that merely contains 'moppa_mm':
# a clone named moppa_mm holds its .venv, torch included)
_PROJECT_DIRS = tuple(osp.join(osp.dirname(osp.abspath(path)), '') for path in (
    moppa_mm.__file__, __file__))


def _callers(depth: int = 3) -> str:
    """The innermost ``depth`` frames of this project (package or tests) on
    the stack, innermost first."""
    frames = [f'{frame.filename}:{frame.lineno} ({frame.name})'
              for frame in reversed(traceback.extract_stack())
              if frame.filename.startswith(_PROJECT_DIRS)
              and not frame.filename.endswith('dtype_check.py')]
    return ' <- '.join(frames[:depth]) or 'outside this project'


class _AutocastState(TorchFunctionMode):
    """Records whether autocast is on for the innermost torch call in flight."""

    def __init__(self, device_type: str) -> None:
        super().__init__()
        self.device_type = device_type
        self.enabled = torch.is_autocast_enabled(device_type)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        outer, self.enabled = self.enabled, torch.is_autocast_enabled(self.device_type)
        try:
            return func(*args, **(kwargs or {}))
        finally:
            self.enabled = outer


class CudaDtypeRules(TorchDispatchMode):
    """Raises :class:`MixedDtypeError` at the first aten call CUDA would refuse
    (module docstring). ``faults`` lists every one (also those the code under
    test caught); ``seen`` counts what was checked: ``'calls'`` (aten calls),
    ``'low precision matmuls'`` (matmuls and convolutions all in bfloat16 or
    float16: autocast did its work) and ``'mixed norms under autocast'`` (the
    CPU-autocast norms let through)."""

    def __init__(self, autocast_state: _AutocastState) -> None:
        super().__init__()
        self.autocast_state = autocast_state
        self.faults: List[str] = []
        self.seen = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        fault = self.check(func, args, kwargs)
        if fault is not None:
            self.faults.append(fault)
            raise MixedDtypeError(fault)
        return func(*args, **(kwargs or {}))

    def check(self, func, args, kwargs) -> Optional[str]:
        """The fault of one aten call, or None; counts it in ``seen``."""
        self.seen['calls'] += 1
        packet = func.overloadpacket
        if packet in MATMULS_AND_CONVS:
            if packet in LEADING_OPERANDS:
                args, kwargs = args[:LEADING_OPERANDS[packet]], {}
            dtypes = floating_dtypes(args, kwargs)
            if len(dtypes) < 2:
                self.seen['low precision matmuls'] += dtypes[:1] in ([torch.bfloat16],
                                                                     [torch.float16])
                return None
            why = 'CUDA refuses mixed dtypes in matmuls and convolutions'
        elif packet in NORMS:
            dtypes = floating_dtypes(args, kwargs)
            if len(dtypes) < 2:
                return None
            if self.autocast_state.enabled:
                self.seen['mixed norms under autocast'] += 1
                return None
            why = 'autocast is off here, and CUDA refuses a norm with mixed dtypes'
        elif packet is aten.native_batch_norm_backward:
            why = batch_norm_backward_fault(args)
            if why is None:
                return None
            dtypes = floating_dtypes(args, kwargs)
        else:
            return None
        shapes = [tuple(a.shape) for a in tree_flatten((args, kwargs or {}))[0]
                  if isinstance(a, torch.Tensor)]
        return (f'{func} with floating dtypes {[str(d) for d in dtypes]} '
                f'(tensor shapes {shapes}) at {_callers()}: {why}')


@contextlib.contextmanager
def cuda_dtype_rules(device_type: str = 'cpu'):
    """Check every aten call of the block (forward and backward) against
    CUDA's dtype rules; ``device_type`` is the device whose autocast state
    counts. Yields the :class:`CudaDtypeRules` mode (``faults``, ``seen``)."""
    autocast_state = _AutocastState(device_type)
    rules = CudaDtypeRules(autocast_state)
    with autocast_state, rules:
        yield rules
    if rules.faults:  # raised inside and caught by the code under test
        raise MixedDtypeError('; '.join(rules.faults))

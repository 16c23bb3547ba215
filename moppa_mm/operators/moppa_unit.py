"""The MoPPA unit (paper Sec. 3.2, Eqs. 7-11): pure PyTorch, no registry.

For a channel-last input ``X`` of shape (B, H, W, C) split into ``N`` heads::

    Y = IDCT2( DCT2(X) * (a1 exp(-k w^2 t_h) + a2 cos(c |w| t_w))
               + a3 SD(w) / (w^2 + eta) )                              (Eq. 11)

    k = k(w, head), c = c(w, head)            frequency x head
    t_h, t_w = t(channel in head)             shared across heads
    SD(w, channel) = H1(w, head) * H2(channel in head)
    (a1, a2, a3) = softmax(lambda)            the router

Everything is linear in ``X``: the three experts (Eq. 10) fuse into ONE filter
multiply and ONE additive field in the DCT domain, independent of ``X`` (cached in
eval mode: :meth:`MoPPAUnit.clear_cache` after assigning ``param.data``).
"""
import contextlib
import functools
from contextvars import ContextVar
from types import MappingProxyType
from itertools import chain
from typing import Dict, List, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn
import torch.nn.functional as F
from mmengine.logging import print_log
from torch.autograd.function import once_differentiable

from moppa_mm.utils.errors import InputValueError

from .dct import (_cached, dct_frequencies, dct_method, dct_tokens, expanded_kron_basis,
                  matmul_dtype)
from .tracing import is_capturing

EXPERTS = ('heat', 'wave', 'poisson')
INIT_MODES = ('paper', 'identity')
HEAT_PARAMS = ('raw', 'softplus')
RESIZE_MODES = ('bicubic', 'bilinear', 'nearest')
FREQ_PARAMS = ('frequency_maps', )  # indexed by frequency: resized to another grid on load


def inverse_softplus(value: torch.Tensor) -> torch.Tensor:
    """The ``raw`` with ``softplus(raw) == value`` (``value > 0``), computed
    without overflow: ``log(exp(v) - 1) = v + log(1 - exp(-v))``."""
    return value + torch.log(-torch.expm1(-value))


_FACTORS: Dict[tuple, torch.Tensor] = {}


def _expert_factors(experts: Tuple[str, ...], h: int, w: int, eta: float, device,
                    dtype) -> torch.Tensor:
    """The experts' frequency factors (E, H, W, 1), cached: ``-w^2``, ``|w|``,
    ``1 / (w^2 + eta)``."""

    def build():
        omega_sq, omega_abs = dct_frequencies(h, w, device, torch.float64)
        factor = dict(heat=-omega_sq, wave=omega_abs, poisson=1 / (omega_sq + eta))
        return torch.stack([factor[e] for e in experts])[..., None].to(dtype)

    return _cached(_FACTORS, (experts, h, w, eta, torch.device(device), dtype), build)


def _softplus_rows(rows: int, trailing: int, device) -> torch.Tensor:
    """True at heat's row (the first) of ``rows``, (rows, 1...), cached."""
    return _cached(_FACTORS, ('softplus', rows, trailing, torch.device(device)),
                   lambda: (torch.arange(rows, device=device) == 0).view(-1, *[1] * trailing))


def _check_grid(size: Union[int, Sequence[int]], what: str) -> Tuple[int, int]:
    size = (size, size) if isinstance(size, int) else tuple(size)
    if len(size) != 2 or min(size) <= 0:
        raise ValueError(f'{what} must be positive (H, W), got {size}')
    return size


def resize_frequency_map(param: torch.Tensor, size: Tuple[int, int],
                         mode: str = 'bicubic') -> torch.Tensor:
    """Resample a frequency-indexed map (N, Hr, Wr) to the grid (N, H, W),
    frequency-exact: index ``n`` (frequency ``pi n / H``) reads reference
    position ``n * Hr / H`` (the same frequency; DC to DC), the border beyond."""
    ref_h, ref_w = param.shape[-2:]
    h, w = size
    if (h, w) == (ref_h, ref_w):
        return param

    def normalised(n: int, ref: int) -> torch.Tensor:
        # align_corners=True: -1 is reference index 0, +1 is index ref - 1.
        src = torch.arange(n, device=param.device, dtype=param.dtype) * ref / n
        return src * 2 / max(ref - 1, 1) - 1

    grid = torch.stack(torch.meshgrid(normalised(w, ref_w), normalised(h, ref_h),
                                      indexing='xy'), dim=-1)  # (H, W, 2) as (x, y)
    return F.grid_sample(param.unsqueeze(0), grid.unsqueeze(0), mode=mode,
                         padding_mode='border', align_corners=True).squeeze(0)  # (N, H, W)


def check_unit_options(eta: float, resize_mode: str, experts: Sequence[str],
                       init_mode: str, heat_param: str) -> None:
    """Raise ``ValueError`` naming the first option of :class:`MoPPAUnit` out of
    its range (the one check the unit and the backbones' ``MoPPAConfig`` share)."""
    for name, value, allowed in (('init_mode', init_mode, INIT_MODES),
                                 ('heat_param', heat_param, HEAT_PARAMS),
                                 ('resize_mode', resize_mode, RESIZE_MODES)):
        if value not in allowed:
            raise InputValueError(f'unknown {name} {value!r}, expected one of {allowed}')
    if not isinstance(eta, (int, float)) or isinstance(eta, bool) or not eta > 0:
        raise InputValueError(f'eta must be a number > 0 (the DC term has w = 0), got {eta!r}')
    if not isinstance(experts, (list, tuple)) or not experts \
            or any(e not in EXPERTS for e in experts) or len(set(experts)) != len(experts):
        got = f'the string {experts!r} (a list: [{experts!r}])' if isinstance(experts, str) \
            else repr(experts)
        raise InputValueError(f'experts must be a list of distinct names from {EXPERTS}, '
                              f'got {got}')


class MoPPAUnit(nn.Module):
    """Mixture of Physical Priors unit on a channel-last token grid.

    Parameters, a row per expert in use (heat, wave, Poisson order):
    ``frequency_maps`` (E, Hr, Wr, N): k, c, H1 per frequency and head;
    ``channel_maps`` (E, C/N): t_h, t_w (none with ``share_time``), H2 per
    channel in a head; ``route_logits`` (E, ); ``gate`` (C/N, ) with
    ``init_mode='identity'``. :meth:`expert_maps` names the rows.

    Args:
        embed_dims (int): Channels ``C`` of the input.
        num_heads (int): MoPPA heads ``N``; ``C`` must divide by it.
        grid_size (int | tuple[int, int]): Reference grid (Hr, Wr) of the
            frequency maps (``L = Hr * Wr``); other grids resize them.
        eta (float): Stabiliser of the Poisson division. Defaults to 1e-3 (paper).
        share_time (bool): Heat and wave share one ``t`` per channel (the
            paper reads either way). Defaults to False.
        coef_init (float): k and c start uniform in ``[0, coef_init)``: both
            filters near 1, never exactly at c = 0, where ``cos(c |w| t)`` has
            no gradient in c and t. Defaults to 1e-2.
        time_init (float): Initial ``t``. Defaults to 1.0.
        source_init_std (float): H1 and H2 start normal with this std, small:
            the field starts near 0. Defaults to 1e-2.
        resize_mode (str): 'bicubic' (default, as vHeat), 'bilinear' or
            'nearest', the resizing of the frequency maps.
        experts (sequence of str): The priors in use, of ('heat', 'wave',
            'poisson') (paper Table 4); the router spans them. Defaults to all.
        init_mode (str): 'paper' (default): Eq. 11 (about 2/3 X at init).
            'identity': ``X + gate * (Y_Eq11 - X)`` with a zero gate: the
            identity at init, as LoRA's zero B; ``gate = 1`` is Eq. 11.
        heat_param (str): 'raw' (default, the paper's): heat's rows hold k and
            t; ``k t < 0`` amplifies high frequencies as ``exp(|k t| w^2)``.
            'softplus': they hold ``softplus^-1`` of k and t (and of a ``t``
            wave shares), so heat only damps. A checkpoint's record says which.
    """

    def __init__(self, embed_dims: int, num_heads: int, grid_size: Union[int, Sequence[int]],
                 eta: float = 1e-3, share_time: bool = False, coef_init: float = 1e-2,
                 time_init: float = 1.0, source_init_std: float = 1e-2,
                 resize_mode: str = 'bicubic', experts: Sequence[str] = EXPERTS,
                 init_mode: str = 'paper', heat_param: str = 'raw') -> None:
        super().__init__()
        for name, value in (('num_heads', num_heads), ('embed_dims', embed_dims)):
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f'{name} must be a positive int, got {value!r}')
        if embed_dims % num_heads != 0:
            raise ValueError(f'embed_dims ({embed_dims}) must be divisible by '
                             f'num_heads ({num_heads})')
        check_unit_options(eta=eta, resize_mode=resize_mode, experts=experts,
                           init_mode=init_mode, heat_param=heat_param)
        self.embed_dims, self.num_heads, self.head_dims = embed_dims, num_heads, \
            embed_dims // num_heads
        self.grid_size = tuple(int(size) for size in _check_grid(grid_size, 'grid_size'))
        self.eta, self.share_time, self.resize_mode = eta, share_time, resize_mode
        self.coef_init, self.time_init, self.source_init_std = coef_init, time_init, \
            source_init_std
        self.experts = tuple(e for e in EXPERTS if e in experts)
        self.init_mode, self.heat_param = init_mode, heat_param

        # one row per expert; frequency x head in the layout the filter uses (no
        # permute per forward; gradients keep the parameters' strides: DDP buckets)
        experts = len(self.experts)
        self.frequency_maps = nn.Parameter(torch.empty(experts, *self.grid_size, num_heads))
        shared = share_time and {'heat', 'wave'} <= set(self.experts)
        self.channel_rows = tuple(row - (shared and row > 0) for row in range(experts))
        self.channel_maps = nn.Parameter(torch.empty(experts - shared, self.head_dims))
        self.route_logits = nn.Parameter(torch.zeros(experts))  # lambda
        if init_mode == 'identity':  # blends X and Eq. 11, per channel in a head
            self.gate = nn.Parameter(torch.empty(self.head_dims))

        self._eval_cache: Optional[Tuple[tuple, torch.Tensor, torch.Tensor]] = None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Filters near 1, a small random source, a uniform router, a zero gate;
        'softplus' stores the inverses of the same k (>= ``1e-4 coef_init``) and t."""
        with torch.no_grad():
            for expert, frequency, row in zip(self.experts, self.frequency_maps,
                                              self.channel_rows):
                channel = self.channel_maps[row]
                if expert == 'poisson':  # H1, H2
                    frequency.normal_(0, self.source_init_std)
                    channel.normal_(0, self.source_init_std)
                else:  # k or c; t
                    frequency.uniform_(0, self.coef_init)
                    channel.fill_(self.time_init)
            if self.heat_param == 'softplus' and 'heat' in self.experts:
                k = self.frequency_maps[0].clamp_(min=1e-4 * self.coef_init)
                k.copy_(inverse_softplus(k))
                self.channel_maps[0].copy_(inverse_softplus(self.channel_maps[0]))
            self.route_logits.zero_()
            if self.init_mode == 'identity':
                self.gate.zero_()
        self._eval_cache = None

    def route_weights(self) -> torch.Tensor:
        """``a = softmax(lambda)``, one weight per expert in use."""
        return self.route_logits.softmax(dim=0)

    def expert_maps(self, expert: str) -> Tuple[torch.Tensor, torch.Tensor]:
        """``expert``'s rows of ``frequency_maps`` and ``channel_maps`` (views):
        heat's k and t, wave's c and t, Poisson's H1 and H2, as stored."""
        row = self.experts.index(expert)
        return self.frequency_maps[row], self.channel_maps[self.channel_rows[row]]

    def filter_and_field(self, size: Tuple[int, int], device=None, dtype=None,
                         flat: bool = False, params: Optional[Dict[str, torch.Tensor]] = None
                         ) -> Tuple[torch.Tensor, torch.Tensor]:
        """The fused spectral filter and additive field of Eq. 11, each (H, W, C)
        ((1, H*W, C) if ``flat``): ``filter = a1 heat + a2 wave``, ``field = a3
        poisson`` (``identity``: ``1 + g (filter - 1)`` and ``g field``).
        ``params``: this unit's, or those of L units alike stacked ((L, ...)
        outputs)."""
        params = params or dict(self.named_parameters(recurse=False))
        h, w = size
        logits = params['route_logits']
        device, dtype = device or logits.device, dtype or logits.dtype
        lead = logits.shape[:-1]  # () or (L,)
        frequency, channel = params['frequency_maps'], params['channel_maps']  # (L.., E, ...)
        if (h, w) != self.grid_size:  # (L.., E, Hr, Wr, N) -> (L.., E, H, W, N)
            maps = frequency.movedim(-1, -3)  # (L.., E, N, Hr, Wr)
            resized = resize_frequency_map(maps.reshape(-1, *self.grid_size), (h, w),
                                           self.resize_mode)  # (L.. * E * N, H, W)
            frequency = resized.view(*maps.shape[:-2], h, w).movedim(-3, -1)
        if self.heat_param == 'softplus' and 'heat' in self.experts:  # k and heat's t
            frequency, channel = (torch.where(_softplus_rows(p.shape[-1 - trailing], trailing,
                                                             device), F.softplus(p), p)
                                  for trailing, p in ((3, frequency), (1, channel)))
        if len(self.channel_rows) != channel.shape[-2]:  # share_time: wave reads heat's t
            channel = channel[..., self.channel_rows, :]
        # heat's k (-w^2), wave's c |w|, Poisson's H1 / (w^2 + eta): (L.., E, H, W, N)
        frequency = frequency * _expert_factors(self.experts, h, w, self.eta, device, dtype)
        route = logits.to(dtype).softmax(-1)  # (L.., E)
        mix = _mix_experts if is_capturing() else _MixExperts.apply
        spectral_filter, field = mix(frequency, channel.to(frequency.dtype), route,
                                     self.experts)  # (L.., HW, C) each
        if self.init_mode == 'identity':  # X + g (Y_Eq11 - X), g per channel in a head
            gate = params['gate'].to(dtype).repeat(*[1] * len(lead), self.num_heads)  # (L.., C)
            gate = gate.view(*lead, 1, -1) if lead else gate
            spectral_filter = torch.lerp(torch.ones((), device=device, dtype=dtype),
                                         spectral_filter, gate)
            field = field * gate
        if flat and lead:  # (L, H*W, C)
            return spectral_filter, field
        shape = (1, h * w, self.embed_dims) if flat else (*lead, h, w, self.embed_dims)
        return spectral_filter.view(shape), field.view(shape)

    def clear_cache(self) -> None:
        """Forget the eval-mode filter and field (after ``param.data = ...``)."""
        self._eval_cache = None

    def _apply(self, fn, recurse=True):  # .to(), .half(), .cuda(): new tensors
        self._eval_cache = None
        return super()._apply(fn, recurse)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        """Frequency maps saved on another reference grid (another image size) are
        resized to this one (:func:`resize_frequency_map`), as mmpretrain resizes ``pos_embed``."""
        key = prefix + FREQ_PARAMS[0]
        saved = state_dict.get(key)  # (E, Hs, Ws, N)
        if hasattr(self, 'frequency_maps') and isinstance(saved, torch.Tensor) and \
                saved.dim() == 4 and saved.shape[::3] == self.frequency_maps.shape[::3] and \
                tuple(saved.shape[1:3]) != self.grid_size:
            maps = saved.permute(0, 3, 1, 2).reshape(-1, *saved.shape[1:3])  # (E*N, Hs, Ws)
            resized = resize_frequency_map(maps, self.grid_size, self.resize_mode)
            state_dict[key] = resized.view(saved.shape[0], self.num_heads, *self.grid_size
                                           ).permute(0, 2, 3, 1).contiguous()  # (E, Hr, Wr, N)
            print_log(f'{key}: frequency maps resized from grid {tuple(saved.shape[1:3])} '
                      f'to {self.grid_size} ({self.resize_mode}, frequency-exact)',
                      logger='current')
        self._eval_cache = None
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def train(self, mode: bool = True) -> 'MoPPAUnit':
        self._eval_cache = None
        return super().train(mode)

    def filter_dtype(self, dtype: torch.dtype) -> torch.dtype:
        """The dtype the filter and field are built in for a ``dtype`` spectrum:
        float32 at least (float16's ``a3 / (w^2 + eta)`` overflows at small eta)."""
        own = self.merged_filter.dtype if self.merged else self.route_logits.dtype
        return torch.float64 if torch.float64 in (dtype, own) else torch.float32

    merged = False

    def merge_(self) -> 'MoPPAUnit':
        """Replace the parameters with the filter and field they give on the
        reference grid (buffers ``merged_filter``, ``merged_field``, (H, W, C),
        float32 at least), for inference, one-way. Returns the unit."""
        if self.merged:
            return self
        dtype = torch.promote_types(self.route_logits.dtype, torch.float32)
        with torch.no_grad():
            spectral_filter, field = self.filter_and_field(
                self.grid_size, self.route_logits.device, dtype)
        for name, _ in list(self.named_parameters(recurse=False)):
            delattr(self, name)
        self.register_buffer('merged_filter', spectral_filter.contiguous())
        self.register_buffer('merged_field', field.contiguous())
        self.merged = True
        self._eval_cache = None
        return self

    def forward(self, x: torch.Tensor, grid: Optional[Tuple[int, int]] = None,
                extra: int = 0, terms: Optional[Tuple[torch.Tensor, torch.Tensor]] = None,
                norm_input: Optional[torch.Tensor] = None, norm: Optional[nn.Module] = None
                ) -> torch.Tensor:
        """``x``: (..., H, W, C); or, with the (H, W) ``grid``, tokens (B, extra
        + H*W, C), the ``extra`` first (a class token) unchanged. Returns the
        same shape in the DCTs' dtype (the input's or autocast's): the DCT, one
        multiply-add with the filter and field (``terms`` from :func:`unit_terms`,
        else cached or built), the inverse DCT. With ``x = norm(norm_input)`` (a
        plain ``nn.LayerNorm``) in mixed precision, the backward recomputes ``x``
        and its DCT rather than keep the spectrum."""
        if grid is None:  # (..., H, W, C)
            if x.dim() < 3 or x.shape[-1] != self.embed_dims:
                raise ValueError(f'MoPPAUnit expects (..., H, W, {self.embed_dims}), '
                                 f'got {tuple(x.shape)}')
            h, w, channels = x.shape[-3:]
            _check_grid((h, w), 'the input grid')
            return self.forward(x.reshape(-1, h * w, channels), (h, w)).view(x.shape)
        _check_grid(grid, 'the input grid')
        if x.dim() != 3 or tuple(x.shape[1:]) != (extra + grid[0] * grid[1], self.embed_dims):
            raise ValueError(f'MoPPAUnit expects (B, {extra} + {grid[0]}*{grid[1]}, '
                             f'{self.embed_dims}) tokens, got {tuple(x.shape)}')
        if extra and dct_method(*grid, x.device) == 'separable':
            # the separable passes take the grid tokens alone: split and join
            out = self.forward(x[:, extra:], grid, terms=terms)  # (B, H*W, C)
            return torch.cat([x[:, :extra].to(out.dtype), out], dim=1)
        key = (grid, extra, x.device, matmul_dtype(x))
        spectral_filter, field = terms or self._cached_terms(*key) or self._spectral_terms(*key)
        if dct_method(*grid, x.device) == 'kron' and torch.is_grad_enabled() and \
                not is_capturing():
            bases = (expanded_kron_basis(*grid, inverse, x.device, key[3], extra, x.shape[0])
                     for inverse in (False, True))
            if key[3] not in (torch.bfloat16, torch.float16) or not isinstance(
                    norm, nn.LayerNorm) or type(norm).forward is not nn.LayerNorm.forward:
                norm_input = norm = None  # a plain LayerNorm's, in mixed precision
            return _KronFilter.apply(x, spectral_filter, field, *bases, norm_input, norm)
        spectrum = dct_tokens(x, grid, extra=extra)
        spectrum = torch.addcmul(field, spectrum, spectral_filter)  # Eq. 11
        return dct_tokens(spectrum, grid, inverse=True, extra=extra)

    def _cached_terms(self, grid: Tuple[int, int], rows: int, device: torch.device,
                      dtype: torch.dtype) -> Optional[Tuple[torch.Tensor, torch.Tensor]]:
        """:meth:`_spectral_terms` from the eval cache, in eval mode without
        gradients to the unit, and merged; None otherwise or while captured."""
        if is_capturing() or not (self.merged or not self.training and not (
                torch.is_grad_enabled() and self.route_logits.requires_grad)):
            return None
        key = (tuple(grid), rows, device, dtype)
        # with the tensors' versions: an in-place update bumps them (a load, .to() clear it)
        state = key + tuple(t._version for t in chain(self.parameters(), self.buffers()))
        if self._eval_cache is None or self._eval_cache[0] != state:
            with torch.no_grad():
                self._eval_cache = (state, *self._spectral_terms(*key))
        return self._eval_cache[1:]

    def _spectral_terms(self, grid: Tuple[int, int], rows: int, device: torch.device,
                        dtype: torch.dtype, params: Optional[Dict[str, torch.Tensor]] = None
                        ) -> Tuple[torch.Tensor, torch.Tensor]:
        """The filter and field, (1, rows + H*W, C) each ((L, ...) from stacked
        ``params``), in ``dtype``; ``rows`` first rows of 1 and 0 for extra tokens."""
        with torch.autocast(device.type, enabled=False):
            if self.merged:
                if tuple(grid) != tuple(self.grid_size):
                    raise ValueError(
                        f'MoPPAUnit: merged for its reference grid {tuple(self.grid_size)}, got '
                        f'an input on the grid {tuple(grid)}: merge a model built for this '
                        'input size (img_size), or run the unmerged model')
                spectral_filter = self.merged_filter.view(1, -1, self.embed_dims)  # (1, H*W, C)
                field = self.merged_field.view(1, -1, self.embed_dims)
            else:
                spectral_filter, field = self.filter_and_field(
                    grid, device, self.filter_dtype(dtype), True, params)
            spectral_filter, field = spectral_filter.to(dtype), field.to(dtype)
            if rows:
                spectral_filter = F.pad(spectral_filter, (0, 0, rows, 0), value=1.0)
                field = F.pad(field, (0, 0, rows, 0))
        return spectral_filter, field

    def extra_repr(self) -> str:
        return (f'embed_dims={self.embed_dims}, num_heads={self.num_heads}, '
                f'grid_size={self.grid_size}, experts={self.experts}, '
                f'eta={self.eta}, share_time={self.share_time}, '
                f'resize_mode={self.resize_mode!r}, init_mode={self.init_mode!r}, '
                f'heat_param={self.heat_param!r}' + (', merged=True' if self.merged else ''))


class _KronFilter(torch.autograd.Function):
    """``K^T (K x * filter + field)``, ``K`` (N, T, T) an orthonormal Kronecker
    DCT expanded to the batch; backward ``g' = K g``, ``sum_b g' * (K x)``,
    ``sum_b g'``, ``K^T (g' * filter)``, ``K x`` kept or recomputed from ``norm_input``."""

    @staticmethod
    def forward(ctx, x, spectral_filter, field, basis, inverse_basis, norm_input, norm):
        ctx.input_dtype, ctx.norm = x.dtype, norm
        spectral_filter, field = spectral_filter.to(basis.dtype), field.to(basis.dtype)
        with torch.autocast(x.device.type, enabled=False):
            spectrum = torch.bmm(basis, x.to(basis.dtype))  # (N, T, C)
            out = torch.bmm(inverse_basis, torch.addcmul(field, spectrum, spectral_filter))
        kept = spectrum if norm is None else norm_input
        ctx.save_for_backward(kept, spectral_filter, basis, inverse_basis)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        spectrum, spectral_filter, basis, inverse_basis = ctx.saved_tensors
        needs = ctx.needs_input_grad
        grad = torch.bmm(basis, grad.to(basis.dtype))  # (N, T, C): K (K^T)^T
        if needs[1] and ctx.norm is not None:  # the spectrum from the norm's input
            spectrum = torch.bmm(basis, recompute_norm(ctx.norm, spectrum).to(basis.dtype))
        grad_filter = (grad * spectrum).sum(0, keepdim=True) if needs[1] else None  # (1, T, C)
        grad_field = grad.sum(0, keepdim=True) if needs[2] else None
        grad_x = torch.bmm(inverse_basis, grad.mul_(spectral_filter)).to(ctx.input_dtype)
        return grad_x, grad_filter, grad_field, None, None, None, None


def recompute_norm(norm: nn.LayerNorm, norm_input: torch.Tensor) -> torch.Tensor:
    """``norm(norm_input)`` again in a backward (autocast off), every tensor cast
    to the widest dtype among them (CUDA refuses a bfloat16 input with float32 weights)."""
    params = (norm.weight, norm.bias)
    dtype = functools.reduce(_promoted, [p.dtype for p in params if p is not None],
                             norm_input.dtype)
    weight, bias = (None if p is None else p.to(dtype) for p in params)
    with torch.no_grad():
        return F.layer_norm(norm_input.to(dtype), norm.normalized_shape, weight, bias, norm.eps)


@functools.lru_cache(maxsize=None)
def _promoted(first: torch.dtype, second: torch.dtype) -> torch.dtype:
    """``torch.promote_types``, remembered (a dispatched call each time)."""
    return torch.promote_types(first, second)


def _expert_products(frequency: torch.Tensor, channel: torch.Tensor) -> torch.Tensor:
    """Each expert's (per frequency and head) x (per channel in a head), one
    product for all: (L.., E, H, W, N) and (L.., E, C/N) -> (L.., E, H*W, C)."""
    *lead, experts, h, w, _ = frequency.shape
    products = frequency.unsqueeze(-1) * channel.view(*lead, experts, 1, 1, 1, -1)
    return products.reshape(*lead, experts, h * w, -1)


# each expert's term of Eq. 11 from its product: a1 exp(-k w^2 t) + a2 cos(c |w| t)
# into the filter, a3 H1 H2 / (w^2 + eta) into the field
_TERMS = MappingProxyType(dict(heat=torch.exp, wave=torch.cos, poisson=lambda product: product))


def _mix_experts(frequency: torch.Tensor, channel: torch.Tensor, route: torch.Tensor,
                 experts: Tuple[str, ...]) -> Tuple[torch.Tensor, torch.Tensor]:
    """The filter and field of Eq. 11, each (L.., H*W, C), from the experts'
    factors ``frequency`` (L.., E, H, W, N), ``channel`` (L.., E, C/N) and the
    route ``a`` (L.., E); zeros where no expert in ``experts`` adds to one."""
    mixed = {}
    products = _expert_products(frequency, channel).unbind(-3)  # (L.., HW, C) each
    for expert, product, weight in zip(experts, products, route[..., None, None].unbind(-3)):
        term, into = _TERMS[expert](product), 'field' if expert == 'poisson' else 'filter'
        mixed[into] = torch.addcmul(mixed[into], term, weight) if into in mixed else term * weight
    return tuple(mixed[into] if into in mixed else torch.zeros_like(products[0])
                 for into in ('filter', 'field'))


class _MixExperts(torch.autograd.Function):
    """:func:`_mix_experts` keeping only its small inputs for backward: the
    products are recomputed there and their gradients reduced to the factors
    by two batched matmuls (autograd keeps three products-sized tensors and
    every expert's output)."""

    @staticmethod
    def forward(ctx, frequency, channel, route, experts):
        ctx.experts = experts
        ctx.save_for_backward(frequency, channel, route)
        return _mix_experts(frequency, channel, route, experts)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_filter, grad_field):
        frequency, channel, route = ctx.saved_tensors
        products = _expert_products(frequency, channel)  # (L.., E, HW, C)
        grads = [grad_field if expert == 'poisson' else grad_filter for expert in ctx.experts]
        grad_products = (torch.empty_like if None not in grads else torch.zeros_like)(products)
        grad_route = []
        for expert, grad, product, out, weight in zip(
                ctx.experts, grads, products.unbind(-3), grad_products.unbind(-3),
                route[..., None, None].unbind(-3)):  # weight: (L.., 1, 1)
            if grad is None:
                grad_route.append(torch.zeros_like(weight[..., 0, 0]))
                continue
            value = _TERMS[expert](product)
            if expert == 'poisson':
                torch.mul(grad, weight, out=out)
            else:  # d exp(p) = exp(p), d cos(p) = -sin(p)
                slope = value if expert == 'heat' else torch.sin(product).neg_()
                torch.mul(slope, grad, out=out).mul_(weight)
            grad_route.append((grad * value).sum((-2, -1)))
        # the products' gradient reduced to each factor, batched over (L.. * E):
        # (H*W*N, C/N) x (C/N, 1) and (1, H*W*N) x (H*W*N, C/N)
        grad_products = grad_products.view(-1, frequency.shape[-3:].numel(), channel.shape[-1])
        with torch.autocast(products.device.type, enabled=False):
            grad_frequency = torch.bmm(grad_products, channel.reshape(-1, channel.shape[-1], 1))
            grad_channel = torch.bmm(frequency.reshape(-1, 1, grad_products.shape[1]),
                                     grad_products)
        return (grad_frequency.view(frequency.shape), grad_channel.view(channel.shape),
                torch.stack(grad_route, -1), None)


class _Stack(torch.autograd.Function):
    """``torch.stack``, its backward one ``unbind`` (autograd's: one select each)."""

    @staticmethod
    def forward(ctx, *tensors):
        return torch.stack(tensors)

    @staticmethod
    def backward(ctx, grad):
        return grad.unbind(0)


def _stack(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """``torch.stack(tensors)``, through :class:`_Stack` unless captured."""
    return torch.stack(tensors) if is_capturing() else _Stack.apply(*tensors)


def unit_terms(units: Sequence[Optional[MoPPAUnit]], grid: Tuple[int, int], extra: int,
               like: torch.Tensor) -> List[Optional[Tuple[torch.Tensor, torch.Tensor]]]:
    """The filter and field (``terms`` of :meth:`MoPPAUnit.forward`) of each unit
    (None: None or off) for tokens like ``like`` (B, extra + H*W, C) on ``grid``:
    cached, else in ONE set of operations for the units alike."""
    device, dtype = like.device, matmul_dtype(like)
    rows = extra if dct_method(*grid, device) == 'kron' else 0  # as forward pads
    terms: List[Optional[Tuple[torch.Tensor, torch.Tensor]]] = [None] * len(units)
    alike: Dict[tuple, List[int]] = {}
    for index, unit in enumerate(units):
        if unit is None or not getattr(unit, 'enabled', True):
            continue
        terms[index] = unit._cached_terms(grid, rows, device, dtype)
        if terms[index] is not None:
            continue
        if unit.merged:  # its buffers, while a graph is captured
            terms[index] = unit._spectral_terms(grid, rows, device, dtype)
            continue
        params = unit.named_parameters(recurse=False)
        key = (type(unit), unit.extra_repr()) + tuple(
            (name, p.shape, p.dtype, p.device, p.requires_grad) for name, p in params)
        alike.setdefault(key, []).append(index)
    for indices in alike.values():
        group = [units[index] for index in indices]
        params = None if len(group) == 1 else {  # (L, ...) each: one stack per parameter
            name: _stack([getattr(unit, name) for unit in group])
            for name, _ in group[0].named_parameters(recurse=False)}
        built = group[0]._spectral_terms(grid, rows, device, dtype, params)
        for index, spectral_filter, field in zip(indices, *(term.split(1) for term in built)):
            terms[index] = (spectral_filter, field)  # (1, rows + H*W, C) each
    return terms


_SHARED: ContextVar[Optional[dict]] = ContextVar('moppa_shared_unit_terms', default=None)


@contextlib.contextmanager
def sharing_unit_terms(groups: Sequence[Sequence[MoPPAUnit]], like: torch.Tensor):
    """Within the block, :func:`shared_unit_terms` hands each unit of ``groups``
    the terms :func:`unit_terms` builds for its group, once per grid, for inputs
    like ``like``: for a backbone whose base class's forward runs its units from
    modules it cannot pass them to."""
    token = _SHARED.set(dict(groups={id(unit): group for group in groups for unit in group},
                             like=like, grad=torch.is_grad_enabled(), built={}))
    try:
        yield
    finally:
        _SHARED.reset(token)


def shared_unit_terms(unit: MoPPAUnit, grid: Tuple[int, int], like: torch.Tensor
                      ) -> Optional[Tuple[torch.Tensor, torch.Tensor]]:
    """``unit``'s terms from the enclosing :func:`sharing_unit_terms`, built in
    the grad mode it began in (a checkpointed block may ask first, without
    grad); None outside one (a checkpoint's recompute, a graph capture) or for
    another device or dtype: the unit builds its own."""
    shared = None if is_capturing() else _SHARED.get()
    group = shared and shared['groups'].get(id(unit))
    if not group or (like.device, matmul_dtype(like)) != (
            shared['like'].device, matmul_dtype(shared['like'])):
        return None
    key = (id(group), tuple(grid))
    if key not in shared['built']:
        with torch.set_grad_enabled(shared['grad']):
            terms = unit_terms(group, tuple(grid), 0, shared['like'])
        shared['built'][key] = {id(member): term for member, term in zip(group, terms)}
    return shared['built'][key][id(unit)]


def route_loss_weight(base_weight: float, progress: float, total: float) -> float:
    """The schedule of paper Eq. 13: ``w * max(1 - 2T / T_total, 0)``, T the
    epoch (or iteration) ``progress``, T_total their ``total``."""
    if total <= 0:
        raise ValueError(f'total must be > 0, got {total}')
    return base_weight * max(1.0 - 2.0 * progress / total, 0.0)


def moppa_units(module: nn.Module):
    return [m for m in module.modules() if isinstance(m, MoPPAUnit)]


def route_regularization(module: nn.Module) -> torch.Tensor:
    """``L_reg = sum_i a_i log a_i`` (paper Eq. 12: the router's negative
    entropy) averaged over the MoPPA units inside ``module`` (a unit too); the
    routers of as many experts stacked: one softmax serves them all."""
    units = moppa_units(module)
    if not units:
        raise ValueError(f'{type(module).__name__} holds no MoPPAUnit')
    routers: Dict[torch.Size, List[torch.Tensor]] = {}
    for unit in units:
        routers.setdefault(unit.route_logits.shape, []).append(unit.route_logits)
    total = sum((logits.softmax(-1) * logits.log_softmax(-1)).sum()
                for logits in (_stack(group) for group in routers.values()))
    return total / len(units)

"""Orthonormal 2-D DCT-II over the token grid of channel-last tensors.

``DCT2(X) = C_H @ X @ C_W^T`` (``C_N`` the orthonormal DCT-II matrix; the
inverse is its transpose). On tokens (B, H*W, C), a grid flattened row-major,
it runs as ``bmm`` with a basis expanded to the batch: ``'kron'``, ONE matmul
with ``C_H (x) C_W`` (HW, HW), or ``'separable'``, along H then along W
(:func:`dct_method`; docs/performance.md).
"""
import math
from typing import Dict, Tuple, Union

import torch
import torch.nn.functional as F

from .tracing import is_capturing

# The largest grid (H * W tokens) for which 'auto' takes the Kronecker basis.
KRON_MAX_TOKENS = {'cpu': 64, 'cuda': 196}

_BASES: Dict[tuple, torch.Tensor] = {}
_KRON: Dict[tuple, torch.Tensor] = {}
_FREQS: Dict[tuple, Tuple[torch.Tensor, torch.Tensor]] = {}
_EXPANDED: Dict[tuple, torch.Tensor] = {}  # bases expanded to a batch (views)
EXPANDED_MAX = 64  # batch sizes kept (window counts vary with the image size)


def _cached(cache: dict, key: tuple, build):
    """``cache[key]``, made by ``build()`` the first time; not kept while a graph
    is captured: what a capture makes (fake tensors, a tracer's values) must not
    outlive it."""
    value = cache.get(key)
    if value is None:
        value = build()
        if not is_capturing():
            cache[key] = value
    return value


def dct_basis(n: int, device=None, dtype=torch.float32, inverse: bool = False) -> torch.Tensor:
    """The orthonormal DCT-II matrix ``C`` of size (n, n): ``C[k, i]`` =
    ``s_k cos(pi (2i + 1) k / (2n))``, ``s_0 = sqrt(1/n)``, ``s_k = sqrt(2/n)``;
    its transpose (contiguous) if ``inverse``."""
    if n < 1:
        raise ValueError(f'DCT size must be >= 1, got {n}')
    device = torch.device(device or 'cpu')

    def build():  # out of place, in operations every exporter knows
        k = torch.arange(n, dtype=torch.float64).unsqueeze(1)  # (n, 1)
        i = torch.arange(n, dtype=torch.float64).unsqueeze(0)  # (1, n)
        scale = torch.where(k == 0, math.sqrt(1.0 / n),
                            torch.full_like(k, math.sqrt(2.0 / n)))  # (n, 1)
        basis = torch.cos(math.pi * (2 * i + 1) * k / (2 * n)) * scale
        basis = basis.t().contiguous() if inverse else basis
        return basis.to(device=device, dtype=dtype)

    return _cached(_BASES, (n, inverse, device, dtype), build)


def kron_basis(h: int, w: int, inverse: bool = False, device=None,
               dtype=torch.float32, extra: int = 0) -> torch.Tensor:
    """The 2-D DCT-II of an (H, W) grid as one (HW, HW) matrix, ``C_H (x) C_W``
    (its transpose if ``inverse``); with ``extra`` leading tokens, (extra + HW,
    extra + HW): an identity block for them, then the grid's."""
    device = torch.device(device or 'cpu')

    def build():  # torch.kron, written out (the TorchScript exporter lacks aten::kron)
        basis_h = dct_basis(h, device, torch.float64)
        basis_w = dct_basis(w, device, torch.float64)
        grid = (basis_h[:, None, :, None] * basis_w[None, :, None, :]).reshape(
            h * w, h * w)  # (H, W, H, W) -> (HW, HW)
        grid = grid.t() if inverse else grid
        if extra:  # block_diag(eye(extra), grid), written out for the exporters
            grid = F.pad(grid, (extra, 0, extra, 0)) + F.pad(
                torch.eye(extra, dtype=torch.float64, device=device), (0, h * w, 0, h * w))
        return grid.contiguous().to(dtype)

    return _cached(_KRON, (h, w, inverse, extra, device, dtype), build)


def dct_method(h: int, w: int, device: Union[str, torch.device], method: str = 'auto') -> str:
    """'kron' or 'separable' for an (H, W) grid on ``device`` (a device or its
    type; no tensor is needed): ``method`` itself unless 'auto'."""
    if method == 'auto':
        limit = KRON_MAX_TOKENS.get(torch.device(device).type, KRON_MAX_TOKENS['cpu'])
        return 'kron' if h * w <= limit else 'separable'
    if method not in ('kron', 'separable'):
        raise ValueError(f"unknown DCT method {method!r}, expected 'auto', "
                         "'kron' or 'separable'")
    return method


def matmul_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype a matmul of ``x`` runs in: autocast's where it is on (and
    ``x`` is not float64, which autocast leaves), else ``x``'s."""
    device = x.device.type
    autocast = torch.is_autocast_enabled(device) and x.dtype != torch.float64
    return torch.get_autocast_dtype(device) if autocast else x.dtype


def _expanded(basis: torch.Tensor, batch: int, key: tuple) -> torch.Tensor:
    """``basis`` expanded to (batch, n, n): a view, cached under the basis'
    ``key`` and the batch size."""
    if is_capturing():  # the batch may be symbolic: no lookup that would fix it
        return basis.expand(batch, -1, -1)
    if len(_EXPANDED) > EXPANDED_MAX:
        _EXPANDED.clear()
    return _cached(_EXPANDED, key + (batch, ), lambda: basis.expand(batch, -1, -1))


def expanded_kron_basis(h: int, w: int, inverse: bool, device, dtype, extra: int,
                        batch: int) -> torch.Tensor:
    """:func:`kron_basis` expanded to (batch, T, T): the operand of one ``bmm``."""
    return _expanded(kron_basis(h, w, inverse, device, dtype, extra), batch,
                     ('kron', h, w, inverse, extra, torch.device(device), dtype))


def dct_tokens(x: torch.Tensor, grid: Tuple[int, int], method: str = 'auto',
               inverse: bool = False, extra: int = 0) -> torch.Tensor:
    """Orthonormal DCT-II (DCT-III if ``inverse``) of ``x`` (B, extra + H*W, C)
    over the (H, W) ``grid``, the ``extra`` leading tokens unchanged (Kronecker
    only); the bases in the matmuls' dtype. The separable form meets the
    caller's tensor with the H pass, whose ``(B, H, W*C)`` view exists for any
    batch stride (a ViT's patch tokens after its class token): no copy."""
    h, w = grid
    batch, tokens, channels = x.shape
    if tokens != extra + h * w:
        raise ValueError(f'expected (B, {extra} + {h}*{w}, C) tokens, got {tuple(x.shape)}')
    device, dtype = x.device, matmul_dtype(x)
    if dct_method(h, w, device, method) == 'kron':
        return torch.bmm(expanded_kron_basis(h, w, inverse, device, dtype, extra, batch), x)
    if extra:
        raise ValueError('the separable DCT takes the grid tokens alone (extra=0)')
    basis_h = dct_basis(h, device, dtype, inverse)
    basis_w = dct_basis(w, device, dtype, inverse)

    def along_h(t):  # (B, H, W*C): mixes rows
        return torch.bmm(_expanded(basis_h, batch, (h, inverse, device, dtype)),
                         t.reshape(batch, h, w * channels))

    def along_w(t):  # (B*H, W, C): mixes columns
        return torch.bmm(_expanded(basis_w, batch * h, (w, inverse, device, dtype)),
                         t.reshape(batch * h, w, channels))

    out = along_h(along_w(x)) if inverse else along_w(along_h(x))
    return out.view(batch, tokens, channels)


def dct2d(x: torch.Tensor, method: str = 'auto', inverse: bool = False) -> torch.Tensor:
    """Orthonormal DCT-II (DCT-III if ``inverse``) over (H, W) of ``x`` shaped
    (..., H, W, C); ``method``: 'kron', 'separable' or 'auto' (:func:`dct_method`)."""
    if x.dim() < 3:
        raise ValueError('expected a channel-last tensor (..., H, W, C), '
                         f'got shape {tuple(x.shape)}')
    h, w, c = x.shape[-3:]
    tokens = x.reshape(-1, h * w, c)  # (B, HW, C)
    return dct_tokens(tokens, (h, w), method, inverse).view(x.shape)


def idct2d(x: torch.Tensor, method: str = 'auto') -> torch.Tensor:  # dct2d's inverse
    return dct2d(x, method, inverse=True)


def dct_frequencies(h: int, w: int, device=None, dtype=torch.float32
                    ) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(w^2, |w|)``, each (H, W), of the DCT coefficients: ``w_n = pi n / H``,
    ``w_m = pi m / W``."""
    device = torch.device(device or 'cpu')

    def build():
        omega_h = math.pi * torch.arange(h, dtype=torch.float64) / h  # (H,)
        omega_w = math.pi * torch.arange(w, dtype=torch.float64) / w  # (W,)
        omega_sq = omega_h[:, None]**2 + omega_w[None, :]**2  # (H, W)
        return (omega_sq.to(device=device, dtype=dtype),
                omega_sq.sqrt().to(device=device, dtype=dtype))

    return _cached(_FREQS, (h, w, device, dtype), build)

"""Orthonormal 2-D DCT-II over the (H, W) axes of channel-last tensors.

The transform is separable: ``DCT2(X) = C_H @ X @ C_W^T`` with ``C_N`` the
orthonormal DCT-II matrix, so the inverse is the transpose. On ``(..., H, W, C)``
tensors it runs without any permute, in one of two ways:

- small grids (``H * W <= KRON_MAX_TOKENS``, e.g. Swin's 7x7 windows): ONE
  batched matmul with the Kronecker basis ``C_H (x) C_W`` of size (HW, HW) on
  ``(..., HW, C)``. It does ``HW / (H + W)`` times the multiply-adds of the
  separable form but reads and writes the tensor once instead of twice; on
  our CPU it is 1.2-1.7x faster at 7x7 and 8x8 and slower from 10x10 on
  (benchmarks/run.py records the sweep);
- larger grids: two batched matmuls, along H then along W.

Bases and frequency grids are cached per (size, device, dtype), except
what a graph capture builds (:func:`_cached`).
"""
import math
from typing import Dict, Tuple

import torch

from .tracing import is_capturing

KRON_MAX_TOKENS = 64  # measured crossover on CPU: 8x8 kron wins, 10x10 loses

_BASES: Dict[Tuple[int, torch.device, torch.dtype], torch.Tensor] = {}
_KRON: Dict[Tuple[int, int, bool, torch.device, torch.dtype], torch.Tensor] = {}
_FREQS: Dict[Tuple[int, int, torch.device, torch.dtype],
             Tuple[torch.Tensor, torch.Tensor]] = {}


def _cached(cache: dict, key: tuple, build) -> torch.Tensor:
    """``cache[key]``, made by ``build()`` the first time. While a graph is
    captured (:func:`~.tracing.is_capturing`) a missing entry is built into
    the graph and not kept: what a capture makes (the fake tensors of
    ``torch.export``, a tracer's values) must not outlive it."""
    value = cache.get(key)
    if value is None:
        value = build()
        if not is_capturing():
            cache[key] = value
    return value


def dct_basis(n: int, device=None, dtype=torch.float32) -> torch.Tensor:
    """The orthonormal DCT-II matrix ``C`` of size (n, n): ``C[k, i]`` =
    ``s_k cos(pi (2i + 1) k / (2n))``, ``s_0 = sqrt(1/n)``, ``s_k = sqrt(2/n)``."""
    if n < 1:
        raise ValueError(f'DCT size must be >= 1, got {n}')
    device = torch.device(device) if device is not None else torch.device('cpu')

    def build():  # out of place, in operations every exporter knows
        k = torch.arange(n, dtype=torch.float64).unsqueeze(1)  # (n, 1)
        i = torch.arange(n, dtype=torch.float64).unsqueeze(0)  # (1, n)
        scale = torch.where(k == 0, math.sqrt(1.0 / n),
                            torch.full_like(k, math.sqrt(2.0 / n)))  # (n, 1)
        basis = torch.cos(math.pi * (2 * i + 1) * k / (2 * n)) * scale
        return basis.to(device=device, dtype=dtype)

    return _cached(_BASES, (n, device, dtype), build)


def kron_basis(h: int, w: int, inverse: bool = False, device=None,
               dtype=torch.float32) -> torch.Tensor:
    """The 2-D DCT-II of an (H, W) grid as one (HW, HW) matrix acting on the
    row-major flattened grid: ``C_H (x) C_W`` (its transpose if ``inverse``)."""
    device = torch.device(device) if device is not None else torch.device('cpu')

    def build():  # torch.kron, written out (the TorchScript exporter lacks aten::kron)
        basis_h = dct_basis(h, device, torch.float64)
        basis_w = dct_basis(w, device, torch.float64)
        basis = (basis_h[:, None, :, None] * basis_w[None, :, None, :]).reshape(
            h * w, h * w)  # (H, W, H, W) -> (HW, HW)
        return (basis.t() if inverse else basis).contiguous().to(dtype)

    return _cached(_KRON, (h, w, inverse, device, dtype), build)


def _check_channel_last(x: torch.Tensor) -> None:
    if x.dim() < 3:
        raise ValueError('expected a channel-last tensor (..., H, W, C), '
                         f'got shape {tuple(x.shape)}')


def _transform(x: torch.Tensor, basis_h: torch.Tensor, basis_w: torch.Tensor,
               h_first: bool) -> torch.Tensor:
    """Apply ``basis_h`` along H and ``basis_w`` along W of ``(..., H, W, C)``.

    The two passes commute. The forward transform runs H first and the inverse
    H last, so that the pass that meets the caller's tensor (input or output's
    gradient) is always the H pass: its ``(B, H, W*C)`` view exists for any
    batch stride, e.g. the patch tokens of a ViT sequence without its class
    token, where the W pass's ``(B*H, W, C)`` view would need a copy.
    """
    *lead, h, w, c = x.shape

    def along_h(t):  # (B, H, W*C): mixes rows
        return torch.matmul(basis_h, t.reshape(-1, h, w * c))

    def along_w(t):  # (B*H, W, C): mixes columns
        return torch.matmul(basis_w, t.reshape(-1, w, c))

    x = along_w(along_h(x)) if h_first else along_h(along_w(x))
    return x.reshape(*lead, h, w, c)


def _kron_transform(x: torch.Tensor, basis: torch.Tensor) -> torch.Tensor:
    """Apply an (HW, HW) basis to the flattened grid of ``(..., H, W, C)``."""
    *lead, h, w, c = x.shape
    out = torch.matmul(basis, x.reshape(-1, h * w, c))  # (B, HW, C)
    return out.reshape(*lead, h, w, c)


def dct2d(x: torch.Tensor, method: str = 'auto') -> torch.Tensor:
    """Orthonormal DCT-II over (H, W) of ``x`` shaped (..., H, W, C).

    ``method``: 'kron' (one matmul with the Kronecker basis), 'separable'
    (two matmuls) or 'auto' (kron when ``H * W <= KRON_MAX_TOKENS``).
    """
    return _dct(x, method, inverse=False)


def idct2d(x: torch.Tensor, method: str = 'auto') -> torch.Tensor:
    """Inverse of :func:`dct2d` (orthonormal DCT-III) over (H, W)."""
    return _dct(x, method, inverse=True)


def _dct(x: torch.Tensor, method: str, inverse: bool) -> torch.Tensor:
    _check_channel_last(x)
    h, w = x.shape[-3], x.shape[-2]
    if _resolve_method(h, w, method) == 'kron':
        return _kron_transform(x, kron_basis(h, w, inverse, x.device, x.dtype))
    basis_h = dct_basis(h, x.device, x.dtype)
    basis_w = dct_basis(w, x.device, x.dtype)
    if inverse:
        basis_h, basis_w = basis_h.t(), basis_w.t()
    return _transform(x, basis_h, basis_w, h_first=not inverse)


def _resolve_method(h: int, w: int, method: str) -> str:
    """'kron' or 'separable' for an (H, W) grid."""
    if method == 'auto':
        return 'kron' if h * w <= KRON_MAX_TOKENS else 'separable'
    if method not in ('kron', 'separable'):
        raise ValueError(f"unknown DCT method {method!r}, expected 'auto', "
                         "'kron' or 'separable'")
    return method


def dct_frequencies(h: int, w: int, device=None, dtype=torch.float32
                    ) -> Tuple[torch.Tensor, torch.Tensor]:
    """Squared and absolute angular frequency of each DCT coefficient.

    ``w_n = pi n / H``, ``w_m = pi m / W``; returns ``(w^2, |w|)``, each (H, W).
    """
    device = torch.device(device) if device is not None else torch.device('cpu')

    def build():
        omega_h = math.pi * torch.arange(h, dtype=torch.float64) / h  # (H,)
        omega_w = math.pi * torch.arange(w, dtype=torch.float64) / w  # (W,)
        omega_sq = omega_h[:, None]**2 + omega_w[None, :]**2  # (H, W)
        return (omega_sq.to(device=device, dtype=dtype),
                omega_sq.sqrt().to(device=device, dtype=dtype))

    return _cached(_FREQS, (h, w, device, dtype), build)

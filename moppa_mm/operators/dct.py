"""Orthonormal 2-D DCT-II over the (H, W) axes of channel-last tensors.

The transform is separable: ``DCT2(X) = C_H @ X @ C_W^T`` with ``C_N`` the
orthonormal DCT-II matrix, so the inverse is the transpose. Both are done as two
batched matmuls on ``(..., H, W, C)`` tensors without any permute. Bases and
frequency grids are cached per (size, device, dtype).
"""
import math
from typing import Dict, Tuple

import torch

_BASES: Dict[Tuple[int, torch.device, torch.dtype], torch.Tensor] = {}
_FREQS: Dict[Tuple[int, int, torch.device, torch.dtype],
             Tuple[torch.Tensor, torch.Tensor]] = {}


def dct_basis(n: int, device=None, dtype=torch.float32) -> torch.Tensor:
    """The orthonormal DCT-II matrix ``C`` of size (n, n): ``C[k, i]`` =
    ``s_k cos(pi (2i + 1) k / (2n))``, ``s_0 = sqrt(1/n)``, ``s_k = sqrt(2/n)``."""
    if n < 1:
        raise ValueError(f'DCT size must be >= 1, got {n}')
    device = torch.device(device) if device is not None else torch.device('cpu')
    key = (n, device, dtype)
    basis = _BASES.get(key)
    if basis is None:
        k = torch.arange(n, dtype=torch.float64).unsqueeze(1)  # (n, 1)
        i = torch.arange(n, dtype=torch.float64).unsqueeze(0)  # (1, n)
        basis = torch.cos(math.pi * (2 * i + 1) * k / (2 * n))
        basis[0] *= math.sqrt(1.0 / n)
        basis[1:] *= math.sqrt(2.0 / n)
        basis = basis.to(device=device, dtype=dtype)
        _BASES[key] = basis
    return basis


def _check_channel_last(x: torch.Tensor) -> None:
    if x.dim() < 3:
        raise ValueError('expected a channel-last tensor (..., H, W, C), '
                         f'got shape {tuple(x.shape)}')


def _transform(x: torch.Tensor, basis_h: torch.Tensor,
               basis_w: torch.Tensor) -> torch.Tensor:
    """Apply ``basis_h`` along H and ``basis_w`` along W of ``(..., H, W, C)``."""
    *lead, h, w, c = x.shape
    x = x.reshape(-1, h, w * c)  # (B, H, W*C)
    x = torch.matmul(basis_h, x)  # (B, H, W*C): mixes rows
    x = x.reshape(-1, w, c)  # (B*H, W, C)
    x = torch.matmul(basis_w, x)  # (B*H, W, C): mixes columns
    return x.reshape(*lead, h, w, c)


def dct2d(x: torch.Tensor) -> torch.Tensor:
    """Orthonormal DCT-II over (H, W) of ``x`` shaped (..., H, W, C)."""
    _check_channel_last(x)
    h, w = x.shape[-3], x.shape[-2]
    return _transform(x, dct_basis(h, x.device, x.dtype),
                      dct_basis(w, x.device, x.dtype))


def idct2d(x: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`dct2d` (orthonormal DCT-III) over (H, W)."""
    _check_channel_last(x)
    h, w = x.shape[-3], x.shape[-2]
    return _transform(x, dct_basis(h, x.device, x.dtype).t(),
                      dct_basis(w, x.device, x.dtype).t())


def dct_frequencies(h: int, w: int, device=None, dtype=torch.float32
                    ) -> Tuple[torch.Tensor, torch.Tensor]:
    """Squared and absolute angular frequency of each DCT coefficient.

    ``w_n = pi n / H``, ``w_m = pi m / W``; returns ``(w^2, |w|)``, each (H, W).
    """
    device = torch.device(device) if device is not None else torch.device('cpu')
    key = (h, w, device, dtype)
    freqs = _FREQS.get(key)
    if freqs is None:
        omega_h = math.pi * torch.arange(h, dtype=torch.float64) / h  # (H,)
        omega_w = math.pi * torch.arange(w, dtype=torch.float64) / w  # (W,)
        omega_sq = omega_h[:, None]**2 + omega_w[None, :]**2  # (H, W)
        freqs = (omega_sq.to(device=device, dtype=dtype),
                 omega_sq.sqrt().to(device=device, dtype=dtype))
        _FREQS[key] = freqs
    return freqs

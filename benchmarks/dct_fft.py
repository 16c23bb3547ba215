"""Orthonormal DCT-II / DCT-III through the FFT (Makhoul 1980), along any dim.

O(N log N) per line instead of the O(N^2) of a basis matmul; the benchmark
(``benchmarks/run.py``) measures where, if anywhere, this pays on a device. Not
part of the operator: on CPU it is slower than both matmul forms at every grid
measured (docs/benchmarks.md), so ``moppa_mm.operators.dct2d`` does not offer it.
"""
import math

import torch


def _twiddle(n: int, dim: int, ndim: int, device, dtype, sign: float) -> torch.Tensor:
    k = torch.arange(n, device=device, dtype=dtype)
    twiddle = torch.polar(torch.ones_like(k), sign * math.pi * k / (2 * n))
    shape = [1] * ndim
    shape[dim] = n
    return twiddle.view(shape)


def _scale(n: int, dim: int, ndim: int, device, dtype) -> torch.Tensor:
    scale = torch.full((n, ), math.sqrt(1 / (2 * n)), device=device, dtype=dtype)
    scale[0] = math.sqrt(1 / (4 * n))
    shape = [1] * ndim
    shape[dim] = n
    return scale.view(shape)


def dct_fft(x: torch.Tensor, dim: int) -> torch.Tensor:
    """Orthonormal DCT-II of ``x`` along ``dim``."""
    dim = dim % x.dim()
    n = x.shape[dim]
    even = x.index_select(dim, torch.arange(0, n, 2, device=x.device))
    odd = x.index_select(dim, torch.arange(1, n, 2, device=x.device)).flip(dim)
    spectrum = torch.fft.fft(torch.cat([even, odd], dim=dim), dim=dim)
    twiddle = _twiddle(n, dim, x.dim(), x.device, x.dtype, -1.0)
    return 2 * (spectrum * twiddle).real * _scale(n, dim, x.dim(), x.device, x.dtype)


def idct_fft(x: torch.Tensor, dim: int) -> torch.Tensor:
    """Inverse of :func:`dct_fft` (orthonormal DCT-III) along ``dim``."""
    dim = dim % x.dim()
    n = x.shape[dim]
    coeffs = x / _scale(n, dim, x.dim(), x.device, x.dtype)  # unnormalised DCT-II
    # X_{N-k} for k = 1..N-1, and 0 for k = 0
    reversed_ = torch.cat([torch.zeros_like(coeffs.narrow(dim, 0, 1)),
                           coeffs.narrow(dim, 1, n - 1).flip(dim)], dim=dim)
    spectrum = torch.complex(coeffs, -reversed_) * _twiddle(
        n, dim, x.dim(), x.device, x.dtype, 1.0) / 2
    v = torch.fft.ifft(spectrum, dim=dim).real
    out = torch.empty_like(v)
    half = (n + 1) // 2
    index = torch.arange(n, device=x.device)
    out.index_copy_(dim, index[0::2], v.narrow(dim, 0, half))
    out.index_copy_(dim, index[1::2], v.narrow(dim, half, n - half).flip(dim))
    return out


def dct2d_fft(x: torch.Tensor) -> torch.Tensor:
    """Orthonormal 2-D DCT-II over (H, W) of ``(..., H, W, C)``."""
    return dct_fft(dct_fft(x, -3), -2)


def idct2d_fft(x: torch.Tensor) -> torch.Tensor:
    return idct_fft(idct_fft(x, -3), -2)

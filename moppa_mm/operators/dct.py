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

:func:`idct2d_after_prefix` writes the inverse transform straight into a token
sequence behind some extra tokens (a ViT's class token): the concatenation a
caller would do afterwards costs a full pass over the sequence, the last matmul
writing into its place costs nothing.
"""
import math
from typing import Dict, Tuple

import torch
from torch.autograd.function import once_differentiable

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


def _first_pass(h: int, w: int, method: str, device, dtype):
    """The forward DCT of an (H, W) grid as its first pass and the rest:
    ``(basis, rest)``, the first pass being ``basis @ t`` batched over B on
    the grid's (B, basis columns, N) view and ``rest`` the remaining passes,
    applied to the first's result viewed (B, H, W, C)."""
    if _resolve_method(h, w, method) == 'kron':  # (HW, HW) on (B, HW, C): all of it
        return kron_basis(h, w, False, device, dtype), lambda t: t
    basis_w = dct_basis(w, device, dtype)

    def along_w(t):  # (B*H, W, C): mixes columns
        return torch.matmul(basis_w, t.reshape(-1, w, t.shape[-1])).view(t.shape)

    return dct_basis(h, device, dtype), along_w  # H first, on (B, H, W*C)


def _inverse_last_pass(spectrum: torch.Tensor, method: str):
    """The inverse DCT of (B, H, W, C) as the passes before its last (applied
    here) and the last: ``(t, basis)``, the inverse being ``basis @ t`` batched
    over B, with ``t`` (B, K, N) and the result (B, M, N) the row-major
    (B, H*W*C) of the inverse."""
    b, h, w, c = spectrum.shape
    if _resolve_method(h, w, method) == 'kron':  # (HW, HW) on (B, HW, C)
        basis = kron_basis(h, w, True, spectrum.device, spectrum.dtype)
        return spectrum.reshape(b, h * w, c), basis
    # the inverse runs W first, H last; the H pass's view is (B, H, W*C)
    basis_w = dct_basis(w, spectrum.device, spectrum.dtype).t()
    t = torch.matmul(basis_w, spectrum.reshape(-1, w, c))  # (B*H, W, C)
    return t.view(b, h, w * c), dct_basis(h, spectrum.device, spectrum.dtype).t()


class _MatmulOfSuffix(torch.autograd.Function):
    """``(tokens[:, :E], basis @ tokens[:, E:])`` for a (B, E + rows * cols / C,
    C) sequence, the suffix read as (B, rows, cols) in place. Its backward
    writes the suffix's gradient (the transposed basis applied to the output's)
    behind the prefix's in one tensor: no concatenation pass, which the
    backward of a split would make."""

    @staticmethod
    def forward(ctx, tokens, basis, num_prefix):
        batch, length, _ = tokens.shape
        prefix, suffix = tokens.split([num_prefix, length - num_prefix], dim=1)
        ctx.save_for_backward(basis)
        ctx.shape = tokens.shape
        return prefix.clone(), torch.matmul(basis, suffix.reshape(batch, basis.shape[1], -1))

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_prefix, grad_out):  # (undefined gradients come as zeros)
        basis, = ctx.saved_tensors
        if not ctx.needs_input_grad[0]:
            return None, None, None
        batch, num_prefix = grad_out.shape[0], grad_prefix.shape[1]
        grad = grad_out.new_empty(ctx.shape)
        grad[:, :num_prefix] = grad_prefix
        torch.bmm(basis.t().expand(batch, -1, -1), grad_out,
                  out=grad[:, num_prefix:].view(batch, basis.shape[1], -1))
        return grad, None, None


class _MatmulAfterPrefix(torch.autograd.Function):
    """``cat([prefix, (basis @ t).reshape(B, -1, C)], dim=1)`` with the batched
    matmul writing into the concatenation's memory: no pass to copy it there.
    Its backward hands the prefix its slice of the gradient and ``t`` the
    transposed basis applied to the rest, read in place."""

    @staticmethod
    def forward(ctx, prefix, t, basis):
        batch, num_prefix, channels = prefix.shape
        rows, cols = basis.shape[0], t.shape[-1]
        out = prefix.new_empty(batch, num_prefix + rows * cols // channels, channels)
        out[:, :num_prefix] = prefix
        torch.bmm(basis.expand(batch, -1, -1), t,
                  out=out[:, num_prefix:].view(batch, rows, cols))
        ctx.save_for_backward(basis)
        ctx.shape = (num_prefix, rows, cols)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        basis, = ctx.saved_tensors
        num_prefix, rows, cols = ctx.shape
        grad_prefix = grad[:, :num_prefix] if ctx.needs_input_grad[0] else None
        grad_t = None
        if ctx.needs_input_grad[1]:  # (B, rows, cols) is a view for any batch stride
            grad_t = torch.matmul(basis.t(), grad[:, num_prefix:].reshape(
                grad.shape[0], rows, cols))
        return grad_prefix, grad_t, None


def _check_tokens(tokens: torch.Tensor, num_prefix: int, grid) -> None:
    if tokens.dim() != 3 or not 0 <= num_prefix <= tokens.shape[1] or \
            tokens.shape[1] - num_prefix != grid[0] * grid[1]:
        raise ValueError(f'expected (B, {num_prefix} + {grid[0]}*{grid[1]}, C) tokens, '
                         f'got {tuple(tokens.shape)}')


def _fused_ok(*tensors: torch.Tensor) -> bool:
    """Whether the fused sequence functions apply: the matmuls run in the
    tensors' own dtype (no autocast, one dtype), and the forward is run, not
    captured into a graph (:func:`~.tracing.is_capturing`: a compiler or an
    exporter gets the plain split and concatenation, which it fuses itself)."""
    return len({t.dtype for t in tensors}) == 1 and \
        not torch.is_autocast_enabled(tensors[0].device.type) and not is_capturing()


def dct2d_of_suffix(tokens: torch.Tensor, num_prefix: int, grid: Tuple[int, int],
                    method: str = 'auto') -> Tuple[torch.Tensor, torch.Tensor]:
    """Split a token sequence (B, E + H*W, C) into its ``E`` prefix tokens
    (a ViT's class token) and the DCT of the rest as an (H, W) grid:
    ``(prefix (B, E, C), dct2d(grid tokens) (B, H, W, C))``.

    The DCT reads the grid in place, and the backward writes the sequence's
    gradient as one tensor, where a split's backward would concatenate.
    Under autocast, and while a graph is captured, it is the plain split and
    :func:`dct2d`.
    """
    _check_tokens(tokens, num_prefix, grid)
    batch, _, channels = tokens.shape
    h, w = grid
    if not _fused_ok(tokens) or not torch.is_grad_enabled():
        prefix, suffix = tokens.split([num_prefix, h * w], dim=1)
        return prefix, dct2d(suffix.reshape(batch, h, w, channels), method)
    basis, rest = _first_pass(h, w, method, tokens.device, tokens.dtype)
    prefix, first = _MatmulOfSuffix.apply(tokens, basis, num_prefix)
    return prefix, rest(first.view(batch, h, w, channels))


def idct2d_after_prefix(spectrum: torch.Tensor, prefix: torch.Tensor,
                        method: str = 'auto') -> torch.Tensor:
    """``cat([prefix, idct2d(spectrum).reshape(B, H*W, C)], dim=1)``: the
    inverse DCT of a (B, H, W, C) grid written behind ``prefix`` (B, E, C)
    tokens, the last matmul writing into the sequence in place of a copy.

    Where the two dtypes differ or autocast is on, and while a graph is
    captured, it is the plain concatenation (which promotes to the wider dtype).
    """
    _check_channel_last(spectrum)
    if spectrum.dim() != 4 or prefix.dim() != 3 or \
            prefix.shape[0] != spectrum.shape[0] or prefix.shape[2] != spectrum.shape[3]:
        raise ValueError(f'expected a (B, H, W, C) grid and (B, E, C) prefix tokens, '
                         f'got {tuple(spectrum.shape)} and {tuple(prefix.shape)}')
    if not _fused_ok(spectrum, prefix):
        out = idct2d(spectrum, method)
        return torch.cat([prefix, out.reshape(out.shape[0], -1, out.shape[-1])], dim=1)
    t, basis = _inverse_last_pass(spectrum, method)
    return _MatmulAfterPrefix.apply(prefix, t, basis)


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

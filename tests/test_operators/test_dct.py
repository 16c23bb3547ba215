import numpy as np
import pytest
import scipy.fft
import torch

from moppa_mm.operators import dct2d, dct_basis, dct_frequencies, idct2d


@pytest.mark.parametrize('method', ['auto', 'kron', 'separable'])
@pytest.mark.parametrize('shape', [(2, 1, 9, 3), (1, 7, 7, 4), (3, 14, 14, 2),
                                   (1, 50, 68, 3), (2, 5, 1, 2), (2, 3, 7, 5, 2)])
def test_dct_matches_scipy(shape, method):
    rng = np.random.default_rng(0)
    x = rng.standard_normal(shape)
    axes = (-3, -2)
    ours = dct2d(torch.from_numpy(x), method).numpy()
    ref = scipy.fft.dctn(x, type=2, axes=axes, norm='ortho')
    np.testing.assert_allclose(ours, ref, atol=1e-10, rtol=0)
    ours_inv = idct2d(torch.from_numpy(x), method).numpy()
    ref_inv = scipy.fft.idctn(x, type=2, axes=axes, norm='ortho')
    np.testing.assert_allclose(ours_inv, ref_inv, atol=1e-10, rtol=0)


def test_round_trip_is_identity_with_leading_dims():
    x = torch.randn(2, 3, 11, 6, 5, dtype=torch.float64)  # (B, nW, H, W, C)
    torch.testing.assert_close(idct2d(dct2d(x)), x, atol=1e-12, rtol=0)


def test_basis_is_cached_and_orthonormal():
    a = dct_basis(13, 'cpu', torch.float64)
    assert dct_basis(13, 'cpu', torch.float64) is a
    torch.testing.assert_close(a @ a.t(), torch.eye(13, dtype=torch.float64))
    assert dct_basis(13, 'cpu', torch.float32).dtype == torch.float32


def test_frequencies():
    omega_sq, omega_abs = dct_frequencies(4, 6, dtype=torch.float64)
    assert omega_sq.shape == (4, 6)
    assert omega_sq[0, 0] == 0
    assert torch.isclose(omega_sq[3, 5], torch.tensor((np.pi * 3 / 4)**2 +
                                                      (np.pi * 5 / 6)**2,
                                                      dtype=torch.float64))
    torch.testing.assert_close(omega_abs**2, omega_sq)


def test_autograd_through_dct():
    x = torch.randn(1, 3, 5, 2, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: idct2d(dct2d(t) * 2.0), (x, ))


def test_auto_method_picks_kron_for_small_grids(monkeypatch):
    from moppa_mm.operators import dct as dct_module
    calls = []
    kron_transform = dct_module._kron_transform
    monkeypatch.setattr(dct_module, '_kron_transform',
                        lambda x, basis: calls.append(x.shape) or kron_transform(x, basis))
    small = torch.randn(2, 7, 7, 3, dtype=torch.float64)
    big = torch.randn(2, 9, 8, 3, dtype=torch.float64)  # 72 > 64 tokens
    dct2d(small), idct2d(small), dct2d(big), idct2d(big)
    assert dct_module.KRON_MAX_TOKENS == 64
    assert calls == [small.shape, small.shape]
    # the Kronecker basis is the separable transform written as one matrix
    basis = dct_module.kron_basis(7, 7, device='cpu', dtype=torch.float64)
    expected = (basis @ small.reshape(2, 49, 3)).reshape(small.shape)
    torch.testing.assert_close(dct2d(small, 'separable'), expected)
    assert dct_module.kron_basis(7, 7, device='cpu', dtype=torch.float64) is basis


def test_bad_input():
    with pytest.raises(ValueError, match='channel-last'):
        dct2d(torch.randn(4, 4))
    with pytest.raises(ValueError, match="unknown DCT method 'fft'"):
        dct2d(torch.randn(1, 4, 4, 2), 'fft')
    with pytest.raises(ValueError, match='>= 1'):
        dct_basis(0)


@pytest.mark.parametrize('method', ['auto', 'kron', 'separable'])
@pytest.mark.parametrize('grid,num_prefix', [((4, 5), 1), ((9, 8), 1), ((3, 3), 0),
                                             ((6, 4), 2)])
def test_token_sequence_transforms_equal_split_and_concatenation(grid, num_prefix, method):
    """``dct2d_of_suffix`` and ``idct2d_after_prefix`` (a ViT's class token
    ahead of the patch grid) equal the split + dct2d and idct2d + cat they
    replace, in values and gradients, with the same matmul order per pass."""
    from moppa_mm.operators.dct import dct2d_of_suffix, idct2d_after_prefix
    h, w = grid
    tokens = torch.randn(2, num_prefix + h * w, 6, dtype=torch.float64, requires_grad=True)
    prefix, spectrum = dct2d_of_suffix(tokens, num_prefix, grid, method)
    ref_prefix, ref_patches = tokens.split([num_prefix, h * w], dim=1)
    torch.testing.assert_close(prefix, ref_prefix, atol=0, rtol=0)
    torch.testing.assert_close(spectrum, dct2d(ref_patches.reshape(2, h, w, 6), method))
    out = idct2d_after_prefix(spectrum * 3.0, prefix * 2.0, method)
    ref = torch.cat([ref_prefix * 2.0, idct2d(dct2d(ref_patches.reshape(2, h, w, 6), method)
                                              * 3.0, method).reshape(2, -1, 6)], dim=1)
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(out[:, num_prefix:], 3 * tokens[:, num_prefix:])  # round trip
    grad = torch.randn_like(out)[:, :, :]
    got, = torch.autograd.grad(out, tokens, grad)
    want, = torch.autograd.grad(ref, tokens, grad)
    torch.testing.assert_close(got, want)

    def through(t):
        prefix, spectrum = dct2d_of_suffix(t, num_prefix, grid, method)
        return idct2d_after_prefix(spectrum.square(), prefix.exp(), method)

    assert torch.autograd.gradcheck(through, (tokens, ))
    # an output left unused gets a zero gradient
    assert torch.autograd.gradcheck(
        lambda t: dct2d_of_suffix(t, num_prefix, grid, method)[1], (tokens, ))


def test_token_sequence_transforms_fall_back_under_autocast_and_mixed_dtypes():
    """Under autocast the matmuls run in its dtype, as dct2d/idct2d do there:
    the plain split and concatenation; mixed dtypes concatenate with promotion."""
    from moppa_mm.operators.dct import dct2d_of_suffix, idct2d_after_prefix
    tokens = torch.randn(2, 1 + 16, 8, requires_grad=True)
    with torch.autocast('cpu', dtype=torch.bfloat16):
        prefix, spectrum = dct2d_of_suffix(tokens, 1, (4, 4))
        assert spectrum.dtype == torch.bfloat16
        ref = dct2d(tokens[:, 1:].reshape(2, 4, 4, 8))
        torch.testing.assert_close(spectrum, ref, atol=0, rtol=0)
        out = idct2d_after_prefix(spectrum, prefix)
        torch.testing.assert_close(out[:, 1:], idct2d(spectrum).reshape(2, 16, 8).float(),
                                   atol=0, rtol=0)
    assert out.dtype == torch.float32  # cat promotes, as before
    out.sum().backward()
    assert tokens.grad is not None and tokens.grad.shape == tokens.shape
    mixed = idct2d_after_prefix(torch.randn(2, 4, 4, 8, dtype=torch.float64), prefix.detach())
    assert mixed.dtype == torch.float64


def test_token_sequence_transforms_bad_input():
    from moppa_mm.operators.dct import dct2d_of_suffix, idct2d_after_prefix
    with pytest.raises(ValueError, match=r'expected \(B, 1 \+ 4\*4, C\) tokens'):
        dct2d_of_suffix(torch.randn(2, 16, 8), 1, (4, 4))
    with pytest.raises(ValueError, match='prefix tokens'):
        idct2d_after_prefix(torch.randn(2, 4, 4, 8), torch.randn(2, 1, 7))
    with pytest.raises(ValueError, match="unknown DCT method 'fft'"):
        dct2d_of_suffix(torch.randn(2, 17, 8, requires_grad=True), 1, (4, 4), 'fft')

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

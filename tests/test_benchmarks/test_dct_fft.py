"""The FFT DCT that the benchmark measures against the operator's (benchmarks/dct_fft.py)."""
import numpy as np
import pytest
import scipy.fft
import torch

from benchmarks.dct_fft import dct2d_fft, idct2d_fft


@pytest.mark.parametrize('shape', [(2, 7, 7, 3), (1, 14, 9, 4), (1, 5, 1, 2),
                                   (1, 50, 67, 2)])
def test_fft_dct_matches_scipy(shape):
    x = np.random.default_rng(1).standard_normal(shape)
    np.testing.assert_allclose(
        dct2d_fft(torch.from_numpy(x)).numpy(),
        scipy.fft.dctn(x, type=2, axes=(1, 2), norm='ortho'), atol=1e-10)
    np.testing.assert_allclose(
        idct2d_fft(torch.from_numpy(x)).numpy(),
        scipy.fft.idctn(x, type=2, axes=(1, 2), norm='ortho'), atol=1e-10)

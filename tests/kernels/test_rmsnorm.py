"""rmsnorm_kernel and linear_kernel against the reference on fresh random inputs (odd sizes, rows past
meta[1] left untouched)."""

import numpy as np
import pytest

from kernels_numba.device import download, to_device
from kernels_numba.linear import linear
from kernels_numba.rmsnorm import rmsnorm
from workbench.reference.layers import rmsnorm as ref_rmsnorm


@pytest.mark.parametrize("ks,k", [(None, 45), (3, 45), (8, 45), (1, 301), (8, 1100), (32, 7168)])
def test_rmsnorm_matches_reference_and_skips_dead_rows(ks, k):
    """ks: the K-sliced block (32, ks) a long row gets on the GPU (``rmsnorm.norm_slices``: 32 warps at
    K2's 7,168); k = 301 and 1100 take the four-loads-ahead loops' main part and their tail."""
    rng = np.random.default_rng(k)
    x = rng.standard_normal((4, k)).astype(np.float32) * 3
    w = rng.standard_normal(k).astype(np.float32)
    out = to_device(np.full((4, k), 7.0, np.float32))
    rmsnorm(out, to_device(x), to_device(w), 1e-6, to_device(np.array([0, 3, 0, 0, 0, 0, 0, 0], np.int32)), 4,
            ks=ks)
    got = download(out)
    np.testing.assert_allclose(got[:3], ref_rmsnorm(x[:3], w, 1e-6), rtol=1e-5, atol=1e-5)
    assert (got[3] == 7.0).all()


def test_rmsnorm_in_place_on_a_long_row():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 1100)).astype(np.float32)
    w = rng.standard_normal(1100).astype(np.float32)
    buf = to_device(x)
    rmsnorm(buf, buf, to_device(w), 1e-6, to_device(np.array([0, 2, 0, 0, 0, 0, 0, 0], np.int32)), 2, ks=8)
    np.testing.assert_allclose(download(buf), ref_rmsnorm(x, w, 1e-6), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("ks", [1, 4])
def test_linear_overwrites_or_accumulates(ks):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((3, 37)).astype(np.float32)
    w = rng.standard_normal((41, 37)).astype(np.float32)                 # [N, K]
    base = rng.standard_normal((3, 41)).astype(np.float32)
    meta = to_device(np.array([0, 3, 0, 0, 0, 0, 0, 0], np.int32))
    out = to_device(base)
    linear(out, to_device(x), to_device(np.ascontiguousarray(w.T)), meta, 3, ks=ks)
    np.testing.assert_allclose(download(out), x @ w.T, rtol=1e-5, atol=1e-5)
    out = to_device(base)
    linear(out, to_device(x), to_device(np.ascontiguousarray(w.T)), meta, 3, accumulate=True, ks=ks)
    np.testing.assert_allclose(download(out), base + x @ w.T, rtol=1e-5, atol=1e-5)


def test_row_slices_widen_long_rows_only():
    from kernels_numba.blockops import KS, ROW_KS, row_slices
    assert row_slices(192) == 1                               # a toy row keeps one warp
    assert row_slices(7168) == min(KS, ROW_KS)                # 8 slices on the GPU, 1 under the simulator

"""int4_matmul against the W4A16 definition (workbench.quant.int4.int4_linear), both tiers.

Simulator tier: tiny shapes, every M bucket (MT = 1, 2, 4, 8 and M > 64), every group size, the
split-K path, odd N, NaN-poisoned outputs, bad inputs rejected before launch. GPU tier: K2 shapes.
"""

import numpy as np
import pytest

from kernels_numba import KernelInputError, int4_matmul, repack_int4
from kernels_numba.int4_layout import Int4Weight
from workbench.quant.int4 import gen_quant4, int4_linear

from .helpers import SIMULATED, assert_close, dev, gpu, host, needs_gpu, poisoned


def _weight(n, k, g, seed):
    _, packed, scales = gen_quant4(n, k, g, seed=seed)
    w = repack_int4(packed, scales)
    return (w if SIMULATED else w.to_device()), packed, scales


def _check(m, n, k, g, seed, config=None):
    rng = np.random.default_rng(seed)
    w, packed, scales = _weight(n, k, g, seed)
    x = rng.standard_normal((m, k)).astype(np.float16)
    out = poisoned((m, n))
    int4_matmul(dev(x), w, out=out, config=config)
    assert_close(host(out), int4_linear(x, packed, scales), what=f"M={m} N={n} K={k} G={g}")


@pytest.mark.parametrize("m,n,k,g", [
    (1, 16, 64, 32),        # GEMV bucket MT=1
    (5, 40, 128, 64),       # odd M, N not a multiple of 16 (padded tile)
    (16, 16, 128, 128),     # MT=2
    (27, 16, 64, 32),       # MT=4
    (64, 16, 64, 64),       # MT=8
    (70, 16, 64, 32),       # M > 64: two grid rows
])
def test_matches_reference(m, n, k, g):
    _check(m, n, k, g, seed=m * 1000 + n)


def test_guarded_and_group_configs():
    """Slices that do not divide K/64 (chunk guards) and G = 64 / 128 partial sums across chunks."""
    _check(3, 16, 192, 32, 1, config=(1, 2, 2))
    _check(3, 16, 256, 128, 2, config=(1, 2, 2))
    _check(9, 16, 256, 64, 3, config=(2, 1, 4))


def test_tuned_k2_down_config():
    """The tuned M <= 8 config for K = 2048 (4 warps x 8 chunks, no guards), as chosen by default."""
    _check(2, 16, 2048, 32, 4)


def test_output_allocated_when_omitted():
    w, packed, scales = _weight(16, 64, 32, 5)
    x = np.random.default_rng(5).standard_normal((2, 64)).astype(np.float16)
    assert_close(host(int4_matmul(dev(x), w)), int4_linear(x, packed, scales))


def test_bad_inputs_raise_before_launch():
    w, _, _ = _weight(16, 64, 32, 7)
    x = np.zeros((2, 64), np.float16)
    with pytest.raises(KernelInputError, match="dtype"):
        int4_matmul(dev(x.astype(np.float32)), w)
    with pytest.raises(KernelInputError, match="shape"):
        int4_matmul(dev(np.zeros((2, 128), np.float16)), w)
    with pytest.raises(KernelInputError, match="shape"):
        int4_matmul(dev(x), w, out=dev(np.zeros((2, 15), np.float32)))
    with pytest.raises(KernelInputError, match="Int4Weight"):
        int4_matmul(dev(x), (w.wq, w.sq))
    with pytest.raises(KernelInputError, match="unsupported"):
        int4_matmul(dev(x), Int4Weight(w.wq, w.sq, 16, 64, 48))
    with pytest.raises(KernelInputError, match="weight.wq"):
        int4_matmul(dev(x), Int4Weight(w.wq[:-4], w.sq, 16, 64, 32))
    with pytest.raises(KernelInputError, match="config"):
        int4_matmul(dev(x), w, config=(3, 1, 1))
    if SIMULATED:     # host-side layout checks on numpy views (device arrays cannot be misaligned this way)
        with pytest.raises(KernelInputError, match="contiguous"):
            int4_matmul(np.zeros((2, 128), np.float16)[:, ::2], w)
        with pytest.raises(KernelInputError, match="aligned"):
            int4_matmul(np.zeros(2 * 64 + 1, np.float16)[1:].reshape(2, 64), w)


@gpu
@needs_gpu
@pytest.mark.parametrize("m", [1, 2, 8, 16, 33, 64, 100])
@pytest.mark.parametrize("n,k", [(2048, 7168), (7168, 2048)])
def test_gpu_k2_shapes(m, n, k):
    _check(m, n, k, 32, seed=m + n)


@gpu
@needs_gpu
@pytest.mark.parametrize("g", [64, 128])
def test_gpu_group_sizes(g):
    _check(16, 1024, 2048, g, seed=g)

"""Offline tile repack (kernels_numba.int4_layout): exact round trip and the documented word layout."""

import numpy as np
import pytest

from kernels_numba import LayoutError, repack_int4, unrepack_int4
from kernels_numba.intrinsics import NIBBLE_ORDER
from workbench.quant.int4 import gen_quant4, unpack_int4


@pytest.mark.parametrize("n,k,g", [(16, 64, 32), (40, 128, 64), (7, 256, 128), (33, 192, 32)])
def test_round_trip_exact(n, k, g):
    _, packed, scales = gen_quant4(n, k, g, seed=n * k)
    w = repack_int4(packed, scales)
    p2, s2 = unrepack_int4(w)
    np.testing.assert_array_equal(p2, packed)
    np.testing.assert_array_equal(s2.view(np.uint16), scales.view(np.uint16))
    assert w.wq.dtype == np.uint32 and w.wq.size == -(-n // 16) * k * 2


def test_expert_stack_round_trip():
    parts = [gen_quant4(24, 128, 32, seed=s)[1:] for s in range(3)]
    packed = np.stack([p for p, _ in parts])
    scales = np.stack([s for _, s in parts])
    w = repack_int4(packed, scales)
    assert w.experts == 3
    p2, s2 = unrepack_int4(w)
    np.testing.assert_array_equal(p2, packed)
    np.testing.assert_array_equal(s2, scales)


def test_word_layout_matches_docstring():
    """Spot-check the documented position of random weights, independently of the gather table."""
    rng = np.random.default_rng(3)
    n, k = 32, 128
    _, packed, scales = gen_quant4(n, k, 32, seed=11)
    u = unpack_int4(packed).astype(np.int32) + 8
    wq = repack_int4(packed, scales).wq.reshape(n // 16, k // 64, 32, 4)
    for _ in range(200):
        tile, c, lane, ks, p = (int(rng.integers(v)) for v in (n // 16, k // 64, 32, 4, 8))
        g, t, e = lane // 4, lane % 4, NIBBLE_ORDER[p]
        row = tile * 16 + g + 8 * ((e >> 1) & 1)
        col = 64 * c + 32 * (ks // 2) + 8 * t + 4 * (ks % 2) + (e & 1) + 2 * (e >> 2)
        assert (int(wq[tile, c, lane, ks]) >> (4 * p)) & 0xF == u[row, col]


def test_rejects_bad_shapes():
    _, packed, scales = gen_quant4(16, 96, 32, seed=1)
    with pytest.raises(LayoutError, match="multiple of 64"):
        repack_int4(packed, scales)
    _, packed, scales = gen_quant4(16, 128, 32, seed=1)
    with pytest.raises(LayoutError):
        repack_int4(packed, scales.astype(np.float32))
    with pytest.raises(LayoutError):
        repack_int4(packed.astype(np.int64), scales)

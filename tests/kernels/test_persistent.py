"""The persistent W16A16 SwiGLU against its definition (bf16 operands, float32 sums, silu(g) * u) and
against the three launches it replaces, bit for bit; its refusals; both tiers."""

import numpy as np
import pytest
import torch

from kernels_numba import KernelInputError
from kernels_numba.persistent import fits, grid_blocks, persistent_swiglu, tiling
from kernels_numba.sim import sim_speed
from kernels_numba.w16a16 import glu_rows, linear, repack_w16
from numformats.bf16 import bf16

from .helpers import SIMULATED, assert_close, dev, gpu, host, needs_gpu

SMALL = (352, 416)               # D, I: both tilings one warp, 2 steps a batch (11 and 13 batches)


def _weight(n, k, rng):
    bits = bf16(rng.standard_normal((n, k)).astype(np.float32) / np.sqrt(k)).bits
    w_t = torch.from_numpy(np.ascontiguousarray(bits.T).view(np.int16)).view(torch.bfloat16)
    return (bits.astype(np.uint32) << 16).view(np.float32), repack_w16(w_t if SIMULATED else w_t.cuda())


def _bf(x):
    return (bf16(x).bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def _case(d, i, t, seed):
    rng = np.random.default_rng(seed)
    (w13f, w13), (w2f, w2) = _weight(2 * i, d, rng), _weight(d, i, rng)
    x = rng.standard_normal((t + 1, d)).astype(np.float32)        # a row past ``t``: never read
    h0 = rng.standard_normal((t + 1, d)).astype(np.float32)
    return w13f, w13, w2f, w2, x, h0


def _three_launches(h, x, w13, w2, t, accumulate):
    gu, a = dev(np.zeros((t, 2 * w2.k), np.float32)), dev(np.zeros((t, w2.k), np.float32))
    linear(gu, x, w13, t)
    glu_rows(a, gu, t)
    linear(h, a, w2, t, accumulate=accumulate)


@pytest.mark.parametrize("t,accumulate", [(1, True), (8, False)])
def test_persistent_swiglu_is_the_three_launches_bit_for_bit(t, accumulate):
    d, i = SMALL
    w13f, w13, w2f, w2, x, h0 = _case(d, i, t, 1 + t)
    h, h3 = dev(h0.copy()), dev(h0.copy())
    gu, a = dev(np.full((t + 1, 2 * i), np.nan, np.float32)), dev(np.full((t + 1, i), np.nan, np.float32))
    with sim_speed():
        persistent_swiglu(h, dev(x), w13, w2, gu, a, t, accumulate=accumulate)
        _three_launches(h3, dev(x), w13, w2, t, accumulate)
    got = host(h)
    assert np.array_equal(got[:t], host(h3)[:t])
    assert np.array_equal(got[t:], h0[t:])                        # rows past ``t`` untouched
    gu_ref = _bf(x[:t]) @ w13f.T.astype(np.float64)               # the definition, in float64
    g, u = gu_ref[:, :i], gu_ref[:, i:]
    want = _bf((g / (1 + np.exp(-g)) * u).astype(np.float32)) @ w2f.T.astype(np.float64)
    assert_close(got[:t], want + (h0[:t] if accumulate else 0), rtol=2e-3, atol_rel=2e-3, what=f"T={t}")


def test_tilings_and_refusals():
    assert tiling(7168, 2048) == (8, 8, 7, 2) and tiling(7168, 18432) == (8, 8, 7, 18)   # K2's MLPs
    assert tiling(*SMALL) == (1, 2, 11, 13)
    assert tiling(7168, 1024) is None                             # W2 would have one batch
    assert fits(7168, 2048, 8) and not fits(7168, 2048, 9) and not fits(7168, 1024, 1)
    d, i = SMALL
    _, w13, _, w2, x, h0 = _case(d, i, 2, 9)
    gu, a = dev(np.zeros((2, 2 * i), np.float32)), dev(np.zeros((2, i), np.float32))
    with pytest.raises(KernelInputError, match="W13 \\[2I, D\\] and W2 \\[D, I\\]"):
        persistent_swiglu(dev(h0), dev(x), w2, w13, gu, a, 2)
    with pytest.raises(KernelInputError, match="1..8 rows"):
        persistent_swiglu(dev(h0), dev(x), w13, w2, gu, a, 9)
    with pytest.raises(KernelInputError, match="rows must be at most"):
        persistent_swiglu(dev(h0), dev(x), w13, w2, gu, a, 3)
    with pytest.raises(KernelInputError, match="gu: shape"):
        persistent_swiglu(dev(h0), dev(x), w13, w2, a, a, 2)
    with pytest.raises(KernelInputError, match="cooperative grid"):
        persistent_swiglu(dev(h0), dev(x), w13, w2, gu, a, 2, blocks=grid_blocks() + 1)
    with pytest.raises(KernelInputError, match="repack_w16"):
        persistent_swiglu(dev(h0), dev(x), None, w2, gu, a, 2)


@gpu
@needs_gpu
@pytest.mark.parametrize("d,i,t", [(7168, 2048, 1), (7168, 2048, 8), (7168, 18432, 1)])
def test_gpu_k2_shapes_are_the_three_launches_bit_for_bit(d, i, t):
    """K2's shared expert and dense MLP (the drafter's MLP too) on the whole cooperative grid and on
    132 blocks: the bits of the three launches."""
    _, w13, _, w2, x, h0 = _case(d, i, t, 3)
    gu, a = dev(np.zeros((t, 2 * i), np.float32)), dev(np.zeros((t, i), np.float32))
    h3 = dev(h0[:t].copy())
    _three_launches(h3, dev(x[:t]), w13, w2, t, True)
    for blocks in (None, 132):
        h = dev(h0[:t].copy())
        persistent_swiglu(h, dev(x[:t]), w13, w2, gu, a, t, blocks=blocks)
        assert np.array_equal(host(h), host(h3)), blocks

"""The W16A16 tensor-core linear against the W16A16 definition (bf16 operands, float32 sums), both tiers;
its rows equal, bit for bit, the same rows computed alone."""

import numpy as np
import pytest
import torch

from kernels_numba import KernelInputError
from kernels_numba.sim import sim_speed
from kernels_numba.w16a16 import (
    Groups,
    glu_rows,
    linear,
    norm_rows,
    repack_w16,
    row_tiles,
    unrepack_w16,
    w16_tiling,
)
from numformats.bf16 import bf16

from .helpers import SIMULATED, assert_close, dev, gpu, host, needs_gpu, poisoned


def _weight(n, k, seed):
    """W [N, K] as bf16 bits, its float32 values, and the repacked weight where the kernel runs."""
    rng = np.random.default_rng(seed)
    bits = bf16(rng.standard_normal((n, k)).astype(np.float32) / np.sqrt(k)).bits
    w_t = torch.from_numpy(np.ascontiguousarray(bits.T).view(np.int16)).view(torch.bfloat16)
    return bits, (bits.astype(np.uint32) << 16).view(np.float32), repack_w16(w_t if SIMULATED else w_t.cuda())


def _x(t, k, seed):
    return np.random.default_rng(seed).standard_normal((t, k)).astype(np.float32)


def _ref(x, wf):
    xb = (bf16(x).bits.astype(np.uint32) << 16).view(np.float32)
    return xb.astype(np.float64) @ wf.T.astype(np.float64)


def test_repack_round_trips_and_tilings_cover_k():
    bits, _, w = _weight(48, 96, 1)
    assert np.array_equal(unrepack_w16(w), bits)
    for k in (64, 1536, 2048, 7168, 8192, 18432, 272):
        ks, cpw, nb = w16_tiling(k)
        assert ks * cpw * nb == k // 16 and ks <= 8 and cpw <= 8
    assert w16_tiling(7168) == (8, 8, 7)
    assert [row_tiles(r) for r in (1, 8, 9, 16, 17, 33, 65, 72)] == [1, 1, 2, 2, 3, 5, 9, 9]
    with pytest.raises(KernelInputError, match="at most 72"):
        row_tiles(73)


@pytest.mark.parametrize("t,k,acc", [(1, 96, False), (11, 2560, True), (75, 32, False)])   # 75: two launches
def test_linear_matches_the_w16a16_definition(t, k, acc):
    n = 32
    _, wf, w = _weight(n, k, 2)
    x = _x(t + 2, k, 3)                                          # rows past ``t`` are not computed
    base = _x(t + 2, n, 4)
    out = dev(base.copy()) if acc else poisoned((t + 2, n))   # (the simulator works on the array itself)
    with sim_speed():
        linear(out, dev(x), w, t, accumulate=acc)
    got = host(out)
    want = _ref(x[:t], wf) + (base[:t] if acc else 0)
    assert_close(got[:t], want, rtol=1e-5, atol_rel=1e-5, what=f"T={t} K={k}")
    if acc:
        assert np.array_equal(got[t:], base[t:])
    else:
        assert np.isnan(got[t:]).all()


def test_rows_equal_the_rows_alone_bit_for_bit():
    """A row's sum does not depend on how many rows run with it or where it sits (a verify's rows equal
    decode's)."""
    n, k = 32, 1024
    _, _, w = _weight(n, k, 5)
    x = _x(17, k, 6)
    with sim_speed():
        many = poisoned((17, n))
        linear(many, dev(x), w, 17)
        alone = []
        for r in (0, 8, 16):
            o = poisoned((1, n))
            linear(o, dev(x[r:r + 1]), w, 1)
            alone.append(host(o)[0])
    assert np.array_equal(host(many)[[0, 8, 16]], np.stack(alone))


def test_column_tiles_per_block_change_no_bit(monkeypatch):
    """NT column tiles a block (from 17 rows) sum every output in one tile's order."""
    import kernels_numba.w16a16 as w16
    n, k, t = 64, 1024, 17
    _, _, w = _weight(n, k, 12)
    x = dev(_x(t, k, 13))
    monkeypatch.setattr(w16, "MIN_BLOCKS", 1)
    outs = {}
    for multi, nt in ((False, 1), (True, 4)):
        assert w16.tiles_per_block(w, row_tiles(t), multi) == nt
        outs[nt] = poisoned((t, n))
        with sim_speed():
            linear(outs[nt], x, w, t, multi_tile=multi)
    assert np.array_equal(host(outs[4]), host(outs[1]))
    assert [w16.tiles_per_block(w, row_tiles(r), True) for r in (9, 33, 65)] == [1, 2, 1]   # NT MT <= 12


def test_glu_linear_is_silu_times_up_then_the_linear_and_bad_input():
    """glu: x = [g || u] [T, 2K], the activation silu(g) * u in float32 (an exp a few ulps off numpy's may
    flip a bf16 rounding of it: a tolerance of a few bf16 ulps of an input's share)."""
    t, n, k = 3, 32, 64
    _, wf, w = _weight(n, k, 10)
    gu = _x(t, 2 * k, 7)
    out = poisoned((t, n))
    a, unfused = poisoned((t, k)), poisoned((t, n))
    with sim_speed():
        linear(out, dev(gu), w, 2, glu=True)
        glu_rows(a, dev(gu), 2)                                             # the unfolded path: same bits
        linear(unfused, a, w, 2)
    g, u = gu[:2, :k], gu[:2, k:]
    assert_close(host(out)[:2], _ref(g / (1 + np.exp(-g)) * u, wf), rtol=2e-3, atol_rel=2e-3)
    assert np.isnan(host(out)[2:]).all()
    assert np.array_equal(host(unfused)[:2], host(out)[:2])
    with pytest.raises(KernelInputError, match="gu: shape"):
        glu_rows(a, dev(_x(t, k, 7)), 2)
    with pytest.raises(KernelInputError, match="x: shape"):
        linear(poisoned((2, n)), dev(_x(2, k, 7)), w, 2, glu=True)
    _, _, w = _weight(32, 96, 8)
    with pytest.raises(KernelInputError, match="shape"):
        linear(poisoned((2, 32)), dev(_x(2, 64, 9)), w, 2)
    with pytest.raises(KernelInputError, match="rows must be"):
        linear(poisoned((2, 32)), dev(_x(2, 96, 9)), w, 3)
    with pytest.raises(KernelInputError, match="multiples of 16"):
        repack_w16(torch.zeros(40, 24, dtype=torch.bfloat16))


def test_two_batches_in_flight_change_no_bit(monkeypatch):
    """A small grid at up to PIPE_TILES row tiles loads the next batch's weights while the current one
    multiplies; the MMAs still chain in step order, so every bit equals the one-batch-at-a-time kernel
    (NB = 3 and 2)."""
    import kernels_numba.w16a16 as w16
    for k, t in ((3072, 1), (2048, 9)):
        assert w16.w16_tiling(k)[2] == {3072: 3, 2048: 2}[k]
        _, _, w = _weight(32, k, 16)
        x = dev(_x(t, k, 17))
        outs = []
        for tiles in (2, 0):
            monkeypatch.setattr(w16, "PIPE_TILES", tiles)
            assert w16.pipelined(w, row_tiles(t), 1) == (tiles == 2)
            outs.append(poisoned((t, 32)))
            with sim_speed():
                linear(outs[-1], x, w, t)
        assert np.array_equal(host(outs[0]), host(outs[1])), k
    big = _weight(16 * (w16.PIPE_BLOCKS + 1), 64, 18)[2]                    # more blocks: one batch at a time
    assert not w16.pipelined(big, 1, 1) and not w16.pipelined(w, 3, 1)


@pytest.mark.parametrize("k,t", [(96, 1), (2048, 5), (96, 19)])      # one batch; two in flight; 3 row tiles
def test_norm_folded_into_the_product_is_rmsnorm_then_the_linear(k, t):
    """norm: x is rmsnorm(x) * nw, each row's 1 / rms summed by the block, 8 rows at a time; one rms in
    another order may flip a bf16 rounding of the normed x: a few bf16 ulps of an input's share. A row's
    output is the same alone (a verify row equals its decode row), and ``norm_rows`` then the plain
    product gives the folded product's bits (the unfused path). Bad input: one line."""
    from workbench.reference.layers import rmsnorm
    n, eps = 32, 1e-6
    _, wf, w = _weight(n, k, 19)
    x = _x(t, k, 20) * 3.0
    nw = (1.0 + 0.1 * _x(1, k, 21)[0]).astype(np.float32)
    out, alone, xn, unfused = poisoned((t, n)), poisoned((1, n)), poisoned((t, k)), poisoned((t, n))
    with sim_speed():
        linear(out, dev(x), w, t, norm=(dev(nw), eps))
        linear(alone, dev(x[t - 1:]), w, 1, norm=(dev(nw), eps))
        norm_rows(xn, dev(x), w, dev(nw), eps, t)
        linear(unfused, xn, w, t)
    want = _ref(rmsnorm(x, nw, eps), wf)
    assert_close(host(out), want, rtol=3e-3, atol_rel=3e-3, what=f"K={k} T={t}")
    assert np.array_equal(host(alone)[0], host(out)[t - 1])
    assert np.array_equal(host(unfused), host(out))
    with pytest.raises(KernelInputError, match="no GLU"):
        linear(out, dev(x), w, t, groups=Groups(16, k, 0, 16), norm=(dev(nw), eps))
    with pytest.raises(KernelInputError, match="norm weight"):
        norm_rows(xn, dev(x), w, dev(nw[:-1].copy()), eps, t)


@pytest.mark.parametrize("t", [1, 10])
def test_grouped_product_is_each_groups_linear_of_its_x_slice(t):
    """Groups: G stacked matrices, group g reading x columns g XG .. + K of rows XS long and writing
    out columns g OG .. + GN (an attention's per-head W_UK into q_lat beside q_pe, and W_UV from ctx),
    with the sums rounded to bf16: into int16 bits and into float32, the reference's r(.)."""
    g, gn, k, xg, og = 3, 32, 48, 56, 40
    _, wf, w = _weight(g * gn, k, 14)
    x = _x(t, g * xg, 15)
    want = np.stack([_ref(x[:, j * xg:j * xg + k], wf[j * gn:(j + 1) * gn]) for j in range(g)], axis=1)
    want = bf16(want.astype(np.float32)).float32()                   # [T, G, GN] rounded once
    groups = Groups(gn, g * xg, xg, og)
    out16 = dev(np.full((t, g * og), -1, np.int16))
    out32 = poisoned((t, g * og))
    with sim_speed():
        linear(out16, dev(x), w, t, groups=groups, round_out=True)
        linear(out32, dev(x), w, t, groups=groups, round_out=True)
    got16 = (host(out16).view(np.uint16).astype(np.uint32) << 16).view(np.float32).reshape(t, g, og)
    got32 = host(out32).reshape(t, g, og)
    for got in (got16, got32):                     # float32 sums in two orders: one bf16 step at most
        assert_close(got[:, :, :gn], want, rtol=8e-3, atol_rel=8e-3, what=f"T={t}")
    assert np.array_equal(got16[:, :, :gn], got32[:, :, :gn])                  # the same rounding
    assert (host(out16).reshape(t, g, og)[:, :, gn:] == -1).all()             # the slots beside untouched
    assert np.isnan(got32[:, :, gn:]).all()
    with pytest.raises(KernelInputError, match="grouped"):
        linear(out32, dev(x), w, t, groups=Groups(24, g * xg, xg, og))
    with pytest.raises(KernelInputError, match="reads"):
        linear(out32, dev(x), w, t, groups=Groups(gn, g * xg, xg + 8, og))


@gpu
@needs_gpu
@pytest.mark.parametrize("k,n,multi", [(7168, 1536, False), (1536, 2048, False), (8192, 1024, False),
                                       (18432, 512, False), (2048, 8448, True), (8192, 4352, True)])
def test_gpu_k2_shapes_rows_alone_and_reference(k, n, multi):
    """K2's projection depths: 65 rows equal each row alone bit for bit, and the definition (the last two
    with NT = 4 and 2 column tiles a block at 17-40 rows)."""
    _, wf, w = _weight(n, k, 10)
    x = _x(65, k, 11)
    many = poisoned((65, n))
    linear(many, dev(x), w, 65, multi_tile=multi)
    got = host(many)
    for r in (0, 7, 8, 33, 64):
        for rows in (1, r + 1):
            o = poisoned((rows, n))
            linear(o, dev(x[r + 1 - rows:r + 1]), w, rows, multi_tile=multi)
            assert np.array_equal(host(o)[-1], got[r]), (k, n, r, rows)
    assert_close(got, _ref(x, wf), rtol=1e-4, atol_rel=1e-4, what=f"K={k} N={n}")

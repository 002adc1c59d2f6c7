"""int4_matmul against the W4A16 definition (workbench.quant.int4.int4_linear), both tiers.

Simulator tier: tiny shapes, every M bucket (MT = 1, 2, 4, 8 and M > 64), every group size, the
split-K path, odd N, NaN-poisoned outputs, bad inputs rejected before launch. GPU tier: K2 shapes.
"""

import contextlib

import numpy as np
import pytest

from kernels_numba import KernelInputError, int4_matmul, repack_int4
from kernels_numba.int4_layout import Int4Weight
from kernels_numba.int4_matmul import GemmWorkspace, choose_config, gemm_workspace, wgmma_config
from kernels_numba.int4_staged import Staged
from kernels_numba.int4_wgmma import Wgmma
from kernels_numba.sim import sim_speed
from workbench.quant.int4 import dequantize_packed, gen_quant4, int4_linear, pack_int4

from .helpers import SIMULATED, assert_close, dev, gpu, host, needs_gpu, poisoned


def _weight(n, k, g, seed):
    _, packed, scales = gen_quant4(n, k, g, seed=seed)
    w = repack_int4(packed, scales)
    return (w if SIMULATED else w.to_device()), packed, scales


def _f16_weights_linear(x, packed, scales):
    """What a ``prescale`` wgmma tiling computes: the definition with each dequantized weight rounded to
    float16 (the kernel multiplies the scales into the weights in f16), summed in float32."""
    w = dequantize_packed(packed, scales).astype(np.float16).astype(np.float32)
    return x.astype(np.float16).astype(np.float32) @ w.T


def _check(m, n, k, g, seed, config=None, workspace=None, fast=False):
    """int4_matmul against the reference; ``fast``: under ``sim_speed`` (the configuration sweeps; the
    simulator's pooled executor runs the same kernel tens of times faster than numba's plain one)."""
    rng = np.random.default_rng(seed)
    w, packed, scales = _weight(n, k, g, seed)
    x = rng.standard_normal((m, k)).astype(np.float16)
    out = poisoned((m, n))
    with sim_speed() if fast else contextlib.nullcontext():
        int4_matmul(dev(x), w, out=out, config=config, workspace=workspace)
    ref = _f16_weights_linear if getattr(config, "prescale", False) else int4_linear
    assert_close(host(out), ref(x, packed, scales), what=f"M={m} N={n} K={k} G={g} {config}")


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


def test_tuned_k2_down_configs():
    """The tuned configs for K = 2048 (4 warps x 8 chunks, no guards), as chosen by default: M <= 8
    and the M = 32 bucket (MT = 4)."""
    _check(2, 16, 2048, 32, 4, fast=True)
    _check(29, 16, 2048, 32, 6, fast=True)


def test_paired_configs():
    """KP = 2, tile pairs in clusters of 2 (the simulator's clusters have one block, which computes both
    halves of K; the exchange of halves runs in the GPU tier): M buckets 1, 2, 4, G = 64, two grid rows."""
    _check(13, 32, 1024, 32, 1, config=(2, 8, 2, 2), fast=True)
    _check(3, 64, 512, 64, 2, config=(1, 4, 2, 2), fast=True)
    _check(29, 32, 1024, 32, 3, config=(4, 16, 1, 2), fast=True)
    _check(70, 32, 512, 32, 4, config=(2, 8, 1, 2), fast=True)


def test_staged_split_k_reuses_its_workspace():
    """From 33 rows on the default is the staged kernel (x in shared memory, K split over blocks), for
    56 rows two grid rows with K split in two; a second launch on the same workspace finds its counters
    reset."""
    assert choose_config(56, 256, 32, 32) == Staged(4, 2, 2, 4, 4)
    assert choose_config(32, 256, 32, 32) == (4, 4, 1)
    ws = gemm_workspace(56, [(32, 256, 32)])
    _check(56, 32, 256, 32, 11, workspace=ws, fast=True)
    _check(33, 32, 256, 32, 12, workspace=ws, fast=True)
    assert not host(ws.cnt).any()


def test_staged_tilings():
    """No split K over two grid rows (M > 64) at G = 64; the stage rings wrapping (8 chunks over 3
    weight and 2 x stages); G = 128 groups that start in another block's share (6 splits of 6 chunks);
    M = 20 in the MT = 4 bucket; split K over three grid rows of the MT = 2 bucket (M = 40); deep rings,
    and fewer weight than x stages (weight chunk c then in a younger commit group than x chunk c)."""
    _check(70, 16, 128, 64, 13, config=Staged(8, 1, 1, 2, 2), fast=True)
    _check(40, 32, 256, 32, 17, config=Staged(2, 2, 2, 2, 3), fast=True)
    _check(20, 16, 512, 32, 18, config=Staged(4, 1, 1, 2, 5), fast=True)
    _check(40, 32, 1024, 32, 19, config=Staged(4, 2, 2, 6, 5), fast=True)
    _check(20, 16, 512, 32, 16, config=Staged(4, 1, 1, 3, 2), fast=True)
    _check(20, 16, 384, 128, 14, config=Staged(4, 1, 6, 3, 3), fast=True)


def test_staged_bad_config_and_workspace():
    w, _, _ = _weight(16, 128, 32, 15)
    x = dev(np.zeros((40, 128), np.float16))
    for cfg in (Staged(8, 1, 3, 2, 2), Staged(8, 1, 1, 1, 2), Staged(8, 1, 1, 2, 7), Staged(8, 0, 1, 2, 2),
                Staged(8, 16, 1, 8, 3)):
        with pytest.raises(KernelInputError, match="bad staged config"):
            int4_matmul(x, w, config=cfg)
    small = GemmWorkspace(dev(np.zeros(8, np.float32)), dev(np.zeros(1, np.int32)))
    with pytest.raises(KernelInputError, match="workspace too small"):
        int4_matmul(x, w, config=Staged(8, 1, 2, 2, 2), workspace=small)


def test_wgmma_tilings():
    """The wgmma kernel (the simulator runs each wgmma as the PTX ISA defines its operands: wgmma.py):
    M = 40 (a 40-column wgmma) with split K over rings of 3; two warpgroups with split K at G = 64 and
    M = 64; G = 128 groups across chunks, split K over two grid rows (M = 70); N = 40, not a whole
    warpgroup of tiles, under deep rings."""
    _check(40, 64, 256, 32, 1, config=Wgmma(5, 1, 2, 3, 3), fast=True)
    _check(64, 128, 512, 64, 2, config=Wgmma(8, 2, 2, 3, 3), fast=True)
    _check(70, 48, 384, 128, 3, config=Wgmma(8, 1, 3, 3, 4), fast=True)
    _check(33, 40, 256, 32, 4, config=Wgmma(6, 1, 1, 4, 5), fast=True)


def test_wgmma_prescaled():
    """``prescale``: against the definition with f16-rounded weights (what it computes), and within
    float16 weight rounding of the exact definition."""
    _check(33, 64, 512, 32, 5, config=Wgmma(6, 1, 2, 5, 6, True), fast=True)
    _check(48, 64, 256, 64, 6, config=Wgmma(8, 1, 2, 3, 4, True), fast=True)
    w, packed, scales = _weight(32, 512, 32, 7)
    x = np.random.default_rng(7).standard_normal((40, 512)).astype(np.float16)
    with sim_speed():
        got = host(int4_matmul(dev(x), w, config=Wgmma(5, 1, 1, 3, 3, True)))
    exact = int4_linear(x, packed, scales)
    bound = 2.0 ** -11 * (np.abs(x.astype(np.float32)) @ np.abs(dequantize_packed(packed, scales)).T)
    assert np.all(np.abs(got - exact) <= bound + 1e-5 * np.abs(exact).max())
    assert not np.array_equal(got, exact)                            # the rounding is there to see


def test_wgmma_bad_configs():
    w, _, _ = _weight(16, 128, 32, 15)
    x = dev(np.zeros((40, 128), np.float16))
    for cfg in (Wgmma(9, 1, 1, 3, 3), Wgmma(8, 3, 1, 3, 3), Wgmma(8, 1, 3, 3, 3), Wgmma(8, 1, 1, 3, 2),
                Wgmma(8, 1, 1, 2, 4), Wgmma(8, 2, 1, 4, 5)):
        with pytest.raises(KernelInputError, match="bad wgmma config"):
            int4_matmul(x, w, config=cfg)


def test_choose_config_pairs_only_even_tile_counts():
    assert choose_config(16, 7168) == (2, 16, 7, 2) == choose_config(9, 7168, n=2048)
    assert choose_config(32, 7168, n=2032) == (4, 16, 7)          # 127 tiles: no pairs
    assert choose_config(1, 7168, n=2048) == (1, 16, 7)


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
    w3, _, _ = _weight(48, 1024, 32, 8)                              # 3 tiles: no pairs
    x3 = dev(np.zeros((16, 1024), np.float16))
    with pytest.raises(KernelInputError, match="paired config"):
        int4_matmul(x3, w3, config=(2, 8, 2, 2))
    w4, _, _ = _weight(64, 1024, 32, 9)
    for bad in ((2, 8, 2, 3), (4, 8, 2, 2), (2, 4, 4, 2)):           # KP != 2, MT > KS / 4
        with pytest.raises(KernelInputError, match="paired config"):
            int4_matmul(x3, w4, config=bad)
    w128, _, _ = _weight(64, 1024, 128, 10)
    with pytest.raises(KernelInputError, match="paired config"):
        int4_matmul(x3, w128, config=(2, 8, 2, 2))
    if SIMULATED:     # host-side layout checks on numpy views (device arrays cannot be misaligned this way)
        with pytest.raises(KernelInputError, match="contiguous"):
            int4_matmul(np.zeros((2, 128), np.float16)[:, ::2], w)
        with pytest.raises(KernelInputError, match="aligned"):
            int4_matmul(np.zeros(2 * 64 + 1, np.float16)[1:].reshape(2, 64), w)
        from numba import cuda
        with pytest.raises(KernelInputError, match="numpy array in the simulator"):
            int4_matmul(cuda.to_device(x), w)     # the simulator's device array: a clear error, no crash


def _pdl_chain(m, n_a, k_a, n_b, rounds, stream):
    """``rounds`` pairs A -> B launched back to back, B reading A's output as its activations.

    A's weights are integers (scale 1) and each row of its input has 8 entries of +-1, so every
    output of A is an integer |v| <= 56, whose float32 bits have a zero low half: read as float16
    pairs ``[M, 2 N_A]`` they are finite (0.0 and a value of magnitude < 4). A's outputs start as
    NaN, so a B that read them before A finished (a missing ``griddep_wait``) gives NaN.
    """
    rng = np.random.default_rng(m * 7 + n_a)
    codes = rng.integers(-7, 8, (n_a, k_a)).astype(np.int8)
    packed_a, scales_a = pack_int4(codes), np.ones((n_a, k_a // 32), np.float16)
    w_a = repack_int4(packed_a, scales_a)
    w_a = w_a if SIMULATED else w_a.to_device()
    w_b, packed_b, scales_b = _weight(n_b, 2 * n_a, 32, m)
    xs, outs_a, outs_b = [], [], []
    for _ in range(rounds):
        x = np.zeros((m, k_a), np.float16)
        for row in x:
            row[rng.choice(k_a, 8, replace=False)] = rng.choice([-1.0, 1.0], 8)
        xs.append(x)
        outs_a.append(poisoned((m, n_a)))
        outs_b.append(poisoned((m, n_b)))
    for x, oa, ob in zip(xs, outs_a, outs_b, strict=True):
        int4_matmul(dev(x), w_a, out=oa, stream=stream)
        int4_matmul(oa.reshape(m * n_a).view(np.float16).reshape(m, 2 * n_a), w_b, out=ob, stream=stream)
    if stream is not None:
        stream.synchronize()
    for x, oa, ob in zip(xs, outs_a, outs_b, strict=True):
        a = host(oa)
        assert_close(a, int4_linear(x, packed_a, scales_a), what=f"A M={m}")
        assert_close(host(ob), int4_linear(a.view(np.float16), packed_b, scales_b), what=f"B M={m}")


def test_dependent_launches():
    """A kernel reading the previous kernel's output (the order PDL launches must keep)."""
    _pdl_chain(2, 32, 64, 16, rounds=2, stream=None)


@gpu
@needs_gpu
@pytest.mark.parametrize("m", [1, 16])
@pytest.mark.parametrize("own_stream", [False, True])
def test_gpu_dependent_launches(m, own_stream):
    from numba import cuda
    _pdl_chain(m, 2048, 7168, 7168, rounds=16, stream=cuda.stream() if own_stream else None)


@gpu
@needs_gpu
@pytest.mark.parametrize("m", [1, 2, 8, 16, 32, 33, 64, 100])
@pytest.mark.parametrize("n,k", [(2048, 7168), (7168, 2048)])
def test_gpu_k2_shapes(m, n, k):
    _check(m, n, k, 32, seed=m + n)


@gpu
@needs_gpu
@pytest.mark.parametrize("m", [33, 48, 64])
@pytest.mark.parametrize("n,k", [(2048, 7168), (7168, 2048)])
@pytest.mark.parametrize("prescale", [False, True])
def test_gpu_wgmma_k2_shapes(m, n, k, prescale):
    """The hardware's wgmma (descriptor fields, fragment layouts, the async pipeline) against the reference
    at K2 shapes: what the simulator tier cannot see."""
    _check(m, n, k, 32, seed=m + n + 7, config=wgmma_config(k, n, prescale))


@gpu
@needs_gpu
@pytest.mark.parametrize("m", [9, 16, 30])
def test_gpu_paired_and_odd_tile_counts(m):
    """Gate/up widths at the paired M buckets: 127 tiles (no pairs) and 2 x 64 tiles by default."""
    _check(m, 2032, 7168, 32, seed=m)
    _check(m, 2048, 7168, 32, seed=m + 1, config=choose_config(m, 7168))


@gpu
@needs_gpu
@pytest.mark.parametrize("g", [64, 128])
def test_gpu_group_sizes(g):
    _check(16, 1024, 2048, g, seed=g)

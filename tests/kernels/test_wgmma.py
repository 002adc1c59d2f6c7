"""The wgmma intrinsics against numpy, from the operand layouts written out here (kernels_numba/wgmma.py's
notes): the simulator's fallbacks in CI, the hardware's wgmma in the GPU tier (descriptor fields,
fragment layouts, the async group: what the simulator cannot show)."""

import numpy as np
import pytest
from numba import cuda, uint32

from kernels_numba import wgmma as kw

from .helpers import dev, gpu, host, needs_gpu

LAYOUTS = [(64, 1024, 128), (40, 128, 256)]          # (N, lbo, sbo): K halves far apart, or N-blocks


def _fragments(a: np.ndarray) -> np.ndarray:
    """A [64, 16] f16 as each thread's 4 words [128, 4]: warp w rows 16w.., lane 4g + t; word j holds
    rows g + 8 (j % 2), columns 2t + 8 (j // 2) and the next (low half first)."""
    out = np.zeros((128, 4, 2), np.float16)
    for th in range(128):
        w, lane = divmod(th, 32)
        g, t = divmod(lane, 4)
        for j in range(4):
            for h in range(2):
                out[th, j, h] = a[16 * w + g + 8 * (j % 2), 2 * t + 8 * (j // 2) + h]
    return out.reshape(128, 8).view(np.uint32)


def _b_words(b: np.ndarray, n: int, lbo: int, sbo: int, words: int) -> np.ndarray:
    """B [16, n] f16 in shared-memory words: element (k, c) at byte (c // 8) sbo + (c % 8) 16 +
    (k // 8) lbo + 2 (k % 8)."""
    halves = np.zeros(2 * words, np.float16)
    for k in range(16):
        for c in range(n):
            halves[((c // 8) * sbo + (c % 8) * 16 + (k // 8) * lbo + 2 * (k % 8)) // 2] = b[k, c]
    return halves.view(np.uint32)


def _b_read(b: np.ndarray, n: int, lbo: int, sbo: int, words: int) -> np.ndarray:
    """The 16 x n B a descriptor with the two offsets' roles exchanged reads from ``_b_words``'s layout:
    what a wrong field assignment would multiply."""
    halves = _b_words(b, n, lbo, sbo, words).view(np.float16)
    out = np.zeros((16, n))
    for k in range(16):
        for c in range(n):
            out[k, c] = halves[((c // 8) * lbo + (c % 8) * 16 + (k // 8) * sbo + 2 * (k % 8)) // 2]
    return out


def _gather_d(regs: np.ndarray, n: int) -> np.ndarray:
    """Each thread's n / 2 registers [128, n / 2] as D [64, n]: register 4j + r of lane 4g + t in warp w
    is row 16w + g + 8 (r >> 1), column 8j + 2t + (r & 1)."""
    d = np.full((64, n), np.nan)
    for th in range(128):
        w, lane = divmod(th, 32)
        g, t = divmod(lane, 4)
        for i in range(n // 2):
            j, r = divmod(i, 4)
            d[16 * w + g + 8 * (r >> 1), 8 * j + 2 * t + (r & 1)] = regs[th, i]
    return d


def _make_kernel(n: int, lbo: int, sbo: int, words: int):
    SW, ND = 2 * words, n // 2                          # sizes the compiler sees: constants, not expressions

    @cuda.jit
    def kernel(out, parts, a0w, a1w, scales, bw):
        """A0 B0, then A1 s B1 over it with keep 0 (the exact form's two products: A1 by split_scale's hi
        and lo halves, each scaled with scale_a16), then A0 B0 added again: A1 s B1 + A0 B0."""
        sm = cuda.shared.array(SW, uint32)
        tid = cuda.threadIdx.x
        th = tid % 128
        for i in range(tid, SW, cuda.blockDim.x):
            sm[i] = bw[i]
        kw.fence_proxy_async()
        cuda.syncthreads()
        hi, lo = kw.split_scale(scales[th])
        parts[tid, 0] = hi
        parts[tid, 1] = lo
        qa = kw.scale_a16(a1w[th, 0], a1w[th, 1], a1w[th, 2], a1w[th, 3], hi)
        qb = kw.scale_a16(a1w[th, 0], a1w[th, 1], a1w[th, 2], a1w[th, 3], lo)
        d = kw.acc_zeros(ND)
        kw.wgmma_fence()
        d = kw.wgmma_f16(d, a0w[th, 0], a0w[th, 1], a0w[th, 2], a0w[th, 3], sm, 0, lbo, sbo, 1)
        d = kw.wgmma_f16(d, qa[0], qa[1], qa[2], qa[3], sm, words, lbo, sbo, 0)
        d = kw.wgmma_f16(d, qb[0], qb[1], qb[2], qb[3], sm, words, lbo, sbo, 1)
        d = kw.wgmma_f16(d, a0w[th, 0], a0w[th, 1], a0w[th, 2], a0w[th, 3], sm, 0, lbo, sbo, 1)
        kw.wgmma_commit()
        kw.wgmma_wait(0)
        for i in range(ND):
            out[tid, i] = d[i]
    return kernel


def _run(n, lbo, sbo, warpgroups=1):
    rng = np.random.default_rng(n + lbo)
    a0, a1 = (rng.integers(-8, 8, (64, 16)).astype(np.float16) for _ in range(2))
    b0, b1 = (rng.integers(-8, 8, (16, n)).astype(np.float16) for _ in range(2))
    row_scale = (1 + rng.integers(0, 1024, 64) / 1024).astype(np.float16)    # [1, 2), all 11 bits
    scales = np.zeros(128, np.uint32)                   # thread's (row g, row g + 8) pair of its warp
    for th in range(128):
        w, lane = divmod(th, 32)
        g = lane // 4
        pair = np.array([row_scale[16 * w + g], row_scale[16 * w + g + 8]], np.float16)
        scales[th] = pair.view(np.uint32)[0]
    words = max((n // 8 - 1) * max(lbo, sbo) + 128 + max(lbo, sbo), 16 * 4) // 4   # either offset order
    bw = np.concatenate([_b_words(b0, n, lbo, sbo, words), _b_words(b1, n, lbo, sbo, words)])
    out = dev(np.full((128 * warpgroups, n // 2), np.nan, np.float32))
    parts = dev(np.zeros((128 * warpgroups, 2), np.uint32))
    kernel = _make_kernel(n, lbo, sbo, words)
    kernel[1, 128 * warpgroups](out, parts, dev(_fragments(a0)), dev(_fragments(a1)), dev(scales), dev(bw))
    hi, lo = (np.ascontiguousarray(host(parts)[:128, j]).view(np.float16).reshape(128, 2) for j in range(2))
    assert not (hi.view(np.uint16) & 0xF).any()                     # 7 significant bits
    np.testing.assert_array_equal(hi.astype(np.float64) + lo, scales.view(np.float16).reshape(128, 2))
    a1s = a1.astype(np.float64) * row_scale.astype(np.float64)[:, None]
    want = a1s @ b1 + a0.astype(np.float64) @ b0
    for wg in range(warpgroups):
        got = _gather_d(host(out)[128 * wg:128 * wg + 128], n)
        if not np.array_equal(got, want):          # each product and sum exact in f32 (< 2^12, 2^-10 apart)
            read = [_b_read(b, n, lbo, sbo, words) for b in (b0, b1)]   # the B a swapped descriptor reads
            swapped = a1s @ read[1] + a0.astype(np.float64) @ read[0]
            hint = (" (the hardware reads lbo as the N-direction offset and sbo as the K one: swap them in "
                    "wgmma.wgmma_f16)" if np.array_equal(got, swapped) else "")
            raise AssertionError(f"wgmma n={n} lbo={lbo} sbo={sbo}: {int((got != want).sum())} of {got.size} "
                                 f"outputs differ{hint}")


@pytest.mark.parametrize("n,lbo,sbo", LAYOUTS)
def test_wgmma_operand_layouts(n, lbo, sbo):
    _run(n, lbo, sbo)


def test_wgmma_two_warpgroups():
    _run(64, 1024, 128, warpgroups=2)


@gpu
@needs_gpu
@pytest.mark.parametrize("n,lbo,sbo", LAYOUTS)
def test_wgmma_operand_layouts_gpu(n, lbo, sbo):
    _run(n, lbo, sbo)
    _run(n, lbo, sbo, warpgroups=2)

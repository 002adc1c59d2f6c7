"""W4A16 GEMV/GEMM on tensor cores: ``out [M, N] = f16(x) [M, K] @ ((u - 8) * scale).T``, f32 accumulation.

Legend: M activation rows, N output rows, K input columns, G group size; MT m8-tiles per block
(the M bucket), KS warps per block splitting K, CPW 64-column chunks per warp, KC = K/64.

Design (docs/perf.md has the version ladder and measurements; dev/kernels/int4_matmul.py the ladder):
- "swap A/B": weights are the A operand of ``mma.m16n8k16`` (16 output rows per MMA), activations
  the B operand (8 rows), so M = 1 wastes 7/8 of an MMA instead of 15/16, and one kernel covers
  M = 1..64 with MT = 1, 2, 4, 8 m8-tiles (the M buckets); M > 64 adds grid rows of 64.
- One block = one 16-row weight tile; its KS warps split K into contiguous slices. Each lane first
  issues all CPW 16-byte weight loads of its slice (``ld.global.nc.L1::no_allocate``: weights are
  read exactly once and must not evict activations), then dequantizes (lop3 magic-number trick,
  exact) and runs the MMAs. The weights are streamed once for any M <= 64.
- Scales are applied per group in f32 outside the MMA: ``acc += s * sum_k q x`` equals the
  definition ``sum_k x (q s)`` up to rounding order, and q (integers |q| <= 8) is exact in f16.
- Partial sums of the KS warps meet in shared memory; a fixed-order sum writes ``out`` (f32).
- Launched with PDL (``launch.py``): phase 1 (the weight loads) overlaps the previous kernel in the
  stream; ``griddep_wait`` comes before the first activation read and output write. ptxas moves
  some ``.nc`` weight loads past a plain wait (offline SASS); PIN configs wait with
  ``griddep_wait_for`` the XOR of every phase-1 word, which keeps all of them before it (measured
  faster only where listed in ``PINNED``); COHERENT configs load the weights with the coherent
  ``ld.global.L1::no_allocate``, which ptxas keeps before a plain wait (faster only there).
- Branch-free inner loop: when KS * CPW == K/64 (the chosen configs) there are no chunk guards;
  rows past M read row M-1 (their outputs are never stored; for MT = 1 they are also masked to
  zero, which ptxas schedules better there); for G = 32 each 32-column half is one group, so its
  two MMAs start from zero and no partial-sum registers are kept.
"""

from __future__ import annotations

import functools

import numpy as np
from numba import cuda, float32, uint32

from ._validate import GRID_Y_MAX, KernelInputError, as_stream, check, empty, flat
from .int4_layout import Int4Weight
from .intrinsics import (
    SIMULATED,
    bulk_copy_mc,
    cluster_rank,
    cluster_size,
    cluster_sync,
    dequant_i4x8,
    fence_mbar_init,
    griddep_launch_dependents,
    griddep_wait,
    griddep_wait_for,
    h2_to_f32,
    ld_once_v4,
    ld_shared_v4,
    ld_stream_v4,
    ld_v4,
    mbar_expect_tx,
    mbar_init,
    mbar_wait,
    mma_16816,
)
from .launch import launch

MT_BUCKETS = (1, 2, 4, 8)          # m8 tiles per block: M <= 8, 16, 32, 64
ZERO = float32(0.0)
SHARED_MAX = 232448                # bytes of shared memory one block may have on sm_90 (227 KB)


def _x_stage_layout(k: int, mt: int) -> tuple[int, int]:
    """Staged x (XC > 0): words per row (K/2 + 16: 64 bytes of padding put rows g and g + 1 on other
    banks, so ld.shared.v4 of a fragment is conflict-free) and the word of the first barrier."""
    xrow = k // 2 + 16
    return xrow, 8 * mt * xrow


def x_stage_bytes(k: int, mt: int, cpw: int) -> int:
    """Dynamic shared memory of an XC > 0 block: 8 MT staged x rows and one 8-byte barrier per stage
    (CPW of them)."""
    return _x_stage_layout(k, mt)[1] * 4 + 8 * cpw


@functools.cache
def make_int4_matmul_kernel(K: int, G: int, MT: int, KS: int, CPW: int, XC: int = 0):
    """Kernel factory: K, G and the tiling are compile-time constants (closure variables); XC > 0
    stages x in shared memory, multicast to the XC blocks of a cluster (``x_stage_bytes``)."""
    KC = K // 64                   # 64-column chunks per weight row tile
    NS = K // G                    # scale groups per row
    TILE_W = KC * 128              # uint32 words per 16-row tile
    SPC = 2 if G == 32 else 1      # scale words a lane loads per chunk (= groups per chunk, G <= 64)
    EXACT = KS * CPW == KC         # every warp's slice is full: no chunk guards
    NACC = MT * 4                  # accumulator registers per lane
    MASK = MT == 1                 # zero rows past M (not needed: never stored; ptxas schedules M = 1 better)
    PIN = EXACT and G == 32 and (MT, K, KS, CPW) in PINNED   # wait on the XOR of the phase-1 words
    ONCE = G == 32 and (MT, K, KS, CPW) in COHERENT           # coherent weight loads (see COHERENT)
    NOUT = MT * 128                # outputs per block (16 rows x 8 MT columns)
    NTHR = KS * 32
    NRED = KS * NACC * 32          # shared floats for the cross-warp reduction
    XROW, XBAR = _x_stage_layout(K, MT)   # XC: staged x row stride and first barrier (shared words)
    NRED_S = 0 if XC else NRED     # XC: the sum reuses the staged x (dynamic shared memory)
    CSTEP = KS if XC else 1        # chunk c0 + ci * CSTEP is a warp's ci-th: XC strides them, so the
                                   # ci-th chunks of all KS warps (stage ci) are one stretch of x
    NWL = CPW * 4                  # weight words held per lane
    NSL = CPW * SPC                # scale words held per lane
    # MT >= 2: <= 128 registers, 4 blocks of 4 warps per SM, so K2 down (448 blocks) runs in one wave
    # at M = 16 (uncapped it took 192 registers: 2 waves, 6.34 vs 5.42 us); no config spills at 128
    # (offline SASS). MT = 1 stays uncapped: capped, K2 down M = 1 ran 3.90 us instead of 3.66.
    opts = {} if SIMULATED else {"max_registers": min(128 if MT > 1 else 255, 65536 // NTHR // 8 * 8)}

    @cuda.jit(**opts)
    def int4_matmul_kernel(out, x, wq, sq, m_rows, n_rows):
        griddep_launch_dependents()                           # the next kernel may start its weight loads
        tile = cuda.blockIdx.x                                # 16 output rows
        m0 = cuda.blockIdx.y * (8 * MT)                       # first activation row of this block
        tid = cuda.threadIdx.x
        warp = tid >> 5
        lane = tid & 31
        g = lane >> 2
        t = lane & 3
        red = cuda.shared.array(NRED_S, float32)
        acc = cuda.local.array(NACC, float32)
        prt = cuda.local.array(NACC, float32)
        xb = cuda.local.array(MT, uint32)                     # first activation word index, per m8 tile
        xm = cuda.local.array(MT, uint32)                     # MASK: 0xFFFFFFFF for rows < M, else 0
        for i in range(NACC):
            acc[i] = ZERO
            prt[i] = ZERO
        c0 = warp if XC else warp * CPW
        if XC and tid < CPW:
            mbar_init(red, XBAR + 2 * tid, 1)                 # one barrier per stage: its x has landed
        # phase 1: all 16-byte weight loads (and scale words) of this warp's slice in flight at
        # once; index math once, constant offsets inside the unrolled loop
        wl = cuda.local.array(NWL, uint32)
        sl = cuda.local.array(NSL, uint32)
        wbase = tile * TILE_W + c0 * 128 + lane * 4
        sbase = (tile * NS + (c0 * 64) // G) * 8 + g
        for ci in range(CPW):
            if EXACT or c0 + ci * CSTEP < KC:
                if ONCE:
                    w = ld_once_v4(wq, wbase + ci * CSTEP * 128)
                else:
                    w = ld_stream_v4(wq, wbase + ci * CSTEP * 128)
                for j in range(4):
                    wl[ci * 4 + j] = w[j]
                for j in range(SPC):
                    sl[ci * SPC + j] = sq[sbase + ((ci * CSTEP * 64) // G + j) * 8]
        if XC:
            fence_mbar_init()
            cluster_sync()                                    # every barrier of the cluster is ready
        if PIN:                                               # x and out belong to the previous kernel
            pin = uint32(0)                                   # every word phase 1 loaded
            for j in range(NWL):
                pin ^= wl[j]
            for j in range(NSL):
                pin ^= sl[j]
            griddep_wait_for(pin)
        else:
            griddep_wait()
        if XC:                                                # x rows m0.. (< M) to shared memory: lane 0
            nrows = min(8 * MT, m_rows - m0)                  # of warp w copies rows w, w + KS, ..., each
            nrk = cluster_size()                              # stage by stage, and multicasts them to the
            if tid == 0:                                      # cluster (each row by one of its blocks)
                for st in range(CPW):
                    mbar_expect_tx(red, XBAR + 2 * st, nrows * KS * 128)
            if lane == 0:
                for row in range(warp, nrows, KS):
                    if (row & (nrk - 1)) == cluster_rank():
                        for st in range(CPW):
                            bulk_copy_mc(red, row * XROW + st * KS * 32, x, (m0 + row) * K + st * KS * 64,
                                         KS * 128, red, XBAR + 2 * st, (1 << nrk) - 1)
        for mt in range(MT):
            m = m0 + mt * 8 + g
            if MASK:
                xm[mt] = uint32(0xFFFFFFFF) if m < m_rows else uint32(0)
            if XC:                                            # word index in the staged rows
                xb[mt] = (mt * 8 + g) * XROW + c0 * 32 + 4 * t
            else:
                xb[mt] = min(m, m_rows - 1) * K + c0 * 64 + 8 * t
        # phase 2: dequantize (exact), MMA, scale per group
        for ci in range(CPW):
            if EXACT or c0 + ci * CSTEP < KC:
                if XC:
                    mbar_wait(red, XBAR + 2 * ci, 0)
                for h in range(2):
                    a = dequant_i4x8(wl[ci * 4 + 2 * h])
                    b = dequant_i4x8(wl[ci * 4 + 2 * h + 1])
                    s_lo, s_hi = h2_to_f32(sl[ci * SPC + h * (SPC - 1)])
                    for mt in range(MT):
                        if XC:
                            xv = ld_shared_v4(red, xb[mt] + ci * KS * 32 + 16 * h)
                        else:
                            xv = ld_v4(x, xb[mt] + ci * 64 + 32 * h)
                        if MASK:
                            k0, k1, k2, k3 = xv[0] & xm[mt], xv[1] & xm[mt], xv[2] & xm[mt], xv[3] & xm[mt]
                        else:
                            k0, k1, k2, k3 = xv[0], xv[1], xv[2], xv[3]
                        if G == 32:                           # one group per half: start from zero
                            d = mma_16816(a[0], a[1], a[2], a[3], k0, k1, ZERO, ZERO, ZERO, ZERO)
                        else:
                            d = mma_16816(a[0], a[1], a[2], a[3], k0, k1, prt[mt * 4], prt[mt * 4 + 1],
                                          prt[mt * 4 + 2], prt[mt * 4 + 3])
                        d = mma_16816(b[0], b[1], b[2], b[3], k2, k3, d[0], d[1], d[2], d[3])
                        if G == 32 or h == 1:                 # end of a group (or of a chunk, G > 64)
                            acc[mt * 4 + 0] += s_lo * d[0]
                            acc[mt * 4 + 1] += s_lo * d[1]
                            acc[mt * 4 + 2] += s_hi * d[2]
                            acc[mt * 4 + 3] += s_hi * d[3]
                            for r in range(4):
                                prt[mt * 4 + r] = ZERO
                        else:
                            for r in range(4):
                                prt[mt * 4 + r] = d[r]
        # the KS warps' partial tiles meet in shared memory; fixed-order sum, one output per thread
        if XC:
            cuda.syncthreads()                                # every warp is done with the staged x
        for i in range(NACC):
            red[(warp * NACC + i) * 32 + lane] = acc[i]
        cuda.syncthreads()
        for o in range(tid, NOUT, NTHR):
            s = ZERO
            for w_ in range(KS):
                s += red[(w_ * NACC + (o >> 5)) * 32 + (o & 31)]
            mt = o >> 7
            r = (o >> 5) & 3
            ln = o & 31
            n = tile * 16 + (ln >> 2) + 8 * (r >> 1)
            m = m0 + mt * 8 + 2 * (ln & 3) + (r & 1)
            if n < n_rows and m < m_rows:
                out[m * n_rows + n] = s

    return int4_matmul_kernel


# (MT, KS, CPW) measured best on the H200 per (M bucket, K) (docs/perf.md, v4 sweep); others: heuristic
_TUNED = {(1, 7168): (1, 16, 7), (2, 7168): (2, 16, 7), (1, 2048): (1, 4, 8), (2, 2048): (2, 4, 8),
          (4, 2048): (4, 4, 8)}         # M = 32 down: 8.72 us vs 13.54 for the heuristic's (4, 16, 2)
# (MT, K, KS, CPW) measured faster with the PIN wait (ladder --m16, two runs: K2 down M = 16 5.18 /
# 5.23 vs 5.53 / 5.52 us); slower at gate/up M = 1 / 16, down M = 1 and down (2, 8, 4)
PINNED = {(2, 2048, 4, 8)}
# (MT, K, KS, CPW) measured faster with coherent weight loads (ld_once_v4, which ptxas keeps before the
# wait; ladder --m16, two runs: K2 down M = 32 7.83 / 7.99 vs 8.77 / 8.85 us); slower at M = 1 and at
# gate/up M = 32 / 64, equal at M = 16 and down M = 64
COHERENT = {(4, 2048, 4, 8)}


def choose_config(m: int, k: int, g: int = 32) -> tuple[int, int, int]:
    """(MT, KS, CPW): the M bucket, warps per block, chunks per warp."""
    mt = next(b for b in MT_BUCKETS if m <= 8 * b) if m <= 64 else 8
    if (mt, k) in _TUNED and g == 32:
        return _TUNED[(mt, k)]
    kc = k // 64
    cpw_max = 8 if mt <= 4 else 4                       # keep the unrolled loops in registers
    ks_max = 32 if mt <= 2 else 16
    cpw = min(cpw_max, max(1, -(-kc // ks_max)))
    while cpw > 1 and kc % cpw:                         # prefer exact slices (no guards)
        cpw -= 1
    if g == 128 and cpw % 2 and cpw < kc:
        cpw += 1                                        # a warp's slice starts on a 128-column group
    return mt, -(-kc // cpw), cpw


def int4_matmul(x, weight: Int4Weight, out=None, stream=None, config: tuple[int, ...] | None = None,
                pdl: bool = True):
    """``out [M, N] float32 = f16(x) @ W.T`` for a repacked W4A16 weight (``repack_int4``).

    ``x`` float16 ``[M, K]`` C-contiguous, 16-byte aligned, M >= 1; ``weight`` an ``Int4Weight``
    on the device (``.to_device()``); ``out`` optional float32 ``[M, N]`` (allocated if None).
    Accepts numba device arrays or torch CUDA tensors; launches on ``stream`` (numba stream,
    torch stream or raw handle; None = default). ``config`` (MT, KS, CPW) or (MT, KS, CPW, XC)
    overrides ``choose_config``; XC > 0 stages x in shared memory by bulk copies multicast to a
    cluster of XC blocks (XC = 1: no cluster), so the L2 serves each x row once per cluster.
    ``pdl``: launch with programmatic dependent launch (``launch.py``), so the
    weight loads overlap the previous kernel in the stream. Raises KernelInputError before launching
    on any bad input.
    """
    if not isinstance(weight, Int4Weight) or weight.experts or weight.pair:
        raise KernelInputError("weight must be a single-matrix Int4Weight from repack_int4(...).to_device()")
    n, k, gs = weight.n, weight.k, weight.group_size
    if gs not in (32, 64, 128) or k % 64 or k % gs or n < 1:
        raise KernelInputError(f"unsupported weight: N={n} K={k} G={gs} (K % 64 == 0, G in 32/64/128)")
    x = check(x, "x", np.float16, (None, k))
    m = x.shape[0]
    if m < 1:
        raise KernelInputError("x must have at least one row")
    wq = check(weight.wq, "weight.wq", np.uint32, (weight.n16 * k * 2,))
    sq = check(weight.sq, "weight.sq", np.uint32, (weight.n16 * (k // gs) * 8,), align=4)
    stream = as_stream(stream)
    if out is None:
        out = empty((m, n), np.float32, stream)
    out = check(out, "out", np.float32, (m, n), align=4)
    mt, ks, cpw, xc = (*(config or choose_config(m, k, gs)), 0)[:4]
    if mt not in MT_BUCKETS or not 1 <= ks <= 32 or cpw < 1 or ks * cpw < k // 64 or (
            gs == 128 and cpw % 2 and ks > 1):
        raise KernelInputError(f"bad config MT={mt} KS={ks} CPW={cpw} for K={k} G={gs}")
    grid = (weight.n16, -(-m // (8 * mt)))
    if grid[1] > GRID_Y_MAX or m * max(n, k) > 2**31 - 1:
        raise KernelInputError(f"M={m} exceeds the grid / int32 limits")
    shared = x_stage_bytes(k, mt, cpw) if xc else 0
    if xc and (xc not in (1, 2, 4) or mt > 4 or gs > 64 or ks * cpw != k // 64 or grid[0] % xc
               or shared > SHARED_MAX):
        raise KernelInputError(f"bad staged-x config MT={mt} KS={ks} CPW={cpw} XC={xc} for N={n} K={k} "
                               f"G={gs}: needs XC in 1/2/4, MT <= 4, G <= 64, KS*CPW = K/64, N/16 % XC = 0 "
                               f"and {shared} <= {SHARED_MAX} bytes of shared memory")
    kernel = make_int4_matmul_kernel(k, gs, mt, ks, cpw, xc)
    launch(kernel, grid, ks * 32, stream, (flat(out), flat(x), wq, sq, m, n), pdl, shared, max(xc, 1))
    return out

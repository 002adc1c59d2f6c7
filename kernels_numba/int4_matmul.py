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
  faster only where listed in ``PINNED``).
- Branch-free inner loop: when KS * CPW == K/64 (the chosen configs) there are no chunk guards;
  rows past M read row M-1 (their outputs are never stored; for MT = 1 they are also masked to
  zero, which ptxas schedules better there); for G = 32 each 32-column half is one group, so its
  two MMAs start from zero and no partial-sum registers are kept.
"""

from __future__ import annotations

import functools

import numpy as np
from numba import cuda, float32, int32, uint32

from ._validate import GRID_Y_MAX, KernelInputError, as_stream, check, empty, flat
from .int4_layout import Int4Weight
from .intrinsics import (
    SIMULATED,
    dequant_i4x8,
    griddep_launch_dependents,
    griddep_wait,
    griddep_wait_for,
    h2_to_f32,
    ld_cg_f32,
    ld_stream_v4,
    ld_v4,
    mma_16816,
)
from .launch import launch

MT_BUCKETS = (1, 2, 4, 8)          # m8 tiles per block: M <= 8, 16, 32, 64
XS_SPLITS = (1, 2, 4)              # 16-row tiles per block = blocks splitting K
ZERO = float32(0.0)


@functools.cache
def make_int4_matmul_kernel(K: int, G: int, MT: int, KS: int, CPW: int, XS: int = 1):
    """Kernel factory: K, G and the tiling are compile-time constants (closure variables)."""
    KC = K // 64                   # 64-column chunks per weight row tile
    KCB = KC // XS                 # chunks per block (XS blocks split K)
    NS = K // G                    # scale groups per row
    TILE_W = KC * 128              # uint32 words per 16-row tile
    SPC = 2 if G == 32 else 1      # scale words a lane loads per chunk (= groups per chunk, G <= 64)
    EXACT = KS * CPW == KCB        # every warp's slice is full: no chunk guards
    NACC = XS * MT * 4             # accumulator registers per lane: XS tiles x MT m8 tiles
    MASK = MT == 1                 # zero rows past M (not needed: never stored; ptxas schedules M = 1 better)
    PIN = EXACT and G == 32 and XS == 1 and (MT, K, KS, CPW) in PINNED   # wait on the XOR of phase 1
    NOUT = XS * MT * 128           # outputs per block (XS x 16 rows x 8 MT columns)
    NTHR = KS * 32
    NRED = KS * NACC * 32          # shared floats for the cross-warp reduction
    NWL = XS * CPW * 4             # weight words held per lane
    NSL = XS * CPW * SPC           # scale words held per lane
    NDQ, NSC = XS * 8, XS * 2      # dequantized words and scales of one half-chunk of the XS tiles
    # MT >= 2: <= 128 registers, 4 blocks of 4 warps per SM, so K2 down (448 blocks) runs in one wave
    # at M = 16 (uncapped it took 192 registers: 2 waves, 6.34 vs 5.42 us); no config spills at 128
    # (offline SASS). MT = 1 stays uncapped: capped, K2 down M = 1 ran 3.90 us instead of 3.66.
    opts = {} if SIMULATED else {"max_registers": min(128 if MT > 1 else 255, 65536 // NTHR // 8 * 8)}

    @cuda.jit(**opts)
    def int4_matmul_kernel(out, x, wq, sq, m_rows, n_rows, part, cnt):
        griddep_launch_dependents()                           # the next kernel may start its weight loads
        grp = cuda.blockIdx.x // XS                           # XS tiles of 16 output rows
        kb = cuda.blockIdx.x - grp * XS                       # which 1/XS of K this block sums
        n16 = (n_rows + 15) >> 4
        m0 = cuda.blockIdx.y * (8 * MT)                       # first activation row of this block
        tid = cuda.threadIdx.x
        warp = tid >> 5
        lane = tid & 31
        g = lane >> 2
        t = lane & 3
        red = cuda.shared.array(NRED, float32)
        last = cuda.shared.array(1, int32)
        acc = cuda.local.array(NACC, float32)
        prt = cuda.local.array(NACC, float32)
        xb = cuda.local.array(MT, uint32)                     # first activation word index, per m8 tile
        xm = cuda.local.array(MT, uint32)                     # MASK: 0xFFFFFFFF for rows < M, else 0
        dq = cuda.local.array(NDQ, uint32)                    # dequantized half2 pairs of one half-chunk
        sc = cuda.local.array(NSC, float32)                   # its scales (rows g, g + 8)
        for i in range(NACC):
            acc[i] = ZERO
            prt[i] = ZERO
        # phase 1: all 16-byte weight loads (and scale words) of this warp's slice of its XS tiles in
        # flight at once; index math once, constant offsets inside the unrolled loop. A tile past the
        # last one (odd tile count) reads the last one again; its outputs are not stored
        wl = cuda.local.array(NWL, uint32)
        sl = cuda.local.array(NSL, uint32)
        c0 = kb * KCB + warp * CPW                            # first chunk of this warp's slice
        for j in range(XS):
            tile = grp if XS == 1 else min(grp * XS + j, n16 - 1)
            wbase = tile * TILE_W + c0 * 128 + lane * 4
            sbase = (tile * NS + (c0 * 64) // G) * 8 + g
            for ci in range(CPW):
                if EXACT or warp * CPW + ci < KCB:
                    w = ld_stream_v4(wq, wbase + ci * 128)
                    for q in range(4):
                        wl[(j * CPW + ci) * 4 + q] = w[q]
                    for q in range(SPC):
                        sl[(j * CPW + ci) * SPC + q] = sq[sbase + ((ci * 64) // G + q) * 8]
        if PIN:                                               # x and out belong to the previous kernel
            pin = uint32(0)                                   # every word phase 1 loaded
            for j in range(NWL):
                pin ^= wl[j]
            for j in range(NSL):
                pin ^= sl[j]
            griddep_wait_for(pin)
        else:
            griddep_wait()
        for mt in range(MT):
            m = m0 + mt * 8 + g
            if MASK:
                xm[mt] = uint32(0xFFFFFFFF) if m < m_rows else uint32(0)
            xb[mt] = min(m, m_rows - 1) * K + c0 * 64 + 8 * t
        # phase 2: dequantize (exact), MMA, scale per group; each x fragment serves the XS tiles
        for ci in range(CPW):
            if EXACT or warp * CPW + ci < KCB:
                for h in range(2):
                    for j in range(XS):
                        wi = (j * CPW + ci) * 4 + 2 * h
                        a = dequant_i4x8(wl[wi])
                        b = dequant_i4x8(wl[wi + 1])
                        for q in range(4):
                            dq[j * 8 + q] = a[q]
                            dq[j * 8 + 4 + q] = b[q]
                        sc[2 * j], sc[2 * j + 1] = h2_to_f32(sl[(j * CPW + ci) * SPC + h * (SPC - 1)])
                    for mt in range(MT):
                        xv = ld_v4(x, xb[mt] + ci * 64 + 32 * h)
                        if MASK:
                            k0, k1, k2, k3 = xv[0] & xm[mt], xv[1] & xm[mt], xv[2] & xm[mt], xv[3] & xm[mt]
                        else:
                            k0, k1, k2, k3 = xv[0], xv[1], xv[2], xv[3]
                        for j in range(XS):
                            o = (j * MT + mt) * 4
                            if G == 32:                       # one group per half: start from zero
                                d = mma_16816(dq[j * 8], dq[j * 8 + 1], dq[j * 8 + 2], dq[j * 8 + 3],
                                              k0, k1, ZERO, ZERO, ZERO, ZERO)
                            else:
                                d = mma_16816(dq[j * 8], dq[j * 8 + 1], dq[j * 8 + 2], dq[j * 8 + 3],
                                              k0, k1, prt[o], prt[o + 1], prt[o + 2], prt[o + 3])
                            d = mma_16816(dq[j * 8 + 4], dq[j * 8 + 5], dq[j * 8 + 6], dq[j * 8 + 7],
                                          k2, k3, d[0], d[1], d[2], d[3])
                            if G == 32 or h == 1:             # end of a group (or of a chunk, G > 64)
                                acc[o + 0] += sc[2 * j] * d[0]
                                acc[o + 1] += sc[2 * j] * d[1]
                                acc[o + 2] += sc[2 * j + 1] * d[2]
                                acc[o + 3] += sc[2 * j + 1] * d[3]
                                for r in range(4):
                                    prt[o + r] = ZERO
                            else:
                                for r in range(4):
                                    prt[o + r] = d[r]
        # the KS warps' partial tiles meet in shared memory; fixed-order sum, one output per thread
        for i in range(NACC):
            red[(warp * NACC + i) * 32 + lane] = acc[i]
        cuda.syncthreads()
        blk = cuda.blockIdx.y * cuda.gridDim.x + cuda.blockIdx.x
        if XS > 1:                                            # publish this block's sums for the group
            for o in range(tid, NOUT, NTHR):
                s = ZERO
                for w_ in range(KS):
                    s += red[(w_ * NACC + (o >> 5)) * 32 + (o & 31)]
                part[blk * NOUT + o] = s
            cuda.threadfence()
            cuda.syncthreads()
            if tid == 0:
                c = cuda.blockIdx.y * (cuda.gridDim.x // XS) + grp
                last[0] = int32(cuda.atomic.add(cnt, c, uint32(1)) == XS - 1)
                if last[0]:
                    cnt[c] = uint32(0)                        # ready for the next launch
            cuda.syncthreads()
            if last[0] == 0:
                return
            cuda.threadfence()
        for o in range(tid, NOUT, NTHR):
            s = ZERO
            if XS > 1:                                        # the group's XS sums in K order
                for b_ in range(XS):
                    s += ld_cg_f32(part, (blk - kb + b_) * NOUT + o)
            else:
                for w_ in range(KS):
                    s += red[(w_ * NACC + (o >> 5)) * 32 + (o & 31)]
            i = o >> 5                                        # acc index: (tile j * MT + mt) * 4 + r
            r = i & 3
            mt = (i >> 2) & (MT - 1)
            ln = o & 31
            n = (grp * XS + (i >> 2) // MT) * 16 + (ln >> 2) + 8 * (r >> 1)
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


def _parse_config(config, k: int, gs: int) -> tuple[int, int, int, int]:
    """(MT, KS, CPW, XS) from a 3- or 4-tuple config (XS defaults to 1), else KernelInputError."""
    try:
        mt, ks, cpw, xs = (*map(int, config), 1)[:4] if len(config) in (3, 4) else (0,) * 4
    except (TypeError, ValueError):
        mt = ks = cpw = xs = 0
    kc = k // 64
    if (mt not in MT_BUCKETS or not 1 <= ks <= 32 or cpw < 1 or xs not in XS_SPLITS or kc % xs
            or ks * cpw < kc // xs or gs == 128 and (cpw % 2 and ks > 1 or (kc // xs) % 2 and xs > 1)):
        raise KernelInputError(f"bad config {config} (MT, KS, CPW[, XS]) for K={k} G={gs}")
    return mt, ks, cpw, xs


_WORKSPACES: dict = {}


def _split_workspace(stream, floats: int, counters: int):
    """The XS > 1 scratch: float32 partial sums and uint32 group counters (zero between launches: the
    last block of a group resets its counter). One per size for the process, never freed, so that a
    captured graph's pointers stay valid. Launches on one stream use it in turn (a launch touches it
    only after ``griddep_wait``); two XS > 1 launches of one size must not run concurrently on
    different streams. Not keyed by stream: a torch graph captures on a stream of its own, where
    nothing may be allocated."""
    key = (floats, counters)
    if key not in _WORKSPACES:
        if SIMULATED:
            _WORKSPACES[key] = np.empty(floats, np.float32), np.zeros(counters, np.uint32)
        else:
            _WORKSPACES[key] = (cuda.device_array(floats, np.float32, stream=stream),
                                cuda.to_device(np.zeros(counters, np.uint32), stream=stream))
    return _WORKSPACES[key]


def int4_matmul(x, weight: Int4Weight, out=None, stream=None, config: tuple[int, int, int] | None = None,
                pdl: bool = True):
    """``out [M, N] float32 = f16(x) @ W.T`` for a repacked W4A16 weight (``repack_int4``).

    ``x`` float16 ``[M, K]`` C-contiguous, 16-byte aligned, M >= 1; ``weight`` an ``Int4Weight``
    on the device (``.to_device()``); ``out`` optional float32 ``[M, N]`` (allocated if None).
    Accepts numba device arrays or torch CUDA tensors; launches on ``stream`` (numba stream,
    torch stream or raw handle; None = default). ``config`` (MT, KS, CPW) overrides
    ``choose_config``. ``pdl``: launch with programmatic dependent launch (``launch.py``), so the
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
    mt, ks, cpw, xs = _parse_config(config or choose_config(m, k, gs), k, gs)
    grid = (-(-weight.n16 // xs) * xs, -(-m // (8 * mt)))
    if grid[1] > GRID_Y_MAX or m * max(n, k) > 2**31 - 1:
        raise KernelInputError(f"M={m} exceeds the grid / int32 limits")
    blocks = grid[0] * grid[1]
    part, cnt = (_split_workspace(stream, blocks * xs * mt * 128, blocks // xs) if xs > 1
                 else (sq.view(np.float32), sq))        # untouched at XS = 1: any float32 / uint32
    kernel = make_int4_matmul_kernel(k, gs, mt, ks, cpw, xs)
    launch(kernel, grid, ks * 32, stream, (flat(out), flat(x), wq, sq, m, n, part, cnt), pdl)
    return out

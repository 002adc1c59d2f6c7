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
- Tile pairs (KP = 2; gate/up at M = 16 / 32): at M = 16 every block reads all of x (229 KB at K2
  gate/up) for 8 KB of output, and reading x from L2 is about a third of that time. With KP, block b of
  a cluster of 2 computes tiles b & ~1 and (b & ~1) + 1 over half b & 1 of K (KS / 2 warps per tile):
  warps w and w + KS / 2 read the same x, the second from L1, so each SM takes in half of x. Each block
  sums its half of both tiles and stores the other tile's with ``st.async`` into the other block's
  ``inbox``, completing bytes on its mbarrier; out = half 0 + half 1 in both blocks (f32 addition
  commutes, so the result does not depend on which block adds).
- Branch-free inner loop: when KS * CPW == K/64 (the chosen configs) there are no chunk guards;
  rows past M read row M-1 (their outputs are never stored; for MT = 1 they are also masked to
  zero, which ptxas schedules better there); for G = 32 each 32-column half is one group, so its
  two MMAs start from zero and no partial-sum registers are kept.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
from numba import cuda, float32, uint32, uint64

from ._validate import GRID_Y_MAX, KernelInputError, as_stream, check, empty, flat, zeroed
from .device import SIMULATED
from .int4_layout import Int4Weight
from .int4_staged import MAX_PX, MAX_SPLITS, Staged, make_int4_staged_kernel, partials
from .int4_wgmma import MAX_PX as WGMMA_MAX_PX
from .int4_wgmma import Wgmma, make_int4_wgmma_kernel
from .intrinsics import (
    cluster_arrive_relaxed,
    cluster_wait,
    dequant_i4x8,
    fence_mbar_init,
    griddep_launch_dependents,
    griddep_wait,
    griddep_wait_for,
    h2_to_f32,
    ld_once_v4,
    ld_stream_v4,
    ld_v4,
    mbar_expect_tx,
    mbar_init,
    mbar_wait,
    mma_16816,
    st_async_f32,
)
from .launch import CLUSTERS_AVAILABLE, launch

MT_BUCKETS = (1, 2, 4, 8)          # m8 tiles per block: M <= 8, 16, 32, 64
ZERO = float32(0.0)


@functools.cache
def make_int4_matmul_kernel(K: int, G: int, MT: int, KS: int, CPW: int, KP: int = 0):
    """Kernel factory: K, G and the tiling are compile-time constants (closure variables). KP = 2: tile
    pairs, each block of a cluster of 2 computing both tiles over its half of K (module notes)."""
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
    NWL = CPW * 4                  # weight words held per lane
    NSL = CPW * SPC                # scale words held per lane
    NTW = KS // 2 if KP else KS    # warps per 16-row tile
    # K halves a block computes: KP on the GPU runs in clusters of 2 (one half each); the simulator's
    # clusters have one block, which computes both (a compile-time trip count keeps the GPU build
    # straight-line: with a runtime one ptxas moves weight loads past the wait)
    NHB = 2 if KP and SIMULATED else 1
    # MT >= 2: <= 128 registers, so K2 down M = 16 fits 4 blocks per SM and runs in one wave; MT = 1
    # measured faster uncapped (docs/perf.md, int4_matmul ladder v6)
    opts = {} if SIMULATED else {"max_registers": min(128 if MT > 1 else 255, 65536 // NTHR // 8 * 8)}

    @cuda.jit(**opts)
    def int4_matmul_kernel(out, x, wq, sq, m_rows, n_rows):
        griddep_launch_dependents()                           # the next kernel may start its weight loads
        m0 = cuda.blockIdx.y * (8 * MT)                       # first activation row of this block
        tid = cuda.threadIdx.x
        warp = tid >> 5
        lane = tid & 31
        g = lane >> 2
        t = lane & 3
        red = cuda.shared.array(NRED, float32)
        inbox = cuda.shared.array(NOUT if KP else 1, float32)   # KP: the other block's half of my tile
        bar = cuda.shared.array(1, uint64)
        if KP:                                                # a tile pair: warp w computes tile w // NTW
            if tid == 0:                                      # (the exchange at the end: this barrier
                mbar_init(bar, 0, 1)                          # completes when the other block's half of
            fence_mbar_init()                                 # this block's tile has landed in inbox)
            cluster_arrive_relaxed()
            half = cuda.blockIdx.x & 1                        # this block's half of K (its cluster rank)
            tile = (cuda.blockIdx.x & ~1) + warp // NTW       # 16 weight rows
        else:
            tile = cuda.blockIdx.x
            half = 0
        acc = cuda.local.array(NACC, float32)
        prt = cuda.local.array(NACC, float32)
        xb = cuda.local.array(MT, uint32)                     # first activation word index, per m8 tile
        xm = cuda.local.array(MT, uint32)                     # MASK: 0xFFFFFFFF for rows < M, else 0
        for i in range(NACC):
            acc[i] = ZERO
            prt[i] = ZERO
        for hj in range(NHB):                                 # this block's halves of K (see NHB)
            hv = hj if NHB > 1 else half
            # phase 1: all 16-byte weight loads (and scale words) of this warp's slice in flight at
            # once; index math once, constant offsets inside the unrolled loop
            wl = cuda.local.array(NWL, uint32)
            sl = cuda.local.array(NSL, uint32)
            c0 = hv * (KC // 2) + (warp % NTW) * CPW if KP else warp * CPW
            wbase = tile * TILE_W + c0 * 128 + lane * 4
            sbase = (tile * NS + (c0 * 64) // G) * 8 + g
            for ci in range(CPW):
                if EXACT or c0 + ci < KC:
                    if ONCE:
                        w = ld_once_v4(wq, wbase + ci * 128)
                    else:
                        w = ld_stream_v4(wq, wbase + ci * 128)
                    for j in range(4):
                        wl[ci * 4 + j] = w[j]
                    for j in range(SPC):
                        sl[ci * SPC + j] = sq[sbase + ((ci * 64) // G + j) * 8]
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
            # phase 2: dequantize (exact), MMA, scale per group
            for ci in range(CPW):
                if EXACT or c0 + ci < KC:
                    for h in range(2):
                        a = dequant_i4x8(wl[ci * 4 + 2 * h])
                        b = dequant_i4x8(wl[ci * 4 + 2 * h + 1])
                        s_lo, s_hi = h2_to_f32(sl[ci * SPC + h * (SPC - 1)])
                        for mt in range(MT):
                            xv = ld_v4(x, xb[mt] + ci * 64 + 32 * h)
                            if MASK:
                                msk = xm[mt]
                                k0, k1, k2, k3 = xv[0] & msk, xv[1] & msk, xv[2] & msk, xv[3] & msk
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
        for i in range(NACC):
            red[(warp * NACC + i) * 32 + lane] = acc[i]
        cuda.syncthreads()
        if KP:                                                # each block sums its half for both tiles,
            own = ZERO                                        # stores the other tile's into the other
            o = tid                                           # block's inbox (st.async, completing bytes
            cluster_wait()                                    # on its barrier) and adds the half it gets:
            if tid == 0:                                      # out = half 0 + half 1 in both (exact order)
                mbar_expect_tx(bar, 0, NOUT * 4)              # (the wait: the other block has started)
            if o < NOUT:
                for w_ in range(NTW):
                    own += red[((half * NTW + w_) * NACC + (o >> 5)) * 32 + (o & 31)]
                if NHB == 1:
                    p = ZERO
                    for w_ in range(NTW):
                        p += red[(((half ^ 1) * NTW + w_) * NACC + (o >> 5)) * 32 + (o & 31)]
                    st_async_f32(inbox, o, half ^ 1, p, bar, 0)
            mbar_wait(bar, 0, 0)
            if o < NOUT and NHB == 1:
                own += inbox[o]
        for o in range(tid, NOUT, NTHR):                      # (KP: NOUT <= NTHR, o = tid)
            if KP:
                s = own
            else:
                s = ZERO
                for w_ in range(KS):
                    s += red[(w_ * NACC + (o >> 5)) * 32 + (o & 31)]
            mt = o >> 7
            r = (o >> 5) & 3
            ln = o & 31
            n = cuda.blockIdx.x * 16 + (ln >> 2) + 8 * (r >> 1)
            m = m0 + mt * 8 + 2 * (ln & 3) + (r & 1)
            if n < n_rows and m < m_rows:
                out[m * n_rows + n] = s

    return int4_matmul_kernel


# (MT, KS, CPW[, KP]) measured best on the H200 per (M bucket, K), the rest from the heuristic; tile
# pairs (KP = 2) only at gate/up M = 16 / 32, where they measured faster (docs/perf.md, v14)
_TUNED = {(1, 7168): (1, 16, 7), (2, 7168): (2, 16, 7, 2), (4, 7168): (4, 16, 7, 2), (1, 2048): (1, 4, 8),
          (2, 2048): (2, 4, 8), (4, 2048): (4, 4, 8)}
# (MT, K, KS, CPW) measured faster with the PIN wait (K2 down M = 16; slower elsewhere: docs/perf.md, v7)
PINNED = {(2, 2048, 4, 8)}
# (MT, K, KS, CPW) measured faster with coherent weight loads (ld_once_v4, which ptxas keeps before the
# wait): K2 down M = 32 only (docs/perf.md)
COHERENT = {(4, 2048, 4, 8)}


# the staged kernel (int4_staged.py) by default from this many rows on (the MT = 8 bucket and every grid
# row beyond): at both K2 shapes it measured faster than the tiled kernel at M = 33, 48 and 64 (docs/perf.md)
STAGED_FROM = 33
STAGED_SMS = 132                                        # H200 SMs
STAGED_PER_SM = 4                                       # resident blocks of 4 warps per SM (128 registers)


def _splits(blocks: int, kc: int, per_sm: int) -> int:
    """K shares for ``blocks`` column blocks over ``kc`` chunks: none when the blocks alone fill the SMs,
    else as many as ``per_sm`` resident blocks per SM allow, each of at least two chunks."""
    if blocks >= STAGED_SMS:
        return 1
    return max(d for d in range(1, MAX_SPLITS + 1) if kc % d == 0 and (d == 1 or (
        blocks * d <= per_sm * STAGED_SMS and kc // d >= 2)))


def _staged_config(k: int, n: int | None) -> Staged:
    """MT = 4 (two grid rows at M = 33..64), NT = 4, equal rings of 4 (PW = PX measured best); K split by
    ``_splits``. At K2 shapes: gate/up 8 splits, down none."""
    n16 = -(-(n or 2048) // 16)
    nt = min(4, n16)
    return Staged(4, nt, _splits(-(-n16 // nt) * 2, k // 64, STAGED_PER_SM), 4, 4)


WGMMA_PER_SM = 3                # resident wgmma blocks an SM (a warpgroup, <= 168 registers, 41 KB shared)


def wgmma_config(k: int, n: int | None = None, prescale: bool = False) -> Wgmma:
    """The wgmma kernel's tiling for M = 33..64 (not a default: not yet timed): MT = 8 (one grid row),
    one warpgroup, PW = 3 weight and PX = 4 x stages; K split by ``_splits``. At K2 shapes: gate/up 8
    splits (256 blocks), down 2 (224)."""
    n16 = -(-(n or 2048) // 16)
    return Wgmma(8, 1, _splits(-(-n16 // 4), k // 64, WGMMA_PER_SM), 3, 4, prescale)


def choose_config(m: int, k: int, g: int = 32, n: int | None = None) -> tuple[int, ...] | Staged:
    """(MT, KS, CPW) or (MT, KS, CPW, KP): the M bucket, warps per block, chunks per warp and tile
    pairing (KP = 2 needs an even number of 16-row tiles and cluster launches: without it otherwise);
    a ``Staged`` tiling from STAGED_FROM rows on."""
    if m >= STAGED_FROM:
        return _staged_config(k, n)
    return tiled_config(m, k, g, n)


def tiled_config(m: int, k: int, g: int = 32, n: int | None = None) -> tuple[int, ...]:
    """The one-tile-per-block kernel's (MT, KS, CPW[, KP]) for M rows (``choose_config`` without the staged
    buckets)."""
    mt = next(b for b in MT_BUCKETS if m <= 8 * b) if m <= 64 else 8
    if (mt, k) in _TUNED and g == 32:
        cfg = _TUNED[(mt, k)]
        pairs = CLUSTERS_AVAILABLE and (n is None or -(-n // 16) % 2 == 0)
        return cfg if pairs else cfg[:3]
    kc = k // 64
    cpw_max = 8 if mt <= 4 else 4                       # keep the unrolled loops in registers
    ks_max = 32 if mt <= 2 else 16
    cpw = min(cpw_max, max(1, -(-kc // ks_max)))
    while cpw > 1 and kc % cpw:                         # prefer exact slices (no guards)
        cpw -= 1
    if g == 128 and cpw % 2 and cpw < kc:
        cpw += 1                                        # a warp's slice starts on a 128-column group
    return mt, -(-kc // cpw), cpw


@dataclass(frozen=True)
class GemmWorkspace:
    """Split-K partial tiles (float32) and their counters (int32, zero between launches: the last block of
    each column block resets its own) for the staged kernel; one serves every launch in one stream."""
    part: object
    cnt: object


def gemm_workspace(rows: int, shapes, stream=0) -> GemmWorkspace:
    """A workspace for every default-config launch of up to ``rows`` rows on the (N, K, G) ``shapes``: a
    shape's staged tiling is the same from STAGED_FROM rows on, and its partials grow with the grid rows."""
    words, cells = 1, 1
    for n, k, _ in shapes if rows >= STAGED_FROM else ():
        cfg = _staged_config(k, n)
        w, c = partials(cfg, -(-n // 16), -(-rows // (8 * cfg.mt)))
        words, cells = max(words, w), max(cells, c)
    return GemmWorkspace(empty(words, np.float32, stream), zeroed(cells, np.int32, stream))


def int4_matmul(x, weight: Int4Weight, out=None, stream=None,
                config: tuple[int, ...] | Staged | Wgmma | None = None, pdl: bool = True,
                workspace: GemmWorkspace | None = None):
    """``out [M, N] float32 = f16(x) @ W.T`` for a repacked W4A16 weight (``repack_int4``).

    ``x`` float16 ``[M, K]`` C-contiguous, 16-byte aligned, M >= 1; ``weight`` an ``Int4Weight``
    on the device (``.to_device()``); ``out`` optional float32 ``[M, N]`` (allocated if None).
    Accepts numba device arrays or torch CUDA tensors; launches on ``stream`` (numba stream,
    torch stream or raw handle; None = default). ``config`` (MT, KS, CPW) or (MT, KS, CPW, KP)
    overrides ``choose_config`` (KP = 2: tile pairs in clusters of 2 blocks, see the module notes), as
    does a ``Staged`` tiling (the staged kernel, int4_staged.py) or a ``Wgmma`` one (int4_wgmma.py, Hopper).
    ``pdl``: launch with programmatic dependent launch (``launch.py``), so the
    weight loads overlap the previous kernel in the stream. ``workspace`` (``gemm_workspace``) holds the
    staged kernel's split-K partials; without one a launch that needs it allocates its own. Raises
    KernelInputError before launching on any bad input.
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
    config = config or choose_config(m, k, gs, n)
    if isinstance(config, (Staged, Wgmma)):
        _launch_staged(x, weight, out, wq, sq, config, stream, pdl, workspace)
        return out
    mt, ks, cpw, kp = (*config, 0)[:4]
    if mt not in MT_BUCKETS or not 1 <= ks <= 32 or cpw < 1 or ks * cpw < k // 64 or (
            gs == 128 and cpw % 2 and ks > 1):
        raise KernelInputError(f"bad config MT={mt} KS={ks} CPW={cpw} for K={k} G={gs}")
    grid = (weight.n16, -(-m // (8 * mt)))
    if grid[1] > GRID_Y_MAX or m * max(n, k) > 2**31 - 1:
        raise KernelInputError(f"M={m} exceeds the grid / int32 limits")
    if kp and (kp != 2 or ks % 2 or ks * cpw != k // 64 or gs > 64 or mt * 4 > ks
               or grid[0] % 2 or not CLUSTERS_AVAILABLE):
        raise KernelInputError(f"bad paired config MT={mt} KS={ks} CPW={cpw} KP={kp} for N={n} K={k} G={gs}: "
                               "needs KP = 2, KS even, KS*CPW = K/64 (even), G <= 64, MT <= KS/4, an "
                               "even number of 16-row tiles and cluster launches (numba-cuda with cuda.core)")
    kernel = make_int4_matmul_kernel(k, gs, mt, ks, cpw, kp)
    launch(kernel, grid, ks * 32, stream, (flat(out), flat(x), wq, sq, m, n), pdl, max(kp, 1))
    return out


@functools.cache
def _compute_capability() -> tuple[int, int]:
    """The current GPU's (asked once, not on every launch)."""
    return tuple(cuda.get_current_device().compute_capability)


def _launch_staged(x, weight: Int4Weight, out, wq, sq, cfg: Staged | Wgmma, stream, pdl: bool,
                   ws: GemmWorkspace | None):
    m, n, k, gs = x.shape[0], weight.n, weight.k, weight.group_size
    kc = k // 64
    if isinstance(cfg, Wgmma):
        if (not 1 <= cfg.mt <= 8 or cfg.wg not in (1, 2) or not 1 <= cfg.splits <= MAX_SPLITS
                or kc % cfg.splits or not 3 <= cfg.px <= WGMMA_MAX_PX or cfg.pw < max(2, cfg.px - 1)
                or cfg.shared_words(gs) * 4 > 48 * 1024):
            raise KernelInputError(f"bad wgmma config {cfg} for K={k}: MT in 1..8, WG 1 or 2, S in "
                                   f"1..{MAX_SPLITS} dividing K/64 = {kc}, PX in 3..{WGMMA_MAX_PX}, "
                                   "PW >= PX - 1, at most 48 KB of shared memory")
        if not SIMULATED and _compute_capability() != (9, 0):
            raise KernelInputError("the wgmma kernel needs an sm_90 GPU (H100 / H200)")
    elif (cfg.mt not in MT_BUCKETS or not 1 <= cfg.nt <= 16 or not 1 <= cfg.splits <= MAX_SPLITS
            or kc % cfg.splits or cfg.pw < 2 or not 2 <= cfg.px <= MAX_PX
            or cfg.shared_words(gs) * 4 > 48 * 1024):
        raise KernelInputError(f"bad staged config {cfg} for K={k}: NT in 1..16, S in 1..{MAX_SPLITS} "
                               f"dividing K/64 = {kc}, PW >= 2, PX in 2..{MAX_PX}, at most 48 KB of shared "
                               "memory")
    grid = (-(-weight.n16 // cfg.nt) * cfg.splits, -(-m // (8 * cfg.mt)))
    if grid[1] > GRID_Y_MAX or m * max(n, k) > 2**31 - 1:
        raise KernelInputError(f"M={m} exceeds the grid / int32 limits")
    words, cells = partials(cfg, weight.n16, grid[1])
    if words:
        ws = ws or GemmWorkspace(empty(words, np.float32, stream), zeroed(cells, np.int32, stream))
        part = check(flat(ws.part), "workspace.part", np.float32, (None,), align=4)
        cnt = check(flat(ws.cnt), "workspace.cnt", np.int32, (None,), align=4)
        if part.size < words or cnt.size < cells:
            raise KernelInputError(f"workspace too small for {cfg} at M={m} N={n}: "
                                   "make it with gemm_workspace")
    else:
        # not touched without split K (the simulator copies every argument back after a launch, so there
        # an alias of out would undo its stores)
        part, cnt = (empty(1, np.float32) if SIMULATED else flat(out)), sq
    if isinstance(cfg, Wgmma):
        kernel = make_int4_wgmma_kernel(k, gs, cfg.mt, cfg.wg, cfg.splits, cfg.pw, cfg.px, cfg.prescale)
    else:
        kernel = make_int4_staged_kernel(k, gs, cfg.mt, cfg.nt, cfg.splits, cfg.pw, cfg.px)
    launch(kernel, grid, cfg.nt * 32, stream, (flat(out), flat(x), wq, sq, part, cnt, m, n), pdl, 1)

"""W4A16 GEMM for tree-sized M on Hopper's warpgroup MMA (``wgmma``): the staged kernel's rings and
split K (int4_staged.py), with x read by the tensor cores straight from shared memory.

Legend: M activation rows, N output rows, K input columns, G group size; MT m8-tiles (the wgmma's
N = 8*MT, up to 64 rows a grid row), WG warpgroups per block (64 weight rows each: NT = 4 WG 16-row
tiles), S blocks splitting K, PW / PX shared-memory stages of weights / x, KC = K/64, KB = KC/S.

Why: at 33-64 rows the staged kernel's warps run 32 ``mma.sync``, 16 ``ld.shared.v4`` of x fragments
and 64 scale FMAs per 64-column chunk, and its rungs measured latency-bound (docs/perf.md). Here a
chunk is 4 ``wgmma.m64n{8 MT}k16`` per warpgroup, and x never passes through registers.

- Operands ("swap A/B" as in int4_matmul.py): the weights are A (64 rows of a warpgroup: warp w's
  16-row tile is its A fragment, repacked by int4_layout.py), x is B, read by a descriptor from a stage
  of core matrices of 8 rows x 16 bytes: 16-byte column J (0..7) of row r at byte J * LBO + (r // 8) *
  128 + (r % 8) * 16 (LBO = 128 MT), k16 step q reading columns 2q and 2q + 1.
- The repacked tiles give lane t, at step q = 2h + s, the chunk's columns 32h + 8t + 4s + 0..3 (the
  order in which the mma.sync kernels' lanes read x 16 bytes at a time), so column J = 4h + v of the
  stage holds at its 4-byte position t the x pair 32h + 8t + 2v: a 4 x 4 transpose of the 4-byte units
  of each 64-byte half-row, which the copies do (``cp.async`` of 4 bytes, a warp's 32 into 32 banks).
- Scales: a chunk's A fragments are the dequantized weights times their group's scale in f16
  (``scale_a16``). Exact (the default): twice, by the scale's top 7 significant bits and by the rest
  (``split_scale``), so each product is exact in f16 (for |s| < 8188) and a k16 step is two wgmma:
  the definition up to f32 summation order, at twice the tensor work (at M = 64 and K2's shapes, a
  dense-f16 peak's 1.9 us becomes 3.8). ``prescale``: once, the product rounded to f16 (as Marlin-style
  kernels do): the definition with each weight rounded to f16. Both sum over all of K in one set of f32
  accumulators.
- Rings: weights run PW - 1 chunks ahead (the first before the PDL wait), x PX - 2 (from L2). A
  chunk's wgmma are one group; after issuing chunk c a warpgroup waits for chunk c - 1's group, so at
  chunk c the barrier frees x's stage of chunk c - 2 (its wgmma retired in every warp) and the weight
  stage of chunk c - 1 (read into registers). One cp.async commit group per chunk: x chunk c is in
  group c, weight chunk c in group c + PX - PW - 1 or earlier (PW >= PX - 1), so
  ``wait_group(PX - 3)`` completes chunk c; ``fence.proxy.async`` makes the copies visible to wgmma.
- Weight copies and split K as the staged kernel (``int4_staged.make_fetch_w``, ``make_block_end``); the
  next grid is let launch after the chunk loop; rows past M are not copied (a D column reads one x row).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from numba import cuda, float32, int32, uint32

from .device import SIMULATED
from .int4_staged import Staged, make_block_end, make_fetch_w
from .intrinsics import (
    cp_async4,
    cp_async_commit,
    cp_async_wait,
    dequant_i4x8,
    griddep_launch_dependents,
    griddep_wait,
    ld_shared_v4,
)
from .wgmma import (
    acc_zeros,
    fence_proxy_async,
    scale_a16,
    split_scale,
    wgmma_commit,
    wgmma_f16,
    wgmma_fence,
    wgmma_wait,
)

ZERO = float32(0.0)
MAX_PX = 6


@dataclass(frozen=True)
class Wgmma:
    """The wgmma kernel's tiling: MT m8-tiles (1..8), WG warpgroups per block (1 or 2), S K-splits, PW
    weight stages and PX x stages (3 .. MAX_PX, PW >= PX - 1); ``prescale``: each weight times its scale
    rounded to f16, one wgmma a k16 step instead of the exact form's two (module notes)."""
    mt: int
    wg: int
    splits: int
    pw: int
    px: int
    prescale: bool = False

    def __str__(self) -> str:
        return f"wgmma{self.mt}x{self.wg}x{self.splits}x{self.pw}x{self.px}" + ("p" if self.prescale else "")

    @property
    def nt(self) -> int:
        """16-row weight tiles (warps) a block."""
        return 4 * self.wg

    def shared_words(self, g: int) -> int:
        """uint32 words of shared memory: the staged kernel's layout (``Staged.shared_words``)."""
        return Staged(self.mt, self.nt, self.splits, self.pw, self.px).shared_words(g)


@functools.cache
def make_int4_wgmma_kernel(K: int, G: int, MT: int, WG: int, S: int, PW: int, PX: int, PRESCALE: bool):
    """Kernel factory: K, G and the tiling are compile-time constants (closure variables)."""
    KC = K // 64
    KB = KC // S                   # chunks per block
    SPC = 2 if G == 32 else 1      # scale words per lane and chunk (groups per chunk, G <= 64)
    NT = 4 * WG
    NACC = MT * 4                  # accumulators a thread: the wgmma's N / 2
    NTHR = NT * 32
    XW = MT * 256                  # words of one staged x chunk: 8*MT rows x 64 f16
    WW = NT * 128                  # words of one chunk of the block's weight tiles
    W0 = PX * XW                   # shared layout: PX x chunks, PW weight chunks, PW scale chunks
    S0 = W0 + PW * WW
    SMW = Wgmma(MT, WG, S, PW, PX, PRESCALE).shared_words(G)
    UPT = MT * 256 // NTHR         # 4-byte units of an x chunk a thread
    LBO = MT * 128                 # bytes from one 16-byte column of a chunk's x to the next
    SBO = 128                      # bytes from 8 rows of x to the next 8
    QW = MT * 64                   # words from one k16 step of a chunk's x to the next (2 LBO)
    AHEAD = PX - 3                 # commit groups younger than chunk c's that may still be in flight
    ALIGN = None if SIMULATED else 128
    opts = {} if SIMULATED else {"max_registers": min(168, 65536 // (2 * NTHR) // 8 * 8)}   # 2+ blocks/SM
    fetch_w = make_fetch_w(K, G, MT, NT, PW, PX)
    block_end = make_block_end(MT, NT, S)

    @cuda.jit(**opts)
    def int4_wgmma_kernel(out, x, wq, sq, part, cnt, m_rows, n_rows):
        tid = cuda.threadIdx.x
        warp = tid >> 5
        lane = tid & 31
        g = lane >> 2
        t = lane & 3
        cb = cuda.blockIdx.x // S                             # column block
        s = cuda.blockIdx.x % S                               # its share of K
        m0 = cuda.blockIdx.y * (8 * MT)
        n16 = (n_rows + 15) >> 4
        tile = cb * NT + warp
        tl = min(tile, n16 - 1)
        c0 = s * KB
        sm = cuda.shared.array(SMW, uint32, alignment=ALIGN)
        last = cuda.shared.array(1, int32)
        if SIMULATED:                                         # the simulator's shared memory is np.empty:
            for i in range(tid, SMW, NTHR):                   # x rows past M (never copied) feed NaN to mma
                sm[i] = 0
            cuda.syncthreads()

        # x: a thread's copy p takes row 8 rg + g, columns 32 h + 8 t + 2 v and the next (v = warp % 4) to
        # stage column 4 h + v, position t (module notes), with h, rg from idx = warp // 4 + p WG: a
        # warp's 32 copies land in 32 banks
        xsrc = (m0 + g) * K + c0 * 64 + 8 * t + 2 * (warp & 3)
        xdst = (warp & 3) * MT * 32 + g * 4 + t
        rows_left = m_rows - m0 - g
        wg_half = (warp >> 2) if WG == 2 else 0               # (0 at WG = 1: the copies' offsets constant)

        def fetch_x(c):
            b = c % PX
            for p in range(UPT):
                idx = wg_half + p * WG
                rg = idx >> 1
                if rg * 8 < rows_left:                        # rows past M: never stored, not copied
                    h = idx & 1
                    cp_async4(sm, b * XW + xdst + (4 * h * MT + rg) * 32, x,
                              xsrc + c * 64 + rg * 8 * K + 32 * h)

        def frag(q, u):                                       # an A fragment times its rows' scales
            return scale_a16(q[0], q[1], q[2], q[3], u)

        def mma(d, a, at):                                    # d += A B, B the k16 step at stage word at
            return wgmma_f16(d, a[0], a[1], a[2], a[3], sm, at, LBO, SBO, 1)

        for c in range(PW - 1):                               # weights depend on nothing: before the wait
            if c < KB:
                fetch_w(sm, wq, sq, tl, c0, c, warp, lane)
        griddep_wait()                                        # x, out and the workspace: after it
        for c in range(PX - 2):
            if c < KB:
                fetch_x(c)
            cp_async_commit()
        d = acc_zeros(NACC)
        for c in range(KB):
            cp_async_wait(AHEAD)                              # groups up to chunk c's complete
            fence_proxy_async()                               # ... and visible to the wgmma
            cuda.syncthreads()                                # everyone's: chunk c - 2's wgmma retired
            if c + PX - 2 < KB:
                fetch_x(c + PX - 2)
            if c + PW - 1 < KB:
                fetch_w(sm, wq, sq, tl, c0, c + PW - 1, warp, lane)
            cp_async_commit()
            wb = c % PW
            wa = ld_shared_v4(sm, W0 + (wb * NT + warp) * 128 + lane * 4)
            sb = S0 + (wb * NT + warp) * (SPC * 8) + g
            u0 = sm[sb]                                       # scales of the chunk's groups (rows g, g + 8)
            u1 = sm[sb + (SPC - 1) * 8]
            q0 = dequant_i4x8(wa[0])
            q1 = dequant_i4x8(wa[1])
            q2 = dequant_i4x8(wa[2])
            q3 = dequant_i4x8(wa[3])
            xb = (c % PX) * XW
            if PRESCALE:                                      # (u - 8) s rounded to f16
                a0, a1, a2, a3 = frag(q0, u0), frag(q1, u0), frag(q2, u1), frag(q3, u1)
                wgmma_fence()
                d = mma(d, a0, xb)
                d = mma(d, a1, xb + QW)
                d = mma(d, a2, xb + 2 * QW)
                d = mma(d, a3, xb + 3 * QW)
            else:                                             # (u - 8) s_hi + (u - 8) s_lo, both exact
                h0, l0 = split_scale(u0)
                h1, l1 = split_scale(u1)
                a0, b0, a1, b1 = frag(q0, h0), frag(q0, l0), frag(q1, h0), frag(q1, l0)
                a2, b2, a3, b3 = frag(q2, h1), frag(q2, l1), frag(q3, h1), frag(q3, l1)
                wgmma_fence()
                d = mma(mma(d, a0, xb), b0, xb)
                d = mma(mma(d, a1, xb + QW), b1, xb + QW)
                d = mma(mma(d, a2, xb + 2 * QW), b2, xb + 2 * QW)
                d = mma(mma(d, a3, xb + 3 * QW), b3, xb + 3 * QW)
            wgmma_commit()
            wgmma_wait(1)                                     # chunk c - 1's group retired
        wgmma_wait(0)

        griddep_launch_dependents()
        acc = cuda.local.array(NACC, float32)
        for i in range(NACC):
            acc[i] = d[i]
        block_end(out, acc, part, cnt, last, cb, s, tile, m0, m_rows, n_rows)

    return int4_wgmma_kernel

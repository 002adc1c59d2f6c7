"""W4A16 GEMM for tree-sized M (the default from 33 rows on): a block of NT weight tiles loops over its
share of K with x staged in shared memory, so one x fragment serves NT tiles.

Legend: M activation rows, N output rows, K input columns, G group size; MT m8-tiles per block (the M
bucket), NT 16-row weight tiles per block (one warp each), S blocks splitting K, PW / PX shared-memory
stages of weights / x, KC = K/64, KB = KC/S chunks per block, NCB = ceil(N16/NT) column blocks.

Why: ``int4_matmul`` gives every 16-row weight tile its own block, and every block reads all of x from
L2: (N/16) x M x K x 2 bytes, 117 MB at M = 64 for both K2 shapes against 8.26 MB of weights, and the
time follows that traffic (docs/perf.md). Here x crosses from L2 into an SM once per block, N16/NT x M x
K x 2 bytes in all (NT = 4: 29 MB), and the NT warps read it from shared memory. Equal rings of 4
with two or more blocks per SM measured fastest (docs/perf.md, v19).

- Work: block (cb, s) computes tiles cb*NT .. cb*NT+NT-1 over chunks s*KB .. s*KB+KB-1, warp w tile
  cb*NT + w for all 8*MT rows (MT x 4 accumulators per lane). Weights and MMA fragments are those of
  int4_matmul.py (repacked by int4_layout.py; weights the A operand of ``mma.m16n8k16``).
- Everything a chunk reads arrives by ``cp.async`` into a ring of shared-memory stages, so loads in
  flight cost no registers (v15 held two weight chunks ahead in registers, 234-255 registers, and was
  latency-bound: docs/perf.md). Weights run PW - 1 chunks ahead (DRAM), x PX - 1 (from L2); the
  first PW - 1 weight chunks are issued before the PDL wait. The next grid is let launch only after
  the chunk loop: launched at the start, its blocks sat beside this grid's and slowed it by 7 us.
  One commit group per chunk; at chunk c ``wait_group(min(PW, PX) - 2)`` leaves only younger groups
  pending (x chunk c is in group c, weight chunk c in group c + PX - PW or earlier),
  and one ``syncthreads`` makes every thread's copies visible and frees the stages of chunk c - 1,
  which the copies for c + PX - 1 and c + PW - 1 then take.
- x in *fragment order*: a chunk's 8*MT x 64 activations are stored at word ((h * MT + mt) * 32 +
  lane) * 4, so a lane's B operands of one 32-column half are one conflict-free 16-byte ``ld.shared``
  (512 contiguous bytes per warp). A lane reads back the 16 weight bytes it copied itself.
- Split K (S > 1): each block publishes its partial tiles to the workspace, a fence and the column
  block's counter; the block that completes the count sums the S partials in split order (so results
  do not depend on timing), writes ``out`` and resets the counter for the next launch.
- Rows past M are not copied (their stale shared words meet only outputs that are never stored: one
  output column of an MMA reads one x row); copying row M - 1 in their place put every thread of a
  block on the same 128 bytes and made M = 33 slower than M = 64. Warps past the last tile load the
  last tile.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from numba import cuda, float32, int32, uint32

from .device import SIMULATED
from .intrinsics import (
    cp_async16,
    cp_async_commit,
    cp_async_wait,
    dequant_i4x8,
    griddep_launch_dependents,
    griddep_wait,
    h2_to_f32,
    ld_cg_f32,
    ld_shared_v4,
    mma_16816,
)

ZERO = float32(0.0)
MAX_SPLITS = 8
MAX_PX = 6                         # x stages (cp.async.wait_group then waits on at most MAX_PX - 2)


@dataclass(frozen=True)
class Staged:
    """The staged kernel's tiling: MT m8-tiles, NT weight tiles (warps) per block, S K-splits, PW weight
    stages (2 or more) and PX x stages (2 .. MAX_PX) in shared memory."""
    mt: int
    nt: int
    splits: int
    pw: int
    px: int

    def __str__(self) -> str:
        return f"staged{self.mt}x{self.nt}x{self.splits}x{self.pw}x{self.px}"

    def shared_words(self, g: int) -> int:
        """uint32 words of shared memory: PX x chunks (8*MT rows x 64 f16), PW chunks of the NT tiles'
        weights (128 words a tile) and scales (8 words a group)."""
        return self.px * self.mt * 256 + self.pw * self.nt * (128 + (2 if g == 32 else 1) * 8)


def partials(cfg: Staged, n16: int, grid_rows: int) -> tuple[int, int]:
    """(float32 words of partial tiles, counters) a launch with ``cfg`` needs (0, 0 without split K)."""
    if cfg.splits == 1:
        return 0, 0
    ncb = -(-n16 // cfg.nt)
    return cfg.splits * ncb * cfg.nt * cfg.mt * 128 * grid_rows, ncb * grid_rows


@functools.cache
def make_fetch_w(K: int, G: int, MT: int, NT: int, PW: int, PX: int):
    """The staged kernels' weight copy: chunk ``c0 + c`` of tile ``tl`` and its scales by ``cp.async``
    into weight stage c % PW of warp ``warp`` (the shared layout of ``Staged.shared_words``)."""
    TILE_W = K // 64 * 128         # uint32 words per 16-row weight tile
    NS = K // G
    SPC = 2 if G == 32 else 1      # scale words per lane and chunk (groups per chunk, G <= 64)
    SPL = SPC * 2                  # 16-byte scale pieces per tile and chunk (lanes 0..SPL-1 copy them)
    W0 = PX * MT * 256             # shared layout: PX x chunks, PW weight chunks, PW scale chunks
    S0 = W0 + PW * NT * 128

    @cuda.jit(device=True, inline="always")
    def fetch_w(sm, wq, sq, tl, c0, c, warp, lane):
        b = c % PW
        cp_async16(sm, W0 + (b * NT + warp) * 128 + lane * 4, wq, tl * TILE_W + (c0 + c) * 128 + lane * 4)
        if lane < SPL:
            cp_async16(sm, S0 + (b * NT + warp) * (SPC * 8) + lane * 4, sq,
                       (tl * NS + ((c0 + c) * 64) // G) * 8 + lane * 4)
    return fetch_w


@functools.cache
def make_block_end(MT: int, NT: int, S: int):
    """The staged kernels' end, for a block of NT warps holding MT * 4 accumulators a lane (the D
    fragments of its m8-tiles): with split K (S > 1) publish them to the column block's ``cell`` of the
    partials and count it; the block that completes the count sums the S shares in split order (so
    results do not depend on timing), resets the counter for the next launch and stores ``out``; without
    split K every block stores its tiles."""
    NACC = MT * 4

    @cuda.jit(device=True, inline="always")
    def block_end(out, acc, part, cnt, last, cb, s, tile, m0, m_rows, n_rows):
        warp = cuda.threadIdx.x >> 5
        lane = cuda.threadIdx.x & 31
        if S > 1:
            cell = cuda.blockIdx.y * ((((n_rows + 15) >> 4) + NT - 1) // NT) + cb
            pbase = (cell * S * NT + warp) * NACC * 32 + lane
            for i in range(NACC):
                part[pbase + (s * NT * NACC + i) * 32] = acc[i]
            cuda.threadfence()
            cuda.syncthreads()
            if cuda.threadIdx.x == 0:
                last[0] = cuda.atomic.add(cnt, cell, 1)
            cuda.syncthreads()
            if last[0] != S - 1:
                return
            cuda.threadfence()
            tot = cuda.local.array(NACC, float32)
            for i in range(NACC):
                tot[i] = ZERO
            for s2 in range(S):                           # split order, whichever block is last
                if s2 == s:
                    for i in range(NACC):
                        tot[i] += acc[i]
                else:
                    for i in range(NACC):
                        tot[i] += ld_cg_f32(part, pbase + (s2 * NT * NACC + i) * 32)
            for i in range(NACC):
                acc[i] = tot[i]
            if cuda.threadIdx.x == 0:
                cnt[cell] = 0
        for mt in range(MT):
            for r in range(4):
                n = tile * 16 + (lane >> 2) + 8 * (r >> 1)
                m = m0 + mt * 8 + 2 * (lane & 3) + (r & 1)
                if n < n_rows and m < m_rows:
                    out[m * n_rows + n] = acc[mt * 4 + r]
    return block_end


@functools.cache
def make_int4_staged_kernel(K: int, G: int, MT: int, NT: int, S: int, PW: int, PX: int):
    """Kernel factory: K, G and the tiling are compile-time constants (closure variables)."""
    KC = K // 64
    KB = KC // S                   # chunks per block
    SPC = 2 if G == 32 else 1      # scale words per lane and chunk (groups per chunk, G <= 64)
    NACC = MT * 4
    NTHR = NT * 32
    XW = MT * 256                  # words of one staged x chunk: 8*MT rows x 64 f16
    WW = NT * 128                  # words of one chunk of the block's weight tiles
    W0 = PX * XW                   # shared layout: PX x chunks, PW weight chunks, PW scale chunks
    S0 = W0 + PW * WW
    SMW = Staged(MT, NT, S, PW, PX).shared_words(G)
    PIECES = MT * 64               # 16-byte pieces of an x chunk
    PPT = -(-PIECES // NTHR)       # pieces per thread
    AHEAD = min(PW, PX) - 2        # commit groups younger than chunk c's that may still be in flight
    opts = {} if SIMULATED else {"max_registers": min(128, 65536 // (2 * NTHR) // 8 * 8)}   # 2+ blocks/SM
    fetch_w = make_fetch_w(K, G, MT, NT, PW, PX)
    block_end = make_block_end(MT, NT, S)

    @cuda.jit(**opts)
    def int4_staged_kernel(out, x, wq, sq, part, cnt, m_rows, n_rows):
        tid = cuda.threadIdx.x
        warp = tid >> 5
        lane = tid & 31
        g = lane >> 2
        cb = cuda.blockIdx.x // S                             # column block
        s = cuda.blockIdx.x % S                               # its share of K
        m0 = cuda.blockIdx.y * (8 * MT)
        n16 = (n_rows + 15) >> 4
        tile = cb * NT + warp
        tl = min(tile, n16 - 1)
        c0 = s * KB
        sm = cuda.shared.array(SMW, uint32)
        last = cuda.shared.array(1, int32)
        acc = cuda.local.array(NACC, float32)
        prt = cuda.local.array(NACC, float32)
        for i in range(NACC):
            acc[i] = ZERO
            prt[i] = ZERO
        if SIMULATED:                                         # the simulator's shared memory is np.empty:
            for i in range(tid, SMW, NTHR):                   # x rows past M (never copied) feed NaN to mma
                sm[i] = 0
            cuda.syncthreads()

        def fetch_x(c):                                       # piece q: row q >> 3, 16 bytes j = q & 7
            b = c % PX
            for p in range(PPT):
                q = tid + p * NTHR
                if q < PIECES and m0 + (q >> 3) < m_rows:     # rows past M: never stored, not copied
                    r = q >> 3
                    j = q & 7
                    at = b * XW + (((j >> 2) * MT + (r >> 3)) * 32 + (r & 7) * 4 + (j & 3)) * 4
                    cp_async16(sm, at, x, (m0 + r) * K + (c0 + c) * 64 + 8 * j)

        for c in range(PW - 1):                               # weights depend on nothing: before the wait
            if c < KB:
                fetch_w(sm, wq, sq, tl, c0, c, warp, lane)
        griddep_wait()                                        # x, out and the workspace: after it
        for c in range(PX - 1):
            if c < KB:
                fetch_x(c)
            cp_async_commit()
        for c in range(KB):
            cp_async_wait(AHEAD)                              # groups up to chunk c's complete
            cuda.syncthreads()                                # everyone's copies landed; chunk c - 1 read
            if c + PX - 1 < KB:
                fetch_x(c + PX - 1)
            if c + PW - 1 < KB:
                fetch_w(sm, wq, sq, tl, c0, c + PW - 1, warp, lane)
            cp_async_commit()
            wb = c % PW
            wa = ld_shared_v4(sm, W0 + (wb * NT + warp) * 128 + lane * 4)
            xb = (c % PX) * XW + lane * 4
            sb = S0 + (wb * NT + warp) * (SPC * 8) + g
            for h in range(2):
                a = dequant_i4x8(wa[2 * h])
                a2 = dequant_i4x8(wa[2 * h + 1])
                s_lo, s_hi = h2_to_f32(sm[sb + h * (SPC - 1) * 8])
                for mt in range(MT):
                    xv = ld_shared_v4(sm, xb + (h * MT + mt) * 128)
                    if G == 32:                               # one group per half: start from zero
                        e = mma_16816(a[0], a[1], a[2], a[3], xv[0], xv[1], ZERO, ZERO, ZERO, ZERO)
                    else:
                        e = mma_16816(a[0], a[1], a[2], a[3], xv[0], xv[1], prt[mt * 4], prt[mt * 4 + 1],
                                      prt[mt * 4 + 2], prt[mt * 4 + 3])
                    e = mma_16816(a2[0], a2[1], a2[2], a2[3], xv[2], xv[3], e[0], e[1], e[2], e[3])
                    if G == 32 or h == 1:                     # end of a group (or of a chunk, G > 64)
                        acc[mt * 4 + 0] += s_lo * e[0]
                        acc[mt * 4 + 1] += s_lo * e[1]
                        acc[mt * 4 + 2] += s_hi * e[2]
                        acc[mt * 4 + 3] += s_hi * e[3]
                        for r in range(4):
                            prt[mt * 4 + r] = ZERO
                    else:
                        for r in range(4):
                            prt[mt * 4 + r] = e[r]

        griddep_launch_dependents()                           # only now: a next grid resident early slowed
        #                                                     this one's loop by 7 us (docs/perf.md, v17)
        block_end(out, acc, part, cnt, last, cb, s, tile, m0, m_rows, n_rows)

    return int4_staged_kernel


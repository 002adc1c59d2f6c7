"""The two expert GEMM kernels of the fused MoE, stream-K over the 8-row expert tiles of moe_align.py.

Legend: D model width, I expert width, G group size, KC = K/64 chunks of a weight row tile, SC chunks
per step, KSTEPS = KC/SC steps per unit, DP steps in flight per warp, WPB warps per block, NT n-tiles
per unit, NMAT 16-row matrices per unit (gate and up count two).

Work: a *unit* is NT consecutive 16-row weight tiles (n-tiles) of one expert tile ``j`` (8 token
rows), KC chunks of K; units are ordered ``u = j * NU + group`` (NU = N16 / NT) and a flat *step*
index runs over ``meta[0] * NU * KSTEPS``. Stream-K on two levels: every block of the persistent
grid takes one contiguous, equal share of the steps and every warp of the block an equal part of
it, so the load is balanced whatever the routing, and nothing waits on a wave tail. Per step a lane
holds SC 16-byte weight loads per matrix; DP steps are in flight while one computes (the load of
step s + DP is issued right after step s is used, in the same unrolled slot).

Per lane (g, t) the activation row ``tile_rows[8j + g]`` is the B operand of ``mma.m16n8k16``;
weights are the A operand, repacked by int4_layout.py (int4_matmul.py's docstring explains it).
A warp whose share covers a whole unit finishes it from registers. Split units are summed in a
fixed order, so results do not depend on timing:
- between warps of a block: each piece goes to shared memory (slot 2w for the first segment of
  warp w's share, 2w + 1 for its last); after one ``syncthreads`` at the end, the warp holding the
  unit's first step in the block sums the pieces in warp order. Nothing waits inside the loop.
- between blocks (at most two units per block): the block's piece is published to the global part
  buffer (slot 2b / 2b + 1), then a fence and the unit's step counter; the block that completes the
  count sums the pieces in block order and finishes the unit. A block that finds every other piece
  already published (an acquire load of the counter) finishes without publishing its own. A piece
  held by one warp is published as soon as that warp's segment ends, so the other block rarely waits.

- gate/up: gate and up tiles of the same 16 rows share the activation fragments; the unit's
  epilogue writes ``h[pair, n] = f16(silu(gate) * up)`` (float16 bits, the down GEMM's input).
- down: the epilogue writes ``y[pair, n] = w_pair * (h_pair . W2[n])`` in float32.
Counters must be zero at launch: moe_align zeroes the gate/up ones, the gate/up kernel the down ones.
"""

from __future__ import annotations

import functools

from numba import cuda, float32, int32, int64, uint16, uint32

from .blockops import silu_mul
from .device import SIMULATED
from .intrinsics import (
    bcast0,
    dequant_i4x8,
    f32_to_h2,
    h2_to_f32,
    ld_acquire_i32,
    ld_cg_f32,
    ld_stream_v4,
    ld_u32,
    ld_v4,
    mma_16816,
    syncwarp,
)

ZERO = float32(0.0)


@cuda.jit(device=True, inline="always")
def _share(i, n, steps):
    """First step of share i when ``steps`` steps are split into n equal contiguous shares."""
    return i * steps // n


@functools.cache
def make_moe_gemm_kernel(KIN: int, NOUT_ROWS: int, G: int, GATE_UP: bool, WPB: int, SC: int, DP: int, NT: int,
                         MAXREG: int):
    """GATE_UP: weights are gate/up pairs [X, N16, 2, KC*128] -> h (float16 bits, uint16);
    else single matrices [X, N16, KC*128] -> y float32 scaled by the router weight.
    A unit is NT consecutive n-tiles (NMAT = NT or 2 NT matrices sharing the activation loads)."""
    KC = KIN // 64
    KSTEPS = KC // SC
    NS = KIN // G
    NMAT = NT * (2 if GATE_UP else 1)          # 16-row matrices per unit, consecutive in memory
    TW = KC * 128                              # words per 16-row tile of one matrix
    NU = NOUT_ROWS // 16 // NT                 # units per expert tile
    SPC = 2 if G == 32 else 1                  # scale words per chunk and matrix
    NACC = NMAT * 4
    STW = SC * NMAT * 4                        # weight words per lane per step
    STS = SC * NMAT * SPC                      # scale words per lane per step
    NTHR = WPB * 32
    SLOT = NMAT * 128                          # floats of one stored partial fragment
    NPIECE = 2 * WPB * SLOT                    # shared floats: two pieces per warp
    RW, RS = DP * STW, DP * STS                # register ring sizes
    opts = {} if SIMULATED else {"max_registers": MAXREG}

    LG = G.bit_length() - 1                    # log2(G)
    # position counters, int32: compute side (tile, unit group, steps done in the unit) and prefetch
    # side (the same for the step being loaded); int64 offsets: the compute side's activation row
    # base, the prefetch side's weight-word and scale-word bases
    CJ, CN, CK, PJ, PN, PK = range(6)
    CX, PW, PS = range(3)

    @cuda.jit(**opts)
    def moe_gemm_kernel(dst, act, wq, sq, tile_expert, tile_rows, meta, topk_w, n_tok, k_top,
                        part, cnt, cnt_next, n_next):
        tid = cuda.threadIdx.x
        warp = tid >> 5
        lane = tid & 31
        g = lane >> 2
        t = lane & 3
        nthr_all = cuda.gridDim.x * NTHR
        for i in range(cuda.blockIdx.x * NTHR + tid, n_next, nthr_all):
            cnt_next[i] = 0                                   # the next stage's unit counters

        def block_share():
            """(blocks, this block, total steps, this block's steps [A, B)); recomputed where needed
            rather than held in registers through the loop."""
            nb = int64(cuda.gridDim.x)
            blk = int64(cuda.blockIdx.x)
            total = int64(meta[0]) * (NU * KSTEPS)
            return nb, blk, total, _share(blk, nb, total), _share(blk + 1, nb, total)

        _, _, _, A, B = block_share()
        a = A + _share(warp, WPB, B - A)                       # this warp's steps [a, b)
        b = A + _share(warp + 1, WPB, B - A)
        tk = n_tok * k_top
        piece = cuda.shared.array(NPIECE, float32)            # two unit pieces per warp
        rw = cuda.local.array(RW, uint32)                     # DP steps of weights in flight
        rs = cuda.local.array(RS, uint32)                     # and their scale words
        acc = cuda.local.array(NACC, float32)
        prt = cuda.local.array(NACC, float32)
        ctx = cuda.local.array(6, int32)
        cto = cuda.local.array(3, int64)
        for i in range(NACC):
            acc[i] = ZERO
        u_a = a // KSTEPS                                     # both sides start at step a
        ctx[CJ] = ctx[PJ] = u_a // NU
        ctx[CN] = ctx[PN] = u_a - (u_a // NU) * NU
        ctx[CK] = ctx[PK] = a - u_a * KSTEPS

        def advance(K, N, J, k):
            """The position at ctx slots (steps in the unit K = k, unit group N, tile J) moves one step."""
            ctx[K] = k + 1
            if k + 1 == KSTEPS:
                ctx[K] = 0
                ctx[N] += 1
                if ctx[N] == NU:
                    ctx[N] = 0
                    ctx[J] += 1

        def epilogue(u):
            """acc holds the whole sum of unit u: write its outputs."""
            j = u // NU
            for q in range(4):
                m = 2 * t + (q & 1)
                p = tile_rows[j * 8 + m]
                if p >= 0:
                    for nti in range(NT):
                        n = ((u - j * NU) * NT + nti) * 16 + g + 8 * (q >> 1)
                        if GATE_UP:
                            hv = silu_mul(acc[8 * nti + q], acc[8 * nti + 4 + q])
                            dst[p * NOUT_ROWS + n] = uint16(f32_to_h2(hv, ZERO) & 0xFFFF)
                        else:
                            wgt = topk_w[p] if p < tk else float32(1.0)
                            dst[p * NOUT_ROWS + n] = wgt * acc[4 * nti + q]

        def publish(u, lo, hi):
            """acc holds this block's piece [lo, hi) of unit u, which crosses a block boundary. The
            last block to publish sums every block's piece in block order and finishes the unit."""
            nb, blk, total, A, _ = block_share()
            u0 = u * KSTEPS
            n = int32(hi - lo)
            old = int32(0)
            if lane == 0:
                old = ld_acquire_i32(cnt, u)
            # fast path: the other pieces are all published. Lane 0's acquire orders its own reads;
            # the other lanes read the pieces with ld.cg (from L2, where the publishers' fenced
            # stores are) only after the broadcast of that value: ordered on the hardware, though
            # the PTX model only covers lane 0 (the slow path below fences every lane)
            done = bcast0(old) + n == KSTEPS
            if not done:
                sl = 2 * blk + (0 if lo == A else 1)
                for i in range(NACC):
                    part[sl * SLOT + i * 32 + lane] = acc[i]
                cuda.threadfence()
                syncwarp()
                if lane == 0:
                    old = cuda.atomic.add(cnt, u, n)
                done = bcast0(old) + n == KSTEPS
                if done:
                    cuda.threadfence()
            if done:
                for i in range(NACC):
                    prt[i] = acc[i]
                    acc[i] = ZERO
                bb = ((u0 + 1) * nb - 1) // total             # the block holding step u0
                while bb < nb and _share(bb, nb, total) < u0 + KSTEPS:
                    b0 = _share(bb, nb, total)
                    if bb == blk:
                        for i in range(NACC):
                            acc[i] += prt[i]
                    elif b0 < _share(bb + 1, nb, total):      # a non-empty share
                        sl = 2 * bb + (0 if b0 >= u0 else 1)
                        for i in range(NACC):
                            acc[i] += ld_cg_f32(part, sl * SLOT + i * 32 + lane)
                    bb += 1
                epilogue(u)

        def finish(s):
            """End of this warp's segment [lo, s] of the current unit u."""
            u = int64(ctx[CJ]) * NU + ctx[CN]
            u0 = u * KSTEPS
            lo = max(a, u0)
            _, _, _, A, B = block_share()
            if lo == u0 and s == u0 + KSTEPS - 1:             # the whole unit
                epilogue(u)
            elif lo == max(A, u0) and s + 1 == min(B, u0 + KSTEPS):
                publish(u, lo, s + 1)                         # the block's whole piece: publish now
            else:                                             # summed after the loop, in warp order
                sl = 2 * warp + (0 if lo == a else 1)
                for i in range(NACC):
                    piece[(sl * NACC + i) * 32 + lane] = acc[i]
            for i in range(NACC):
                acc[i] = ZERO

        def step(r, s):
            """Slot r holds step s: use it (if s is this warp's), then refill it with step s + DP."""
            if s >= a:
                ks = ctx[CK]
                if s == a or ks == 0:                         # a new unit: its activation row
                    pair = tile_rows[ctx[CJ] * 8 + g]
                    if GATE_UP:                               # activation row = the pair's token
                        row = -1 if pair < 0 else (pair // k_top if pair < tk else (pair - tk) % n_tok)
                    else:                                     # activation row = the pair's h row
                        row = pair
                    cto[CX] = max(row, 0) * KIN + 8 * t       # padding columns read row 0: never stored
                xs = cto[CX] + ks * (SC * 64)
                for ci in range(SC):
                    for h in range(2):
                        xv = ld_v4(act, xs + ci * 64 + 32 * h)
                        for mi in range(NMAT):
                            wi = ((r * SC + ci) * NMAT + mi) * 4 + 2 * h
                            si = ((r * SC + ci) * NMAT + mi) * SPC
                            qa = dequant_i4x8(rw[wi])
                            qb = dequant_i4x8(rw[wi + 1])
                            if G == 32 or h == 0:
                                d = mma_16816(qa[0], qa[1], qa[2], qa[3], xv[0], xv[1],
                                              ZERO, ZERO, ZERO, ZERO)
                            else:
                                d = mma_16816(qa[0], qa[1], qa[2], qa[3], xv[0], xv[1], prt[mi * 4],
                                              prt[mi * 4 + 1], prt[mi * 4 + 2], prt[mi * 4 + 3])
                            d = mma_16816(qb[0], qb[1], qb[2], qb[3], xv[2], xv[3], d[0], d[1], d[2], d[3])
                            if G == 32 or h == 1:             # a group (G = 32) or a chunk (G > 32) ends
                                s_lo, s_hi = h2_to_f32(rs[si + h * (SPC - 1)])
                                acc[mi * 4 + 0] += s_lo * d[0]
                                acc[mi * 4 + 1] += s_lo * d[1]
                                acc[mi * 4 + 2] += s_hi * d[2]
                                acc[mi * 4 + 3] += s_hi * d[3]
                            else:
                                for q in range(4):
                                    prt[mi * 4 + q] = d[q]
                if ks == KSTEPS - 1 or s == b - 1:            # this warp's segment of the unit ends
                    finish(s)
                advance(CK, CN, CJ, ks)
            ns = s + DP
            if ns < b:                                        # refill slot r with step ns
                ks2 = ctx[PK]
                if ns == a or ks2 == 0:                       # a new unit: its weight and scale bases
                    mat = (tile_expert[ctx[PJ]] * NU + ctx[PN]) * NMAT
                    cto[PW] = mat * TW + lane * 4 + ks2 * (SC * 128)
                    cto[PS] = mat * (NS * 8) + g
                wb = cto[PW]
                for ci in range(SC):
                    sb = cto[PS] + (((ks2 * SC + ci) * 64) >> LG) * 8
                    for mi in range(NMAT):
                        wv = ld_stream_v4(wq, wb + mi * TW + ci * 128)
                        for q in range(4):
                            rw[((r * SC + ci) * NMAT + mi) * 4 + q] = wv[q]
                        for q in range(SPC):
                            rs[((r * SC + ci) * NMAT + mi) * SPC + q] = ld_u32(sq, sb + (mi * NS + q) * 8)
                cto[PW] = wb + SC * 128
                advance(PK, PN, PJ, ks2)

        s = a - DP
        while s < b:                                          # slots 0..DP-1 written out: static indices
            step(0, s)
            if DP > 1 and s + 1 < b:
                step(1, s + 1)
            if DP > 2 and s + 2 < b:
                step(2, s + 2)
            if DP > 3 and s + 3 < b:
                step(3, s + 3)
            s += DP

        # units split between warps of this block: the warp holding the unit's first step in the
        # block sums the pieces in warp order (and publishes the sum if the unit crosses the block)
        cuda.syncthreads()
        _, _, _, A, B = block_share()
        if a < b:
            for which in range(2):
                u = a // KSTEPS if which == 0 else (b - 1) // KSTEPS
                u0 = u * KSTEPS
                lead = (u0 == a or a == A) if which == 0 else u0 > a
                hi = min(B, u0 + KSTEPS)
                if lead and hi > b:
                    for i in range(NACC):
                        acc[i] = ZERO
                    w = warp
                    wa = a
                    while w < WPB and wa < hi:
                        wb = A + _share(w + 1, WPB, B - A)
                        if wa < wb:
                            sl = 2 * w + (0 if u0 <= wa else 1)
                            for i in range(NACC):
                                acc[i] += piece[(sl * NACC + i) * 32 + lane]
                        w += 1
                        wa = wb
                    if u0 >= A and u0 + KSTEPS <= B:
                        epilogue(u)
                    else:
                        publish(u, max(A, u0), hi)

    return moe_gemm_kernel

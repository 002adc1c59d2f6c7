"""The fused MoE as grouped GEMVs: per pair for few tokens, over expert tiles above.

Legend as in moe.py (T tokens, D model width, I expert width, E routed experts, K experts per token,
S shared pseudo-experts, P = T*(K + S) pairs; pair p < T*K is (token p // K, expert topk_ids.flat[p],
weight topk_w.flat[p]), pair T*K + s*T + t is (token t, expert E + s, weight 1)); G = 32.

At T = 1 every pair has its own expert, so there is nothing to align or to share between pairs, and
the stream-K GEMMs (moe_gemm.py) pay for machinery that has no work: at K2 width this path runs at
about three quarters of the bandwidth floor, stream-K at about half (docs/perf.md). Up to
moe.GEMV_TOKENS tokens a shared expert is read once per pair (the copies mostly from L2). Four launches,
all with PDL:

  gate_up  grid (2 I/16, P): block (2 n + half, p) computes 16 rows of the gate (half 0) or up
           (half 1) projection of pair p's expert for p's token: ``gu[p, half I + 16 n + r]`` (f32).
           It reads topk_ids, which the previous kernel may write, so it waits before anything.
  act      ``h[p, i] = f16(silu(gu[p, i]) * gu[p, I + i])``, as moe_gemm's gate/up epilogue.
  down     grid (D/16, P): 16 rows of pair p's w2 times h[p]: ``y[p, n] = w_p * acc``. Its weight
           loads come before its wait (coherent loads, which ptxas keeps there): every kernel of
           the four triggers its dependents only after its own wait, so once down runs the routing
           is final (and so are moe_align's tiles, which the tiled down reads for its first item's
           weights before the wait; a block with no item never waits, as it writes nothing).
  combine  moe_align.make_combine_kernel (sum over pairs in fixed order; it waits first).

Tiled (above GEMV_TOKENS tokens): moe_align first puts each expert's pairs in tiles of 8; gate_up and
down then walk the tiles (grid rows stride over ``meta[0]``), the tile's 8 pairs in the MMA's 8
activation columns, so an expert is read once per tile, not once per pair. A column's result depends
on its own operands only, and its sum runs in the per-pair path's order, so every pair's output equals,
bit for bit, its output alone: a verify's rows equal the decode rows of the same tokens (stream-K,
which splits K by the amount of work, does not).

Each GEMV block is int4_matmul's M = 1 block (int4_matmul.py explains the layout and the MMA), its
KS warps splitting K with CPW chunks each, the row's sum in fixed warp order; activation columns
past the first read the same row and are never stored. Ids outside [0, E) are read as expert 0 (so
every load stays in bounds), their y is 0, and down flags them in ``meta[1]`` (gate/up clears it).
"""

from __future__ import annotations

import functools

from numba import cuda, float32, uint16, uint32

from .blockops import silu_mul
from .device import SIMULATED
from .intrinsics import (
    dequant_i4x8,
    f32_to_h2,
    griddep_launch_dependents,
    griddep_wait,
    h2_to_f32,
    ld_once_v4,
    ld_stream_v4,
    ld_v4,
    mma_16816,
)

ZERO = float32(0.0)


def gemv_tiling(k: int, want_warps: int) -> tuple[int, int] | None:
    """(KS warps, CPW chunks per warp) with KS * CPW = K/64 exactly, KS >= want_warps where possible
    and CPW <= 16 (a warp's slice stays in registers); None if K/64 has no such split."""
    kc = k // 64
    fits = [d for d in range(1, 33) if kc % d == 0 and kc // d <= 16]
    if not fits:
        return None
    ks = min((d for d in fits if d >= want_warps), default=max(fits))
    return ks, kc // ks


@functools.cache
def make_moe_gemv_kernel(K: int, KS: int, CPW: int, GATE_UP: bool, maxreg: int, TILED: bool = False,
                         GLU: bool = False):
    """GATE_UP: the gate/up GEMV over the pair layout of prepare_moe (K = D); else the down GEMV
    (K = I, x router weight, coherent weight loads before the wait). TILED: each block row walks
    moe_align's 8-pair expert tiles (grid-stride over ``meta[0]`` tiles), the tile's pairs in the MMA's
    8 activation columns, so an expert is read once per tile; else block row p is pair p alone.
    GLU (gate/up only): block (n, p) loads both halves of rows 16 n .. 16 n + 15 (twice the weights in
    registers), each x fragment feeding both, and writes ``h = f16(silu(gate) * up)`` itself (grid
    (I/16, P), dst the float16 bits of h): the act launch and the gate/up buffer go, every sum as before.
    At 14 chunks a warp its loops no longer unroll (the arrays go to local memory, PTX): 7 or 8."""
    NH = 2 if GLU else 1           # halves a block holds: gate and up, or the one of its tile
    KC = K // 64
    NS = K // 32                   # scale groups per row
    TILE_W = KC * 128              # uint32 words per 16-row tile
    NRED = KS * 4 * 32
    NWL, NSL = CPW * 4, CPW * 2
    NCOL = 8 if TILED else 1       # activation columns stored
    NREDH, NWLH, NSLH, NACC = NRED * NH, NWL * NH, NSL * NH, 4 * NH   # (numba sizes arrays from constants)
    opts = {} if SIMULATED else {"max_registers": maxreg}

    @cuda.jit(**opts)
    def moe_gemv_kernel(dst, act, wq, sq, topk_ids, topk_w, meta, n_tok, k_top, n_routed, n16,
                        tile_expert, tile_rows):
        tile = cuda.blockIdx.x
        tid = cuda.threadIdx.x
        warp = tid >> 5
        lane = tid & 31
        g = lane >> 2
        t = lane & 3
        red = cuda.shared.array(NREDH, float32)
        wl = cuda.local.array(NWLH, uint32)
        sl = cuda.local.array(NSLH, uint32)
        acc = cuda.local.array(NACC, float32)
        tk = n_tok * k_top
        c0 = warp * CPW
        if GATE_UP:
            griddep_wait()                                # topk_ids / the tiles may be the previous kernel's
            griddep_launch_dependents()                   # after the wait: the routing is final
            if not TILED and cuda.blockIdx.y == 0 and tile == 0 and tid == 0:
                meta[1] = 0
        first = cuda.blockIdx.y
        end, step = (meta[0], cuda.gridDim.y) if TILED else (first + 1, 1)   # per pair: one item, no loop
        for item in range(first, end, step):
            if TILED:
                e = tile_expert[item]
                ok = True
            else:
                p = item
                if p < tk:
                    e = topk_ids[p]
                    ok = 0 <= e < n_routed
                    e = e if ok else 0
                else:                                     # (32-bit unsigned division: inline, where
                    e = n_routed + uint32(p - tk) // uint32(n_tok)   # int64 calls a routine)
                    ok = True
            for hh in range(NH):
                if GLU:
                    mat = (e * n16 + tile) * 2 + hh
                elif GATE_UP:
                    mat = (e * n16 + (tile >> 1)) * 2 + (tile & 1)
                else:
                    mat = e * n16 + tile
                wbase = mat * TILE_W + c0 * 128 + lane * 4
                sbase = (mat * NS + c0 * 2) * 8 + g
                for ci in range(CPW):
                    if GATE_UP:
                        w = ld_stream_v4(wq, wbase + ci * 128)
                    else:
                        w = ld_once_v4(wq, wbase + ci * 128)
                    for j in range(4):
                        wl[(hh * CPW + ci) * 4 + j] = w[j]
                    for j in range(2):
                        sl[(hh * CPW + ci) * 2 + j] = sq[sbase + (ci * 2 + j) * 8]
            if not GATE_UP and item == first:             # the first item's weights load before it
                griddep_wait()                            # h is act's output
                griddep_launch_dependents()
                if not ok and tile == 0 and tid == 0:
                    meta[1] = 1
            pg = tile_rows[item * 8 + g] if TILED else item   # this lane's activation column's pair
            if pg < 0:
                pg = tile_rows[item * 8]                  # padding columns read a real row, never stored
            if GATE_UP:
                row = uint32(pg) // uint32(k_top) if pg < tk else uint32(pg - tk) % uint32(n_tok)
            else:
                row = pg                                  # h holds one row per pair
            for i in range(4 * NH):
                acc[i] = ZERO
            xb = row * K + c0 * 64 + 8 * t
            for ci in range(CPW):
                for h in range(2):
                    xv = ld_v4(act, xb + ci * 64 + 32 * h)
                    for hh in range(NH):
                        a = dequant_i4x8(wl[(hh * CPW + ci) * 4 + 2 * h])
                        b = dequant_i4x8(wl[(hh * CPW + ci) * 4 + 2 * h + 1])
                        s_lo, s_hi = h2_to_f32(sl[(hh * CPW + ci) * 2 + h])
                        d = mma_16816(a[0], a[1], a[2], a[3], xv[0], xv[1], ZERO, ZERO, ZERO, ZERO)
                        d = mma_16816(b[0], b[1], b[2], b[3], xv[2], xv[3], d[0], d[1], d[2], d[3])
                        acc[hh * 4 + 0] += s_lo * d[0]
                        acc[hh * 4 + 1] += s_lo * d[1]
                        acc[hh * 4 + 2] += s_hi * d[2]
                        acc[hh * 4 + 3] += s_hi * d[3]
            for hh in range(NH):
                for i in range(4):
                    red[((hh * KS + warp) * 4 + i) * 32 + lane] = acc[hh * 4 + i]
            cuda.syncthreads()
            for o in range(tid, 16 * NCOL, KS * 32):      # output row r of the tile, activation column j
                r = o & 15
                j = o >> 4
                p = tile_rows[item * 8 + j] if TILED else item
                if p >= 0:
                    ri = 2 * (r >> 3) + (j & 1)           # c0/c1 (row g) or c2/c3 (row g + 8) ...
                    li = 4 * (r & 7) + (j >> 1)           # ... of lane 4 g + j / 2
                    s = ZERO
                    for w_ in range(KS):
                        s += red[(w_ * 4 + ri) * 32 + li]
                    if GLU:                               # act's silu(gate) * up, on the same sums
                        su = ZERO
                        for w_ in range(KS):
                            su += red[((KS + w_) * 4 + ri) * 32 + li]
                        dst[p * n16 * 16 + tile * 16 + r] = uint16(f32_to_h2(silu_mul(s, su), ZERO) & 0xFFFF)
                    elif GATE_UP:
                        dst[(2 * p + (tile & 1)) * n16 * 16 + (tile >> 1) * 16 + r] = s
                    else:
                        wgt = float32(1.0)
                        if p < tk:
                            wgt = topk_w[p] if ok else ZERO
                        dst[p * n16 * 16 + tile * 16 + r] = wgt * s
            cuda.syncthreads()                            # red is the next item's

    return moe_gemv_kernel


@cuda.jit
def moe_act_kernel(h, gu, width):
    """``h[p, i] = f16(silu(gate) * up)`` (float16 bits) of ``gu[p] = [gate, up]``; grid (width/128, P)."""
    griddep_wait()
    griddep_launch_dependents()
    p = cuda.blockIdx.y
    i = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    if i < width:
        hv = silu_mul(gu[2 * p * width + i], gu[(2 * p + 1) * width + i])
        h[p * width + i] = uint16(f32_to_h2(hv, ZERO) & 0xFFFF)

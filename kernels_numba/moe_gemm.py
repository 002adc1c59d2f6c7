"""The two expert GEMM kernels of the fused MoE, over the 8-row expert tiles of moe_align.py.

Legend: D model width, I expert width, G group size, KS warps per block splitting the input dim,
CPW 64-column chunks per warp per batch, NBT batches; one block = one 16-row weight tile (n-tile)
x a strided subset of the expert tiles (worker ``blockIdx.y`` takes tiles y, y + W, ...; surplus
workers exit when ``meta[0]`` tiles are done). Per tile the lane (g, t) feeds activation row
``tile_rows[8j + g]`` (zeros for padding) as the B operand of ``mma.m16n8k16``; weights are the A
operand, repacked by int4_layout.py (same scheme as int4_matmul.py, whose docstring explains it).

- gate/up: gate and up tiles of the same 16 rows share the activation fragments;
  the epilogue writes ``h[pair, n] = f16(silu(gate) * up)`` (the down GEMM's f16 activations).
- down: the epilogue writes ``y[pair, n] = w_pair * (h_pair . W2[n])`` in float32.
"""

from __future__ import annotations

import functools
import math

from numba import cuda, float32, uint32

from .intrinsics import SIMULATED, dequant_i4x8, f32_to_h2, h2_to_f32, ld_stream_v4, ld_v4, mma_16816

ZERO = float32(0.0)


@functools.cache
def make_moe_gemm_kernel(KIN: int, NOUT_ROWS: int, G: int, KS: int, CPW: int, GATE_UP: bool):
    """GATE_UP: weights are gate/up pairs [X, N16, 2, KC*128] -> h (f16 as uint32 pairs);
    else single matrices [X, N16, KC*128] -> y float32 scaled by the router weight."""
    KC = KIN // 64
    NS = KIN // G
    NMAT = 2 if GATE_UP else 1
    TW = KC * 128                              # words per 16-row tile of one matrix
    N16 = NOUT_ROWS // 16
    EXW = N16 * NMAT * TW                      # words per expert
    EXS = N16 * NMAT * NS * 8                  # scale words per expert
    SPC = 2 if G == 32 else 1
    NBT = -(-KC // (KS * CPW))                 # batches of CPW chunks per warp
    EXACT = NBT * KS * CPW == KC               # no chunk guards
    NACC = NMAT * 4
    NRED = KS * NACC * 32
    NTOT = NMAT * 128
    NTHR = KS * 32
    NWL, NSL = NMAT * CPW * 4, NMAT * CPW * SPC
    # 64 registers x 256 threads: four blocks (32 warps) per SM keep enough loads in flight
    opts = {} if SIMULATED else {"max_registers": min(255, max(64, 65536 // NTHR // 4 // 8 * 8))}

    @cuda.jit(**opts)
    def moe_gemm_kernel(dst, act, wq, sq, tile_expert, tile_rows, meta, topk_w, n_tok, k_top):
        nt = cuda.blockIdx.x
        tid = cuda.threadIdx.x
        warp = tid >> 5
        lane = tid & 31
        g = lane >> 2
        t = lane & 3
        red = cuda.shared.array(NRED, float32)
        tot = cuda.shared.array(NTOT, float32)
        acc = cuda.local.array(NACC, float32)
        prt = cuda.local.array(NACC, float32)
        wl = cuda.local.array(NWL, uint32)
        sl = cuda.local.array(NSL, uint32)
        tk = n_tok * k_top
        for j in range(cuda.blockIdx.y, meta[0], cuda.gridDim.y):
            e = tile_expert[j]
            pair = tile_rows[j * 8 + g]
            if GATE_UP:                                   # activation row = the pair's token
                row = -1 if pair < 0 else (pair // k_top if pair < tk else (pair - tk) % n_tok)
            else:                                         # activation row = the pair's h row
                row = pair
            xmask = uint32(0xFFFFFFFF) if row >= 0 else uint32(0)
            xrow = max(row, 0) * KIN + 8 * t              # padding reads row 0, masked to zero
            for i in range(NACC):
                acc[i] = ZERO
                prt[i] = ZERO
            wbase = e * EXW + nt * NMAT * TW + lane * 4
            sbase = e * EXS + nt * NMAT * NS * 8 + g
            for bt in range(NBT):
                c0 = (bt * KS + warp) * CPW
                # phase 1: this batch's weight and scale loads in flight together
                for ci in range(CPW):
                    if EXACT or c0 + ci < KC:
                        for mi in range(NMAT):
                            w = ld_stream_v4(wq, wbase + mi * TW + (c0 + ci) * 128)
                            for q in range(4):
                                wl[(mi * CPW + ci) * 4 + q] = w[q]
                            for q in range(SPC):
                                sl[(mi * CPW + ci) * SPC + q] = sq[
                                    sbase + (mi * NS + ((c0 + ci) * 64) // G + q) * 8]
                # phase 2: activations (L2-resident), dequantize, MMA, scale per group
                for ci in range(CPW):
                    if EXACT or c0 + ci < KC:
                        for h in range(2):
                            xv = ld_v4(act, xrow + (c0 + ci) * 64 + 32 * h)
                            k0, k1, k2, k3 = xv[0] & xmask, xv[1] & xmask, xv[2] & xmask, xv[3] & xmask
                            for mi in range(NMAT):
                                a = dequant_i4x8(wl[(mi * CPW + ci) * 4 + 2 * h])
                                b = dequant_i4x8(wl[(mi * CPW + ci) * 4 + 2 * h + 1])
                                if G == 32:                       # one group per half: start at zero
                                    d = mma_16816(a[0], a[1], a[2], a[3], k0, k1, ZERO, ZERO, ZERO, ZERO)
                                else:
                                    d = mma_16816(a[0], a[1], a[2], a[3], k0, k1, prt[mi * 4],
                                                  prt[mi * 4 + 1], prt[mi * 4 + 2], prt[mi * 4 + 3])
                                d = mma_16816(b[0], b[1], b[2], b[3], k2, k3, d[0], d[1], d[2], d[3])
                                if G == 32 or h == 1:
                                    s_lo, s_hi = h2_to_f32(sl[(mi * CPW + ci) * SPC + h * (SPC - 1)])
                                    acc[mi * 4 + 0] += s_lo * d[0]
                                    acc[mi * 4 + 1] += s_lo * d[1]
                                    acc[mi * 4 + 2] += s_hi * d[2]
                                    acc[mi * 4 + 3] += s_hi * d[3]
                                    for r in range(4):
                                        prt[mi * 4 + r] = ZERO
                                else:
                                    for r in range(4):
                                        prt[mi * 4 + r] = d[r]
            # cross-warp sum in shared memory, fixed order
            for i in range(NACC):
                red[(warp * NACC + i) * 32 + lane] = acc[i]
            cuda.syncthreads()
            for o in range(tid, NTOT, NTHR):
                s = ZERO
                for w_ in range(KS):
                    s += red[(w_ * NACC + (o >> 5)) * 32 + (o & 31)]
                tot[o] = s
            cuda.syncthreads()
            # epilogue: thread -> (row pair nl, nl + 1 of the tile, column m); fragment index
            # o = r*32 + ln with n_local = (ln >> 2) + 8*(r >> 1), m = 2*(ln & 3) + (r & 1)
            for q in range(tid, 64, NTHR):
                m = q & 7
                nl = (q >> 3) * 2
                p = tile_rows[j * 8 + m]
                if p >= 0:
                    o0 = (((nl >> 3) << 1) | (m & 1)) * 32 + (((nl & 7) << 2) | (m >> 1))
                    o1 = o0 + 4                                   # n_local + 1: ln + 4
                    if GATE_UP:
                        g0, g1 = tot[o0], tot[o1]
                        h0 = g0 / (float32(1.0) + math.exp(-g0)) * tot[128 + o0]
                        h1 = g1 / (float32(1.0) + math.exp(-g1)) * tot[128 + o1]
                        dst[(p * NOUT_ROWS + nt * 16 + nl) >> 1] = f32_to_h2(h0, h1)
                    else:
                        wgt = topk_w[p] if p < tk else float32(1.0)
                        dst[p * NOUT_ROWS + nt * 16 + nl] = wgt * tot[o0]
                        dst[p * NOUT_ROWS + nt * 16 + nl + 1] = wgt * tot[o1]
            cuda.syncthreads()                                    # shared memory reused next tile

    return moe_gemm_kernel

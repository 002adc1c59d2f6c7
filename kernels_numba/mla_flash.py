"""The W16A16 attention core in one pass over the latent cache (split-key "flash decoding" on tensor cores):
ctx = softmax(scale * q_all . kv) @ c_kv for every row and head of a step, between the W_UK and W_UV
absorptions.

Legend: T rows, H heads (a multiple of 16), C latent columns, R rope columns, D = C + R, S8 cache rows,
n = meta[0] + meta[1] live keys (keys at or past n are never read), NCH key chunks a row, KT keys a
tile, CS warps sharing a head group's columns, HG = H / 16 head groups, NW = HG CS warps a block.

Inputs as ``blas.AttentionRows`` holds them: q_all [T, H D] and the cache [S8, D] bf16 bits (read as
words of bf16 pairs), the key mask hidden [T, S8] uint8 (1: row t may not see key j), meta [start, live].

- ``chunks`` kernel, grid (NCH, T), block (32, NW): chunk c of row t takes keys c K .. (c + 1) K - 1,
  K = KT ceil(ceil(n / NCH) / KT) (from n on the device, so a captured graph splits the live keys, not
  the cache's rows); tile after tile of KT keys it stages the keys in shared memory (the next tile's
  loads issued before this one's scores), scores S = q . k on ``mma_16816_bf16`` (a warp per 16 heads x
  8 keys), then each warp takes its 16 heads' scores, keeps their running max m and sum l (float32, in
  registers) and adds p = bf16(exp(scale s - m)) @ c_kv into its C / CS columns (MMA accumulators,
  rescaled when m grows). It writes O = sum p c_kv [T, NCH, H, C] and (m, l) [T, NCH, H, 2]; a chunk
  past n writes (-inf, -1) and no O (the used chunks are a prefix).
- ``combine`` kernel, grid (T, H, C / 128), block 32: ctx = sum_c exp(m_c - M) O_c /
  sum_c exp(m_c - M) l_c over the used chunks in order; a row that sees no key gets 0.

The probabilities that multiply c_kv are bf16(exp(scale s - m)) before the division by l (the reference
rounds p after it), so the result agrees with the reference within bf16 rounding, not bit for bit; the
chunk split depends on n and NCH, which the host picks from T (``chunks_for``).

Fragment tricks (m16n8k16, ``intrinsics``): any map of the MMA's k index to dims serves, so long as A
and B use the same one; here lane t's k pairs (2t, 2t + 1) and (2t + 8, 2t + 9) of two consecutive k
steps are the 4 consecutive words 4t .. 4t + 3 of a 16-word span, so q (from global memory) and the
staged keys are read 16 bytes at a time. p @ c_kv needs 2 consecutive keys of one column: a lane loads
the words of columns (2w, 2w + 1) from keys 2t and 2t + 1 and splits each into two B fragments, n-tile a
taking the even columns and n-tile b the odd ones; lane g's words are 4g .. 4g + 3 of each 32 (16-byte
loads without bank conflicts at a row pitch of 4 mod 16 words), so a lane's accumulators land on 16
consecutive columns of each 64.
"""

from __future__ import annotations

import functools
import math

import numpy as np
from numba import cuda, float32, uint32

from ._validate import KernelInputError, check
from .blockops import NEG_INF, TPB
from .device import SIMULATED
from .intrinsics import (
    as_f32,
    f32_to_bf162,
    griddep_launch_dependents,
    griddep_wait,
    ld_shared_v4,
    ld_v4,
    mma_16816_bf16,
    shfl_xor,
    st_shared_v4,
)
from .launch import launch
from .resources import register_cap

KT = 32                             # keys a tile
CS = 4                              # warps sharing a head group's columns (K2: 16 warps, 64 accumulators)
TARGET_BLOCKS = 128                 # chunks x rows the host aims at (about one wave on 132 SMs)
MAX_CHUNKS = 128


@functools.cache
def make_flash_mla(H: int, C: int, R: int, kt: int = KT, cs: int = CS):
    """(chunks_kernel, combine_kernel) for H heads, C latent and R rope columns (module docstring)."""
    D = C + R
    HG, NW = H // 16, (H // 16) * cs
    CW = C // cs                     # columns a warp accumulates
    NP = CW // 16                    # its n-tile pairs
    KS32 = D // 32                   # the scores' pairs of k steps
    LAT32 = C // 32                  # ... of them in q_lat (the rest: q_pe)
    PK = kt // 16                    # p @ c_kv's k steps a tile
    UNITS = HG * (kt // 8)           # (head group, 8 keys) score tiles
    UPW = UNITS // NW
    P = D // 2 + 4                   # staged key row pitch in words (conflict-free fragment reads)
    SP = kt + 4                      # score row pitch
    DW4 = D // 8                     # 16-byte units a key row
    TK = TPB * NW // kt              # threads staging a key row
    LOADS = -(-DW4 // TK)
    why = _unfit(H, C, R, kt, cs)
    if why:
        raise KernelInputError(f"flash MLA: {why}")
    KW, SW = kt * P, H * SP
    HD2, D2 = H * D // 2, D // 2
    NPRE, NACC, NSC, NPF = 4 * LOADS, 8 * NP, 4 * UPW, 8     # (local array sizes: constants)
    ALIGN = None if SIMULATED else 16                        # (the simulator takes no alignment argument)

    @cuda.jit(**register_cap(TPB * NW))
    def chunks_kernel(part, stats, q, qpe, rot, cache, hidden, meta, scale, nch, qw, pe0):
        """part float32 [T NCH H C], stats float32 [T NCH H 2], q int32 [T H D / 2] (q_lat's words
        read), qpe float32 [T qw] (head h's rope dims at h (pe0 + R) + pe0), rot float32 [T R] (the
        row's (cos, sin) pairs), cache int32 [S8 D / 2] (bf16 pairs), hidden uint8 [T, S8], meta int32."""
        ks = cuda.shared.array(KW, uint32, alignment=ALIGN)
        ss = cuda.shared.array(SW, float32)
        pre = cuda.local.array(NPRE, uint32)
        acc = cuda.local.array(NACC, float32)
        sc = cuda.local.array(NSC, float32)
        pf = cuda.local.array(NPF, float32)
        qa = cuda.local.array(8, uint32)
        kf = cuda.local.array(4, uint32)
        vw = cuda.local.array(16, uint32)
        griddep_wait()
        griddep_launch_dependents()
        c, t = cuda.blockIdx.x, cuda.blockIdx.y
        lane, w = uint32(cuda.threadIdx.x), uint32(cuda.threadIdx.y)
        lt = uint32(w * TPB + lane)
        g, tq = uint32(lane >> 2), uint32(lane & 3)
        hg, cs_ = uint32(w % HG), uint32(w // HG)
        h0 = uint32(16 * hg)
        s8 = uint32(hidden.shape[1])
        n = min(meta[0] + meta[1], s8)
        span = -(-n // nch)
        span = -(-span // kt) * kt
        k0 = uint32(c * span)                                # (32-bit key arithmetic: no 64-bit compares)
        k1 = uint32(min(k0 + span, n))
        sbase = ((t * nch + c) * H) * 2
        if k0 >= k1:                                         # nothing to see: weight 0 in the combine
            if lt < H:
                stats[sbase + 2 * lt] = NEG_INF
                stats[sbase + 2 * lt + 1] = np.float32(-1.0)
            return
        m0, m1 = NEG_INF, NEG_INF                            # rows h0 + g, h0 + g + 8
        l0, l1 = np.float32(0.0), np.float32(0.0)
        for i in range(8 * NP):
            acc[i] = np.float32(0.0)
        sk, su = uint32(lt // TK), uint32(lt % TK)          # this thread's key of a tile, first unit

        def fetch(kbase):                                    # this thread's words of a tile's key rows
            if kbase + sk < s8:
                for i in range(LOADS):
                    if su + TK * i < DW4:
                        pre[4 * i], pre[4 * i + 1], pre[4 * i + 2], pre[4 * i + 3] = ld_v4(
                            cache, (kbase + sk) * D2 + 4 * (su + TK * i))
        fetch(k0)                                            # the first tile's rows
        qrow = uint32(t * HD2)
        kb = k0
        while kb < k1:
            live = kb + sk < s8                              # stage this tile (zeros past the cache)
            for i in range(LOADS):
                if su + TK * i < DW4:
                    st_shared_v4(ks, sk * P + 4 * (su + TK * i), pre[4 * i] if live else 0,
                                 pre[4 * i + 1] if live else 0, pre[4 * i + 2] if live else 0,
                                 pre[4 * i + 3] if live else 0)
            cuda.syncthreads()
            nb = uint32(kb + kt)
            if nb < k1:                                      # the next tile's rows, under this one's math
                fetch(nb)
            for j in range(4 * UPW):
                sc[j] = np.float32(0.0)
            for s2 in range(KS32):                           # scores: UPW tiles of 16 heads x 8 keys, 2 k
                for j in range(UPW):                         # steps at a time (lane t: words 4 t .. 4 t + 3
                    un = w + j * NW                          # of the 16: 16-byte loads)
                    hh = uint32(16 * (un % HG) + g)
                    kw = uint32((8 * (un // HG) + g) * P + 16 * s2 + 4 * tq)
                    if s2 < LAT32:                           # q_lat: the absorption's bf16 words
                        qh = uint32(qrow + hh * D2 + 16 * s2 + 4 * tq)
                        qa[0], qa[1], qa[2], qa[3] = ld_v4(q, qh)
                        qa[4], qa[5], qa[6], qa[7] = ld_v4(q, qh + 4 * D)
                    else:                                    # q_pe: rotated here, rounded to bf16
                        rw = uint32(16 * (s2 - LAT32) + 4 * tq)              # rope pairs rw .. rw + 3
                        for e in range(2):
                            xh = uint32(t * qw + (hh + 8 * e) * (pe0 + R) + pe0 + 2 * rw)
                            for m in range(2):
                                x0, x1, x2, x3 = ld_v4(qpe, xh + 4 * m)
                                c0, s0, c1, s1 = ld_v4(rot, uint32(t * R + 2 * rw + 4 * m))
                                qa[4 * e + 2 * m] = f32_to_bf162(
                                    as_f32(x0) * as_f32(c0) - as_f32(x1) * as_f32(s0),
                                    as_f32(x1) * as_f32(c0) + as_f32(x0) * as_f32(s0))
                                qa[4 * e + 2 * m + 1] = f32_to_bf162(
                                    as_f32(x2) * as_f32(c1) - as_f32(x3) * as_f32(s1),
                                    as_f32(x3) * as_f32(c1) + as_f32(x2) * as_f32(s1))
                    kf[0], kf[1], kf[2], kf[3] = ld_shared_v4(ks, kw)
                    for i in range(2):                       # k step i: words 2 i (k 2t, 2t + 1), 2 i + 1
                        sc[4 * j], sc[4 * j + 1], sc[4 * j + 2], sc[4 * j + 3] = mma_16816_bf16(
                            qa[2 * i], qa[4 + 2 * i], qa[2 * i + 1], qa[5 + 2 * i], kf[2 * i], kf[2 * i + 1],
                            sc[4 * j], sc[4 * j + 1], sc[4 * j + 2], sc[4 * j + 3])
            for j in range(UPW):                             # masked, scaled, to shared memory
                un = w + j * NW
                hh = 16 * (un % HG) + g
                for e in range(4):
                    kk = 8 * (un // HG) + 2 * tq + (e & 1)
                    key = uint32(kb + kk)
                    seen = key < k1 and hidden[t, key] == 0
                    ss[uint32((hh + 8 * (e >> 1)) * SP + kk)] = sc[4 * j + e] * scale if seen else NEG_INF
            cuda.syncthreads()
            x0 = NEG_INF
            x1 = NEG_INF
            r0 = uint32((h0 + g) * SP + 2 * tq)                     # this lane's scores: heads g, g + 8, keys
            for j in range(2 * PK):                          # 8 j + 2 t, + 1
                x0 = max(x0, max(ss[uint32(r0 + 8 * j)], ss[uint32(r0 + 8 * j + 1)]))
                x1 = max(x1, max(ss[uint32(r0 + 8 * SP + 8 * j)], ss[uint32(r0 + 8 * SP + 8 * j + 1)]))
            x0 = max(x0, shfl_xor(x0, 1))
            x0 = max(x0, shfl_xor(x0, 2))
            x1 = max(x1, shfl_xor(x1, 1))
            x1 = max(x1, shfl_xor(x1, 2))
            n0, n1 = max(m0, x0), max(m1, x1)
            z0 = n0 if n0 != NEG_INF else np.float32(0.0)    # (a row with no key seen yet: every exp 0)
            z1 = n1 if n1 != NEG_INF else np.float32(0.0)
            a0 = math.exp(m0 - z0)
            a1 = math.exp(m1 - z1)
            m0, m1 = n0, n1
            l0 *= a0
            l1 *= a1
            for i in range(NP):
                acc[8 * i] *= a0
                acc[8 * i + 1] *= a0
                acc[8 * i + 2] *= a1
                acc[8 * i + 3] *= a1
                acc[8 * i + 4] *= a0
                acc[8 * i + 5] *= a0
                acc[8 * i + 6] *= a1
                acc[8 * i + 7] *= a1
            cb = uint32((cs_ * CW) // 2 + 4 * g)             # this lane's words: 4 g .. 4 g + 3 of each 32
            for j in range(PK):                              # p = exp(s - m) of 16 keys, then p @ c_kv
                for e in range(8):                           # keys 16 j + 2 t + (e & 1) + 8 (e >> 2)
                    kk = uint32(r0 + 16 * j + (e & 1) + 8 * (e >> 2) + 8 * SP * ((e >> 1) & 1))
                    pf[e] = math.exp(ss[kk] - (z1 if (e >> 1) & 1 else z0))
                l0 += pf[0] + pf[1] + pf[4] + pf[5]
                l1 += pf[2] + pf[3] + pf[6] + pf[7]
                pa0 = f32_to_bf162(pf[0], pf[1])             # head g, keys 2t, 2t + 1
                pa1 = f32_to_bf162(pf[2], pf[3])             # head g + 8
                pa2 = f32_to_bf162(pf[4], pf[5])             # head g, keys 2t + 8, 2t + 9
                pa3 = f32_to_bf162(pf[6], pf[7])
                r1 = uint32((16 * j + 2 * tq) * P + cb)
                for k in range(NP // 4):                     # keys 2t, 2t + 1, 2t + 8, 2t + 9: 16 bytes each
                    vw[0], vw[1], vw[2], vw[3] = ld_shared_v4(ks, r1 + 32 * k)
                    vw[4], vw[5], vw[6], vw[7] = ld_shared_v4(ks, r1 + P + 32 * k)
                    vw[8], vw[9], vw[10], vw[11] = ld_shared_v4(ks, r1 + 8 * P + 32 * k)
                    vw[12], vw[13], vw[14], vw[15] = ld_shared_v4(ks, r1 + 9 * P + 32 * k)
                    for ii in range(4):
                        i = 4 * k + ii
                        w0, w1, w2, w3 = vw[ii], vw[4 + ii], vw[8 + ii], vw[12 + ii]
                        acc[8 * i], acc[8 * i + 1], acc[8 * i + 2], acc[8 * i + 3] = mma_16816_bf16(
                            pa0, pa1, pa2, pa3, (w0 & 0xFFFF) | (w1 << 16), (w2 & 0xFFFF) | (w3 << 16),
                            acc[8 * i], acc[8 * i + 1], acc[8 * i + 2], acc[8 * i + 3])
                        acc[8 * i + 4], acc[8 * i + 5], acc[8 * i + 6], acc[8 * i + 7] = mma_16816_bf16(
                            pa0, pa1, pa2, pa3, (w0 >> 16) | (w1 & 0xFFFF0000),
                            (w2 >> 16) | (w3 & 0xFFFF0000),
                            acc[8 * i + 4], acc[8 * i + 5], acc[8 * i + 6], acc[8 * i + 7])
            cuda.syncthreads()                               # ks and ss are the next tile's
            kb = nb
        l0 += shfl_xor(l0, 1)
        l0 += shfl_xor(l0, 2)
        l1 += shfl_xor(l1, 1)
        l1 += shfl_xor(l1, 2)
        obase = ((t * nch + c) * H + h0 + g) * C + cs_ * CW + 16 * tq
        for k in range(NP // 4):                             # columns 64 k + 16 t .. + 15 of heads g, g + 8
            for ii in range(4):
                i = 4 * k + ii
                o = obase + 64 * k + 2 * ii
                part[o] = acc[8 * i]
                part[o + 1] = acc[8 * i + 4]
                part[o + 8] = acc[8 * i + 1]
                part[o + 9] = acc[8 * i + 5]
                o += 8 * C
                part[o] = acc[8 * i + 2]
                part[o + 1] = acc[8 * i + 6]
                part[o + 8] = acc[8 * i + 3]
                part[o + 9] = acc[8 * i + 7]
        if cs_ == 0 and tq == 0:
            stats[sbase + 2 * (h0 + g)] = m0
            stats[sbase + 2 * (h0 + g) + 1] = l0
            stats[sbase + 2 * (h0 + g + 8)] = m1
            stats[sbase + 2 * (h0 + g + 8) + 1] = l1

    @cuda.jit
    def combine_kernel(ctx, part, stats, nch):
        """ctx float32 [T, H C] = the chunks' sum (module docstring); grid (T, H, C / 128), block 32:
        4 columns a lane, the chunks' partial rows loaded 4 chunks at a time (16 bytes each)."""
        griddep_wait()
        griddep_launch_dependents()
        t, h = cuda.blockIdx.x, cuda.blockIdx.y
        col = uint32(128 * cuda.blockIdx.z + 4 * cuda.threadIdx.x)
        big = NEG_INF
        used = 0
        for c in range(nch):                                 # the used chunks: a prefix (l >= 0)
            sb = ((t * nch + c) * H + h) * 2
            if stats[sb + 1] >= 0:
                big = max(big, stats[sb])
                used = c + 1
        zb = big if big != NEG_INF else np.float32(0.0)      # (a row that sees no key: every weight 0)
        a0 = a1 = a2 = a3 = np.float32(0.0)
        z = np.float32(0.0)
        if col < C:
            for c0 in range(0, used, 4):
                wv = cuda.local.array(4, float32)
                for i in range(4):
                    cc = min(c0 + i, used - 1)
                    sb = ((t * nch + cc) * H + h) * 2
                    wv[i] = math.exp(stats[sb] - zb) if c0 + i < used else np.float32(0.0)
                    z += wv[i] * stats[sb + 1]
                ws = cuda.local.array(16, uint32)
                for i in range(4):
                    cc = min(c0 + i, used - 1)
                    ws[4 * i], ws[4 * i + 1], ws[4 * i + 2], ws[4 * i + 3] = ld_v4(
                        part, uint32(((t * nch + cc) * H + h) * C + col))
                for i in range(4):
                    a0 += wv[i] * as_f32(ws[4 * i])
                    a1 += wv[i] * as_f32(ws[4 * i + 1])
                    a2 += wv[i] * as_f32(ws[4 * i + 2])
                    a3 += wv[i] * as_f32(ws[4 * i + 3])
            r = np.float32(1.0) / z if z > 0 else np.float32(0.0)
            o = t * H * C + h * C + col
            ctx[o] = a0 * r
            ctx[o + 1] = a1 * r
            ctx[o + 2] = a2 * r
            ctx[o + 3] = a3 * r

    return chunks_kernel, combine_kernel


def _unfit(H: int, C: int, R: int, kt: int, cs: int) -> str:
    """Why the chunk kernel has no tiling for these sizes ('' when it has one)."""
    if H % 16 or C % (64 * cs) or (C + R) % 32 or kt % 16 or (H // 16) * (kt // 8) % ((H // 16) * cs)\
            or TPB * (H // 16) * cs % kt:
        return f"no tiling for H {H}, C {C}, R {R}, KT {kt}, CS {cs}"
    if 4 * (kt * ((C + R) // 2 + 4) + H * (kt + 4)) > 48 * 1024:
        return f"a tile of {kt} keys x {C + R} columns exceeds 48 KiB of shared memory"
    return ""


def fits(n_heads: int, c_rank: int, r_dim: int, nope: int) -> bool:
    """Whether the one-pass core takes these sizes (else the caller keeps the GEMM core)."""
    return not _unfit(n_heads, c_rank, r_dim, KT, CS) and nope % 8 == 0


def chunks_for(rows: int, n_keys: int) -> int:
    """Key chunks a row for ``rows`` rows: about TARGET_BLOCKS blocks in all, at most one a tile of the
    cache's ``n_keys`` rows."""
    return max(1, min(MAX_CHUNKS, TARGET_BLOCKS // max(rows, 1), -(-n_keys // KT)))


def scratch_size(max_rows: int, n_heads: int, c_rank: int, n_keys: int) -> tuple[int, int]:
    """(part, stats) float32 elements the flash core needs at up to ``max_rows`` rows."""
    most = max(r * chunks_for(r, n_keys) for r in range(1, max_rows + 1))
    return most * n_heads * c_rank, most * n_heads * 2


def flash_mla(ctx, q_all, q, rot, cache, hidden, meta, scale: float, n_heads: int, c_rank: int, nope: int,
              rows: int, part, stats, stream=0, nch: int | None = None) -> None:
    """ctx float32 [T, H C] = the attention core of the grid's ``rows`` rows (module docstring): q_all
    int32 [T, H D / 2] (bf16 pairs; q_lat's words are read, its rope words not), q float32 [T, >= H (N +
    R)] (the query before the absorption: head h's rope dims at h (N + R) + N, rotated here by rot float32
    [T, R / 2, 2], the row's (cos, sin) pairs, and rounded to bf16 as ``mla.q_rope_kernel`` does), cache
    int32 [S8, D / 2] (bf16 pairs), hidden uint8 [T, S8], meta int32; part and stats flat float32 scratch
    (``scratch_size``); ``nch`` chunks a row (default ``chunks_for``)."""
    ctx = check(ctx, "ctx", np.float32, (None, None))
    t_max, hc = ctx.shape
    if hc != n_heads * c_rank:
        raise KernelInputError(f"ctx has {hc} columns, not {n_heads} heads x {c_rank}")
    cache = check(cache, "cache", np.int32, (None, None))
    s8, d2 = cache.shape
    r_dim = 2 * d2 - c_rank
    q_all = check(q_all, "q_all", np.int32, (t_max, n_heads * d2))
    hidden = check(hidden, "hidden", np.uint8, (None, s8))
    q = check(q, "q", np.float32, (t_max, None))
    if q.shape[1] < n_heads * (nope + r_dim) or nope % 8:
        raise KernelInputError(f"flash MLA: q has {q.shape[1]} columns for {n_heads} heads of {nope} + "
                               f"{r_dim} (nope a multiple of 8)")
    rot = check(rot, "rot", np.float32, (t_max, r_dim // 2, 2))
    if not 1 <= rows <= min(t_max, hidden.shape[0]):
        raise KernelInputError(f"flash MLA: {rows} rows, buffers of {t_max} / {hidden.shape[0]}")
    nch = nch or chunks_for(rows, s8)
    if not 1 <= nch <= MAX_CHUNKS:
        raise KernelInputError(f"flash MLA: {nch} chunks a row, 1..{MAX_CHUNKS} allowed")
    part = check(part, "part", np.float32, (None,))
    stats = check(stats, "stats", np.float32, (None,))
    if part.shape[0] < rows * nch * hc or stats.shape[0] < rows * nch * n_heads * 2:
        raise KernelInputError(f"flash MLA: scratch for {rows} rows x {nch} chunks too small")
    chunks, combine = make_flash_mla(n_heads, c_rank, r_dim, KT, CS)
    nw = (n_heads // 16) * CS
    launch(chunks, (nch, rows), (TPB, nw), stream,
           (part, stats, q_all.reshape(-1), q.reshape(-1), rot.reshape(-1), cache.reshape(-1), hidden, meta,
            np.float32(scale), np.int32(nch), np.int32(q.shape[1]), np.int32(nope)))
    launch(combine, (rows, n_heads, -(-c_rank // (4 * TPB))), TPB, stream,
           (ctx.reshape(-1), part, stats, np.int32(nch)))

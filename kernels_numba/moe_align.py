"""Device-side token routing for the fused MoE: align (token, expert) pairs into 8-row expert tiles,
and the final top-k combine. No host synchronisation: counts, offsets and the tile count stay on
the device; later kernels read ``meta[0]`` and let surplus blocks exit (graph-capturable).

Legend: T tokens, K routed experts per token, E routed experts, S shared pseudo-experts (the shared
MLP split into S experts of the routed width), D model width, P = T*K + T*S pairs.
Pair p < T*K is (token p // K, expert topk_ids.flat[p], weight topk_w.flat[p]); pair T*K + s*T + t
is (token t, expert E + s, weight 1). A tile is 8 pairs of one expert; ``tile_rows`` holds pair
ids in increasing order per expert, -1 for padding. Up to P tiles (each pair alone in the worst case).
"""

from __future__ import annotations

import functools

import numpy as np
from numba import cuda, float32, int32

from .device import SIMULATED
from .intrinsics import griddep_wait


def expert_tiles(ids) -> int:
    """The tiles the kernel below makes of routed ids [T, K] (each expert's pairs in tiles of 8): the
    times the tiled MoE path reads an expert's weights."""
    _, counts = np.unique(np.asarray(ids).reshape(-1), return_counts=True)
    return int(((counts + 7) >> 3).sum())


@functools.cache
def make_align_kernel(EX: int, NTHR: int):
    """EX = E + S experts (closure constant: shared-memory histogram size); NTHR threads, one block."""
    PER = -(-EX // NTHR)                                  # experts per thread in the scan

    @cuda.jit
    def moe_align_kernel(tile_expert, tile_rows, meta, topk_ids, n_tok, k_top, n_routed, max_tiles,
                         cnt, n_cnt, arrival):
        tid = cuda.threadIdx.x
        for i in range(tid, n_cnt, NTHR):                     # the gate/up GEMM's unit counters
            cnt[i] = 0
        counts = cuda.shared.array(EX, int32)
        starts = cuda.shared.array(EX, int32)
        fill = cuda.shared.array(EX, int32)
        part = cuda.shared.array(NTHR, int32)
        bad = cuda.shared.array(1, int32)
        tk = n_tok * k_top
        n_pairs = tk + n_tok * (EX - n_routed)
        for e in range(tid, EX, NTHR):
            counts[e] = 0
            fill[e] = 0
        if tid == 0:
            bad[0] = 0
        for i in range(tid, max_tiles * 8, NTHR):
            tile_rows[i] = -1
        cuda.syncthreads()
        # 1. histogram of pairs per expert (ids outside [0, E) are dropped and flagged)
        for p in range(tid, n_pairs, NTHR):
            e = topk_ids[p] if p < tk else n_routed + (p - tk) // n_tok
            if 0 <= e < EX and (p >= tk or e < n_routed):
                cuda.atomic.add(counts, e, 1)
            else:
                bad[0] = 1
        cuda.syncthreads()
        # 2. tiles per expert, exclusive prefix sum: serial over PER experts, then a shared-memory
        #    Hillis-Steele scan over the NTHR partial sums
        local = 0
        for i in range(PER):
            e = tid * PER + i
            if e < EX:
                local += (counts[e] + 7) >> 3
        part[tid] = local
        cuda.syncthreads()
        off = 1
        while off < NTHR:
            v = part[tid - off] if tid >= off else 0
            cuda.syncthreads()
            part[tid] += v
            cuda.syncthreads()
            off <<= 1
        run = part[tid] - local                             # exclusive prefix of this thread
        for i in range(PER):
            e = tid * PER + i
            if e < EX:
                starts[e] = run
                nt = (counts[e] + 7) >> 3
                for j in range(nt):
                    tile_expert[run + j] = e
                run += nt
        if tid == NTHR - 1:
            meta[0] = part[tid]
            meta[1] = bad[0]
        cuda.syncthreads()
        # 3. each expert's pair ids into its segment [8 starts[e], 8 starts[e] + counts[e]) of
        #    ``arrival``, in the order the atomics happen to serve them
        for p in range(tid, n_pairs, NTHR):
            e = topk_ids[p] if p < tk else n_routed + (p - tk) // n_tok
            if 0 <= e < EX and (p >= tk or e < n_routed):
                arrival[starts[e] * 8 + cuda.atomic.add(fill, e, 1)] = p
        cuda.syncthreads()
        # 4. ... then into the tiles in pair order (a pair's rank among its expert's pairs): the tile a pair
        #    lands in decides where the stream-K GEMMs split its sums, so an arrival order that changes
        #    from run to run would change the last bits of its output
        for i in range(tid, meta[0] * 8, NTHR):
            e = tile_expert[i >> 3]
            base = starts[e] * 8
            if i - base < counts[e]:
                p = arrival[i]
                rank = 0
                for j in range(base, base + counts[e]):
                    if arrival[j] < p:
                        rank += 1
                tile_rows[base + rank] = p

    return moe_align_kernel


@functools.cache
def make_combine_kernel(D: int, K: int, S: int, ACC: bool = False, EXTRA: bool = False):
    """out[t, n] (+= when ACC) = sum_k y[t*K + k, n] + sum_s y[T*K + s*T + t, n] (router weights already
    in y), over the slots k whose expert id lies in [0, n_routed): a dropped pair's y row is never
    written. ACC adds the sum into out (the residual rows) in one addition, as a separate add would;
    EXTRA then adds extra[t, n] (a shared expert's output computed apart) in one more, so the bits are
    those of adding it into out afterwards. ``extra`` is not read without EXTRA."""

    @cuda.jit
    def moe_combine_kernel(out, y, n_tok, topk_ids, n_routed, extra):
        griddep_wait()                                        # y is down's (a no-op without PDL)
        n = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
        t = cuda.blockIdx.y
        if n < D:
            s = float32(0.0)
            for k in range(K):
                e = topk_ids[t * K + k]
                if 0 <= e < n_routed:
                    s += y[(t * K + k) * D + n]
            for j in range(S):
                s += y[(n_tok * K + j * n_tok + t) * D + n]
            v = out[t * D + n] + s if ACC else s
            if EXTRA:
                v += extra[t * D + n]
            out[t * D + n] = v

    return moe_combine_kernel


def align_threads(ex: int) -> int:
    """Threads of the align block: a power of two >= 32 covering the experts (<= 1024)."""
    n = 32
    while n < min(ex, 1024 if not SIMULATED else 64):
        n *= 2
    return n

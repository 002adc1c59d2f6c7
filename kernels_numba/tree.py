"""DDTree draft-tree kernels: per-position top-k log-probs of the draft logits and the tree compile
(control block -> verify ids, depths and ancestor mask).

Legend: L drafted positions, V vocabulary, B budget, K = min(B, V), N <= B tree nodes, node 0 = root.
Mirrors ``workbench.ddtree.tree`` (top_k_log_probs, visibility_from_parents, compile_tree) exactly,
ties included. The best-first heap between the two runs on the host over the copied top-k table
(``workbench.engine.tree_host``).

ctl (int32 [5, W], W >= B + 1, one upload per round): row 0 input ids [root, tokens...], row 1
depths [0, ...], row 2 parents [-1, ...], row 3 accepted offsets of the previous round (kv.py),
row 4 = [start, prev accepted count, prev start, N + 1].
"""

from __future__ import annotations

import math

import numpy as np
from numba import cuda

from .blockops import TPB, block_argmax
from .device import SIMULATED

BIG = 2 ** 30


SORT_MAX = 2048                 # vocabularies up to this size are sorted in shared memory
TOPK_MAX_THREADS = 1024
# block size of the sorting top-k: one bitonic comparator per thread and step at V = 2048 (a 256-thread
# block looping over 4 comparators each spent 131 us on the pair's 15 x 2048 table, latency-bound)
TOPK_THREADS = TPB if SIMULATED else TOPK_MAX_THREADS


@cuda.jit(device=True)
def _precedes(ka, ia, kb, ib):
    # top-k order: larger logit first, ties to the lower token id
    return ka > kb or (ka == kb and ia < ib)


@cuda.jit(device=True)
def _row_lse(shf, shd, logits, src):
    """float64 logsumexp of logits[src, :], identical in every thread of the block (blockDim a power
    of two <= TOPK_MAX_THREADS): per-thread partials, then shared-memory tree reductions."""
    tid = cuda.threadIdx.x
    nt = cuda.blockDim.x
    v_count = logits.shape[1]
    m = -math.inf
    for j in range(tid, v_count, nt):
        m = max(m, logits[src, j])
    shf[tid] = m
    cuda.syncthreads()
    h = nt // 2
    while h > 0:
        if tid < h:
            shf[tid] = max(shf[tid], shf[tid + h])
        cuda.syncthreads()
        h //= 2
    m64 = np.float64(shf[0])
    acc = np.float64(0.0)
    for j in range(tid, v_count, nt):
        acc += math.exp(np.float64(logits[src, j]) - m64)
    shd[tid] = acc
    cuda.syncthreads()
    h = nt // 2
    while h > 0:
        if tid < h:
            shd[tid] += shd[tid + h]
        cuda.syncthreads()
        h //= 2
    return m64 + math.log(shd[0])


@cuda.jit
def topk_sort_kernel(out, logits, row0, k):
    """V <= SORT_MAX: bitonic sort of the padded row's (logit, id) pairs in shared memory
    (log2(V)^2 / 2 barrier steps, independent of K; comparator p of a step joins i = p with a zero
    bit inserted at the stride's position and j = i + stride). grid (L,), block (nt,), nt a power of
    two <= TOPK_MAX_THREADS."""
    row = cuda.blockIdx.x
    src = row0 + row
    tid = cuda.threadIdx.x
    nt = cuda.blockDim.x
    shf = cuda.shared.array(TOPK_MAX_THREADS, np.float32)
    shd = cuda.shared.array(TOPK_MAX_THREADS, np.float64)
    keys = cuda.shared.array(SORT_MAX, np.float32)
    idx = cuda.shared.array(SORT_MAX, np.int32)
    v_count = logits.shape[1]
    lse = _row_lse(shf, shd, logits, src)
    n2 = 1
    while n2 < v_count:
        n2 *= 2
    for i in range(tid, n2, nt):
        if i < v_count:
            keys[i] = logits[src, i]
            idx[i] = i
        else:
            keys[i] = -math.inf
            idx[i] = BIG
    cuda.syncthreads()
    size = 2
    while size <= n2:                                        # bitonic network: position 0 = first in order
        stride = size // 2
        while stride > 0:
            for p in range(tid, n2 // 2, nt):
                i = ((p & ~(stride - 1)) << 1) | (p & (stride - 1))
                j = i + stride
                ki = keys[i]
                kj = keys[j]
                ii = idx[i]
                ij = idx[j]
                if (i & size) == 0:
                    swap = _precedes(kj, ij, ki, ii)
                else:
                    swap = _precedes(ki, ii, kj, ij)
                if swap:
                    keys[i] = kj
                    keys[j] = ki
                    idx[i] = ij
                    idx[j] = ii
            cuda.syncthreads()
            stride //= 2
        size *= 2
    for r in range(tid, k, nt):
        out[0, row, r] = np.float64(keys[r]) - lse
        out[1, row, r] = idx[r]


@cuda.jit
def topk_rounds_kernel(out, logits, row0, k):
    """Any V: K rounds of a block-wide argmax below the previous pick (K * V / 32 reads per
    thread). grid (L,), block (32,)."""
    row = cuda.blockIdx.x
    src = row0 + row
    tid = cuda.threadIdx.x
    shv = cuda.shared.array(TPB, np.float32)
    shi = cuda.shared.array(TPB, np.int32)
    shf = cuda.shared.array(TOPK_MAX_THREADS, np.float32)
    shd = cuda.shared.array(TOPK_MAX_THREADS, np.float64)
    lse = _row_lse(shf, shd, logits, src)
    pv = math.inf                                            # previous pick (value, id)
    pi = -1
    for r in range(k):
        bv = -math.inf
        bi = BIG
        for j in range(tid, logits.shape[1], TPB):
            v = logits[src, j]
            if (v < pv or (v == pv and j > pi)) and (v > bv or (v == bv and j < bi)):
                bv = v
                bi = j
        bv, bi = block_argmax(shv, shi, bv, bi)
        if tid == 0:
            out[0, row, r] = np.float64(bv) - lse
            out[1, row, r] = bi
        pv = bv
        pi = bi


def topk_logprobs(out, logits, row0, k: int, n_rows: int, stream=0) -> None:
    """out [2, L, >=K] float64: out[0] = top-k log-softmax values, out[1] = their token ids (exact in
    float64; one array, so the host fetches the table with one copy), of rows row0 .. row0+L-1 of
    logits [*, V] float32; order: value descending, ties to the lower id; log-softmax in float64
    like ``workbench.ddtree.tree.top_k_log_probs``. Sorts in shared memory when V <= SORT_MAX
    (TOPK_THREADS threads per row: 1024 on the GPU, 32 under the simulator), else K selection rounds.
    """
    if logits.shape[1] <= SORT_MAX:
        topk_sort_kernel[n_rows, TOPK_THREADS, stream](out, logits, np.int32(row0), np.int32(k))
    else:
        topk_rounds_kernel[n_rows, TPB, stream](out, logits, np.int32(row0), np.int32(k))


@cuda.jit
def tree_compile_kernel(ids, depth, vis, meta, ctl):
    """ids [T], depth [T], vis [T, T] uint8 ancestor-or-self, meta[0:2] = (start, N+1) from ctl.

    grid (1,), block (32,); rows >= N+1 are left alone (kernels skip them via meta[1]).
    """
    tid = cuda.threadIdx.x
    n = ctl[4, 3]
    for i in range(tid, n, TPB):
        ids[i] = ctl[0, i]
        depth[i] = ctl[1, i]
        for j in range(n):
            vis[i, j] = 0
        a = i
        while a >= 0:
            vis[i, a] = 1
            a = ctl[2, a]
    if tid == 0:
        meta[0] = ctl[4, 0]
        meta[1] = n

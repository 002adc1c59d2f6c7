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

from ._validate import empty
from .blockops import TPB, block_argmax
from .device import SIMULATED
from .intrinsics import griddep_launch_dependents, griddep_wait
from .launch import launch

BIG = 2 ** 30


SORT_MAX = 2048                 # vocabularies up to this size are sorted in shared memory
# larger ones in chunks of CHUNK logits, the chunks' K best merged (32 KB of shared memory each):
# K2's 163,840 in 40 chunks at K <= 102
CHUNK_MAX = MERGE_MAX = 4096
CHUNK = 256 if SIMULATED else CHUNK_MAX
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
    return _range_lse(shf, shd, logits, src, 0, logits.shape[1])


@cuda.jit(device=True)
def _range_lse(shf, shd, logits, src, lo, hi):
    """``_row_lse`` of logits[src, lo:hi]."""
    tid = cuda.threadIdx.x
    nt = cuda.blockDim.x
    m = -math.inf
    for j in range(lo + tid, hi, nt):
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
    for j in range(lo + tid, hi, nt):
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


@cuda.jit(device=True)
def _bitonic(keys, idx, n2):
    """Sort the block's shared (key, id) pairs [n2], n2 a power of two, into top-k order (position 0
    first): log2(n2)^2 / 2 barrier steps; comparator p of a step joins i = p with a zero bit inserted
    at the stride's position and j = i + stride. The caller has synchronised after filling them."""
    tid = cuda.threadIdx.x
    nt = cuda.blockDim.x
    size = 2
    while size <= n2:
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


@cuda.jit(device=True)
def _sorted_range(keys, idx, logits, src, lo, hi):
    """logits[src, lo:hi] with their ids into the shared keys / idx, padded to n2 (the next power of two)
    with (-inf, BIG), sorted into top-k order; returns n2."""
    tid = cuda.threadIdx.x
    nt = cuda.blockDim.x
    n2 = 1
    while n2 < hi - lo:
        n2 *= 2
    for i in range(tid, n2, nt):
        if lo + i < hi:
            keys[i] = logits[src, lo + i]
            idx[i] = lo + i
        else:
            keys[i] = -math.inf
            idx[i] = BIG
    cuda.syncthreads()
    _bitonic(keys, idx, n2)
    return n2


@cuda.jit
def topk_sort_kernel(out, logits, row0, k):
    """V <= SORT_MAX: bitonic sort of the padded row's (logit, id) pairs in shared memory (independent
    of K). grid (L,), block (nt,), nt a power of two <= TOPK_MAX_THREADS."""
    griddep_wait()                                          # PDL: the inputs are earlier kernels'
    griddep_launch_dependents()
    row = cuda.blockIdx.x
    src = row0 + row
    tid = cuda.threadIdx.x
    nt = cuda.blockDim.x
    shf = cuda.shared.array(TOPK_MAX_THREADS, np.float32)
    shd = cuda.shared.array(TOPK_MAX_THREADS, np.float64)
    keys = cuda.shared.array(SORT_MAX, np.float32)
    idx = cuda.shared.array(SORT_MAX, np.int32)
    lse = _row_lse(shf, shd, logits, src)
    _sorted_range(keys, idx, logits, src, 0, logits.shape[1])
    for r in range(tid, k, nt):
        out[0, row, r] = np.float64(keys[r]) - lse
        out[1, row, r] = idx[r]


@cuda.jit
def topk_rounds_kernel(out, logits, row0, k):
    """Any V: K rounds of a block-wide argmax below the previous pick (K * V / 32 reads per
    thread). grid (L,), block (32,)."""
    griddep_wait()                                          # PDL: the inputs are earlier kernels'
    griddep_launch_dependents()
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


@cuda.jit
def topk_chunk_kernel(part_v, part_i, part_lse, logits, row0, k, chunk):
    """Large V, stage 1: block (c, row) sorts logits[row0 + row, c*chunk : (c+1)*chunk] in shared memory
    and keeps its first K pairs (part_v / part_i [L, S, K]; -inf / BIG past the chunk's end) and the
    chunk's float64 logsumexp (part_lse [L, S]). grid (S, L), block (nt,); chunk <= CHUNK_MAX."""
    griddep_wait()                                          # PDL: the inputs are earlier kernels'
    griddep_launch_dependents()
    c = cuda.blockIdx.x
    row = cuda.blockIdx.y
    src = row0 + row
    tid = cuda.threadIdx.x
    nt = cuda.blockDim.x
    shf = cuda.shared.array(TOPK_MAX_THREADS, np.float32)
    shd = cuda.shared.array(TOPK_MAX_THREADS, np.float64)
    keys = cuda.shared.array(CHUNK_MAX, np.float32)
    idx = cuda.shared.array(CHUNK_MAX, np.int32)
    lo = c * chunk
    hi = min(lo + chunk, logits.shape[1])
    lse = _range_lse(shf, shd, logits, src, lo, hi)
    n2 = _sorted_range(keys, idx, logits, src, lo, hi)
    for r in range(tid, k, nt):
        if r < n2:
            part_v[row, c, r] = keys[r]
            part_i[row, c, r] = idx[r]
        else:
            part_v[row, c, r] = -math.inf
            part_i[row, c, r] = BIG
    if tid == 0:
        part_lse[row, c] = lse


@cuda.jit
def topk_merge_kernel(out, part_v, part_i, part_lse, k):
    """Large V, stage 2: the S chunks' K candidates of a row sorted in shared memory, the first K written
    as ``topk_logprobs`` does, the chunks' logsumexps combined in chunk order. grid (L,), block (nt,);
    S * K <= MERGE_MAX."""
    griddep_wait()                                          # PDL: the inputs are earlier kernels'
    griddep_launch_dependents()
    row = cuda.blockIdx.x
    tid = cuda.threadIdx.x
    nt = cuda.blockDim.x
    keys = cuda.shared.array(MERGE_MAX, np.float32)
    idx = cuda.shared.array(MERGE_MAX, np.int32)
    tot = cuda.shared.array(1, np.float64)
    s_count = part_v.shape[1]
    n = s_count * k
    n2 = 1
    while n2 < n:
        n2 *= 2
    for i in range(tid, n2, nt):
        if i < n:
            keys[i] = part_v[row, i // k, i % k]
            idx[i] = part_i[row, i // k, i % k]
        else:
            keys[i] = -math.inf
            idx[i] = BIG
    if tid == 0:                                         # logsumexp of the chunks' logsumexps, in order
        m = -math.inf
        for c in range(s_count):
            m = max(m, part_lse[row, c])
        acc = np.float64(0.0)
        for c in range(s_count):
            acc += math.exp(part_lse[row, c] - m)
        tot[0] = m + math.log(acc)
    cuda.syncthreads()
    _bitonic(keys, idx, n2)
    lse = tot[0]
    for r in range(tid, k, nt):
        out[0, row, r] = np.float64(keys[r]) - lse
        out[1, row, r] = idx[r]


_PARTS: dict = {}


def _chunk_parts(n_rows: int, s: int, k: int):
    """Stage 1's outputs for (L, S, K), allocated once per shape (the draft runs every round)."""
    key = (n_rows, s, k)
    if key not in _PARTS:
        _PARTS[key] = (empty((n_rows, s, k), np.float32), empty((n_rows, s, k), np.int32),
                       empty((n_rows, s), np.float64))
    return _PARTS[key]


def topk_logprobs(out, logits, row0, k: int, n_rows: int, stream=0, chunk: int = 0) -> None:
    """out [2, L, >=K] float64: out[0] = top-k log-softmax values, out[1] = their token ids (exact in
    float64; one array, so the host fetches the table with one copy), of rows row0 .. row0+L-1 of
    logits [*, V] float32; order: value descending, ties to the lower id; log-softmax in float64
    like ``workbench.ddtree.tree.top_k_log_probs``. V <= SORT_MAX: one block per row sorts it in shared
    memory (TOPK_THREADS threads: 1024 on the GPU, 32 under the simulator). Larger V: S blocks per row
    each sort a chunk of ``chunk`` (default CHUNK) logits and keep K, one block per row merges the S K
    candidates, when S K <= MERGE_MAX; else K rounds of a block-wide argmax (a warp per row).
    """
    v = logits.shape[1]
    chunk = chunk or CHUNK
    s = -(-v // chunk)
    if v <= SORT_MAX:
        launch(topk_sort_kernel, n_rows, TOPK_THREADS, stream, (out, logits, np.int32(row0), np.int32(k)))
    elif chunk <= CHUNK_MAX and s * k <= MERGE_MAX:
        pv, pi, pl = _chunk_parts(n_rows, s, k)
        launch(topk_chunk_kernel, (s, n_rows), TOPK_THREADS, stream,
               (pv, pi, pl, logits, np.int32(row0), np.int32(k), np.int32(chunk)))
        launch(topk_merge_kernel, n_rows, TOPK_THREADS, stream, (out, pv, pi, pl, np.int32(k)))
    else:
        launch(topk_rounds_kernel, n_rows, TPB, stream, (out, logits, np.int32(row0), np.int32(k)))


@cuda.jit
def tree_compile_kernel(ids, depth, vis, meta, ctl):
    """ids [T], depth [T], vis [T, T] uint8 ancestor-or-self, meta[0:2] = (start, N+1) from ctl.

    grid (1,), block (32,); rows >= N+1 are left alone (kernels skip them via meta[1]).
    """
    griddep_wait()                                          # PDL: the inputs are earlier kernels'
    griddep_launch_dependents()
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

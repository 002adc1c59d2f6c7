"""DDTree draft-tree kernels: per-position top-k log-probs on the device, the best-first heap build
(host, numba-compiled, on the copied top-k), the greedy walk (host) and the tree compile (device).

Legend: L drafted positions, V vocabulary, B budget, K = min(B, V), N <= B tree nodes, node 0 = root.
Mirrors ``workbench.ddtree.tree`` (top_k_log_probs, build_tree, visibility_from_parents,
compile_tree) and ``workbench.ddtree.walk.walk`` exactly, including the heap's tie-break on the
rank path, so engine trees equal reference trees node for node.

Why the build is on the host: it is B sequential pops with a data-dependent heap; a single GPU
thread would spend its time on dependent shared-memory latency, while the compiled host loop takes
a few microseconds at B = 64 once the L x K top-k table (a few KB) is copied back.

ctl (int32 [5, W], W >= B + 1, one upload per round): row 0 input ids [root, tokens...], row 1
depths [0, ...], row 2 parents [-1, ...], row 3 accepted offsets of the previous round (kv.py),
row 4 = [start, prev accepted count, prev start, N + 1].
"""

from __future__ import annotations

import math

import numba
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


@numba.njit(cache=False)
def _less(neg, paths, depth, a, b):
    # heap order of the reference: (-score, rank path) compared like Python tuples
    if neg[a] != neg[b]:
        return neg[a] < neg[b]
    da = depth[a]
    db = depth[b]
    for i in range(min(da, db)):
        if paths[a, i] != paths[b, i]:
            return paths[a, i] < paths[b, i]
    return da < db


@numba.njit(cache=False)
def build_tree_host(lp, ids, budget, n_pos, out):
    """Best-first heap over lp/ids [L, K] (float64 / int); writes the tree into ``out`` (int32 [3, >=B+1]:
    tokens, depths, parents with the root at column 0, root token left for the caller) and returns N."""
    k = min(budget, lp.shape[1])
    cap = 2 * budget + 2
    neg = np.empty(cap, np.float64)
    par = np.empty(cap, np.int64)
    dep = np.empty(cap, np.int64)
    rnk = np.empty(cap, np.int64)
    paths = np.empty((cap, n_pos), np.int64)
    heap = np.empty(cap, np.int64)
    out[1, 0] = 0
    out[2, 0] = -1
    if k == 0:
        return 0
    n_c = 1
    neg[0] = -lp[0, 0]
    par[0] = 0
    dep[0] = 1
    rnk[0] = 0
    paths[0, 0] = 0
    heap[0] = 0
    size = 1
    n = 0
    while size > 0 and n < budget:
        top = heap[0]                                        # pop the minimum, sift down
        size -= 1
        heap[0] = heap[size]
        i = 0
        while True:
            lch = 2 * i + 1
            if lch >= size:
                break
            c = lch
            if lch + 1 < size and _less(neg, paths, dep, heap[lch + 1], heap[lch]):
                c = lch + 1
            if _less(neg, paths, dep, heap[c], heap[i]):
                heap[c], heap[i] = heap[i], heap[c]
                i = c
            else:
                break
        d = dep[top]
        r = rnk[top]
        n += 1
        out[0, n] = ids[d - 1, r]
        out[1, n] = d
        out[2, n] = par[top]
        for kind in range(2):                                # sibling, then child (reference order)
            if kind == 0:
                if r + 1 >= k:
                    continue
                neg[n_c] = neg[top] + lp[d - 1, r] - lp[d - 1, r + 1]
                par[n_c] = par[top]
                dep[n_c] = d
                rnk[n_c] = r + 1
                for t in range(d - 1):
                    paths[n_c, t] = paths[top, t]
                paths[n_c, d - 1] = r + 1
            else:
                if d >= n_pos:
                    continue
                neg[n_c] = neg[top] - lp[d, 0]
                par[n_c] = n
                dep[n_c] = d + 1
                rnk[n_c] = 0
                for t in range(d):
                    paths[n_c, t] = paths[top, t]
                paths[n_c, d] = 0
            heap[size] = n_c                                 # push, sift up
            j = size
            size += 1
            n_c += 1
            while j > 0:
                p = (j - 1) // 2
                if _less(neg, paths, dep, heap[j], heap[p]):
                    heap[j], heap[p] = heap[p], heap[j]
                    j = p
                else:
                    break
    return n


@numba.njit(cache=False)
def walk_host(tree, n, post, acc):
    """Greedy walk over tree (int32 [3, >=N+1], as built above) with the target's tokens post [N+1].

    Writes accepted node indices (root first) into acc and returns (count, bonus token).
    """
    cur = 0
    count = 1
    acc[0] = 0
    nxt = post[0]
    while True:
        child = -1
        for i in range(cur + 1, n + 1):                      # children have larger indices
            if tree[2, i] == cur and tree[0, i] == nxt:
                child = i
                break
        if child < 0:
            return count, nxt
        acc[count] = child
        count += 1
        cur = child
        nxt = post[cur]


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

"""The engine's host half of a DDTree round: the best-first heap over the copied top-k table and the
walk, numba-compiled on the host (the device kernels around them are kernels_numba/tree.py).

Legend: L drafted positions, B budget, K = min(B, V), N <= B tree nodes, node 0 = root.
Mirrors ``workbench.ddtree.tree.build_tree`` and ``workbench.ddtree.walk.walk`` exactly, including the
heap's tie-break on the rank path, so engine trees equal reference trees node for node.

Why the build is on the host: it is B sequential pops with a data-dependent heap; a single GPU
thread would spend its time on dependent shared-memory latency, while the compiled host loop takes
a few microseconds at B = 64 once the L x K top-k table (a few KB) is copied back.

The tree is written into rows 0-2 of the control block ``ctl`` (int32 [5, W], layout in
kernels_numba/tree.py) that the verify step uploads.
"""

from __future__ import annotations

import numba
import numpy as np


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
def _verify_us(rows, verify_us, n):
    return np.interp(np.float64(n + 1), rows, verify_us)


@numba.njit(cache=False)
def _rate(cum, n, rows, verify_us, round_us):
    """E(n) / cost of a round verifying n nodes, E(n) = 1 + p_1 + ... + p_n (``TreeBudget.choose``)."""
    return (1.0 + cum) / (round_us + _verify_us(rows, verify_us, n))


@numba.njit(cache=False)
def _bound(cum, p_n, n, budget, rows, verify_us, round_us):
    """The best rate a tree of s in (n, budget] nodes can reach when every further pop has p <= p_n:
    max over s of (1 + cum + (s - n) p_n) / cost(s). Between two of the curve's rows the cost is linear
    in s, so the ratio is monotone there and its maximum sits at s = n + 1, budget or a row - 1 between."""
    best = 0.0
    for j in range(-1, rows.shape[0] + 1):
        s = n + 1 if j == -1 else budget if j == rows.shape[0] else np.int64(rows[j]) - 1
        if n < s <= budget:
            best = max(best, _rate(cum + (s - n) * p_n, s, rows, verify_us, round_us))
    return best


@numba.njit(cache=False)
def _cost_aware_n(cand_n, cand_rate, count, tie):
    """The largest candidate whose rate is within ``tie`` of the best (``TreeBudget.choose``'s rule)."""
    best = cand_rate[0]
    for i in range(1, count):
        best = max(best, cand_rate[i])
    pick = cand_n[0]
    for i in range(count):
        if cand_rate[i] >= best * (1.0 - tie):
            pick = cand_n[i]
    return pick, best


@numba.njit(cache=False)
def build_tree_host(lp, ids, budget, n_pos, out, scores, sizes, rows, verify_us, round_us, tie):
    """Best-first heap over lp/ids [L, K] (float64 / int); writes the tree into ``out`` (int32 [3, >=B+1]:
    tokens, depths, parents with the root at column 0, root token left for the caller) and each node's
    log q(path) into ``scores`` (float64 [>=B+1], scores[0] = 0 for the root), and returns N.

    Fixed budget (``sizes`` empty): N is every node built. Cost-aware (``TreeBudget.host_cost``: the
    candidate sizes, the cost curve, ``tie``): N is ``TreeBudget.choose`` over the pops, and the heap stops
    as soon as no larger tree can win: the nodes still to pop have p <= p_n, so a tree of s > n nodes
    has E(s) <= E(n) + (s - n) p_n, and once that bound's rate stays below the best candidate's at every
    s <= B, the rest of the heap cannot change the choice.
    """
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
    scores[0] = 0.0
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
    n_sizes = sizes.shape[0]
    cand_n = np.empty(n_sizes + 1, np.int64)
    cand_rate = np.empty(n_sizes + 1, np.float64)
    count = 0
    cum = 0.0                                                # p_1 + ... + p_n, summed as expected_tokens does
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
        scores[n] = -neg[top]
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
        if n_sizes == 0:
            continue
        p_n = np.exp(scores[n])
        cum += p_n
        if count < n_sizes and n == sizes[count]:            # a candidate size: its rate, then the bound
            cand_n[count] = n
            cand_rate[count] = _rate(cum, n, rows, verify_us, round_us)
            count += 1
            pick, best = _cost_aware_n(cand_n, cand_rate, count, tie)
            if _bound(cum, p_n, n, budget, rows, verify_us, round_us) < best * (1.0 - tie):
                return pick
    if n_sizes == 0 or n == 0:
        return n
    if count == 0 or cand_n[count - 1] != n:                 # the heap ran out: the whole tree is one
        cand_n[count] = n
        cand_rate[count] = _rate(cum, n, rows, verify_us, round_us)
        count += 1
    return _cost_aware_n(cand_n, cand_rate, count, tie)[0]


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

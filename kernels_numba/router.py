"""The noaux_tc sigmoid router on the device, mirroring ``workbench.reference.moe.moe_gate``.

Legend: T rows, n = meta[1] live rows, D model width, E routed experts, K experts per token,
G routing groups, S slices of D. One (32, KS)-thread block per row: the threads compute the E gate
logits, or sum them from S partial slices (``slices``: ``logit_slices_kernel`` wrote them, and a thread
loads all of its partials before the first sum); thread 0 applies the (tiny) group limit; then one warp
picks the K experts, each pick a max over the warp (a lane scans the experts it holds in registers,
then five shuffles over the lanes; one thread scanning 384 experts K times took ~280 us on the H200),
ties to the lowest index, exactly as the reference's stable argsort does.

``logit_slices_kernel`` reads a large gate (K2's: 7,168 x 384 float32, 11 MB) with many blocks, and
sums each row's logit in an order that does not depend on how many rows run: a row's routing in a
tree verify is then bit for bit its routing in a one-row decode (a cuBLAS SGEMM picks its kernel,
hence its summation order, by the row count).
"""

from __future__ import annotations

import math

import numpy as np
from numba import cuda, uint16

from ._validate import KernelInputError
from .blockops import KS, NEG_INF, TPB
from .intrinsics import f32_to_h2, griddep_launch_dependents, griddep_wait, shfl_xor
from .resources import register_cap

_CACHE: dict = {}


@cuda.jit(device=True, inline="always")
def sigmoid_ref(x):
    """The reference's overflow-free logistic: exp(-|x|) on both branches."""
    e = math.exp(-abs(x))
    if x >= 0:
        return np.float32(1.0) / (np.float32(1.0) + e)
    return e / (np.float32(1.0) + e)


SLICE_D = 512         # features per slice of the sliced logits (K2: 14 slices)
SLICE_WARPS = 16      # warps per block, each over SLICE_D / SLICE_WARPS features of the slice
SLICE_ROWS = 8        # rows per pass over the slice (one accumulator each per thread)
MOST_SPAN = 64        # most gate values a thread holds in registers


def logit_slice_count(d: int, slice_d: int = SLICE_D) -> int:
    """S: the slices of D the sliced logits sum separately."""
    return -(-d // slice_d)


def make_logit_slices(slice_d: int = SLICE_D, warps: int = SLICE_WARPS, f16: bool = False):
    """The sliced logits kernel for slices of ``slice_d`` features and ``warps`` warps a block (each
    thread holds slice_d / warps gate values in registers, at most MOST_SPAN); ``f16``: its first
    column of blocks also writes the float16 bits of the rows it reads into ``x16`` (the fused MoE's
    input, which then needs no conversion kernel of its own)."""
    key = ("slices", slice_d, warps, f16)
    if key in _CACHE:
        return _CACHE[key]
    if slice_d % (32 * warps) or not 1 <= slice_d // warps <= MOST_SPAN:
        raise KernelInputError(f"a slice of {slice_d} features over {warps} warps is not 1..{MOST_SPAN} "
                               "features a thread and a multiple of the block's threads")
    SD, NW, NR = slice_d, warps, SLICE_ROWS
    F = SD // NW
    CPR = SD // (32 * NW)                                       # x values a thread stages per row
    XPT = NR * CPR                                              # (numba sizes arrays from a constant)

    @cuda.jit(**register_cap(32 * NW))                      # 32 gate values a thread fit under the cap
    def logit_slices(parts, x, gate_t, meta, x16):
        """parts [S*T, E] (row s*T + t: slice s of row t) = x[t, slice s] @ gate_t[slice s, :] for the live
        rows. grid (ceil(E/32), S), block (32, NW): thread (c, w) sums features w*F .. w*F + F - 1 of the
        slice (F = SD / NW) in order for expert 32*bx + c, the warps' sums then add in warp order; the
        rows go NR at a time through shared memory. The F gate values are loaded into registers before
        the PDL wait (weights depend on no earlier kernel), so the 11 MB read of K2's gate overlaps the
        kernel before, and serve every pass. Every row's sum is the same sequence of float32 operations
        whatever the number of rows."""
        c = cuda.threadIdx.x
        w = cuda.threadIdx.y
        e = cuda.blockIdx.x * 32 + c
        s = cuda.blockIdx.y
        d_all = gate_t.shape[0]
        n_exp = gate_t.shape[1]
        d0 = s * SD
        gv = cuda.local.array(F, np.float32)
        span = e < n_exp and d0 + w * F + F <= d_all          # a whole span: from registers
        if span:
            for j in range(F):
                gv[j] = gate_t[d0 + w * F + j, e]
        griddep_wait()                                          # x and meta are the previous kernel's
        griddep_launch_dependents()
        n = meta[1]
        t_all = parts.shape[0] // cuda.gridDim.y
        xs = cuda.shared.array((NR, SD), np.float32)
        red = cuda.shared.array((NW, NR, 32), np.float32)
        acc = cuda.local.array(NR, np.float32)
        lin = w * 32 + c
        xv = cuda.local.array(XPT, np.float32)
        for t0 in range(0, n, NR):
            for t in range(NR):                                 # every load in flight before a store
                for q in range(CPR):
                    d = d0 + q * 32 * NW + lin
                    xv[t * CPR + q] = x[t0 + t, d] if t0 + t < n and d < d_all else np.float32(0.0)
            for t in range(NR):
                for q in range(CPR):
                    d = d0 + q * 32 * NW + lin
                    xs[t, d - d0] = xv[t * CPR + q]
                    if f16 and cuda.blockIdx.x == 0 and t0 + t < n and d < d_all:
                        x16[t0 + t, d] = uint16(f32_to_h2(xv[t * CPR + q], np.float32(0.0)) & 0xFFFF)
            cuda.syncthreads()
            for t in range(NR):
                acc[t] = np.float32(0.0)
            if span:
                for j in range(F):
                    for t in range(NR):
                        acc[t] += xs[t, w * F + j] * gv[j]
            elif e < n_exp:                                         # the last slice's tail, one at a time
                for j in range(w * F, w * F + F):
                    if d0 + j < d_all:
                        gj = gate_t[d0 + j, e]
                        for t in range(NR):
                            acc[t] += xs[t, j] * gj
            for t in range(NR):
                red[w, t, c] = acc[t]
            cuda.syncthreads()
            if w == 0 and e < n_exp:
                for t in range(NR):
                    if t0 + t < n:
                        v = np.float32(0.0)
                        for u in range(NW):
                            v += red[u, t, c]
                        parts[s * t_all + t0 + t, e] = v
            cuda.syncthreads()

    _CACHE[key] = logit_slices
    return logit_slices


logit_slices_kernel = make_logit_slices()       # the package's configuration (x16 unused)
logit_slices_f16_kernel = make_logit_slices(f16=True)


def make_route(n_experts: int, top_k: int, n_group: int, topk_group: int, norm_topk: bool, scaling: float,
               ks: int = KS, slices: int = 0):
    """kernel(ids [T, K] int32, wts [T, K] f32, x, gate_t [D, E], bias [E], meta); grid (T,), block
    (32, ks). ``slices`` 0: x [T, D] and thread (e, s) sums every ks-th feature of expert e's gate
    logit; S >= 1: x is [S*T, E] of S partial logits per row (``logit_slices_kernel``; S = 1: whole
    logits), each expert's summed in slice order by one of the block's threads, and gate_t is not read.
    Then one warp picks the K: each lane holds experts lane, lane + 32, ... in registers."""
    key = (n_experts, top_k, n_group, topk_group, norm_topk, scaling, ks, slices)
    if key in _CACHE:
        return _CACHE[key]
    E, K, G, TG = n_experts, top_k, n_group, topk_group
    EG = E // G
    EL = -(-E // TPB)                                        # experts a lane of the selecting warp holds
    if EL > 62:
        raise KernelInputError(f"the router's selecting warp holds at most {62 * TPB} experts, got {E}")
    NORM = bool(norm_topk)
    SCALE = np.float32(scaling)
    NS = int(slices)
    NT = TPB * ks
    EPT = -(-E // NT)                                        # experts a thread scores
    NPV = max(1, EPT * NS)                                   # the partials it holds (numba: a constant)
    PKS = 1 if NS else ks                                    # (sliced logits come summed per slice)

    @cuda.jit
    def route_kernel(ids, wts, x, gate_t, bias, meta):
        griddep_wait()                                       # PDL: x is the previous kernel's
        griddep_launch_dependents()
        row = cuda.blockIdx.x
        if row >= meta[1]:
            return
        tid = cuda.threadIdx.x
        ty = cuda.threadIdx.y
        lt = ty * TPB + tid
        part = cuda.shared.array((PKS, E), np.float32)       # the in-kernel logits' partial sums
        score = cuda.shared.array(E, np.float32)             # unbiased sigmoid scores
        choice = cuda.shared.array(E, np.float32)            # biased, for selection only
        gsc = cuda.shared.array(G, np.float32)
        gok = cuda.shared.array(G, np.int32)
        if NS:                                               # every partial in flight before a sum
            rows_all = x.shape[0] // NS
            pv = cuda.local.array(NPV, np.float32)
            bw = cuda.local.array(EPT, np.float32)
            for i in range(EPT):
                e = lt + i * NT
                bw[i] = bias[e] if e < E else np.float32(0.0)
                for sl in range(NS):
                    pv[i * NS + sl] = x[sl * rows_all + row, e] if e < E else np.float32(0.0)
            for i in range(EPT):
                e = lt + i * NT
                if e < E:
                    acc = np.float32(0.0)
                    for sl in range(NS):
                        acc += pv[i * NS + sl]
                    s = sigmoid_ref(acc)
                    score[e] = s
                    choice[e] = s + bw[i]
        else:
            for e in range(tid, E, TPB):
                acc = np.float32(0.0)
                for d in range(ty, gate_t.shape[0], ks):
                    acc += x[row, d] * gate_t[d, e]
                part[ty, e] = acc
            cuda.syncthreads()
            if ty == 0:
                for e in range(tid, E, TPB):
                    acc = np.float32(0.0)
                    for y in range(ks):
                        acc += part[y, e]
                    s = sigmoid_ref(acc)
                    score[e] = s
                    choice[e] = s + bias[e]
        cuda.syncthreads()
        if G > 1 and lt == 0:                                # group limit: keep the TG best groups
            for g in range(G):
                b1 = -math.inf
                b2 = -math.inf
                for i in range(EG):
                    v = choice[g * EG + i]
                    if v > b1:
                        b2 = b1
                        b1 = v
                    elif v > b2:
                        b2 = v
                gsc[g] = b1 + b2 if EG > 1 else b1
                gok[g] = 0
            for _ in range(TG):
                best = -1
                for g in range(G):
                    if gok[g] == 0 and (best < 0 or gsc[g] > gsc[best]):
                        best = g
                gok[best] = 1
            for e in range(E):
                if gok[e // EG] == 0:
                    choice[e] = -math.inf
        cuda.syncthreads()
        if ty != 0:
            return
        pick = cuda.local.array(K, np.int32)                 # the K picks and their scores (every lane)
        pw = cuda.local.array(K, np.float32)
        cv = cuda.local.array(EL, np.float32)                # top-K by warp 0, ties to the lowest index:
        free = 0                                             # each lane's best free expert, then a
        for j in range(EL):                                  # butterfly over the 32 lanes
            e = tid + TPB * j
            cv[j] = choice[e] if e < E else NEG_INF
            if e < E:
                free |= 1 << j
        for k in range(K):
            bi = np.int32(-1)
            bv = NEG_INF
            for j in range(EL):
                if (free >> j) & 1 and (bi < 0 or cv[j] > bv):
                    bi = np.int32(tid + TPB * j)
                    bv = cv[j]
            for m in (16, 8, 4, 2, 1):                       # (value desc, index asc) is a total order:
                ov = shfl_xor(bv, m)                         # every lane ends on the same pick
                oi = shfl_xor(bi, m)
                if oi >= 0 and (bi < 0 or ov > bv or (ov == bv and oi < bi)):
                    bi = oi
                    bv = ov
            if bi % TPB == tid:
                free &= ~(1 << (bi // TPB))
            pick[k] = bi                                     # in registers: no global round trips
            pw[k] = score[bi]
        if tid == 0:
            total = np.float32(0.0)
            for k in range(K):
                total += pw[k]
            for k in range(K):
                w = pw[k]
                if NORM:
                    w = w / (total + np.float32(1e-20))
                ids[row, k] = pick[k]
                wts[row, k] = w * SCALE

    _CACHE[key] = route_kernel
    return route_kernel

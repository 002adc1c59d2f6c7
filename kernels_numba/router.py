"""The noaux_tc sigmoid router on the device, mirroring ``workbench.reference.moe.moe_gate``.

Legend: T rows, n = meta[1] live rows, D model width, E routed experts, K experts per token,
G routing groups. One (32, KS)-thread block per row: the threads compute the E gate logits (or
read them, where an SGEMM computed them: ``from_logits``); thread 0 applies the (tiny) group
limit; each of the K picks is a max over the block (per-thread scan, then a shared-memory tree:
one thread scanning 384 experts K times took ~280 us on the H200), ties to the lowest index,
exactly as the reference's stable argsort does.
"""

from __future__ import annotations

import math

import numpy as np
from numba import cuda

from ._validate import KernelInputError
from .blockops import KS, TPB

_CACHE: dict = {}


@cuda.jit(device=True)
def sigmoid_ref(x):
    """The reference's overflow-free logistic: exp(-|x|) on both branches."""
    e = math.exp(-abs(x))
    if x >= 0:
        return np.float32(1.0) / (np.float32(1.0) + e)
    return e / (np.float32(1.0) + e)


def make_route(n_experts: int, top_k: int, n_group: int, topk_group: int, norm_topk: bool, scaling: float,
               ks: int = KS, from_logits: bool = False):
    """kernel(ids [T, K] int32, wts [T, K] f32, x [T, D], gate_t [D, E], bias [E], meta); grid (T,),
    block (32, ks): thread (e, s) sums every ks-th feature of expert e's gate logit. ``from_logits``:
    x is the logits [T, E] and gate_t is not read."""
    key = (n_experts, top_k, n_group, topk_group, norm_topk, scaling, ks, from_logits)
    if key in _CACHE:
        return _CACHE[key]
    E, K, G, TG = n_experts, top_k, n_group, topk_group
    EG = E // G
    NORM = bool(norm_topk)
    SCALE = np.float32(scaling)
    LOGITS = bool(from_logits)
    NT = TPB * ks
    if NT & (NT - 1):
        raise KernelInputError(f"the router's top-K tree wants a power-of-two block, got {NT} threads")

    @cuda.jit
    def route_kernel(ids, wts, x, gate_t, bias, meta):
        row = cuda.blockIdx.x
        if row >= meta[1]:
            return
        tid = cuda.threadIdx.x
        ty = cuda.threadIdx.y
        part = cuda.shared.array((ks, E), np.float32)
        score = cuda.shared.array(E, np.float32)             # unbiased sigmoid scores
        choice = cuda.shared.array(E, np.float32)            # biased, for selection only
        taken = cuda.shared.array(E, np.int32)
        gsc = cuda.shared.array(G, np.float32)
        gok = cuda.shared.array(G, np.int32)
        cand_i = cuda.shared.array(NT, np.int32)             # per thread: best untaken expert so far
        cand_v = cuda.shared.array(NT, np.float32)
        for e in range(tid, E, TPB):
            acc = np.float32(0.0)
            if LOGITS:
                if ty == 0:
                    acc = x[row, e]
            else:
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
                taken[e] = 0
        cuda.syncthreads()
        lt = ty * TPB + tid
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
        for k in range(K):                                   # top-K, ties to the lowest index: each
            bi = -1                                          # thread's best untaken expert, then a
            bv = -math.inf                                   # tree over the block's NT threads
            for e in range(lt, E, NT):
                if taken[e] == 0 and (bi < 0 or choice[e] > bv):
                    bi = e
                    bv = choice[e]
            cand_i[lt] = bi
            cand_v[lt] = bv
            cuda.syncthreads()
            step = NT // 2
            while step > 0:
                if lt < step:
                    oi = cand_i[lt + step]
                    ov = cand_v[lt + step]
                    mi = cand_i[lt]
                    if oi >= 0 and (mi < 0 or ov > cand_v[lt] or (ov == cand_v[lt] and oi < mi)):
                        cand_i[lt] = oi
                        cand_v[lt] = ov
                cuda.syncthreads()
                step //= 2
            if lt == 0:
                best = cand_i[0]
                taken[best] = 1
                ids[row, k] = best
                wts[row, k] = score[best]
            cuda.syncthreads()
        if lt == 0:
            total = np.float32(0.0)
            for k in range(K):
                total += wts[row, k]
            for k in range(K):
                w = wts[row, k]
                if NORM:
                    w = w / (total + np.float32(1e-20))
                wts[row, k] = w * SCALE

    _CACHE[key] = route_kernel
    return route_kernel

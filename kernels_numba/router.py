"""The noaux_tc sigmoid router on the device, mirroring ``workbench.reference.moe.moe_gate``.

Legend: T rows, n = meta[1] live rows, D model width, E routed experts, K experts per token,
G routing groups. One (32, KS)-thread block per row: the threads compute the E gate logits (or
read them, where an SGEMM computed them: ``from_logits``), then thread 0 does the (tiny) group
limit and top-K selection sequentially, ties to the lowest index,
exactly as the reference's stable argsort does.
"""

from __future__ import annotations

import math

import numpy as np
from numba import cuda

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
        if tid != 0 or ty != 0:
            return
        if G > 1:                                            # group limit: keep the TG best groups
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
        total = np.float32(0.0)
        for k in range(K):                                   # top-K, ties to the lowest index
            best = -1
            for e in range(E):
                if taken[e] == 0 and (best < 0 or choice[e] > choice[best]):
                    best = e
            taken[best] = 1
            ids[row, k] = best
            wts[row, k] = score[best]
            total += score[best]
        for k in range(K):
            w = wts[row, k]
            if NORM:
                w = w / (total + np.float32(1e-20))
            wts[row, k] = w * SCALE

    _CACHE[key] = route_kernel
    return route_kernel

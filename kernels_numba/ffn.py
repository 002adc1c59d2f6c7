"""SwiGLU experts for the engine: routed experts, shared experts and dense MLPs, FP32 or W4A16.

Legend: T rows, n = meta[1] live rows, D model width, I expert (or MLP) width, E stacked experts,
Sl slots per row (K routed slots, or 1 for a shared/dense MLP with ids = 0, weight = 1), G group.
Device layouts (transposed once at upload so a block's 32 threads read 32 consecutive columns):
  FP32:  w1t, w3t [E, D, I], w2t [E, I, D]
  W4A16: p1t, p3t int32 [E, D/8, I] + s1t, s3t float32 [E, D/G, I]; p2t [E, I/8, D] + s2t [E, I/G, D]
         (the compressed-tensors words of row n transposed: word k8 of output n is p[e, k8, n]).
W4A16 math is ``workbench.quant.int4.int4_linear``: activations rounded to float16, weight
(u - 8) * scale exact in float32, float32 products and sums.

- ``up``:   hid[t, s, j]  = silu(x_t . W1_e[j]) * (x_t . W3_e[j]),  e = ids[t, s]
- ``down``: out[t, n]    += sum_s wts[t, s] * (hid[t, s] . W2_e[n])   (residual add included)
A shared expert is the same launch with its own [1, ...] stack, ids = 0 and wts = 1.
"""

from __future__ import annotations

import numpy as np
from numba import cuda

from .blockops import KS, TPB, col_blocks
from .router import sigmoid_ref


@cuda.jit(device=True)
def silu_mul(g, u):
    return g * sigmoid_ref(g) * u


_CACHE: dict = {}


def make_ffn_kernels(ks: int):
    """(up_f32, down_f32, up_i4, down_i4) for blocks of (32, ks) threads: thread (c, s) sums every
    ks-th term of column c's dot products; slice partials meet in shared memory."""
    if ks in _CACHE:
        return _CACHE[ks]

    @cuda.jit
    def up_f32_kernel(hid, x, ids, w1t, w3t, meta):
        """grid (col_blocks(I), Sl, T)."""
        tx = cuda.threadIdx.x
        ty = cuda.threadIdx.y
        s = cuda.blockIdx.y
        row = cuda.blockIdx.z
        if row >= meta[1]:
            return
        pg = cuda.shared.array((ks, TPB), np.float32)
        pu = cuda.shared.array((ks, TPB), np.float32)
        e = ids[row, s]
        n = w1t.shape[2]
        for tile in range(cuda.blockIdx.x * TPB, n, TPB * cuda.gridDim.x):
            col = tile + tx
            g = np.float32(0.0)
            u = np.float32(0.0)
            if col < n:                                      # 2 steps per iteration: 4 loads in flight
                g1 = np.float32(0.0)
                u1 = np.float32(0.0)
                k = ty
                kk = w1t.shape[1]
                while k + ks < kk:
                    xv = x[row, k]
                    xw = x[row, k + ks]
                    g += xv * w1t[e, k, col]
                    u += xv * w3t[e, k, col]
                    g1 += xw * w1t[e, k + ks, col]
                    u1 += xw * w3t[e, k + ks, col]
                    k += 2 * ks
                if k < kk:
                    xv = x[row, k]
                    g += xv * w1t[e, k, col]
                    u += xv * w3t[e, k, col]
                g += g1
                u += u1
            pg[ty, tx] = g
            pu[ty, tx] = u
            cuda.syncthreads()
            if ty == 0 and col < n:
                g = np.float32(0.0)
                u = np.float32(0.0)
                for j in range(ks):
                    g += pg[j, tx]
                    u += pu[j, tx]
                hid[row, s, col] = silu_mul(g, u)
            cuda.syncthreads()

    @cuda.jit
    def down_f32_kernel(out, hid, ids, wts, w2t, meta):
        """grid (col_blocks(D), T); accumulates into out."""
        tx = cuda.threadIdx.x
        ty = cuda.threadIdx.y
        row = cuda.blockIdx.y
        if row >= meta[1]:
            return
        part = cuda.shared.array((ks, TPB), np.float32)
        n = w2t.shape[2]
        for tile in range(cuda.blockIdx.x * TPB, n, TPB * cuda.gridDim.x):
            col = tile + tx
            acc = np.float32(0.0)
            if col < n:
                for s in range(ids.shape[1]):
                    e = ids[row, s]
                    a = np.float32(0.0)
                    a1 = np.float32(0.0)
                    a2 = np.float32(0.0)
                    a3 = np.float32(0.0)
                    j = ty
                    jj = w2t.shape[1]
                    while j + 3 * ks < jj:                   # 4 independent loads in flight
                        a += hid[row, s, j] * w2t[e, j, col]
                        a1 += hid[row, s, j + ks] * w2t[e, j + ks, col]
                        a2 += hid[row, s, j + 2 * ks] * w2t[e, j + 2 * ks, col]
                        a3 += hid[row, s, j + 3 * ks] * w2t[e, j + 3 * ks, col]
                        j += 4 * ks
                    while j < jj:
                        a += hid[row, s, j] * w2t[e, j, col]
                        j += ks
                    acc += wts[row, s] * ((a + a1) + (a2 + a3))
            part[ty, tx] = acc
            cuda.syncthreads()
            if ty == 0 and col < n:
                total = np.float32(0.0)
                for j in range(ks):
                    total += part[j, tx]
                out[row, col] += total
            cuda.syncthreads()

    @cuda.jit
    def up_i4_kernel(hid, x, ids, p1t, s1t, p3t, s3t, group, meta):
        """W4A16 ``up``; grid (col_blocks(I), Sl, T)."""
        tx = cuda.threadIdx.x
        ty = cuda.threadIdx.y
        s = cuda.blockIdx.y
        row = cuda.blockIdx.z
        if row >= meta[1]:
            return
        pg = cuda.shared.array((ks, TPB), np.float32)
        pu = cuda.shared.array((ks, TPB), np.float32)
        e = ids[row, s]
        n = p1t.shape[2]
        for tile in range(cuda.blockIdx.x * TPB, n, TPB * cuda.gridDim.x):
            col = tile + tx
            g = np.float32(0.0)
            u = np.float32(0.0)
            if col < n:
                for k8 in range(ty, p1t.shape[1], ks):
                    w1 = p1t[e, k8, col]
                    w3 = p3t[e, k8, col]
                    gi = (k8 * 8) // group
                    c1 = s1t[e, gi, col]
                    c3 = s3t[e, gi, col]
                    for b in range(8):
                        xv = np.float32(np.float16(x[row, k8 * 8 + b]))
                        g += xv * (np.float32(((w1 >> (4 * b)) & 15) - 8) * c1)
                        u += xv * (np.float32(((w3 >> (4 * b)) & 15) - 8) * c3)
            pg[ty, tx] = g
            pu[ty, tx] = u
            cuda.syncthreads()
            if ty == 0 and col < n:
                g = np.float32(0.0)
                u = np.float32(0.0)
                for j in range(ks):
                    g += pg[j, tx]
                    u += pu[j, tx]
                hid[row, s, col] = silu_mul(g, u)
            cuda.syncthreads()

    @cuda.jit
    def down_i4_kernel(out, hid, ids, wts, p2t, s2t, group, meta):
        """W4A16 ``down``; grid (col_blocks(D), T); accumulates into out."""
        tx = cuda.threadIdx.x
        ty = cuda.threadIdx.y
        row = cuda.blockIdx.y
        if row >= meta[1]:
            return
        part = cuda.shared.array((ks, TPB), np.float32)
        n = p2t.shape[2]
        for tile in range(cuda.blockIdx.x * TPB, n, TPB * cuda.gridDim.x):
            col = tile + tx
            acc = np.float32(0.0)
            if col < n:
                for s in range(ids.shape[1]):
                    e = ids[row, s]
                    a = np.float32(0.0)
                    for k8 in range(ty, p2t.shape[1], ks):
                        w = p2t[e, k8, col]
                        c = s2t[e, (k8 * 8) // group, col]
                        for b in range(8):
                            hv = np.float32(np.float16(hid[row, s, k8 * 8 + b]))
                            a += hv * (np.float32(((w >> (4 * b)) & 15) - 8) * c)
                    acc += wts[row, s] * a
            part[ty, tx] = acc
            cuda.syncthreads()
            if ty == 0 and col < n:
                total = np.float32(0.0)
                for j in range(ks):
                    total += part[j, tx]
                out[row, col] += total
            cuda.syncthreads()

    _CACHE[ks] = (up_f32_kernel, down_f32_kernel, up_i4_kernel, down_i4_kernel)
    return _CACHE[ks]


def up(hid, x, ids, w: dict, meta, rows: int, stream=0, ks: int = KS) -> None:
    """Launch the FP32 or W4A16 ``up`` for the uploaded expert stack ``w`` (see engine.weights)."""
    up_f32_kernel, _, up_i4_kernel, _ = make_ffn_kernels(ks)
    slots = ids.shape[1]
    if w["int4"]:
        grid = (col_blocks(w["p1t"].shape[2]), slots, rows)
        up_i4_kernel[grid, (TPB, ks), stream](hid, x, ids, w["p1t"], w["s1t"], w["p3t"], w["s3t"], w["group"],
                                              meta)
    else:
        grid = (col_blocks(w["w1t"].shape[2]), slots, rows)
        up_f32_kernel[grid, (TPB, ks), stream](hid, x, ids, w["w1t"], w["w3t"], meta)


def down(out, hid, ids, wts, w: dict, meta, rows: int, stream=0, ks: int = KS) -> None:
    """Launch the FP32 or W4A16 ``down`` (accumulates into ``out``)."""
    _, down_f32_kernel, _, down_i4_kernel = make_ffn_kernels(ks)
    if w["int4"]:
        grid = (col_blocks(w["p2t"].shape[2]), rows)
        down_i4_kernel[grid, (TPB, ks), stream](out, hid, ids, wts, w["p2t"], w["s2t"], w["group"], meta)
    else:
        grid = (col_blocks(w["w2t"].shape[2]), rows)
        down_f32_kernel[grid, (TPB, ks), stream](out, hid, ids, wts, w["w2t"], meta)

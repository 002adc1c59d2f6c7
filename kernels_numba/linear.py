"""The engine's FP32 projection ``out[m, :] (+)= x[m, :] @ W.T`` with W stored transposed.

Legend: T rows in the buffers, n = meta[1] live rows, K input features, N output features,
S = ks K-slices.
Device layout: ``wt`` = W.T, float32 [K, N] C-contiguous (transposed once at upload), so the 32
threads of a slice, which own 32 consecutive output columns, read 32 consecutive floats of one
weight row per step (coalesced) while the activation x[m, k] is a broadcast.
Block (32, S): thread (c, s) sums k = s, s + S, ... for column c; slice partials meet in shared
memory and slice 0 writes (S = blockops.KS: 8 on the GPU, 1 under the simulator).
"""

from __future__ import annotations

import numpy as np
from numba import cuda

from numformats.errors import InputError

from .blockops import KS, TPB, col_blocks

_CACHE: dict = {}


def make_linear_kernel(ks: int):
    """kernel(out [T, N], x [T, K], wt [K, N], accumulate int32, meta);
    grid (col_blocks(N), T), block (32, ks); blocks stride over 32-column tiles."""
    if ks in _CACHE:
        return _CACHE[ks]

    @cuda.jit
    def linear_kernel(out, x, wt, accumulate, meta):
        tx = cuda.threadIdx.x
        ty = cuda.threadIdx.y
        row = cuda.blockIdx.y
        if row >= meta[1]:                                   # uniform over the block
            return
        part = cuda.shared.array((ks, TPB), np.float32)
        n = wt.shape[1]
        for tile in range(cuda.blockIdx.x * TPB, n, TPB * cuda.gridDim.x):   # same trip count in the block
            col = tile + tx
            acc = np.float32(0.0)
            if col < n:                                      # 4 independent loads in flight per step
                a0 = np.float32(0.0)
                a1 = np.float32(0.0)
                a2 = np.float32(0.0)
                a3 = np.float32(0.0)
                k = ty
                kk = wt.shape[0]
                while k + 3 * ks < kk:
                    a0 += x[row, k] * wt[k, col]
                    a1 += x[row, k + ks] * wt[k + ks, col]
                    a2 += x[row, k + 2 * ks] * wt[k + 2 * ks, col]
                    a3 += x[row, k + 3 * ks] * wt[k + 3 * ks, col]
                    k += 4 * ks
                while k < kk:
                    a0 += x[row, k] * wt[k, col]
                    k += ks
                acc = (a0 + a1) + (a2 + a3)
            part[ty, tx] = acc
            cuda.syncthreads()
            if ty == 0 and col < n:
                total = np.float32(0.0)
                for s in range(ks):
                    total += part[s, tx]
                if accumulate:
                    out[row, col] += total
                else:
                    out[row, col] = total
            cuda.syncthreads()

    _CACHE[ks] = linear_kernel
    return linear_kernel


def linear(out, x, wt, meta, rows: int, accumulate: bool = False, stream=0, ks: int = KS) -> None:
    """Launch the linear kernel for ``rows`` rows (grid sized for rows; rows >= meta[1] exit).

    out [T, N] float32, x [T, K] float32, wt [K, N] float32; raises InputError on a shape mismatch.
    """
    if x.shape[1] != wt.shape[0] or out.shape[1] != wt.shape[1] or rows > min(out.shape[0], x.shape[0]):
        raise InputError(f"linear: shapes x {x.shape}, wt {wt.shape}, out {out.shape}, rows {rows} disagree")
    grid = (col_blocks(wt.shape[1]), rows)
    make_linear_kernel(ks)[grid, (TPB, ks), stream](out, x, wt, np.int32(1 if accumulate else 0), meta)

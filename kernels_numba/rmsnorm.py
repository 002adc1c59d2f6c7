"""RMSNorm over rows, mirroring ``workbench.reference.layers.rmsnorm``: ``w * x / sqrt(mean(x^2) + eps)``.

Legend: T rows (tokens) in the buffer, n = meta[1] live rows, K features.
One 32-thread block per row; each thread strides over K, the partial sums meet in shared memory.
"""

from __future__ import annotations

import math

import numpy as np
from numba import cuda

from .blockops import TPB, block_sum


@cuda.jit(device=True)
def row_rms_scale(sh, x, row, off, k, eps):
    """1 / sqrt(mean(x[row, off:off+k]^2) + eps) in float32, same value in every thread."""
    acc = np.float32(0.0)
    for j in range(cuda.threadIdx.x, k, TPB):
        v = x[row, off + j]
        acc += v * v
    ms = block_sum(sh, acc) / np.float32(k)
    return np.float32(1.0) / math.sqrt(ms + eps)


@cuda.jit
def rmsnorm_kernel(out, x, w, eps, meta):
    """out [T, K] = rmsnorm(x [T, K]) * w [K] for rows < meta[1]; grid (T,), block (32,). In-place ok."""
    row = cuda.blockIdx.x
    if row >= meta[1]:
        return
    sh = cuda.shared.array(TPB, np.float32)
    k = x.shape[1]
    r = row_rms_scale(sh, x, row, 0, k, eps)
    for j in range(cuda.threadIdx.x, k, TPB):
        out[row, j] = w[j] * (x[row, j] * r)


def rmsnorm(out, x, w, eps: float, meta, rows: int, stream=0) -> None:
    """Launch ``rmsnorm_kernel`` over ``rows`` blocks (rows >= meta[1]; surplus blocks exit)."""
    rmsnorm_kernel[rows, TPB, stream](out, x, w, np.float32(eps), meta)

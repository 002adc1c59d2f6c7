"""RMSNorm over rows, mirroring ``workbench.reference.layers.rmsnorm``: ``w * x / sqrt(mean(x^2) + eps)``.

Legend: T rows (tokens) in the buffer, n = meta[1] live rows, K features.
One block per row, (32, ks) threads with ks = ``blockops.row_slices(K)``; each thread strides over K,
the partial sums meet in shared memory.
"""

from __future__ import annotations

import math

import numpy as np
from numba import cuda

from .blockops import ROW_THREADS, TPB, block_sum, row_slices, row_sumsq, scale_row


@cuda.jit(device=True)
def row_rms_scale(sh, x, row, off, k, eps):
    """1 / sqrt(mean(x[row, off:off+k]^2) + eps) in float32, same value in every thread of the block."""
    ms = block_sum(sh, row_sumsq(x, row, off, k)) / np.float32(k)
    return np.float32(1.0) / math.sqrt(ms + eps)


@cuda.jit
def rmsnorm_kernel(out, x, w, eps, meta):
    """out [T, K] = rmsnorm(x [T, K]) * w [K] for rows < meta[1]; grid (T,), block (32, ks). In-place ok."""
    row = cuda.blockIdx.x
    if row >= meta[1]:
        return
    sh = cuda.shared.array(ROW_THREADS, np.float32)
    k = x.shape[1]
    r = row_rms_scale(sh, x, row, 0, k, eps)
    scale_row(out, row, x, row, 0, w, r, k)


def rmsnorm(out, x, w, eps: float, meta, rows: int, stream=0, ks: int | None = None) -> None:
    """Launch ``rmsnorm_kernel`` over ``rows`` blocks (rows >= meta[1]; surplus blocks exit)."""
    ks = row_slices(x.shape[1]) if ks is None else ks
    rmsnorm_kernel[rows, (TPB, ks), stream](out, x, w, np.float32(eps), meta)

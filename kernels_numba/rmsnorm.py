"""RMSNorm over rows, mirroring ``workbench.reference.layers.rmsnorm``: ``w * x / sqrt(mean(x^2) + eps)``.

Legend: T rows (tokens) in the buffer, n = meta[1] live rows, K features.
One block per row, (32, ks) threads with ks = ``norm_slices(K)``; each thread strides over K, the
partial sums meet in shared memory. A row of K2's 7,168 takes 32 warps (7 elements a thread): one row
alone is latency-bound, and 8 warps (28 elements, 7 batches of 4 loads for the sum and 7 for the
scaling) took 9.2 us on the H200.
"""

from __future__ import annotations

import math

import numpy as np
from numba import cuda

from .blockops import TPB, block_sum, row_sumsq, scale_row
from .device import SIMULATED
from .intrinsics import griddep_launch_dependents, griddep_wait
from .launch import launch
from .resources import register_cap

NORM_KS = 1 if SIMULATED else 32       # most warps a row's norm takes (the simulator: one, as blockops.KS)
NORM_THREADS = TPB * 32                # the reduction's shared slots (a constant, as numba wants)
NORM_JIT = register_cap(NORM_THREADS)  # the registers that let a block of 32 warps launch


def norm_slices(k: int) -> int:
    """Warps for one row of ``k`` features: at least 4 elements a thread, at most NORM_KS warps."""
    return max(1, min(NORM_KS, k // (TPB * 4)))


@cuda.jit(device=True)
def row_rms_scale(sh, x, row, off, k, eps):
    """1 / sqrt(mean(x[row, off:off+k]^2) + eps) in float32, same value in every thread of the block."""
    ms = block_sum(sh, row_sumsq(x, row, off, k)) / np.float32(k)
    return np.float32(1.0) / math.sqrt(ms + eps)


@cuda.jit(**NORM_JIT)
def rmsnorm_kernel(out, x, w, eps, meta):
    """out [T, K] = rmsnorm(x [T, K]) * w [K] for rows < meta[1]; grid (T,), block (32, ks). In-place ok.
    Launched with PDL: it waits for the previous kernel, then lets the next one start."""
    griddep_wait()
    griddep_launch_dependents()
    row = cuda.blockIdx.x
    if row >= meta[1]:
        return
    sh = cuda.shared.array(NORM_THREADS, np.float32)
    k = x.shape[1]
    r = row_rms_scale(sh, x, row, 0, k, eps)
    scale_row(out, row, x, row, 0, w, r, k)


def rmsnorm(out, x, w, eps: float, meta, rows: int, stream=0, ks: int | None = None) -> None:
    """Launch ``rmsnorm_kernel`` over ``rows`` blocks (rows >= meta[1]; surplus blocks exit)."""
    ks = norm_slices(x.shape[1]) if ks is None else ks
    launch(rmsnorm_kernel, rows, (TPB, ks), stream, (out, x, w, np.float32(eps), meta))

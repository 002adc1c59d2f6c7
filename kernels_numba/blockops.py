"""Block-wide reductions for the engine's 32-thread blocks, written without warp intrinsics.

Every engine kernel runs with blocks of ``TPB`` = 32 threads (times KS slices) and loops inside the
thread, so the
CUDA simulator (one OS thread per CUDA thread) stays affordable at tiny shapes while the same
source runs on the GPU. A reduction stores one value per thread in shared memory, synchronises,
and lets every thread read all 32 slots: a broadcast read on the GPU, deterministic, and the
result is identical in every thread (the sum order is fixed: slot 0 .. 31).
"""

from __future__ import annotations

import math

import numpy as np
from numba import cuda

from .device import SIMULATED

TPB = 32                                    # threads per block along x in every engine kernel
NEG_INF = np.float32(-np.inf)               # a max's start: a Python -inf would carry it in float64
# K-slices along y for the long dot products (linear, experts, router, attention): a block is
# (32, KS) threads, each slice sums every KS-th term and the slices meet in shared memory. On the
# GPU this cuts each thread's dependent load chain KS-fold (decode at tiny shapes is latency-bound);
# under the simulator KS = 1 keeps the simulated thread count low (the kernels take ``ks`` as a
# factory argument, so tests also simulate KS > 1 at small shapes).
KS = 1 if SIMULATED else 8


def col_blocks(n: int) -> int:
    """Grid size along the output columns of a column-parallel kernel (which loops over column tiles
    with a block stride): one 32-column tile per block on the GPU; one block for all tiles under
    the simulator, where every simulated thread costs an OS thread."""
    return 1 if SIMULATED else (n + TPB - 1) // TPB


ROW_KS = 8                                  # most K-slices a one-block-per-row kernel takes
ROW_THREADS = TPB * ROW_KS                  # its reductions' shared slots (a constant: numba sizes shared
                                            # arrays from a global, not from an expression)


def row_slices(k: int) -> int:
    """K-slices for a one-block-per-row kernel over ``k`` features (block (32, ks)): at least 4 elements
    per thread, at most KS slices. One row per block is latency-bound: a row of 7168 on one warp is 224
    loads per thread, each a round trip to memory; a row of 192 keeps one warp, whose reduction is the
    cheapest."""
    return max(1, min(KS, ROW_KS, k // (TPB * 4)))


@cuda.jit(device=True, inline="always")
def silu_mul(g, u):
    """silu(g) * u in float32, one expression for every SwiGLU epilogue and prologue (inlined, so a
    kernel calling it still compiles to PTX without a driver)."""
    return g / (np.float32(1.0) + math.exp(-g)) * u


@cuda.jit(device=True)
def block_lane():
    """(this thread's index in its (32,) or (32, ks) block, the block's thread count): the stride of a
    one-block-per-row loop and the slot of a block reduction."""
    return cuda.threadIdx.y * TPB + cuda.threadIdx.x, TPB * cuda.blockDim.y


@cuda.jit(device=True)
def block_sum(sh, v):
    """Sum of ``v`` over every thread of a (32,) or (32, ks) block; ``sh`` is a float32 shared
    array with a slot per thread. The order is fixed (slots in thread order within a warp, then the
    warps in order), so the result is the same in every thread. A serial pass over 256 slots costs
    256 dependent shared loads; per warp, then across warps, it is 32 + ks."""
    t, nt = block_lane()
    sh[t] = v
    cuda.syncthreads()
    total = 0.0
    if nt == TPB:
        for i in range(TPB):                # a constant trip count: unrolled, the loads overlap
            total += sh[i]
    else:                                   # ks warps: each warp's slots in order, then the ks partials
        if cuda.threadIdx.x == 0:
            base = cuda.threadIdx.y * TPB
            part = 0.0
            for i in range(TPB):
                part += sh[base + i]
            sh[base] = part                 # only this thread reads its warp's slots
        cuda.syncthreads()
        for y in range(cuda.blockDim.y):
            total += sh[y * TPB]
    cuda.syncthreads()                      # sh may be reused right after
    return total


@cuda.jit(device=True)
def block_max(sh, v):
    """Max of ``v`` over every thread of a (32,) or (32, ks) block (-inf if all are -inf); ``sh`` as
    ``block_sum``'s."""
    t, nt = block_lane()
    sh[t] = v
    cuda.syncthreads()
    m = -math.inf
    if nt == TPB:
        for i in range(TPB):                # a constant trip count: unrolled
            m = max(m, sh[i])
    else:
        for i in range(nt):
            m = max(m, sh[i])
    cuda.syncthreads()
    return m


@cuda.jit(device=True)
def block_argmax(shv, shi, v, i):
    """(value, index) of the block-wide maximum of ``v`` over a (32,) or (32, ks) block; ties go to the
    lowest index ``i``.

    ``shv`` float32, ``shi`` int32 shared arrays with a slot per thread; a thread without a candidate
    passes v = -inf, i = a huge index.
    """
    t, nt = block_lane()
    shv[t] = v
    shi[t] = i
    cuda.syncthreads()
    bv = shv[0]
    bi = shi[0]
    for k in range(1, nt):
        cv = shv[k]
        ci = shi[k]
        if cv > bv or (cv == bv and ci < bi):
            bv = cv
            bi = ci
    cuda.syncthreads()
    return bv, bi


@cuda.jit(device=True)
def copy_row(dst, drow, src, srow):
    """dst[drow, :] = src[srow, :] over this thread's strided columns, four loads ahead."""
    lt, nt = block_lane()
    k = src.shape[1]
    j = lt
    while j + 3 * nt < k:
        a0, a1, a2, a3 = src[srow, j], src[srow, j + nt], src[srow, j + 2 * nt], src[srow, j + 3 * nt]
        dst[drow, j] = a0
        dst[drow, j + nt] = a1
        dst[drow, j + 2 * nt] = a2
        dst[drow, j + 3 * nt] = a3
        j += 4 * nt
    while j < k:
        dst[drow, j] = src[srow, j]
        j += nt

"""RMSNorm over rows, mirroring ``workbench.reference.layers.rmsnorm``: ``w * x / sqrt(mean(x^2) + eps)``.

Legend: T rows (tokens) in the buffer, n = meta[1] live rows, K features.
One block per row, (32, ks) threads with ks = ``norm_slices(K)``; each thread holds its strided
features in registers, the partial sums meet in shared memory. A row of K2's 7,168 takes 32 warps (7
elements a thread): one row alone is latency-bound, and 8 warps (28 elements, 7 batches of 4 loads for
the sum and 7 for the scaling) took 9.2 us on the H200. ``hold_row``, ``held_sumsq`` and
``store_normed`` serve the fused norms too (mla_prep, the drafter's head norm).
"""

from __future__ import annotations

import functools
import math

import numpy as np
from numba import cuda

from ._validate import warps
from .blockops import TPB
from .device import SIMULATED
from .intrinsics import griddep_launch_dependents, griddep_wait, shfl_xor, stored_as
from .launch import launch
from .resources import register_cap

NORM_KS = 1 if SIMULATED else 32       # most warps a row's norm takes (the simulator: one, as blockops.KS)
NORM_THREADS = TPB * 32                # the reduction's shared slots (a constant, as numba wants)
NORM_JIT = register_cap(NORM_THREADS)  # the registers that let a block of 32 warps launch


def norm_slices(k: int) -> int:
    """Warps for one row of ``k`` features: at least 4 elements a thread, at most NORM_KS warps."""
    return max(1, min(NORM_KS, k // (TPB * 4)))


@cuda.jit(device=True, inline="always")
def hold_row(v, x, row, off, n, k, lt, nt):
    """v[i] = x[row, off + lt + i nt] for lt + i nt < k, else 0 (i < n): a thread's strided share of a
    row, every load issued before any use (inlined: n a constant, the loop unrolls into registers)."""
    for i in range(n):
        j = lt + i * nt
        v[i] = x[row, off + j] if j < k else np.float32(0.0)


@cuda.jit(device=True, inline="always")
def hold_vec(v, w, n, k, lt, nt):
    """v[i] = w[lt + i nt] for lt + i nt < k, else 0 (i < n): ``hold_row`` of a vector (a norm's weights)."""
    for i in range(n):
        j = lt + i * nt
        v[i] = w[j] if j < k else np.float32(0.0)


@cuda.jit(device=True, inline="always")
def held_sumsq(v, n, k, lt, nt):
    """This thread's sum of its held features' squares (lt + i nt < k), in index order, float32."""
    a = np.float32(0.0)
    for i in range(n):
        if lt + i * nt < k:
            a += v[i] * v[i]
    return a


@cuda.jit(device=True, inline="always")
def store_normed(out, orow, ooff, wv, v, r, n, k, lt, nt):
    """out[orow, ooff + j] = wv[i] * (v[i] * r) for this thread's held features j = lt + i nt < k."""
    for i in range(n):
        j = lt + i * nt
        if j < k:
            out[orow, ooff + j] = stored_as(out, wv[i] * (v[i] * r))


@cuda.jit(device=True, inline="always")
def warps_sum(ws, a):
    """The sum of ``a`` over a (32, ks) block, in every thread: a five-step butterfly in each warp, then
    the warps' sums in order (``ws``: a shared float32 slot a warp, at most 32)."""
    for m in (16, 8, 4, 2, 1):
        a += shfl_xor(a, m)
    if cuda.threadIdx.x == 0:
        ws[cuda.threadIdx.y] = a
    cuda.syncthreads()
    s = np.float32(0.0)
    for y in range(cuda.blockDim.y):
        s += ws[y]
    return s


@cuda.jit(device=True, inline="always")
def warps_max(ws, m):
    """The max of ``m`` over a (32, ks) block, in every thread (as ``warps_sum``; a max in any order)."""
    for k in (16, 8, 4, 2, 1):
        m = max(m, shfl_xor(m, k))
    if cuda.threadIdx.x == 0:
        ws[cuda.threadIdx.y] = m
    cuda.syncthreads()
    for y in range(cuda.blockDim.y):
        m = max(m, ws[y])
    return m


@functools.cache
def make_rmsnorm_kernel(KN: int):
    """rmsnorm_kernel for rows of at most KN features a thread: x's row and w held in registers (w's
    loads before the PDL wait, as weights depend on no kernel), so a row costs one memory round trip,
    not one per four features; the sum of squares in float32, thread order, then a five-step butterfly
    in each warp, then the warps' sums in order."""

    @cuda.jit(**NORM_JIT)
    def rmsnorm_kernel(out, x, w, eps, meta):
        """out [T, K] = rmsnorm(x [T, K]) * w [K] for rows < meta[1]; grid (T,), block (32, ks), K <= KN
        32 ks. In-place ok (the row is read before any store). Launched with PDL."""
        lt = cuda.threadIdx.y * TPB + cuda.threadIdx.x             # (no device function: a probe compiles
        nt = TPB * cuda.blockDim.y                                  # it to PTX without a driver)
        k = x.shape[1]
        wv = cuda.local.array(KN, np.float32)
        hold_vec(wv, w, KN, k, lt, nt)
        griddep_wait()
        griddep_launch_dependents()
        row = cuda.blockIdx.x
        if row >= meta[1]:
            return
        xv = cuda.local.array(KN, np.float32)
        hold_row(xv, x, row, 0, KN, k, lt, nt)
        ws = cuda.shared.array(TPB, np.float32)                  # a sum a warp (at most 32 warps)
        ms = warps_sum(ws, held_sumsq(xv, KN, k, lt, nt))
        r = np.float32(1.0) / math.sqrt(ms / np.float32(k) + eps)
        store_normed(out, row, 0, wv, xv, r, KN, k, lt, nt)

    return rmsnorm_kernel


rmsnorm_kernel = make_rmsnorm_kernel(-(-7168 // (TPB * 32)))     # K2's width on 32 warps (the PTX probes')


def rmsnorm(out, x, w, eps: float, meta, rows: int, stream=0, ks: int | None = None) -> None:
    """Launch ``rmsnorm_kernel`` over ``rows`` blocks (rows >= meta[1]; surplus blocks exit)."""
    ks = norm_slices(x.shape[1]) if ks is None else warps(ks, "rmsnorm")
    kern = make_rmsnorm_kernel(-(-x.shape[1] // (TPB * ks)))
    launch(kern, rows, (TPB, ks), stream, (out, x, w, np.float32(eps), meta))

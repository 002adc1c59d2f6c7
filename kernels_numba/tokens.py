"""Token-level kernels of the engine: embedding lookup, greedy argmax, the AR decode advance, row copy.

Legend: T rows, n = meta[1] live rows, D model width, V vocabulary.
meta (int32 [8], device): [0] start = cache rows before this step, [1] n live rows,
[2] tokens written to the output buffer so far.
"""

from __future__ import annotations

import numpy as np
from numba import cuda

from .blockops import NEG_INF, TPB, copy_row
from .device import SIMULATED
from .intrinsics import griddep_launch_dependents, griddep_wait, shfl_xor
from .resources import register_cap

BIG = 2 ** 30
ARGMAX_UNROLL = 16
ARGMAX_KS = 1 if SIMULATED else 32      # most warps a row's argmax takes (the simulator: one, as blockops.KS)


@cuda.jit
def embed_kernel(h, table, ids, meta):
    """h [T, D] = table [V, D][ids[t]] for t < meta[1]; grid (T,), block (32, ks)."""
    griddep_wait()                                          # PDL: the inputs are earlier kernels'
    griddep_launch_dependents()
    row = cuda.blockIdx.x
    if row >= meta[1]:
        return
    copy_row(h, row, table, ids[row])


@cuda.jit(**register_cap(TPB * ARGMAX_KS))
def argmax_kernel(out, logits, meta):
    """out [T] int32 = argmax(logits [T, V]) per row (ties to the lowest id); grid (T,), block (32, ks),
    ks = ``argmax_slices(V)``: K2's 163,840 logits a row over 1,024 threads, 16 loads in flight each (one
    block of 256 threads, 4 ahead, waited out 160 memory latencies: ~90 us a row). Each thread keeps its
    best in index order, then five butterfly shuffles a warp and the warps in order, each step keeping
    the larger value or, of two equal, the lower id."""
    griddep_wait()                                          # PDL: the inputs are earlier kernels'
    griddep_launch_dependents()
    row = cuda.blockIdx.x
    if row >= meta[1]:
        return
    wv = cuda.shared.array(TPB, np.float32)                 # a warp's best (at most 32 warps)
    wi = cuda.shared.array(TPB, np.int32)
    buf = cuda.local.array(ARGMAX_UNROLL, np.float32)
    bv = NEG_INF
    bi = np.int32(BIG)
    lt = cuda.threadIdx.y * TPB + cuda.threadIdx.x
    nt = TPB * cuda.blockDim.y
    nv = logits.shape[1]
    for j0 in range(lt, nv, ARGMAX_UNROLL * nt):               # the next words loaded before they are
        for u in range(ARGMAX_UNROLL):                        # compared (one memory latency each, not
            j = j0 + u * nt                                   # one a word)
            buf[u] = logits[row, j] if j < nv else NEG_INF
        for u in range(ARGMAX_UNROLL):                        # ascending j: strict > keeps the lowest
            if buf[u] > bv:
                bv = buf[u]
                bi = np.int32(j0 + u * nt)
    for m in (16, 8, 4, 2, 1):
        ov = shfl_xor(bv, m)
        oi = shfl_xor(bi, m)
        if ov > bv or (ov == bv and oi < bi):
            bv = ov
            bi = oi
    if cuda.threadIdx.x == 0:
        wv[cuda.threadIdx.y] = bv
        wi[cuda.threadIdx.y] = bi
    cuda.syncthreads()
    if lt == 0:
        for y in range(1, cuda.blockDim.y):
            if wv[y] > bv or (wv[y] == bv and wi[y] < bi):
                bv = wv[y]
                bi = wi[y]
        out[row] = bi


def argmax_slices(v: int) -> int:
    """Warps for one row of ``v`` logits: ARGMAX_UNROLL loads a thread at least, at most ARGMAX_KS warps."""
    return max(1, min(ARGMAX_KS, v // (TPB * ARGMAX_UNROLL)))


@cuda.jit
def advance_kernel(ids, amax, outbuf, meta):
    """AR bookkeeping on the device after a decode step: emit amax[0], feed it back, start += 1.

    grid (1,), block (1,). Keeps the whole decode loop free of host round trips.
    """
    griddep_wait()                                          # PDL: the inputs are earlier kernels'
    griddep_launch_dependents()
    tok = amax[0]
    outbuf[meta[2]] = tok
    ids[0] = tok
    meta[0] += 1
    meta[2] += 1


@cuda.jit
def copy_rows_kernel(dst, src, meta):
    """dst [T, D] = src [T, D] for rows < meta[1] (tapped hidden states); grid (T,), block (32, ks)."""
    griddep_wait()                                          # PDL: the inputs are earlier kernels'
    griddep_launch_dependents()
    row = cuda.blockIdx.x
    if row >= meta[1]:
        return
    copy_row(dst, row, src, row)

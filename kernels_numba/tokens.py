"""Token-level kernels of the engine: embedding lookup, greedy argmax, the AR decode advance, row copy.

Legend: T rows, n = meta[1] live rows, D model width, V vocabulary.
meta (int32 [8], device): [0] start = cache rows before this step, [1] n live rows,
[2] tokens written to the output buffer so far.
"""

from __future__ import annotations

import numpy as np
from numba import cuda

from .blockops import ROW_THREADS, block_argmax, block_lane, copy_row
from .intrinsics import griddep_launch_dependents, griddep_wait

BIG = 2 ** 30
ARGMAX_UNROLL = 4
NEG_INF = np.float32(-np.inf)   # float32: a Python -inf would compare in float64


@cuda.jit
def embed_kernel(h, table, ids, meta):
    """h [T, D] = table [V, D][ids[t]] for t < meta[1]; grid (T,), block (32, ks)."""
    griddep_wait()                                          # PDL: the inputs are earlier kernels'
    griddep_launch_dependents()
    row = cuda.blockIdx.x
    if row >= meta[1]:
        return
    copy_row(h, row, table, ids[row])


@cuda.jit
def argmax_kernel(out, logits, meta):
    """out [T] int32 = argmax(logits [T, V]) per row (ties to the lowest id); grid (T,), block (32, ks)."""
    griddep_wait()                                          # PDL: the inputs are earlier kernels'
    griddep_launch_dependents()
    row = cuda.blockIdx.x
    if row >= meta[1]:
        return
    shv = cuda.shared.array(ROW_THREADS, np.float32)
    shi = cuda.shared.array(ROW_THREADS, np.int32)
    buf = cuda.local.array(ARGMAX_UNROLL, np.float32)
    bv = NEG_INF
    bi = BIG
    lt, nt = block_lane()
    nv = logits.shape[1]
    for j0 in range(lt, nv, ARGMAX_UNROLL * nt):               # the next words loaded before they are
        for u in range(ARGMAX_UNROLL):                        # compared (one memory latency each, not
            j = j0 + u * nt                                   # one a word)
            buf[u] = logits[row, j] if j < nv else NEG_INF
        for u in range(ARGMAX_UNROLL):                        # ascending j: strict > keeps the lowest
            if buf[u] > bv:
                bv = buf[u]
                bi = j0 + u * nt
    bv, bi = block_argmax(shv, shi, bv, bi)
    if lt == 0:
        out[row] = bi


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

"""YaRN RoPE on interleaved pairs, mirroring ``workbench.reference.rope``.

Legend: P positions in the table, R rope dims (R/2 frequency pairs).
The host builds cos/sin tables [P, R/2] once (``workbench.reference.rope.rope_tables``: float64 math
of the reference, stored float32, which is what the reference's float32 path multiplies by); kernels
rotate pair i of a vector at position p as ``(x0 c - x1 s, x1 c + x0 s)`` with c = cos[p, i], s = sin[p, i].
"""

from __future__ import annotations

from numba import cuda

from .intrinsics import griddep_launch_dependents, griddep_wait


@cuda.jit(device=True)
def rope_pair(x0, x1, cos, sin, pos, i):
    """Rotate one interleaved pair (x0, x1) = dims (2i, 2i+1) at position ``pos``."""
    c = cos[pos, i]
    s = sin[pos, i]
    return x0 * c - x1 * s, x1 * c + x0 * s


@cuda.jit
def rope_rows_kernel(rot, cos, sin, depth, meta):
    """rot float32 [T, R/2, 2] (a complex64 [T, R/2] buffer) = (cos, sin) [pos, :] at pos = meta[0] +
    depth[i] for the live rows i < meta[1], (1, 0) past them: a step's rope rows, gathered once for every
    layer's BLAS attention core. grid (T,), block (32,)."""
    griddep_wait()                                          # PDL: the inputs are earlier kernels'
    griddep_launch_dependents()
    i = cuda.blockIdx.x
    live = i < meta[1]
    pos = meta[0] + depth[i] if live else 0
    for k in range(cuda.threadIdx.x, rot.shape[1], cuda.blockDim.x):
        rot[i, k, 0] = cos[pos, k] if live else 1.0
        rot[i, k, 1] = sin[pos, k] if live else 0.0

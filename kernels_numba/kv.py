"""Latent-KV compaction of the accepted DDTree path, on the device (docs/ddtree.md, commit).

Legend: Ly layers, S cache rows, W = C + R latent width, A accepted nodes (root included).
After a verify over rows [ps, ps + N + 1), the accepted node offsets acc[0..A) (acc[0] = 0, strictly
increasing) move to rows ps .. ps + A - 1 of every layer. Each thread owns latent columns and walks
j in increasing order: the destination ps + j never equals a later source ps + acc[j'] (acc[j'] > j),
so the in-place copy is safe without a temporary.

ctl (int32 [5, W'], uploaded once per round): row 3 = acc offsets, ctl[4, 1] = A, ctl[4, 2] = ps.
"""

from __future__ import annotations

from numba import cuda

from .blockops import TPB
from .intrinsics import griddep_launch_dependents, griddep_wait


@cuda.jit
def kv_compact_kernel(cache, ctl):
    """cache [Ly, S, W]; grid (Ly,), block (32,). A <= 1 is a no-op."""
    griddep_wait()                                          # PDL: the inputs are earlier kernels'
    griddep_launch_dependents()
    layer = cuda.blockIdx.x
    n_acc = ctl[4, 1]
    ps = ctl[4, 2]
    for col in range(cuda.threadIdx.x, cache.shape[2], TPB):
        for j in range(1, n_acc):
            src = ps + ctl[3, j]
            if src != ps + j:
                cache[layer, ps + j, col] = cache[layer, src, col]

"""YaRN RoPE on interleaved pairs, mirroring ``workbench.reference.rope``.

Legend: P positions in the table, R rope dims (R/2 frequency pairs).
The host builds cos/sin tables [P, R/2] once (``workbench.reference.rope.rope_tables``: float64 math
of the reference, stored float32, which is what the reference's float32 path multiplies by); kernels
rotate pair i of a vector at position p as ``(x0 c - x1 s, x1 c + x0 s)`` with c = cos[p, i], s = sin[p, i].
"""

from __future__ import annotations

from numba import cuda


@cuda.jit(device=True)
def rope_pair(x0, x1, cos, sin, pos, i):
    """Rotate one interleaved pair (x0, x1) = dims (2i, 2i+1) at position ``pos``."""
    c = cos[pos, i]
    s = sin[pos, i]
    return x0 * c - x1 * s, x1 * c + x0 * s

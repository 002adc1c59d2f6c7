"""YaRN RoPE on interleaved pairs, mirroring ``workbench.reference.rope``.

Legend: P positions in the table, R rope dims (R/2 frequency pairs).
The host builds cos/sin tables [P, R/2] once (float64 math of the reference, stored float32,
which is what the reference's float32 path multiplies by); kernels rotate pair i of a vector at
position p as ``(x0 c - x1 s, x1 c + x0 s)`` with c = cos[p, i], s = sin[p, i].
"""

from __future__ import annotations

import numpy as np
from numba import cuda

from workbench.config import ModelConfig


def rope_tables(cfg: ModelConfig, max_pos: int) -> tuple[np.ndarray, np.ndarray]:
    """(cos, sin) float32 [max_pos, R/2] for positions 0..max_pos-1, YaRN factor included."""
    from workbench.reference.rope import rope_cos_sin
    cos, sin = rope_cos_sin(cfg, np.arange(max_pos, dtype=np.int64))
    return np.ascontiguousarray(cos, dtype=np.float32), np.ascontiguousarray(sin, dtype=np.float32)


@cuda.jit(device=True)
def rope_pair(x0, x1, cos, sin, pos, i):
    """Rotate one interleaved pair (x0, x1) = dims (2i, 2i+1) at position ``pos``."""
    c = cos[pos, i]
    s = sin[pos, i]
    return x0 * c - x1 * s, x1 * c + x0 * s

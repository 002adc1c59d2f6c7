"""What both parts of ``bench ep`` compare with: the whole k2_slice MoE layer on one GPU, and the
relative error of each row's update against it (``ep_moe``'s NCCL ranks and ``ep_in_turn``'s shares).

Legend: T rows, D hidden size, E routed experts.
"""

from __future__ import annotations

import numpy as np

WARMUP = 3                           # untimed steps before each timed series


def row_errors(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """Each row's relative error |got - want| / |want| (float64 want, rows [T, D])."""
    return np.linalg.norm(got - want, axis=1) / np.maximum(np.linalg.norm(want, axis=1), 1e-30)


def whole_layer(src, layer: int, max_rows: int, fused=None):
    """(the whole MoE block of ``layer`` on this GPU, its ``ops.Scratch``) from ``src`` (an
    ``engine.build.SeededSource``): ``fused`` its E experts when this rank already holds them all."""
    from kernels_numba import ops

    from ..engine.build import int4_experts
    f = f"layers.{layer}.ffn"
    if fused is None:
        fused = int4_experts(src.cfg, src.stacks, layer, src.workers)
    m = ops.moe_fused(src.router(f), fused, src.shared(f))
    return m, ops.Scratch(max_rows, [], [m])

"""Row-wise glue between the engine's float32 activations and the W4A16 tensor-core kernels.

Legend: T rows in the buffers, n = meta[1] live rows, N columns.
``to_f16_kernel`` rounds rows to float16 (the kernels' input: the reference's f16(x), round to
nearest even); ``add_rows_kernel`` adds a kernel's output rows into the residual stream. Both touch
rows < meta[1] only; grid (col_blocks(N), rows), block (32,), blocks stride over 32-column tiles.
Both wait for the previous kernel (programmatic dependent launch, ``launch.py``) and then let the next
one start.
"""

from __future__ import annotations

from numba import cuda, float32, uint16

from .blockops import TPB
from .intrinsics import f32_to_h2, griddep_launch_dependents, griddep_wait

ZERO = float32(0.0)


@cuda.jit
def to_f16_kernel(dst, src, meta):
    """dst [T', N] uint16 = float16 bits of src [T, N] float32."""
    griddep_wait()
    griddep_launch_dependents()
    row = cuda.blockIdx.y
    if row >= meta[1]:
        return
    for j in range(cuda.blockIdx.x * TPB + cuda.threadIdx.x, src.shape[1], TPB * cuda.gridDim.x):
        dst[row, j] = uint16(f32_to_h2(src[row, j], ZERO) & 0xFFFF)


@cuda.jit
def add_rows_kernel(h, y, meta):
    """h [T, N] += y [T', N] (float32)."""
    griddep_wait()
    griddep_launch_dependents()
    row = cuda.blockIdx.y
    if row >= meta[1]:
        return
    for j in range(cuda.blockIdx.x * TPB + cuda.threadIdx.x, h.shape[1], TPB * cuda.gridDim.x):
        h[row, j] += y[row, j]

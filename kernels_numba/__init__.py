"""numba.cuda kernels of the workbench (W4A16 GEMV/GEMM, fused MoE, engine kernels).

Host wrappers validate every input and raise ``KernelInputError`` (a ValueError) before launching.
GPU-only instructions live in ``intrinsics`` with simulator fallbacks, so CI simulates the same source.
"""

from ._validate import KernelInputError
from .int4_layout import Int4Weight, LayoutError, repack_int4, unrepack_int4
from .int4_matmul import int4_matmul
from .moe import MoEWeights, MoEWorkspace, fused_moe, moe_workspace, prepare_moe

__all__ = ["Int4Weight", "KernelInputError", "LayoutError", "MoEWeights", "MoEWorkspace", "fused_moe",
           "int4_matmul", "moe_workspace", "prepare_moe", "repack_int4", "unrepack_int4"]

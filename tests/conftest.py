"""Test-wide settings. Kernels run in numba's CUDA simulator unless KDTREE_GPU=1 (the GPU tier)."""

import os

if os.environ.get("KDTREE_GPU") != "1":
    os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")

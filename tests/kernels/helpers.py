"""Shared helpers of the kernel tests: device transfer that works in both tiers, assert_close, markers.

Simulator tier (default, CI): numba's CUDA simulator, numpy arrays in and out, tiny shapes.
GPU tier (KDTREE_GPU=1 on the H200): the same kernels on the device, tests marked ``gpu``.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from numba import cuda

from kernels_numba.device import SIMULATED

ON_GPU = os.environ.get("KDTREE_GPU") == "1" and not SIMULATED and cuda.is_available()

gpu = pytest.mark.gpu
needs_gpu = pytest.mark.skipif(not ON_GPU, reason="GPU tier: needs KDTREE_GPU=1 and a CUDA GPU")
sim_only = pytest.mark.skipif(not SIMULATED, reason="simulator tier")


def dev(a):
    """Host array -> what the kernels take in this tier (numpy in the simulator, device array on GPU)."""
    a = np.ascontiguousarray(a)
    return a if SIMULATED else cuda.to_device(a)


def host(a):
    return np.asarray(a) if isinstance(a, np.ndarray) else a.copy_to_host()


def poisoned(shape, dtype=np.float32):
    """Output buffer full of NaN, so an unwritten element cannot pass."""
    return dev(np.full(shape, np.nan, dtype))


def assert_close(got, ref, rtol=1e-5, atol_rel=1e-5, what=""):
    """|got - ref| <= atol + rtol |ref| with atol = atol_rel * max|ref| (float32 summation order only);
    NaN anywhere fails; prints the first mismatches."""
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    if got.shape != ref.shape:                  # raise, not assert: helpers are not rewritten under -O
        raise AssertionError(f"{what}: shape {got.shape} != {ref.shape}")
    tol = atol_rel * float(np.abs(ref).max() or 1.0) + rtol * np.abs(ref)
    bad = ~(np.abs(got - ref) <= tol)
    if bad.any():
        idx = np.argwhere(bad)[:5]
        rows = ", ".join(f"{tuple(i)}: got {got[tuple(i)]:.6g} ref {ref[tuple(i)]:.6g}" for i in idx)
        raise AssertionError(f"{what}: {int(bad.sum())} of {bad.size} elements off; first: {rows}")

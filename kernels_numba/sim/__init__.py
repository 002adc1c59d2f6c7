"""A faster executor for numba's CUDA simulator (same semantics), behind one context manager.

``sim_speed()``: while active, simulated launches run on pooled threads / greenlets (``executor``,
``threads``), device-function calls hold their module swap for the launch (``calls``), and the
simulator's shared-array allocation is thread-safe. No effect on a GPU (``device.SIMULATED`` off).
The engine enters it around every generation; kernel tests use numba's plain simulator.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Iterator

import numpy as np

from ..device import SIMULATED

_PATCHED = False


def _patch_arrays() -> None:
    """Make the simulator's ``cuda.shared.array`` thread-safe and its ``cuda.local.array`` quicker (once
    per process; same arrays either way).

    numba's simulator creates a block's shared array on first use with an unlocked look-up-then-insert
    keyed by call site; a thread preempted between the two (the simulator's thread mode) lets two
    threads of a block both miss and each get a private array, silently breaking a block reduction.
    This version does the same keyed allocation under a lock. Local arrays (one per thread and call)
    keep the numba-to-numpy dtype translation of each numba type instead of redoing it per call.
    """
    global _PATCHED
    if _PATCHED:
        return
    from numba.cuda.simulator import kernelapi
    lock = threading.Lock()
    original = kernelapi.FakeCUDAShared.array
    dtypes: dict = {}

    def as_dtype(dtype):
        if not isinstance(dtype, kernelapi.types.Type):
            return dtype
        dt = dtypes.get(dtype)
        if dt is None:
            dt = dtypes[dtype] = kernelapi.numpy_support.as_dtype(dtype)
        return dt

    def array(self, shape, dtype, alignment=None):
        if alignment is not None or shape == 0:
            return original(self, shape, dtype, alignment)
        frame = sys._getframe(1)
        key = (frame.f_code.co_filename, frame.f_lineno)
        with lock:
            res = self._allocations.get(key)
            if res is None:
                res = np.empty(shape, as_dtype(dtype))
                self._allocations[key] = res
        return res

    def local_array(self, shape, dtype, alignment=None):
        if alignment is not None:
            raise RuntimeError("Array alignment is not supported in cudasim")
        return np.empty(shape, as_dtype(dtype))

    kernelapi.FakeCUDAShared.array = array
    kernelapi.FakeCUDALocal.array = local_array
    _PATCHED = True


@contextlib.contextmanager
def sim_speed() -> Iterator[None]:
    """Under the simulator, run launches with the block executor of ``executor.fast_blocks`` (greenlets
    when installed, else pooled threads with blocking barriers) and ``_patch_arrays``' shared and local
    arrays. No effect on a GPU."""
    if not SIMULATED:
        yield
        return
    from .executor import fast_blocks
    _patch_arrays()
    with fast_blocks():
        yield

"""Device arrays of the engine, and the simulator's fast path.

On a GPU these are numba ``DeviceNDArray`` objects. Under the CUDA simulator they are ``memoryview``s
of host numpy arrays: the simulator passes non-ndarray kernel arguments through unchanged, so the
kernels index a memoryview directly instead of the simulator's two-level array wrapper (several
times faster per element; dtypes are preserved: float32 stays 'f', int32 'i'). The kernel source is
the same either way; only the container the simulated kernels index differs.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Iterator

import numpy as np
from numba import config as numba_config
from numba import cuda


def simulated() -> bool:
    return bool(numba_config.ENABLE_CUDASIM)


def to_device(a: np.ndarray):
    a = np.ascontiguousarray(a)
    if simulated():
        return memoryview(a.copy())
    return cuda.to_device(a)


def zeros(shape, dtype=np.float32):
    return to_device(np.zeros(shape, dtype=dtype))


def upload(dev, host: np.ndarray, stream=0) -> None:
    """Copy a host array of the same shape and dtype into ``dev``."""
    if simulated():
        np.asarray(dev)[...] = host
    else:
        dev.copy_to_device(np.ascontiguousarray(host), stream=stream)


def download(dev, stream=0) -> np.ndarray:
    """A host copy of ``dev`` (the caller synchronises the stream on a GPU)."""
    if simulated():
        return np.array(np.asarray(dev))
    return dev.copy_to_host(stream=stream)


def host_buffer(shape, dtype) -> np.ndarray:
    """A reusable host staging array: page-locked on a GPU (fast, truly async copies), plain numpy
    under the simulator."""
    if simulated():
        return np.zeros(shape, dtype=dtype)
    return cuda.pinned_array(shape, dtype=dtype)


def download_into(dev, host: np.ndarray, stream=0) -> np.ndarray:
    """Copy ``dev`` into the preallocated ``host`` (the caller synchronises on a GPU)."""
    if simulated():
        host[...] = np.asarray(dev)
    else:
        dev.copy_to_host(host, stream=stream)
    return host


def sub(dev, i: int):
    """The i-th slice along the first axis, as a device array of the same kind (a view)."""
    if simulated():
        return memoryview(np.asarray(dev)[i])
    return dev[i]


def head_rows(dev, n: int):
    """The first ``n`` rows along the first axis, as a device array of the same kind (a view)."""
    if simulated():
        return memoryview(np.asarray(dev)[:n])
    return dev[:n]


def tail_rows(dev, start: int):
    """Rows ``start`` .. end along the first axis, as a device array of the same kind (a view)."""
    if simulated():
        return memoryview(np.asarray(dev)[start:])
    return dev[start:]


def shape(dev) -> tuple[int, ...]:
    return tuple(dev.shape)


_SHARED_LOCKED = False


def _lock_sim_shared_arrays() -> None:
    """Make the simulator's ``cuda.shared.array`` thread-safe (once per process).

    numba's simulator creates a block's shared array on first use with an unlocked look-up-then-insert
    keyed by call site; a thread preempted between the two (the simulator's thread mode) lets two
    threads of a block both miss and each get a private array, silently breaking a block reduction
    (one suspected occurrence in a loaded test run). This version does the same keyed allocation
    under a lock.
    """
    global _SHARED_LOCKED
    if _SHARED_LOCKED:
        return
    from numba.cuda.simulator import kernelapi
    lock = threading.Lock()
    original = kernelapi.FakeCUDAShared.array

    def array(self, shape, dtype, alignment=None):
        if alignment is not None or shape == 0:
            return original(self, shape, dtype, alignment)
        frame = sys._getframe(1)
        key = (frame.f_code.co_filename, frame.f_lineno)
        with lock:
            res = self._allocations.get(key)
            if res is None:
                if isinstance(dtype, kernelapi.types.Type):
                    dtype = kernelapi.numpy_support.as_dtype(dtype)
                res = np.empty(shape, dtype)
                self._allocations[key] = res
        return res

    kernelapi.FakeCUDAShared.array = array
    _SHARED_LOCKED = True


@contextlib.contextmanager
def sim_speed() -> Iterator[None]:
    """Under the simulator, run launches with the faster block executor of ``simexec.fast_blocks``
    (pooled simulated threads, blocking barriers, greenlets when installed; same semantics) and make
    the simulator's shared-array allocation thread-safe (``_lock_sim_shared_arrays``). No effect on
    a GPU."""
    if not simulated():
        yield
        return
    from .simexec import fast_blocks
    _lock_sim_shared_arrays()
    with fast_blocks():
        yield

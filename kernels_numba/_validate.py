"""Host-side checks shared by the kernel wrappers: every check runs before any launch.

The GPU has no bounds checking (docs/numba-cuda.md), so these checks are the only protection:
dtype, rank, shape, C-contiguity, 16-byte alignment, int32 index ranges, grid limits.
"""

from __future__ import annotations

import numpy as np
from numba import cuda

from .device import SIMULATED

INT32_MAX = 2**31 - 1
GRID_Y_MAX = 65535


class KernelInputError(ValueError):
    """An input a kernel cannot take; raised by the host wrapper before launching."""


def warps(ks: int, name: str) -> int:
    """``ks`` if it is 1..32 warps a block (a block has at most 1,024 threads), else KernelInputError."""
    if not isinstance(ks, (int, np.integer)) or not 1 <= ks <= 32:
        raise KernelInputError(f"{name}: ks must be 1..32 warps a block, got {ks}")
    return int(ks)


def as_array(a, name: str):
    """A numba device array (or, in the simulator, a numpy array) viewing ``a`` without a copy.

    Accepts numba device arrays and anything with ``__cuda_array_interface__`` (torch CUDA tensors);
    host numpy arrays are accepted only by the simulator (tests).
    """
    if a is None:
        raise KernelInputError(f"{name}: missing array")
    if SIMULATED:                                           # the simulator's kernels take numpy arrays
        if isinstance(a, np.ndarray):
            return a
        raise KernelInputError(f"{name}: expected a numpy array in the simulator, got {type(a).__name__}")
    if cuda.is_cuda_array(a):
        return cuda.as_cuda_array(a, sync=False)
    raise KernelInputError(f"{name}: expected a CUDA array (numba device array or torch CUDA tensor), "
                           f"got {type(a).__name__}")


def _pointer(a) -> int:
    if isinstance(a, np.ndarray):
        return a.ctypes.data
    cai = getattr(a, "__cuda_array_interface__", None)
    if cai is not None:
        return int(cai["data"][0])
    return int(a.device_ctypes_pointer.value or 0)


def check(a, name: str, dtype, shape: tuple, align: int = 16):
    """Raise KernelInputError unless ``a`` has ``dtype``, ``shape`` (None = any), is C-contiguous
    and its base address is a multiple of ``align`` bytes. Returns ``a`` as a device array."""
    a = as_array(a, name)
    if np.dtype(a.dtype) != np.dtype(dtype):
        raise KernelInputError(f"{name}: dtype {np.dtype(a.dtype)} but {np.dtype(dtype)} is required")
    if len(a.shape) != len(shape) or any(s is not None and s != d
                                         for s, d in zip(shape, a.shape, strict=True)):
        want = tuple("*" if s is None else s for s in shape)
        raise KernelInputError(f"{name}: shape {tuple(a.shape)} but {want} is required")
    contiguous = a.flags["C_CONTIGUOUS"] if isinstance(a, np.ndarray) else a.is_c_contiguous()
    if not contiguous:
        raise KernelInputError(f"{name}: must be C-contiguous")
    if a.size and _pointer(a) % align:
        raise KernelInputError(f"{name}: base address must be {align}-byte aligned")
    if a.size > INT32_MAX:
        raise KernelInputError(f"{name}: {a.size} elements exceed the int32 index range")
    return a


def flat(a):
    """1-D view of a C-contiguous array (kernels index flat buffers with precomputed strides)."""
    return a.reshape(a.size) if len(a.shape) != 1 else a


def as_stream(stream):
    """None -> default stream; a numba stream; an int handle or torch stream -> external stream."""
    if stream is None or SIMULATED:
        return 0
    if hasattr(stream, "cuda_stream"):                     # torch.cuda.Stream
        return cuda.external_stream(stream.cuda_stream)
    if isinstance(stream, int):
        return cuda.external_stream(stream) if stream else 0
    return stream


def empty(shape, dtype, stream=0):
    if SIMULATED:
        return np.empty(shape, dtype)
    return cuda.device_array(shape, dtype, stream=stream)


def zeroed(n: int, dtype, stream=0):
    """``n`` zeros of ``dtype`` on ``stream`` (a device memset)."""
    a = empty(n, dtype, stream)
    if SIMULATED:
        a[:] = 0
    else:
        cuda.driver.device_memset(a, 0, a.nbytes, stream=stream)
    return a

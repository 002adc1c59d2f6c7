"""Where the kernels run: the one "simulated?" switch, device arrays and streams.

``SIMULATED`` is True under numba's CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``, set before numba.cuda
is first imported); every module that behaves differently there reads this name.

Device arrays of the engine are numba ``DeviceNDArray`` objects on a GPU. Under the simulator they
are ``memoryview``s of host numpy arrays: the simulator passes non-ndarray kernel arguments through
unchanged, so the engine's scalar kernels index a memoryview directly instead of the simulator's
two-level array wrapper (several times faster per element; dtypes are preserved: float32 stays 'f',
int32 'i'). The validating host wrappers of the tensor-core kernels take numpy arrays there
(``kernel_array``). The kernel source is the same either way.
"""

from __future__ import annotations

import functools

import numpy as np
from numba import config, cuda

SIMULATED = bool(config.ENABLE_CUDASIM)


def on_gpu() -> bool:
    """True on a real CUDA device (not the simulator)."""
    return not SIMULATED and cuda.is_available()


def default_stream():
    """The stream engine launches and copies go to: torch's current stream on a GPU, else 0."""
    if on_gpu():
        import torch
        return cuda.external_stream(torch.cuda.current_stream().cuda_stream)
    return 0


class SideStream:
    """A second stream for launches that may run beside the main stream's: ``mark(stream)`` notes the
    point of ``stream`` they start from (an event), ``fork()`` returns the second stream waiting for it,
    ``join(stream)`` makes ``stream`` wait for everything launched on the second stream since. The
    branch's launches may be issued after later main-stream ones: issued main first, a captured graph's
    branches of every layer take one stream (issued branch first, its instantiation gives each layer's
    branch a stream of its own). Eager runs and captures alike; without a GPU the branch runs on the
    marked stream, in program order. Made on the first mark, an eager run (a capture may not create
    streams)."""

    def __init__(self) -> None:
        self._torch_stream = self._side = self._fork = self._join = self._marked = None

    def mark(self, stream) -> None:
        self._marked = stream
        if not on_gpu():
            return
        if self._side is None:
            import torch
            self._torch_stream = torch.cuda.Stream()                 # non-blocking: no tie to stream 0
            self._side = cuda.external_stream(self._torch_stream.cuda_stream)
            self._fork, self._join = cuda.event(timing=False), cuda.event(timing=False)
        self._fork.record(stream)

    def fork(self):
        if self._side is None:
            return self._marked
        self._fork.wait(self._side)
        return self._side

    def join(self, stream) -> None:
        if self._side is not None:
            self._join.record(self._side)
            self._join.wait(stream)


@functools.cache
def sm_count() -> int:
    """SMs of the current GPU (132 on an H200, assumed where there is none: compile-only checks)."""
    if SIMULATED or not cuda.is_available():
        return 132
    return cuda.get_current_device().MULTIPROCESSOR_COUNT


def to_device(a: np.ndarray):
    a = np.ascontiguousarray(a)
    if SIMULATED:
        return memoryview(a.copy())
    return cuda.to_device(a)


def zeros(shape, dtype=np.float32):
    return to_device(np.zeros(shape, dtype=dtype))


def upload(dev, host: np.ndarray, stream=0) -> None:
    """Copy a host array of the same shape and dtype into ``dev``."""
    if SIMULATED:
        np.asarray(dev)[...] = host
    else:
        dev.copy_to_device(np.ascontiguousarray(host), stream=stream)


def download(dev, stream=0) -> np.ndarray:
    """A host copy of ``dev`` (the caller synchronises the stream on a GPU)."""
    if SIMULATED:
        return np.array(np.asarray(dev))
    return dev.copy_to_host(stream=stream)


def host_buffer(shape, dtype) -> np.ndarray:
    """A reusable host staging array: page-locked on a GPU (fast, truly async copies), plain numpy
    under the simulator."""
    if SIMULATED:
        return np.zeros(shape, dtype=dtype)
    return cuda.pinned_array(shape, dtype=dtype)


class Mirror:
    """A device array and a page-locked host array of its shape, for the small copies a decoding round
    makes every time (control blocks, top-k tables, the target's tokens). On a GPU both sides are
    wrapped once as torch tensors and copied with ``copy_`` on torch's current stream, the stream the
    engine launches on: measured on the H200 (dev/copy_costs.py), numba's copy_to_device costs about
    150 us of host time per call and its copy_to_host about 40, torch's copy about 10. Under the
    simulator ``host`` is a plain array copied with numpy."""

    def __init__(self, dev) -> None:
        self.dev = dev
        if SIMULATED:
            self.host = np.zeros(np.asarray(dev).shape, np.asarray(dev).dtype)
            self._d = self._h = None
        else:
            import torch
            self._d = torch.as_tensor(dev, device="cuda")
            self._h = torch.empty(self._d.shape, dtype=self._d.dtype, pin_memory=True)
            self.host = self._h.numpy()

    def push(self) -> None:
        """device <- host, stream-ordered (the host array must not change until the stream passes it)."""
        if self._d is None:
            np.asarray(self.dev)[...] = self.host
        else:
            self._d.copy_(self._h, non_blocking=True)

    def pull(self) -> np.ndarray:
        """host <- device, stream-ordered; the caller synchronises before reading ``host`` on a GPU."""
        if self._d is None:
            self.host[...] = np.asarray(self.dev)
        else:
            self._h.copy_(self._d, non_blocking=True)
        return self.host


def download_into(dev, host: np.ndarray, stream=0) -> np.ndarray:
    """Copy ``dev`` into the preallocated ``host`` (the caller synchronises on a GPU)."""
    if SIMULATED:
        host[...] = np.asarray(dev)
    else:
        dev.copy_to_host(host, stream=stream)
    return host


def sub(dev, i: int):
    """The i-th slice along the first axis, as a device array of the same kind (a view)."""
    if SIMULATED:
        return memoryview(np.asarray(dev)[i])
    return dev[i]


def head_rows(dev, n: int):
    """The first ``n`` rows along the first axis, as a device array of the same kind (a view)."""
    if SIMULATED:
        return memoryview(np.asarray(dev)[:n])
    return dev[:n]


def tail_rows(dev, start: int):
    """Rows ``start`` .. end along the first axis, as a device array of the same kind (a view)."""
    if SIMULATED:
        return memoryview(np.asarray(dev)[start:])
    return dev[start:]


def rows_view(flat, rows: int, width: int):
    """The first ``rows * width`` elements of a 1-D device array as a C-contiguous [rows, width] view
    of the same kind (one flat scratch buffer serves every width up to its size)."""
    if SIMULATED:
        return memoryview(np.asarray(flat)[:rows * width].reshape(rows, width))
    return flat[:rows * width].reshape(rows, width)


def kernel_array(dev, dtype=None):
    """``dev`` as the validating kernel wrappers take it: a numpy view under the simulator, the device
    array itself on a GPU; ``dtype`` reinterprets the bytes (uint16 bits as float16)."""
    a = np.asarray(dev) if SIMULATED else dev
    return a if dtype is None else a.view(dtype)

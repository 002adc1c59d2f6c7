"""Kernel launch with programmatic dependent launch (PDL), so consecutive kernels overlap.

Without PDL a kernel's blocks start only after every block of the previous kernel in the stream has
exited, and its first loads only then begin: one launch gap plus one memory ramp-up and drain per
kernel (measured ~1.8 us per launch for one K2 weight matrix, docs/perf.md). With PDL the next
kernel may start as soon as every block of this one has executed ``griddep_launch_dependents()``;
it issues its weight loads (which depend on nothing earlier in the stream) and then blocks in
``griddep_wait()`` until the previous grid has completed and its writes are visible, before it
reads any activation or writes any output. A kernel launched this way must call ``griddep_wait()``
before its first dependent read or write; without the launch attribute the wait is a no-op.

numba-cuda (0.30) launches through ``cuda.core``'s ``LaunchConfig``, which has the
``programmatic_stream_serialization`` attribute but no numba API to set it. On import, this module
wraps the ``LaunchConfig`` name numba's dispatcher calls: the wrapper adds the attribute only while
``launch(..., pdl=True)`` runs in the calling thread (a thread-local flag), so every other launch,
in this thread or another, is built exactly as before. Argument handling, compilation and caching
stay numba's. The simulator runs launches one after another (no PDL).

The same two hooks launch thread block clusters (cuda.core's ``cluster``; its grid then counts
clusters) and opt a kernel in to more than 48 KB of dynamic shared memory before its launch.
"""

from __future__ import annotations

import threading

from .intrinsics import SIMULATED

_local = threading.local()


def _install() -> bool:
    """Wrap numba's LaunchConfig and launch (see above); False when this numba-cuda / cuda.core cannot
    do PDL."""
    if SIMULATED:
        return False
    try:
        from numba.cuda import dispatcher
        base = dispatcher.LaunchConfig
        base(grid=1, block=32, programmatic_stream_serialization=True)
        base_launch = dispatcher.launch
    except (ImportError, AttributeError, TypeError):
        return False

    def launch_config(*args, **kwargs):
        if getattr(_local, "pdl", False):
            kwargs["programmatic_stream_serialization"] = True
        c = getattr(_local, "cluster", 1)
        if c > 1:                                   # cuda.core counts the grid in clusters
            gx, *rest = kwargs["grid"]
            kwargs["grid"], kwargs["cluster"] = (gx // c, *rest), (c, 1, 1)
        return base(*args, **kwargs)

    def launch_fn(stream, config, kernel, *args):
        need = getattr(_local, "shared", 0)
        if need > _STATIC_SHARED_MAX and _opted_in.get(kernel.handle, 0) < need:
            _allow_shared(kernel.handle, need)
            _opted_in[kernel.handle] = need
        return base_launch(stream, config, kernel, *args)
    dispatcher.LaunchConfig = launch_config
    dispatcher.launch = launch_fn
    return True


_STATIC_SHARED_MAX = 48 * 1024              # dynamic shared memory a kernel may use without opting in
_opted_in: dict = {}


def _allow_shared(handle, nbytes: int) -> None:
    from numba import cuda
    from numba.cuda.cudadrv.driver import binding, driver
    attr = binding.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
    driver.cuKernelSetAttribute(attr, nbytes, handle, cuda.get_current_device().id)


PDL_AVAILABLE = _install()


def launch(kernel, grid, block, stream, args, pdl: bool = True, shared: int = 0, cluster: int = 1):
    """``kernel[grid, block, stream, shared](*args)``, with PDL when ``pdl`` and this numba-cuda supports
    it; ``shared`` bytes of dynamic shared memory (opted in above 48 KB); ``cluster`` blocks along x per
    thread block cluster (grid[0] a multiple of it; the simulator runs clusters of one block)."""
    if cluster > 1 and not (PDL_AVAILABLE or SIMULATED):
        raise RuntimeError("this numba-cuda cannot launch thread block clusters")
    _local.pdl = pdl and PDL_AVAILABLE
    _local.shared, _local.cluster = shared, cluster if PDL_AVAILABLE else 1
    try:
        kernel[grid, block, stream, shared](*args)
    finally:
        _local.pdl, _local.shared, _local.cluster = False, 0, 1

"""Kernel launch with programmatic dependent launch (PDL), so consecutive kernels overlap.

Without PDL a kernel's blocks start only after every block of the previous kernel in the stream has
exited, and its first loads only then begin: one launch gap plus one memory ramp-up and drain per kernel
(int4_matmul at K2 M = 1 takes 1.3-1.7 us longer per launch without PDL, docs/perf.md). With PDL the
next kernel may start as soon as every block of this one has executed ``griddep_launch_dependents()``;
it issues its weight loads (which depend on nothing earlier in the stream) and then blocks in
``griddep_wait()`` until the previous grid has completed and its writes are visible, before it reads any
activation or writes any output. A kernel launched this way must call ``griddep_wait()`` before its
first dependent read or write (``launch`` refuses a kernel whose body never calls it); without the
launch attribute the wait is a no-op.

numba-cuda (0.30) launches through ``cuda.core``'s ``LaunchConfig``, which has the
``programmatic_stream_serialization`` attribute but no numba API to set it. On import, this module
wraps the ``LaunchConfig`` name numba's dispatcher calls: the wrapper adds the attribute only while
``launch(..., pdl=True)`` runs in the calling thread (a thread-local flag), so every other launch,
in this thread or another, is built exactly as before. Argument handling, compilation and caching
stay numba's. The simulator runs launches one after another (no PDL).

The same hook launches thread block clusters (cuda.core's ``cluster``; its grid then counts clusters).
"""

from __future__ import annotations

import functools
import threading

from .device import SIMULATED

_local = threading.local()


def _install() -> bool:
    """Wrap numba's LaunchConfig (see above); False when this numba-cuda / cuda.core cannot do PDL."""
    if SIMULATED:
        return False
    try:
        from numba.cuda import dispatcher
        base = dispatcher.LaunchConfig
        base(grid=1, block=32, programmatic_stream_serialization=True)
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
    dispatcher.LaunchConfig = launch_config
    return True


PDL_AVAILABLE = _install()
CLUSTERS_AVAILABLE = PDL_AVAILABLE or SIMULATED     # the simulator runs clusters of one block


def launch(kernel, grid, block, stream, args, pdl: bool = True, cluster: int = 1):
    """``kernel[grid, block, stream](*args)``, with PDL when ``pdl`` and this numba-cuda supports it, in
    thread block clusters of ``cluster`` blocks along x (grid[0] a multiple of it; the simulator runs
    clusters of one block)."""
    if cluster > 1 and not CLUSTERS_AVAILABLE:
        raise RuntimeError("this numba-cuda cannot launch thread block clusters")
    if pdl and not waits(kernel):
        raise RuntimeError(f"{_name(kernel)} is launched with PDL but never calls griddep_wait: it could "
                           "read its inputs before the kernel that writes them has finished")
    _local.pdl = pdl and PDL_AVAILABLE
    _local.cluster = cluster if PDL_AVAILABLE else 1
    try:
        kernel[grid, block, stream](*args)
    finally:
        _local.pdl, _local.cluster = False, 1


def _py_func(kernel):
    return getattr(kernel, "py_func", None) or kernel.fn          # a dispatcher; the simulator's kernel


def _name(kernel) -> str:
    return _py_func(kernel).__name__


@functools.cache                                     # once a kernel, not on every launch
def waits(kernel) -> bool:
    """Whether the kernel's own body calls ``griddep_wait`` (or ``griddep_wait_for``): what a PDL launch
    needs, here and in the simulator alike (which cannot show the race a missing wait makes)."""
    names = _py_func(kernel).__code__.co_names
    return "griddep_wait" in names or "griddep_wait_for" in names

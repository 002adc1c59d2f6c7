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
``programmatic_stream_serialization`` attribute but no numba API to set it. ``launch`` sets it for
one call by swapping the config class numba's dispatcher uses, under a lock; argument handling,
compilation and caching stay numba's. The simulator runs launches one after another (no PDL).
"""

from __future__ import annotations

import functools
import threading

from .intrinsics import SIMULATED

_lock = threading.Lock()


def _pdl_hook():
    """(dispatcher module, its LaunchConfig, the PDL variant) or None when this numba-cuda lacks it."""
    if SIMULATED:
        return None
    try:
        from numba.cuda import dispatcher
        base = dispatcher.LaunchConfig
        base(grid=1, block=32, programmatic_stream_serialization=True)
    except (ImportError, AttributeError, TypeError):
        return None
    return dispatcher, base, functools.partial(base, programmatic_stream_serialization=True)


_HOOK = _pdl_hook()
PDL_AVAILABLE = _HOOK is not None


def launch(kernel, grid, block, stream, args, pdl: bool = True):
    """``kernel[grid, block, stream](*args)``, with PDL when ``pdl`` and this numba-cuda supports it."""
    configured = kernel[grid, block, stream]
    if not (pdl and PDL_AVAILABLE):
        configured(*args)
        return
    module, base, with_pdl = _HOOK
    with _lock:
        module.LaunchConfig = with_pdl
        try:
            configured(*args)
        finally:
            module.LaunchConfig = base

"""Quicker device-function calls for the simulator's executor.

Device functions: the simulator wraps every call in ``swapped_cuda_module`` (a lock, a context
manager and, whenever the function's module is not swapped already, a scan of its globals). While
``held_device_calls()`` is active, the first call into a module during a launch enters that swap
once and holds it until the launch returns, so later calls go straight to the function. The
module's ``cuda`` is the launch's fake module for the rest of the launch (only kernel threads run
during a launch); the refcounted swap restores it afterwards, as after any call.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

_lock = threading.Lock()
_held: dict = {}                             # id(module globals) -> fake cuda module it is held for
_held_exits: list = []                       # the entered swaps of the current launch
_original_call = None
_active = 0


def _fast_call(self, *args):
    from numba.cuda.simulator import kernel as simkernel
    from numba.cuda.simulator.kernelapi import swapped_cuda_module
    ctx = simkernel._kernel_context
    if not (self._device or ctx):            # a launch: run it, then let go of the held swaps
        try:
            return _original_call(self, *args)
        finally:
            with _lock:
                while _held_exits:
                    _held_exits.pop().__exit__(None, None, None)
                _held.clear()
    if ctx is None:                          # a device function called outside a launch
        return _original_call(self, *args)
    gid = id(self.fn.__globals__)
    if _held.get(gid) is not ctx:
        with _lock:
            if _held.get(gid) is not ctx:
                cm = swapped_cuda_module(self.fn, ctx)
                cm.__enter__()
                _held_exits.append(cm)
                _held[gid] = ctx
    return self.fn(*args)


@contextlib.contextmanager
def held_device_calls() -> Iterator[None]:
    """Patch the simulator's kernel call for held module swaps while active (re-entrant)."""
    global _active, _original_call
    from numba.cuda.simulator import kernel as simkernel
    with _lock:
        if _active == 0:
            _original_call = simkernel.FakeCUDAKernel.__call__
            simkernel.FakeCUDAKernel.__call__ = _fast_call
        _active += 1
    try:
        yield
    finally:
        with _lock:
            _active -= 1
            if _active == 0:
                simkernel.FakeCUDAKernel.__call__ = _original_call

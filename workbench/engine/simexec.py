"""A faster block executor for numba's CUDA simulator, with the simulator's semantics (engine runs).

numba's simulator runs each CUDA thread of a block as a fresh OS thread and detects a ``syncthreads``
barrier by polling every thread's flag from the launching thread. At the engine's tiny shapes most
of a simulated verify step went into that machinery (32 thread starts per block, 10-20 us of OS
thread switching per thread and barrier, the polling loop competing for the interpreter lock), not
into the kernels' arithmetic.

``fast_blocks()`` swaps ``PooledBlock`` in for the simulator's ``BlockManager`` while active (and
holds device-function module swaps per launch, ``simcalls``). A block runs on one reused worker
thread with each CUDA thread as a reusable greenlet (``greenlet`` package, when installed): a barrier
switches to the next thread (~1 us) and the block proceeds in phases, each phase resuming every
thread still inside the kernel, in a fixed order, until it reaches the barrier or returns. Without
``greenlet`` (or with ``USE_GREENLETS`` off), and for kernels that can reach kernels_numba's
warp-collective intrinsics (whose lanes must run concurrently), the CUDA threads run on pooled OS
threads and a barrier is a condition variable: the last thread to arrive releases the rest.

What a kernel observes is the simulator's in both modes: one simulated thread per CUDA thread with
its own threadIdx / blockIdx / thread_id, blocks one after another, a barrier that releases once
every thread still running has reached it (returned threads do not hold it up), syncthreads_count /
and / or over the block, and an exception in any thread aborting the block and re-raised by the
launch with the thread and block named. Shared arrays, the fake ``cuda`` module and argument
handling stay the simulator's own. The greenlet schedule is deterministic; the thread one is not
(nor is the simulator's); a race-free kernel gives the same result under any schedule. A kernel
that waits on anything but a barrier (a spin on another thread's write) would hang in greenlet mode.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import numpy as np

from . import simthreads
from .simcalls import held_device_calls, reaches_collectives

USE_GREENLETS = True                         # greenlet mode when the package is installed
_lock = threading.Lock()
_active = 0                                  # nesting depth of fast_blocks()
_original = None                             # the simulator's BlockManager while patched
_collective: dict = {}                       # kernel function -> reaches_collectives(...)
_POINTS: dict = {}                           # block shape -> _points(...)


def _points(block_dim: tuple[int, ...]) -> list:
    """(threadIdx, thread_id, index into block_state) of every thread of a block, in a fixed order."""
    pts = _POINTS.get(block_dim)
    if pts is None:
        from numba.cuda.simulator.kernelapi import Dim3
        bx, by, _ = (block_dim + (1, 1))[:3]
        pts = []
        for p in np.ndindex(*block_dim):
            t = Dim3(*p)
            pts.append((t, t.x + bx * (t.y + by * t.z), p))
        _POINTS[block_dim] = pts
    return pts


def _green_for(fn) -> bool:
    if not (USE_GREENLETS and simthreads.green_available()):
        return False
    res = _collective.get(fn)
    if res is None:
        res = _collective[fn] = reaches_collectives(fn)
    return not res


class PooledBlock:
    """Drop-in for the simulator's ``BlockManager(f, grid_dim, block_dim, debug)``: ``run(grid_point,
    *args)`` executes one block of ``f`` and returns when every thread has finished."""

    def __init__(self, f, grid_dim, block_dim, debug) -> None:
        self.fn = f
        self._grid_dim = grid_dim
        self._block_dim = block_dim
        self._debug = debug
        self.block_state = np.zeros(block_dim, dtype=np.bool_)
        self.cond = threading.Condition(threading.Lock())
        self.done = threading.Lock()
        self.args: tuple = ()
        self.points: list = []
        self.block_idx = None
        self.live = 0                        # thread mode: threads not yet returned
        self.arrived = 0                     # ... of which waiting at the barrier
        self.generation = 0
        self.abort = False
        self.error = None
        self.scheduler = None                # greenlet mode: the worker's own greenlet

    def run(self, grid_point, *args) -> None:
        from numba.cuda.simulator.kernelapi import Dim3
        self.points = _points(tuple(self._block_dim))
        self.block_idx = Dim3(*grid_point)
        self.args = args
        self.live = len(self.points)
        self.done.acquire()
        if _green_for(self.fn):
            w = simthreads.green_worker()
            w._manager = self
            w.blockIdx = self.block_idx
            w.gate.release()
        else:
            workers = simthreads.thread_workers(len(self.points))
            for w, p in zip(workers, self.points, strict=True):
                w._manager = self
                w.blockIdx = self.block_idx
                w.threadIdx, w.thread_id, w.state_idx = p
            for w in workers:
                w.gate.release()
        self.done.acquire()                  # released when the block is over
        self.done.release()
        self.args = ()                       # the pooled threads keep no kernel arguments alive
        if self.error is not None:
            raise self.error[0].with_traceback(self.error[1])

    def run_green(self, w) -> None:
        """Greenlet mode, on the worker thread: phases until every thread has returned."""
        self.scheduler = simthreads.greenlet.getcurrent()
        inside = list(zip(self.points, w.slots(len(self.points)), strict=True))
        arg = self                           # phase 0 hands each greenlet this block
        while inside:
            nxt = []
            for p, g in inside:
                if self.error is not None:   # abort: unwind the threads suspended at a barrier
                    if arg is None:
                        g.throw(simthreads.Unwind)
                    continue
                w.threadIdx, w.thread_id, w.state_idx = p
                res = g.switch(arg)
                if res is simthreads.BARRIER:
                    nxt.append((p, g))
                elif res is not simthreads.FINISHED:
                    raise RuntimeError(f"a simulated thread switched back with {res!r}")
            inside = nxt
            arg = None

    # ---- called from the block's threads -----------------------------------------------------
    def _release(self) -> None:
        self.arrived = 0
        self.generation += 1
        self.cond.notify_all()

    def sync(self) -> None:
        if self.scheduler is not None:       # greenlet mode: back to the phase loop
            self.scheduler.switch(simthreads.BARRIER)
            return
        with self.cond:
            if self.abort:
                raise RuntimeError("abort flag set on syncthreads call")
            self.arrived += 1
            if self.arrived == self.live:
                self._release()
            else:
                gen = self.generation
                while gen == self.generation and not self.abort:
                    self.cond.wait()
            if self.abort:
                raise RuntimeError("abort flag set on syncthreads clear")

    def vote(self, idx, value, reduce) -> int:
        self.block_state[idx] = value
        self.sync()
        res = reduce(self.block_state)
        self.sync()
        return res

    def leave(self) -> None:
        with self.cond:
            self.live -= 1
            if self.live == 0:
                self.done.release()
            elif self.arrived == self.live:
                self._release()

    def fail(self, worker, e: BaseException, tb) -> None:
        """Record the block's first exception (named by thread and block) and abort the others."""
        with self.cond:
            if self.error is None:
                tid = list(worker.threadIdx) if worker.threadIdx is not None else "?"
                where = f"tid={tid} ctaid={list(self.block_idx)}"
                msg = f"{where}: {e}" if str(e) else where
                try:
                    err = type(e)(msg)
                except Exception:            # an exception type that takes other arguments
                    err = e
                self.error = (err, tb)
            self.abort = True
            self.cond.notify_all()


@contextlib.contextmanager
def fast_blocks() -> Iterator[None]:
    """Run simulated launches with ``PooledBlock`` and held device-function swaps while active
    (re-entrant; one launching thread at a time, as in the simulator). ``cuda.jit(debug=True)``
    launches keep the simulator's own BlockManager."""
    global _active, _original
    from numba.cuda.simulator import kernel as simkernel
    with _lock:
        if _active == 0:
            _original = simkernel.BlockManager
            simkernel.BlockManager = _pick
        _active += 1
    try:
        with held_device_calls():
            yield
    finally:
        with _lock:
            _active -= 1
            if _active == 0:
                simkernel.BlockManager = _original


def _pick(f, grid_dim, block_dim, debug):
    if debug:
        return _original(f, grid_dim, block_dim, debug)
    return PooledBlock(f, grid_dim, block_dim, debug)

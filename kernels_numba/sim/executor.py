"""A faster block executor for numba's CUDA simulator, with the simulator's semantics (engine runs).

numba's simulator runs each CUDA thread of a block as a fresh OS thread and detects a ``syncthreads``
barrier by polling every thread's flag from the launching thread. At the engine's tiny shapes most
of a simulated verify step went into that machinery (32 thread starts per block, 10-20 us of OS
thread switching per thread and barrier, the polling loop competing for the interpreter lock), not
into the kernels' arithmetic.

``fast_blocks()`` swaps ``PooledBlock`` in for the simulator's ``BlockManager`` while active (and
holds device-function module swaps per launch, ``calls``). A block runs on the launching thread
with each CUDA thread as a reusable greenlet (``greenlet`` package, when installed): a barrier
switches to the next thread (~1 us) and the block proceeds in phases, each phase resuming every
thread still inside the kernel, in a fixed order, until it reaches the barrier or returns. The
warp-collective intrinsics of kernels_numba (mma, syncwarp, bcast0) wait the same way, for the 32
lanes of their warp (``warp_sync``, ``threads.inline``). Without ``greenlet`` (or with
``USE_GREENLETS`` off) the CUDA threads run on pooled OS threads, a barrier is a condition variable
(the last thread to arrive releases the rest) and a warp collective the intrinsics' own 32-lane barrier.

What a kernel observes is the simulator's in both modes: one simulated thread per CUDA thread with
its own threadIdx / blockIdx / thread_id, blocks one after another, a barrier that releases once
every thread still running has reached it (returned threads do not hold it up), syncthreads_count /
and / or over the block, and an exception in any thread aborting the block and re-raised by the
launch with the thread and block named. Shared arrays, the fake ``cuda`` module and argument
handling stay the simulator's own. The greenlet schedule is deterministic; the thread one is not
(nor is the simulator's); a race-free kernel gives the same result under any schedule. A kernel
that waits on anything but a barrier (a spin on another thread's write) would hang in greenlet mode;
a warp collective that not all 32 lanes reach is an error there (the intrinsics' barrier times out).
"""

from __future__ import annotations

import collections
import contextlib
import threading
from collections.abc import Iterator

import numpy as np

from . import threads
from .calls import held_device_calls

USE_GREENLETS = True                         # greenlet mode when the package is installed
_lock = threading.Lock()
_active = 0                                  # nesting depth of fast_blocks()
_original = None                             # the simulator's BlockManager while patched
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
    return USE_GREENLETS and threads.green_available()


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
        self.scheduler = None                # greenlet mode: the launching thread's greenlet

    def run(self, grid_point, *args) -> None:
        from numba.cuda.simulator.kernelapi import Dim3
        self.points = _points(tuple(self._block_dim))
        self.block_idx = Dim3(*grid_point)
        self.args = args
        self.live = len(self.points)
        if _green_for(self.fn):
            with threads.inline(self) as w:
                self.run_green(w)
        else:
            self.done.acquire()
            workers = threads.thread_workers(len(self.points))
            for w, p in zip(workers, self.points, strict=True):
                w._manager = self
                w.blockIdx = self.block_idx
                w.threadIdx, w.thread_id, w.state_idx = p
            for w in workers:
                w.gate.release()
            self.done.acquire()              # released when the block is over
            self.done.release()
        self.args = ()                       # the pooled threads keep no kernel arguments alive
        if self.error is not None:
            raise self.error[0].with_traceback(self.error[1])

    def run_green(self, w) -> None:
        """Greenlet mode, on the launching thread: phases until every thread has returned. A phase resumes
        each thread still inside the kernel until it reaches a barrier or returns; a lane at a warp
        collective waits there until all 32 lanes of its warp have come, then they go on in lane order."""
        self.scheduler = threads.greenlet.getcurrent()
        inside = list(zip(self.points, w.slots(len(self.points)), strict=True))
        arg = self                           # phase 0 hands each greenlet this block
        while inside:
            nxt: list = []
            parked: dict = {}                # warp -> its lanes waiting at a collective
            for i, (p, g) in enumerate(inside):
                ready = collections.deque([(p, g, arg)])
                while ready and self.error is None:
                    q, gl, a = ready.popleft()
                    w.threadIdx, w.thread_id, w.state_idx = q
                    res = gl.switch(a)
                    if res is threads.BARRIER:
                        nxt.append((q, gl))
                    elif res is threads.WARP:
                        lanes = parked.setdefault(q[1] // 32, [])
                        lanes.append((q, gl))
                        if len(lanes) == 32:
                            ready.extend((x, y, None) for x, y in parked.pop(q[1] // 32))
                    elif res is not threads.FINISHED:
                        raise RuntimeError(f"a simulated thread switched back with {res!r}")
                if self.error is not None:   # abort: unwind every thread suspended in the kernel
                    later = inside[i + 1:] if arg is None else []     # (phase 0: not started yet)
                    self._unwind([*((q, gl) for q, gl, _ in ready), *nxt, *later,
                                  *(pg for lanes in parked.values() for pg in lanes)])
                    return
            if parked:
                warp = next(iter(parked))
                self.error = (RuntimeError(f"ctaid={list(self.block_idx)} warp {warp}: a warp-collective "
                                           f"intrinsic reached by {len(parked[warp])} of 32 lanes"), None)
                self._unwind([*nxt, *(pg for lanes in parked.values() for pg in lanes)])
                return
            inside = nxt
            arg = None

    def _unwind(self, suspended) -> None:
        for _, g in suspended:
            g.throw(threads.Unwind)

    # ---- called from the block's threads -----------------------------------------------------
    def _release(self) -> None:
        self.arrived = 0
        self.generation += 1
        self.cond.notify_all()

    def sync(self) -> None:
        if self.scheduler is not None:       # greenlet mode: back to the phase loop
            self.scheduler.switch(threads.BARRIER)
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

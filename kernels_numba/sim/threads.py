"""The simulated CUDA threads of the executor: pooled OS threads (thread mode) and reusable greenlets
on one OS thread (greenlet mode, when the ``greenlet`` package is installed).

A block object (``executor.PooledBlock``) hands its work to these and provides ``fn``, ``args``,
``sync``, ``vote``, ``leave``, ``fail``, ``done``, ``scheduler`` and ``run_green``. A greenlet-mode
thread also answers ``warp_sync`` (the warp collectives of kernels_numba.intrinsics wait through it).
"""

from __future__ import annotations

import sys
import threading

import numpy as np

try:
    import greenlet
except ImportError:                          # optional: thread mode is the fallback
    greenlet = None

_lock = threading.Lock()
_pool: list = []                             # _Worker threads, reused across blocks and launches
_green: list = []                            # the one _GreenWorker, created on first use
FINISHED = object()                          # what a greenlet switches back with when its thread returned
BARRIER = object()                           # ... when it reached a barrier
WARP = object()                              # ... and when it reached a warp collective


def green_available() -> bool:
    """True when blocks can run as greenlets (the ``greenlet`` package is installed)."""
    return greenlet is not None


class Unwind(BaseException):
    """Thrown into the greenlets of a block that failed, to unwind them."""


class SimThread(threading.Thread):
    """What the simulator's kernel API reads from ``threading.current_thread()``: threadIdx, blockIdx,
    thread_id and the syncthreads* methods; kernels_numba's warp intrinsics read ``_manager`` (the
    block, with ``_block_dim``)."""

    def __init__(self, name: str) -> None:
        super().__init__(name=name, daemon=True)
        self.gate = threading.Lock()
        self.gate.acquire()                  # released once per block this worker runs
        self._manager = None
        self.threadIdx = self.blockIdx = None
        self.thread_id = 0
        self.state_idx: tuple[int, ...] = ()

    def syncthreads(self) -> None:
        self._manager.sync()

    def syncthreads_count(self, value) -> int:
        return self._manager.vote(self.state_idx, value, lambda s: int(np.count_nonzero(s)))

    def syncthreads_and(self, value) -> int:
        return self._manager.vote(self.state_idx, value, lambda s: 1 if np.all(s) else 0)

    def syncthreads_or(self, value) -> int:
        return self._manager.vote(self.state_idx, value, lambda s: 1 if np.any(s) else 0)


class Worker(SimThread):
    """Thread mode: one pooled OS thread per CUDA thread of the block."""

    def run(self) -> None:
        while True:
            self.gate.acquire()
            blk = self._manager
            try:
                blk.fn(*blk.args)
            except BaseException as e:       # handed to the launching thread
                blk.fail(self, e, sys.exc_info()[2])
            finally:
                blk.leave()


def _slot_run(blk) -> None:
    """A reusable greenlet: runs one CUDA thread of ``blk``, then waits for the next block."""
    while True:
        try:
            blk.fn(*blk.args)
        except Unwind:
            pass
        except BaseException as e:           # handed to the launching thread
            blk.fail(threading.current_thread(), e, sys.exc_info()[2])
        blk = blk.scheduler.switch(FINISHED)


class GreenWorker(SimThread):
    """Greenlet mode: one OS thread runs a whole block, one reusable greenlet per CUDA thread."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self._slots: list = []

    def warp_sync(self) -> None:
        """Called by kernels_numba.intrinsics' warp collectives: wait for the warp's 32 lanes."""
        self._manager.scheduler.switch(WARP)

    def slots(self, n: int) -> list:
        while len(self._slots) < n:          # created on this thread: their parent is its greenlet
            self._slots.append(greenlet.greenlet(_slot_run))
        return self._slots[:n]

    def run(self) -> None:
        while True:
            self.gate.acquire()
            blk = self._manager
            try:
                blk.run_green(self)
            except BaseException as e:       # a failure of the scheduler itself
                blk.fail(self, e, sys.exc_info()[2])
            finally:
                blk.done.release()


def thread_workers(n: int) -> list[Worker]:
    """n pooled thread-mode workers (started on first need, then reused)."""
    with _lock:
        while len(_pool) < n:
            w = Worker(f"cudasim-pool-{len(_pool)}")
            w.start()
            _pool.append(w)
        return _pool[:n]


def green_worker() -> GreenWorker:
    """The greenlet-mode worker (started on first need, then reused)."""
    with _lock:
        if not _green:
            w = GreenWorker("cudasim-green")
            w.start()
            _green.append(w)
        return _green[0]

"""The simulated CUDA threads of the executor: pooled OS threads (thread mode) and reusable greenlets
on the launching thread (greenlet mode, when the ``greenlet`` package is installed).

A block object (``executor.PooledBlock``) hands its work to these and provides ``fn``, ``args``,
``block_idx``, ``sync``, ``vote``, ``leave``, ``fail``, ``done`` and ``scheduler``. In greenlet mode
the current thread also answers ``warp_sync`` (the warp collectives of kernels_numba.intrinsics wait
through it).
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Iterator

import numpy as np

try:
    import greenlet
except ImportError:                          # optional: thread mode is the fallback
    greenlet = None

_lock = threading.Lock()
_pool: list = []                             # Worker threads, reused across blocks and launches
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


_ATTRS = ("_manager", "blockIdx", "threadIdx", "thread_id", "state_idx", "slots", "syncthreads",
          "syncthreads_count", "syncthreads_and", "syncthreads_or", "warp_sync")
_slots: dict = {}                            # launching thread id -> its reusable greenlets


@contextlib.contextmanager
def inline(blk) -> Iterator[threading.Thread]:
    """Greenlet mode: the launching thread runs the block, one reusable greenlet per CUDA thread (no OS
    thread hand-off per block). While it runs, the launching thread's Thread object carries what the
    simulator's kernel API and kernels_numba's intrinsics read from ``threading.current_thread()``
    (SimThread's attributes and methods, and ``warp_sync``); they are removed afterwards."""
    th = threading.current_thread()
    mine = _slots.setdefault(threading.get_ident(), [])

    def slots(n: int) -> list:
        while len(mine) < n:                 # created on this thread: their parent is its greenlet
            mine.append(greenlet.greenlet(_slot_run))
        return mine[:n]

    attrs = {"_manager": blk, "blockIdx": blk.block_idx, "threadIdx": None, "thread_id": 0, "state_idx": (),
             "slots": slots, "syncthreads": blk.sync,
             "syncthreads_count": lambda v: blk.vote(th.state_idx, v, lambda s: int(np.count_nonzero(s))),
             "syncthreads_and": lambda v: blk.vote(th.state_idx, v, lambda s: 1 if np.all(s) else 0),
             "syncthreads_or": lambda v: blk.vote(th.state_idx, v, lambda s: 1 if np.any(s) else 0),
             "warp_sync": lambda: blk.scheduler.switch(WARP)}    # the warp collectives wait here
    if any(k in th.__dict__ for k in _ATTRS):
        raise RuntimeError("a simulated block launched from inside another block")
    th.__dict__.update(attrs)
    try:
        yield th
    finally:
        for k in _ATTRS:
            th.__dict__.pop(k, None)


def thread_workers(n: int) -> list[Worker]:
    """n pooled thread-mode workers (started on first need, then reused)."""
    with _lock:
        while len(_pool) < n:
            w = Worker(f"cudasim-pool-{len(_pool)}")
            w.start()
            _pool.append(w)
        return _pool[:n]

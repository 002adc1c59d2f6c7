"""Phase timing of the expert-parallel MoE block: CUDA events on a GPU, the host clock on a CPU.

``PhaseTimer.start()`` opens a step; ``mark(name)`` closes the phase that ran since the previous mark;
``times_us()`` (after the step: it synchronises on a GPU) gives {phase: microseconds}. The block calls
``mark`` only when it is given a timer, so results never depend on timing.
"""

from __future__ import annotations

import time

PHASES = ("router", "dispatch", "local_moe", "combine", "shared", "gather")


class PhaseTimer:
    def __init__(self, cuda: bool) -> None:
        self.cuda = cuda
        self._marks: list[tuple[str, object]] = []

    def _stamp(self):
        if not self.cuda:
            return time.perf_counter()
        import torch
        ev = torch.cuda.Event(enable_timing=True)
        ev.record()
        return ev

    def start(self) -> None:
        self._marks = [("", self._stamp())]

    def mark(self, name: str) -> None:
        self._marks.append((name, self._stamp()))

    def times_us(self) -> dict[str, float]:
        """{phase: us} of the last step, plus ``total`` (first stamp to last)."""
        if len(self._marks) < 2:
            return {}
        if self.cuda:
            self._marks[-1][1].synchronize()

        def gap(a, b) -> float:
            return a.elapsed_time(b) * 1e3 if self.cuda else (b - a) * 1e6
        out = {name: gap(self._marks[i][1], stamp) for i, (name, stamp) in enumerate(self._marks[1:])}
        out["total"] = gap(self._marks[0][1], self._marks[-1][1])
        return out

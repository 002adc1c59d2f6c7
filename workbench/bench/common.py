"""Timing and metadata helpers shared by the kernel and engine benchmarks (GPU only, torch + numba).

- ``time_op(fn, ...)``: CUDA-event timing of ``fn`` (which enqueues work on torch's current stream),
  after warm-up, either launched eagerly back to back or captured once in a torch CUDA graph and
  replayed; returns per-call statistics in microseconds.
- ``copy_bandwidth()``: device-to-device copy rate (bytes read + written per second) measured now,
  the ceiling every GB/s figure is compared with.
- ``run_metadata()``: GPU, driver, CUDA, library versions, git SHA, time.
Results are written with ``workbench.results.write_csv`` and ``workbench.fileio.write_json_atomic``.
"""

from __future__ import annotations

import datetime
import os
import platform
import statistics
import subprocess
from collections.abc import Callable
from pathlib import Path


def require_gpu() -> None:
    """Raise UserError (one line, exit 2) unless torch sees a CUDA GPU."""
    from workbench.errors import UserError
    try:
        import torch
    except ImportError as e:
        raise UserError(f"benchmarks need torch with CUDA: {e}") from None
    if not torch.cuda.is_available():
        raise UserError("benchmarks need a CUDA GPU (torch.cuda.is_available() is False)")


def stats(samples_us: list[float]) -> dict[str, float]:
    return {"median_us": statistics.median(samples_us), "min_us": min(samples_us), "max_us": max(samples_us)}


def capture_graph(fn: Callable[[], None]):
    """``fn`` captured in a torch CUDA graph, after one warm-up call on the capture stream."""
    import torch
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()                                         # warm-up on the capture stream
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    with torch.cuda.graph(g):
        fn()
    return g


def time_op(fn: Callable[[], None], *, calls: int = 1, reps: int = 20, warmup: int = 3,
            graph: bool = True) -> dict[str, float]:
    """Median/min/max microseconds per call of ``fn``, where one ``fn()`` makes ``calls`` calls.

    graph=True captures ``fn`` once in a torch CUDA graph (numba kernels must launch on
    ``cuda.external_stream(torch.cuda.current_stream().cuda_stream)``) and times replays, which
    removes Python launch overhead; graph=False times eager back-to-back launches.
    """
    import torch
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    run = fn
    if graph:
        g = capture_graph(fn)
        g.replay()
        torch.cuda.synchronize()
        run = g.replay
    samples = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        run()
        b.record()
        b.synchronize()
        samples.append(a.elapsed_time(b) * 1e3 / calls)
    return stats(samples)


SPIN_GRAPH = 100_000          # GPU cycles (~50 us) to cover the host's submission of one graph replay
SPIN_EAGER = 10_000_000       # ~5 ms: covers the host launching an eager op sequence of a few hundred us


def spin_timed(fn: Callable[[], None], reps: int, *, spin: int = SPIN_GRAPH,
               before: Callable[[int], None] | None = None) -> list[float]:
    """Microseconds of GPU time of each of ``reps`` calls of ``fn`` (a graph replay, or eager work).

    A spin kernel of ``spin`` cycles queued before the start event keeps the GPU busy while the host
    submits ``fn``, so the interval is the GPU's time, not the host's launch latency. ``before(r)``
    runs ahead of the spin of rep r (new inputs, an L2 flush), outside the timed interval.
    """
    import torch
    samples = []
    for r in range(reps):
        if before is not None:
            before(r)
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(spin)
        a.record()
        fn()
        b.record()
        b.synchronize()
        samples.append(a.elapsed_time(b) * 1e3)
    return samples


def _kernel_lines(avg, per: int, top: int) -> tuple[list, list[str]]:
    """The device kernels among torch profiler averages ``avg`` by device time: (all of them, lines of the
    ``top`` with their time and launch count per ``per`` calls)."""
    from torch.autograd import DeviceType
    ev = sorted((e for e in avg if e.device_type != DeviceType.CPU and e.device_time_total > 0),
                key=lambda e: -e.device_time_total)
    return ev, [f"{e.device_time_total / per:9.1f} us x{e.count // per:<4d} {e.key[:100]}" for e in ev[:top]]


def kernel_table(fn: Callable[[], None], reps: int = 5, top: int = 15, ops: int = 0) -> list[str]:
    """Where ``fn``'s device time goes (GPU only): ``fn`` run ``reps`` times eagerly under torch's
    profiler after one warm-up; lines of the total per call and the ``top`` kernels (numba's and
    torch's) by device time per call, with their launch counts; ``ops``: then that many torch ops by
    the device time of the work they launched themselves (a memcpy or a copy kernel named by its op)."""
    import torch
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    avg = prof.key_averages()
    ev, top_lines = _kernel_lines(avg, reps, top)
    total = sum(e.device_time_total for e in ev) / reps
    calls = sum(e.count for e in ev) // reps
    lines = [f"{total:9.1f} us of device time a call in {calls} kernels", *top_lines]
    if ops:
        launched = [e for e in avg if e.device_type == DeviceType.CPU and e.self_device_time_total > 0]
        launched.sort(key=lambda e: -e.self_device_time_total)
        lines.append("torch ops by the device time of the work they launched themselves:")
        lines += [f"{e.self_device_time_total / reps:9.1f} us x{e.count // reps:<4d} {e.key[:100]}"
                  for e in launched[:ops]]
    return lines


def timeline_steps(work: list[tuple[float, float]], split_us: float = 500.0) -> list[dict[str, float]]:
    """Device work (start, end) in us of several steps run apart: per step (a run of work with no idle
    stretch of ``split_us`` or more inside), its launches, its span (first start to last end), the time
    something ran (the union of the intervals: kernels that overlap, by PDL or on a second stream,
    count once) and the idle rest of the span (launch gaps and waits)."""
    steps: list[list[tuple[float, float]]] = []
    reach = -float("inf")
    for s, e in sorted(work):
        if not steps or s - reach >= split_us:
            steps.append([])
            reach = -float("inf")
        steps[-1].append((s, e))
        reach = max(reach, e)
    out = []
    for step in steps:
        busy, cur_s, cur_e = 0.0, *step[0]
        for s, e in step[1:]:
            if s > cur_e:
                busy += cur_e - cur_s
                cur_s, cur_e = s, e
            else:
                cur_e = max(cur_e, e)
        busy += cur_e - cur_s
        span = max(e for _, e in step) - step[0][0]
        out.append({"launches": len(step), "span_us": span, "busy_us": busy, "idle_us": span - busy})
    return out


def graph_profile(fn: Callable[[], None], reps: int = 10, top: int = 15) -> list[str]:
    """``fn`` captured in a CUDA graph and replayed ``reps`` times under torch's profiler (GPU only), a
    millisecond apart: lines of the median step's launches, span, busy and idle time
    (``timeline_steps``), then the ``top`` kernels by device time per step with their counts."""
    import time

    import torch
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile
    g = capture_graph(fn)
    g.replay()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            g.replay()
            torch.cuda.synchronize()
            time.sleep(0.002)                         # steps 2 ms apart: timeline_steps splits them there
    work = [(e.time_range.start, e.time_range.end) for e in prof.events()
            if e.device_type != DeviceType.CPU and e.time_range.end > e.time_range.start]
    steps = timeline_steps(work, split_us=1000.0)
    if not steps:
        return ["no device work was recorded (a profiler that does not see graph replays?)"]
    mid = {k: statistics.median(st[k] for st in steps) for k in steps[0]}
    lines = [f"{len(steps)} steps, the median: {mid['launches']:.0f} launches, span {mid['span_us']:.1f} us, "
             f"busy {mid['busy_us']:.1f} us, idle {mid['idle_us']:.1f} us (gaps and waits)"]
    return lines + _kernel_lines(prof.key_averages(), len(steps), top)[1]


def copy_bandwidth(nbytes: int = 2 << 30, reps: int = 20) -> float:
    """Device-to-device copy of ``nbytes``: (read + written) bytes / median time, in GB/s."""
    import torch
    src = torch.empty(nbytes // 2, dtype=torch.int16, device="cuda").random_()
    dst = torch.empty_like(src)
    st = time_op(lambda: dst.copy_(src), reps=reps, graph=False)
    return 2 * nbytes / (st["median_us"] * 1e-6) / 1e9


def git_sha() -> str:
    sha = os.environ.get("KDTREE_GIT_SHA")
    if sha:
        return sha
    try:
        return subprocess.run(["git", "describe", "--always", "--dirty"], capture_output=True, text=True,
                              timeout=10, cwd=Path(__file__).parent).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def run_metadata(**extra) -> dict:
    import numba
    import numpy
    import torch
    meta = {
        "time_utc": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "git_sha": git_sha(), "python": platform.python_version(), "torch": torch.__version__,
        "torch_cuda": torch.version.cuda, "numba": numba.__version__, "numpy": numpy.__version__,
    }
    try:
        from importlib.metadata import version
        meta["numba_cuda"] = version("numba-cuda")
    except Exception:                                # noqa: BLE001 - metadata is best effort
        meta["numba_cuda"] = "unknown"
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        meta.update(gpu=p.name, sm_count=p.multi_processor_count, capability=f"{p.major}.{p.minor}",
                    memory_gib=round(p.total_memory / 2**30, 1),
                    l2_mib=round(getattr(p, "L2_cache_size", 0) / 2**20, 1))
        try:
            q = subprocess.run(["nvidia-smi", "--query-gpu=driver_version,clocks.max.sm,clocks.max.mem",
                                "--format=csv,noheader"], capture_output=True, text=True, timeout=20)
            meta["nvidia_smi"] = q.stdout.strip()
        except (OSError, subprocess.SubprocessError):
            meta["nvidia_smi"] = "unavailable"
    from kernels_numba import ops
    meta["ops_switches"] = ops.switches()            # the kernel paths this run took
    meta.update(extra)
    return meta

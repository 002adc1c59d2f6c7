"""Where a DDTree round of the trained pair spends its device time (GPU only).

For one bundle: the graph-replayed decode step, verify steps at several budgets and the device
drafter's round, each timed with CUDA events over replays; then each launched eagerly under the
torch profiler, whose kernel records give the device time per kernel name (numba names shortened).
Timing only: the steps run on a warmed state whose values do not matter.

    python dev/profile_pair.py [--bundle models/code.kdtr] [--budgets 4,16,64] [--reps 200]
"""

from __future__ import annotations

import argparse
import re
from collections import defaultdict

import numpy as np


def short(name: str) -> str:
    """A numba kernel's mangled name -> its qualified Python name's last part (``_ZN...7rmsnorm...``)."""
    if "::" in name:                                          # already demangled by the profiler
        return re.split(r"[\[(<]", name.split("::")[-1])[0]
    if not name.startswith("_ZN"):
        return name[:60]
    parts, rest = [], name[3:]
    while (m := re.match(r"\d+", rest)):
        n, d = int(m.group()), len(m.group())
        parts.append(rest[d:d + n])
        rest = rest[d + n:]
    return parts[-1] if parts else name[:60]


def replay_us(fn, reps: int) -> float:
    import torch
    fn()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(reps):
        fn()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) * 1e3 / reps


def kernel_table(fn, calls: int = 5) -> list[tuple[str, int, float]]:
    """(kernel, launches per call, device us per call) of ``fn`` run eagerly ``calls`` times."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    agg: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for e in prof.events():
        if e.device_type.name != "CUDA":
            continue
        k = agg[short(e.name)]
        k[0] += 1
        k[1] += e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total
    rows = [(n, int(c) // calls, t / calls) for n, (c, t) in agg.items()]
    return sorted(rows, key=lambda r: -r[2])


def host_costs(eng, s, replay, reps: int) -> None:
    """Host wall time (median us) of what a round does around its graphs: the control upload, the
    graph launch call alone, launch + wait, and the copy back + wait."""
    import time

    import torch

    def wall(fn, sync=True):
        ts = []
        for _ in range(reps):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            fn()
            if sync:
                eng.sync()
            ts.append(time.perf_counter() - t0)
            torch.cuda.synchronize()
        return float(np.median(ts)) * 1e6

    from kernels_numba.device import Mirror, host_buffer, zeros
    scratch = zeros(eng.buf.ctl.shape, np.int32)             # not the engine's ctl: its tree stays valid
    ctl = np.zeros(eng.buf.ctl.shape, np.int32)
    ctl_h = host_buffer(eng.buf.ctl.shape, np.int32)
    amax_h = host_buffer(eng.buf.amax.shape, np.int32)
    m_ctl, m_amax = Mirror(scratch), Mirror(eng.buf.amax)
    print("host costs (median us): "
          f"numba put ctl pageable {wall(lambda: eng.put(scratch, ctl)):.1f}, "
          f"pinned {wall(lambda: eng.put(scratch, ctl_h)):.1f}, Mirror.push {wall(m_ctl.push):.1f}; "
          f"verify graph launch call {wall(replay, sync=False):.1f}, launch + wait {wall(replay):.1f}; "
          f"numba fetch_into amax {wall(lambda: eng.fetch_into(eng.buf.amax, amax_h)):.1f}, "
          f"Mirror.pull + sync {wall(m_amax.pull):.1f}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bundle", default="models/code.kdtr")
    ap.add_argument("--budgets", default="4,16,64")
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--trace", help="also write a torch-profiler trace (host and device) of one DDTree "
                                    "generation at the first budget to this chrome-trace JSON")
    a = ap.parse_args()
    budgets = [int(x) for x in a.budgets.split(",")]

    from workbench.bench.pair import _pair
    from workbench.engine.ar import engine_for
    from workbench.engine.dflash import DeviceDFlash
    from workbench.generate import generate
    cfg, w, dcfg = _pair(a.bundle)
    prompt = np.arange(2, 66, dtype=np.int32) % cfg.vocab_size
    # room for every decode replay: each one advances the position by one
    eng = engine_for(cfg, w, len(prompt), 64 + a.reps + 16, max(budgets), taps=dcfg.target_layer_ids)
    generate(cfg, w, prompt, 16, backend="numba", engine=eng)
    for bud in budgets:
        generate(cfg, w, prompt, 16, budget=bud, backend="numba", mode="ddtree", drafter="dflash",
                 drafter_config=dcfg, engine=eng)
    if a.trace:
        import torch
        from torch.profiler import ProfilerActivity, profile
        spec = dict(budget=budgets[0], backend="numba", mode="ddtree", drafter="dflash", drafter_config=dcfg,
                    engine=eng)
        generate(cfg, w, prompt, 64, **spec)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            t: dict = {}
            generate(cfg, w, prompt, 64, **spec, timing=t)
            torch.cuda.synchronize()
        prof.export_chrome_trace(a.trace)
        print("trace:", a.trace, {k: round(v * 1e6) for k, v in t.items()}, "us")
    s = eng.stream
    dec = eng.decode_step()
    dd = DeviceDFlash(eng, w, dcfg)
    dd.prepare()
    dd._upload(5, 70, np.arange(dd.cap, dtype=np.int32), dd.cap)
    steps = {"decode": (lambda: dec.run(s), lambda: dec.fn(s))}
    for bud in budgets:
        v = eng.verify_step(bud)
        steps[f"verify B={bud}"] = (lambda v=v: v.run(s), lambda v=v: v.fn(s))
    steps["drafter round"] = (lambda: dd.graph.run(s), lambda: dd._launch(s, dd.cap))
    from kernels_numba import ops
    from kernels_numba.device import zeros
    lpk = zeros((2, dcfg.block_size - 1, budgets[0]), np.float64)
    topk = lambda: ops.topk_logprobs(lpk, dd.logits, 0, budgets[0], dcfg.block_size - 1, s)  # noqa: E731
    steps[f"draft top-k K={budgets[0]}"] = (topk, topk)
    host_costs(eng, s, steps[f"verify B={budgets[0]}"][0], a.reps)
    print(f"bundle {a.bundle}: D {cfg.hidden_size}, layers {cfg.num_hidden_layers}, "
          f"experts {cfg.n_routed_experts} top-{cfg.num_experts_per_tok}, vocab {cfg.vocab_size}")
    for name, (graph, eager) in steps.items():
        eng.set_meta(len(prompt), 1)       # decode advances the position: back to the prompt's end
        us = replay_us(graph, a.reps)
        eng.set_meta(len(prompt), 1)
        tab = kernel_table(eager)
        total = sum(t for _, _, t in tab)
        launches = sum(c for _, c, _ in tab)
        print(f"\n== {name}: graph replay {us:.1f} us; eager: {launches} launches, "
              f"{total:.1f} us of kernel time")
        for n, c, t in tab:
            print(f"  {n:32s} x{c:<3d} {t:8.1f} us")


if __name__ == "__main__":
    main()

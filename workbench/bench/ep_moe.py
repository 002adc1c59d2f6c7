"""``bench ep``: one k2_slice MoE layer expert-parallel over P = 1, 2, 4, 8 GPUs (NCCL), checked and timed.

Legend: P ranks, T rows of a step (1 decode, N + 1 for a verify of an N-node tree), E = 384 experts,
El = E / P per rank, K = 8, Kl = min(K, El) slots a row carries, D = 7168.

Each P is one ``launch.run_ranks`` job (``NCCL_NVLS_ENABLE=0``). Every rank builds the seeded layer's
router and shared expert (bf16 widened to FP32, as ``bench k2``) and its El INT4 experts (G = 32)
repacked for fused_moe, then ``parallel.ep_moe.EPMoE``. Rank 0 also builds the layer with all E
experts on one GPU (``ops.moe``: router, fused_moe, shared expert): the local baseline. Per T:

- check: the EP output h - h0 of one input against the local baseline's, each row's relative error
  within TOL, before anything is timed;
- time: ``reps`` eager steps (the counts exchange makes the host wait, so no graph), inputs rotated over
  SETS random sets, the L2 flushed and the ranks at a barrier before each; each phase (router,
  dispatch, local MoE, combine, shared expert, all-gather) timed by CUDA events, per step the slowest
  rank's time, median over steps;
- floors, per step (slowest rank), median: ``floor_moe_us`` = the distinct local experts a rank ran x
  the INT4 expert's bytes at the copy rate measured at the start (as ``bench k2``); beside it, timed in
  the same step after a barrier, ``all_to_all_single`` of the step's own split sizes: the counts, the
  dispatched rows, the combined rows, and the all-gather; ``floor_us`` = their sum.
P = 1 runs the same block (its exchanges are copies to itself) and the local baseline (``impl`` local).
Before the NCCL runs, ``ep_in_turn`` runs the split at each P of ``in_turn`` rank after rank on one GPU
(``impl`` ranks in turn: each rank's local MoE, checked and timed; no communication). Writes the result
set ``ep_moe_<commit>`` (CSV, JSON metadata, plot, log). ``plan`` (``--dry-run``) prints the per-row
byte counts per P without a GPU.
"""

from __future__ import annotations

import math
import os
import statistics
import time
from functools import partial
from pathlib import Path

import numpy as np

from .ep_layer import WARMUP, row_errors, whole_layer

ROWS = (1, 2, 3, 5, 9, 17, 33, 65)   # decode, then trees of 1, 2, 4, ..., 64 nodes + root
WORLDS = (1, 2, 4, 8)
SETS = 8                             # random input sets rotated over the timed steps
TOL = 2e-3                           # relative error of each row's update against the local baseline


def ranks_touched(e: int, el: int, k: int) -> float:
    """Expected ranks a row's K distinct experts (uniform) fall on: P (1 - C(E - El, K) / C(E, K))."""
    return (e // el) * (1.0 - math.comb(e - el, k) / math.comb(e, k))


def plan(cfg, worlds=WORLDS, rows=ROWS) -> list[dict]:
    """Per (P, T): the split and the bytes each exchange moves (uniform routing), no GPU needed."""
    from ..parallel.experts import ExpertSplit
    from .k2_build import layer_bytes
    from .k2_layer import union_model
    e, k, d = cfg.n_routed_experts, cfg.num_experts_per_tok, cfg.hidden_size
    expert = layer_bytes(cfg, 1)["expert_int4"]
    out = []
    for p in worlds:
        sp = ExpertSplit(e, p)
        kl = min(k, sp.per_rank)
        row = 2 * d + 8 * kl
        dest = ranks_touched(e, sp.per_rank, k)
        for t in rows:
            distinct = union_model(e, k, t) * sp.per_rank / e             # this rank's share
            out.append({"world": p, "rows": t, "experts_per_rank": sp.per_rank, "slots": kl, "row_bytes": row,
                        "ranks_per_row": round(dest, 2), "dispatch_bytes": round(t * dest * row),
                        "combine_bytes": round(t * dest * 4 * d),
                        "gather_bytes": p * sp.rows_per_rank(t) * 4 * d,
                        "distinct_local_experts": round(distinct, 1),
                        "local_expert_bytes": round(distinct * expert)})
    return out


# ---- one rank (a child of run_ranks) --------------------------------------------------------------
def rank_main(rank: int, world: int, seed: int, layer: int, rows: list, reps: int, copy_gbs: float,
              workers: int) -> dict:
    import torch
    import torch.distributed as dist

    from kernels_numba import ops
    from kernels_numba.device import default_stream

    from ..config import preset
    from ..engine.build import SeededSource, int4_experts
    from ..parallel.ep_moe import EPMoE, ep_weights, kview
    from ..parallel.experts import ExpertSplit
    from ..parallel.phases import PhaseTimer
    from .k2_build import layer_bytes

    cfg = preset("k2_slice")
    t0 = time.perf_counter()
    logs: list[str] = []

    def log(msg: str) -> None:
        logs.append(f"[P={world} rank {rank} {time.perf_counter() - t0:6.1f} s] {msg}")

    sp = ExpertSplit(cfg.n_routed_experts, world)
    src, f = SeededSource(cfg, seed, workers=workers), f"layers.{layer}.ffn"
    local = int4_experts(cfg, seed, layer, workers, experts=sp.experts(rank)).to_device()
    block = EPMoE(ep_weights(sp, rank, src.router(f), local, src.shared(f)), max(rows), "cuda")
    log(f"experts {sp.experts(rank).start}..{sp.experts(rank).stop - 1} built")
    base = whole_layer(src, layer, max(rows), local if world == 1 else None) if rank == 0 else None
    if base is not None:
        log("local baseline (all experts) built")
    d, el = cfg.hidden_size, sp.per_rank
    expert_bytes = layer_bytes(cfg, layer)["expert_int4"]
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    meta = torch.zeros(8, dtype=torch.int32, device="cuda")
    res: dict = {"checks": [], "samples": {}, "local": {}}
    for t in rows:
        g = torch.Generator().manual_seed(seed * 1000 + t)          # the same inputs on every rank
        xs = [torch.randn(t, d, generator=g).cuda() for _ in range(SETS)]
        h0 = torch.randn(t, d, generator=g).cuda()
        h, x = h0.clone(), torch.empty_like(h0)
        x.copy_(xs[0])
        block(h, x)
        y_ep = (h - h0).cpu().numpy()
        if base is not None:
            m, sc = base
            sc.reserve(t)
            hb = h0.clone()
            meta[1] = t
            ops.moe(kview(hb), kview(x), m, sc, kview(meta), t, default_stream())
            want = (hb - h0).cpu().numpy().astype(np.float64)
            err = row_errors(y_ep, want)
            res["checks"].append({"impl": "expert parallel", "world": world, "rows": t,
                                  "max_rel_err": float(err.max()), "tol": TOL,
                                  "passed": bool(err.max() <= TOL)})
            log(f"T={t}: EP vs local max rel err {err.max():.2e} (tol {TOL:g})")
            if world == 1:                                          # time the local baseline too
                samples = []
                for r in range(WARMUP + reps):
                    x.copy_(xs[r % SETS])
                    hb.copy_(h0)
                    flush.zero_()
                    us = _event_us(partial(ops.moe, kview(hb), kview(x), m, sc, kview(meta), t,
                                           default_stream()))
                    if r >= WARMUP:
                        samples.append(us)
                res["local"][t] = samples
        steps = []
        timer = PhaseTimer(cuda=True)
        for r in range(WARMUP + reps):
            x.copy_(xs[r % SETS])
            h.copy_(h0)
            flush.zero_()
            dist.barrier()
            torch.cuda.synchronize()
            timer.start()
            block(h, x, timer)
            ph = timer.times_us()
            last = block.last
            ids = last.local_ids.cpu().numpy()
            ph["distinct_local_experts"] = float(len(np.unique(ids[ids < el])))
            ph["floor_moe_us"] = ph["distinct_local_experts"] * expert_bytes / (copy_gbs * 1e3)
            ph.update(_comm_times(last, d, world, t))
            if r >= WARMUP:
                steps.append(ph)
        res["samples"][t] = steps
        log(f"T={t}: timed {reps} steps, median total {statistics.median(s['total'] for s in steps):.1f} us")
    res["logs"] = logs
    every = [None] * world
    dist.all_gather_object(every, res)
    return every if rank == 0 else {"logs": logs}


def _event_us(fn) -> float:
    """fn's GPU time in us between CUDA events, from an idle device."""
    import torch
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    fn()
    b.record()
    b.synchronize()
    return a.elapsed_time(b) * 1e3


def _comm_times(last, d: int, world: int, t: int) -> dict:
    """all_to_all_single of the step's own split sizes (counts, rows, partial sums) and the all-gather,
    each after a barrier, in us."""
    import torch
    import torch.distributed as dist

    from ..parallel.ep_moe import _all_gather

    def timed(fn) -> float:
        dist.barrier()
        return _event_us(fn)

    sent, got, rb = last.sent, last.got, last.row_bytes
    cnt = torch.zeros(world, dtype=torch.int64, device="cuda")
    rows_out = torch.empty(sum(sent), rb, dtype=torch.uint8, device="cuda")
    rows_in = torch.empty(sum(got), rb, dtype=torch.uint8, device="cuda")
    y_in = torch.empty(sum(got), d, dtype=torch.float32, device="cuda")
    y_out = torch.empty(sum(sent), d, dtype=torch.float32, device="cuda")
    tp = -(-t // world)
    pad, full = torch.zeros(tp, d, device="cuda"), torch.empty(world * tp, d, device="cuda")
    return {
        "a2a_counts_us": timed(lambda: dist.all_to_all_single(torch.empty_like(cnt), cnt)),
        "a2a_dispatch_us": timed(lambda: dist.all_to_all_single(rows_in, rows_out, got, sent)),
        "a2a_combine_us": timed(lambda: dist.all_to_all_single(y_out, y_in, sent, got)),
        "allgather_us": timed(lambda: _all_gather(full, pad, None)),
    }


# ---- the whole run (parent) -----------------------------------------------------------------------
PHASE_COLS = ("router", "dispatch", "local_moe", "combine", "shared", "gather", "total")
FLOOR_COLS = ("floor_moe_us", "a2a_counts_us", "a2a_dispatch_us", "a2a_combine_us", "allgather_us")


def summarise(world: int, t: int, per_rank: list[dict], local: list | None) -> list[dict]:
    """CSV rows of one (P, T): per phase and the floors, the slowest rank per step, median over steps."""
    steps = list(zip(*(r["samples"][t] for r in per_rank), strict=True))      # [step][rank]
    slow = {c: [max(s[c] for s in step) for step in steps] for c in (*PHASE_COLS, *FLOOR_COLS,
                                                                       "distinct_local_experts")}
    med = {c: statistics.median(v) for c, v in slow.items()}
    floor = sum(med[c] for c in FLOOR_COLS)
    out = [{"world": world, "rows": t, "tree_nodes": t - 1, "impl": "expert parallel", "phase": c,
            "us": round(med[c], 2), "min_us": round(min(slow[c]), 2), "max_us": round(max(slow[c]), 2)}
           for c in PHASE_COLS]
    out[-1].update({c: round(med[c], 2) for c in FLOOR_COLS})
    out[-1].update(distinct_local_experts=med["distinct_local_experts"], floor_us=round(floor, 2),
                   pct_floor=round(100 * floor / med["total"], 1))
    if local:
        out.append({"world": 1, "rows": t, "tree_nodes": t - 1, "impl": "local", "phase": "total",
                    "us": round(statistics.median(local), 2), "min_us": round(min(local), 2),
                    "max_us": round(max(local), 2)})
    return out


def run(out_dir, worlds=None, rows=ROWS, reps: int = 20, seed: int = 0, layer: int = 1,
        timeout_s: float = 540.0, in_turn=WORLDS, progress=None):
    """Check and time the layer's split at each P of ``in_turn`` rank after rank on one GPU
    (``ep_in_turn``), then the EP layer at each P of ``worlds`` (as many GPUs as there are); writes
    ``ep_moe_<commit>``, whose metadata's ``failed`` lists what did not run or did not pass. progress:
    ``progress(done, total, what)`` before each part (ranks in turn, then each P)."""
    import torch

    from ..config import preset
    from ..fileio import write_json_atomic
    from ..parallel.launch import run_ranks
    from ..results import result_set, write_csv
    from .common import copy_bandwidth, run_metadata
    from .ep_in_turn import run_in_turn

    n_gpu = torch.cuda.device_count()
    worlds = [p for p in (worlds or WORLDS) if p <= n_gpu]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    meta = run_metadata(bench="ep_moe", model="k2_slice", layer=layer, reps=reps, rows=list(rows),
                        worlds=worlds, in_turn=list(in_turn), gpus=n_gpu,
                        nccl=".".join(map(str, torch.cuda.nccl.version())), nccl_nvls_enable="0", tol=TOL)
    rs = result_set(out, "ep_moe", meta["git_sha"])
    t0 = time.perf_counter()
    table, checks, failed = [], [], []
    step = progress or (lambda done, total, what: None)
    parts = int(bool(in_turn)) + len(worlds)

    def log(msg) -> None:
        print(f"[{time.perf_counter() - t0:7.1f} s] {msg}", flush=True)

    def save() -> None:
        write_csv(table, rs.csv)
        write_json_atomic(rs.meta, {**meta, "checks": checks, "failed": failed,
                                    "elapsed_s": round(time.perf_counter() - t0, 1)})

    meta["copy_gbs"] = round(copy_bandwidth(), 1)
    torch.cuda.empty_cache()
    log(f"copy rate {meta['copy_gbs']} GB/s; {n_gpu} GPUs; worlds {worlds}; ranks in turn {list(in_turn)}")
    if in_turn:
        step(0, parts, f"ranks in turn, P in {list(in_turn)}")
        try:
            part, part_checks = run_in_turn(preset("k2_slice"), seed, layer, in_turn, rows, reps,
                                            meta["copy_gbs"], max(1, (os.cpu_count() or 2) - 1), SETS, TOL,
                                            log)
        except Exception as ex:  # noqa: BLE001 - the NCCL part still runs
            log(f"ranks in turn: FAILED {type(ex).__name__}: {ex}")
            part, part_checks = [], []
            failed.append(f"ranks in turn: {type(ex).__name__}: {str(ex).splitlines()[0]}")
        table += part
        checks += part_checks
        failed += [c.get("check") or f"ranks in turn P={c['world']} T={c['rows']}: check"
                   for c in part_checks if not c["passed"]]
        save()
        torch.cuda.empty_cache()
    for i, p in enumerate(worlds):
        step(parts - len(worlds) + i, parts, f"expert parallel P={p}")
        workers = max(1, (os.cpu_count() or 2) // p - 1)
        try:
            per = run_ranks("workbench.bench.ep_moe:rank_main", p,
                            (seed, layer, list(rows), reps, meta["copy_gbs"], workers),
                            backend="nccl", timeout_s=timeout_s)
        except Exception as ex:  # noqa: BLE001 - keep the other world sizes
            log(f"P={p}: FAILED {type(ex).__name__}: {ex}")
            failed.append(f"expert parallel P={p}: {type(ex).__name__}: {str(ex).splitlines()[0]}")
            continue
        every = per[0]
        for r in every:
            for line in r["logs"]:
                print(line)
        checks += every[0]["checks"]
        if not all(c["passed"] for c in every[0]["checks"]):
            log(f"P={p}: check FAILED, its times are left out")
            failed.append(f"expert parallel P={p}: check")
            continue
        for t in rows:
            table += summarise(p, t, every, every[0]["local"].get(t))
        save()
    step(parts, parts, "done")
    try:
        plot(table, rs.plot)
    except Exception as ex:  # noqa: BLE001
        log(f"plot FAILED {type(ex).__name__}: {ex}")
    save()
    log(f"checks: {sum(c['passed'] for c in checks)}/{len(checks)} passed; wrote {rs.csv}, {rs.meta}"
        + (f"; FAILED: {'; '.join(failed)}" if failed else ""))
    return rs


def plot(table: list[dict], path: Path) -> None:
    """Layer time and floor vs rows per P; the phases of the decode step per P; the busiest rank's local
    MoE vs rows per P, ranks in turn on one GPU."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ..fileio import save_figure_atomic
    fig, (a, b, c) = plt.subplots(1, 3, figsize=(17, 4.5))
    turn = [r for r in table if r["impl"] == "ranks in turn"]
    for p in sorted({r["world"] for r in turn}):
        sel = [r for r in turn if r["world"] == p]
        line, = c.plot([r["rows"] for r in sel], [r["us"] for r in sel], "o-", label=f"P={p} busiest rank")
        c.plot([r["rows"] for r in sel], [r["floor_moe_us"] for r in sel], ":", color=line.get_color(),
               label=f"P={p} floor")
    c.set(xscale="log", yscale="log", xlabel="rows (tree nodes + root)", ylabel="us",
          title="local MoE, ranks in turn on one GPU (no communication)")
    c.legend(fontsize=6)
    for p in sorted({r["world"] for r in table if r["impl"] == "expert parallel"}):
        sel = [r for r in table
               if r["world"] == p and r["phase"] == "total" and r["impl"] == "expert parallel"]
        a.plot([r["rows"] for r in sel], [r["us"] for r in sel], "o-", label=f"EP P={p}")
        a.plot([r["rows"] for r in sel], [r["floor_us"] for r in sel], ":", label=f"floor P={p}")
    loc = [r for r in table if r["impl"] == "local"]
    if loc:
        a.plot([r["rows"] for r in loc], [r["us"] for r in loc], "k--", label="local (one GPU)")
    a.set(xscale="log", yscale="log", xlabel="rows (tree nodes + root)", ylabel="us",
          title="k2_slice MoE layer")
    a.legend(fontsize=6)
    worlds = sorted({r["world"] for r in table if r["impl"] == "expert parallel"})
    bottom = np.zeros(len(worlds))
    for ph in PHASE_COLS[:-1]:
        v = np.array([next((r["us"] for r in table if r["world"] == p and r["rows"] == 1 and r["phase"] == ph
                            and r["impl"] == "expert parallel"), 0.0) for p in worlds])
        b.bar([str(p) for p in worlds], v, bottom=bottom, label=ph)
        bottom += v
    b.set(xlabel="P", ylabel="us (slowest rank per phase)", title="decode step (T = 1) by phase")
    b.legend(fontsize=6)
    fig.tight_layout()
    save_figure_atomic(fig, path)
    plt.close(fig)

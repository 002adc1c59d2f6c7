"""``bench ep``'s one-GPU part: the k2_slice MoE layer's expert split at P = 1, 2, 4, 8, each rank's share
run in turn on this GPU (``parallel.in_turn``), checked and timed.

Legend: as ``ep_moe``; R_q rows rank q receives, U_q its distinct local experts.

What each GPU of P would run in its local phase, measured here one rank after another: the seeded
layer's router and all E INT4 experts (G = 32) are built once; per T, SETS random inputs are routed
by the layer's router (``ops.route``), and per P every rank's share is made (``in_turn.shares``).
- check: first the whole block on one GPU (router, experts, shared expert, as the builder makes it)
  against the reference's block (``engine.scenarios.check_moe_block``); then per T, on the first set,
  the shares run and combined in rank order equal the routed experts of that block (``ops.moe``
  without the shared expert), each row within TOL;
- time: per step (inputs rotated over the sets) each rank's fused_moe alone, captured in a CUDA graph
  as the engine runs it (``engine.graphs.StepGraph``, as ``bench k2`` times its parts), the L2 flushed
  before it and a spin kernel ahead of it (``common.spin_timed``); per step the busiest rank's time
  (what the layer would wait for), the mean over ranks, and the sum (the whole layer's expert work
  done in P pieces); median over steps;
- floor: the most distinct local experts a rank ran x the INT4 expert's bytes at the copy rate.
No bytes move between GPUs here: dispatch and combine are not in these times (``impl`` "ranks in turn").
"""

from __future__ import annotations

import statistics
from functools import partial

import numpy as np


def run_in_turn(cfg, seed: int, layer: int, worlds, rows, reps: int, copy_gbs: float, workers: int,
                sets: int, tol: float, log=print) -> tuple[list[dict], list[dict]]:
    """(CSV rows, checks) of every P in ``worlds`` and T in ``rows`` (module docstring)."""
    import torch

    from kernels_numba import ops
    from kernels_numba.device import default_stream

    from ..engine.build import SeededSource
    from ..engine.graphs import StepGraph
    from ..engine.scenarios import check_moe_block
    from ..parallel.ep_moe import kview
    from ..parallel.experts import ExpertSplit
    from ..parallel.in_turn import combine, run, shares
    from .common import spin_timed
    from .ep_layer import WARMUP, row_errors, whole_layer
    from .k2_build import layer_bytes

    d, k = cfg.hidden_size, cfg.num_experts_per_tok
    block, sc = whole_layer(SeededSource(cfg, seed, workers=workers), layer, max(rows))
    full = block.fused
    log(f"ranks in turn: layer {layer}'s {full.n_routed} INT4 experts built")
    checks = [check_moe_block(cfg, seed, layer, block, sc, log=log)]     # the whole block, then its shares
    whole = ops.moe_fused(block.router, full)                             # the routed experts alone
    expert_bytes = layer_bytes(cfg, layer)["expert_int4"]
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    meta = torch.zeros(8, dtype=torch.int32, device="cuda")
    s = default_stream()
    table = []
    for t in rows:
        g = torch.Generator().manual_seed(seed * 1000 + t + 7)
        xs = [torch.randn(t, d, generator=g).cuda() for _ in range(sets)]
        routes = []
        meta[1] = t
        sc.reserve(t)
        for x in xs:
            ids = torch.empty(t, k, dtype=torch.int32, device="cuda")
            wts = torch.empty(t, k, dtype=torch.float32, device="cuda")
            ops.route(kview(ids), kview(wts), kview(x), whole.router, sc, kview(meta), t, s)
            routes.append((ids, wts))
        want = torch.zeros(t, d, device="cuda")
        ops.moe(kview(want), kview(xs[0]), whole, sc, kview(meta), t, s)
        want = want.cpu().numpy().astype(np.float64)
        for p in worlds:
            split = ExpertSplit(cfg.n_routed_experts, p)
            per_set = [shares(x, ids, wts, full, split) for x, (ids, wts) in zip(xs, routes, strict=True)]
            for sh in per_set[0]:
                run(sh, s)
            got = combine(per_set[0], t).cpu().numpy()
            err = row_errors(got, want)
            ok = bool(err.max() <= tol)
            checks.append({"impl": "ranks in turn", "world": p, "rows": t, "max_rel_err": float(err.max()),
                           "tol": tol, "passed": ok})
            if not ok:
                log(f"ranks in turn P={p} T={t}: check FAILED (max rel err {err.max():.2e}), not timed")
                continue
            graphs = [[StepGraph(lambda st, sh=sh: run(sh, st), True) if len(sh.rows) else None
                       for sh in parts] for parts in per_set]          # a rank that receives no row: 0 us
            most = [(max(sh.distinct for sh in parts), max(len(sh.rows) for sh in parts))
                    for parts in per_set]
            steps = []
            for r in range(WARMUP + reps):
                us = [spin_timed(partial(g.run, None), 1, before=lambda _r: flush.zero_())[0] if g else 0.0
                      for g in graphs[r % sets]]
                if r >= WARMUP:
                    u, n = most[r % sets]
                    steps.append({"busiest": max(us), "mean": statistics.fmean(us), "sum": sum(us),
                                  "distinct": u, "received": n})
            table.append(_row(p, t, steps, expert_bytes, copy_gbs))
            log(f"ranks in turn P={p} T={t}: max rel err {err.max():.2e}; busiest rank "
                f"{table[-1]['us']:.1f} us, {table[-1]['distinct_local_experts']:g} experts")
            del per_set, graphs
    return table, checks


def _row(p: int, t: int, steps: list[dict], expert_bytes: float, copy_gbs: float) -> dict:
    """One CSV row: the busiest rank's local MoE per step, median over steps, and its floor."""
    med = {c: statistics.median(st[c] for st in steps) for c in steps[0]}
    busiest = [st["busiest"] for st in steps]
    floor = med["distinct"] * expert_bytes / (copy_gbs * 1e3)
    return {"world": p, "rows": t, "tree_nodes": t - 1, "impl": "ranks in turn", "phase": "local_moe",
            "us": round(med["busiest"], 2), "min_us": round(min(busiest), 2),
            "max_us": round(max(busiest), 2),
            "mean_rank_us": round(med["mean"], 2), "sum_ranks_us": round(med["sum"], 2),
            "distinct_local_experts": med["distinct"], "rows_received": med["received"],
            "floor_moe_us": round(floor, 2), "pct_floor": round(100 * floor / med["busiest"], 1)}

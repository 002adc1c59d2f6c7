"""Fused-MoE part of ``bench kernels`` (K2 shape: D 7168, I 2048, 384 experts + 1 shared, top-8, G 32)."""

from __future__ import annotations

import functools
import time

import numpy as np

from .common import capture_graph, spin_timed, stats

D, I, E, S, K, G = 7168, 2048, 384, 1, 8, 32
EXPERT_BYTES = 3 * D * I // 2 + 3 * D * (I // G) * 2          # 24.77 MB: packed nibbles + f16 scales


def k2_random_experts(torch, e=E, s=S, d=D, i=I, g=G):
    """Random repacked K2-shape experts on the GPU (random words are random nibbles)."""
    from numba import cuda

    from kernels_numba.ops import Int4Weight, MoEWeights
    x = e + s

    def words(n):
        t = torch.randint(-2**31, 2**31 - 1, (n,), dtype=torch.int32, device="cuda")
        return cuda.as_cuda_array(t).view(np.uint32)

    def scales(n):
        h = (torch.rand(2 * n, device="cuda") * 0.004 + 0.001).half()
        return cuda.as_cuda_array(h.view(torch.int32)).view(np.uint32)
    n16 = i // 16
    w13 = Int4Weight(words(x * n16 * 2 * d * 2), scales(x * n16 * 2 * (d // g) * 8), i, d, g, x, True)
    w2 = Int4Weight(words(x * (d // 16) * i * 2), scales(x * (d // 16) * (i // g) * 8), d, i, g, x)
    return MoEWeights(w13, w2, e, s)


def routings(torch, t, sets, seed):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    return [torch.stack([torch.randperm(E, device="cuda", generator=gen)[:K] for _ in range(t)]).int()
            for _ in range(sets)]


def graph_of(torch, fn):
    fn()
    torch.cuda.synchronize()
    return capture_graph(fn)


def timed_replays(torch, g, ids, id_sets, reps, n_shared=S):
    """Replay ``g`` reps times, rotating the routing sets into ``ids``: (us per replay, experts read).

    A ~50 us spin kernel queued before the start event keeps the GPU busy while the host submits the
    graph, so the interval is the graph's GPU time, not the host's launch latency."""
    samples = spin_timed(g.replay, reps, before=lambda r: ids.copy_(id_sets[r % len(id_sets)]))
    uniq = [len(torch.unique(id_sets[r % len(id_sets)])) + n_shared for r in range(reps)]
    return samples, uniq


def _on_current_stream(torch, launch):
    from numba import cuda
    launch(cuda.external_stream(torch.cuda.current_stream().cuda_stream))


def bench_moe(torch, copy, rows, log):
    from kernels_numba import ops
    from kernels_numba.ops import TILE_ROWS, choose_moe_config, moe_stages, moe_workspace, stream_k_config

    mw = k2_random_experts(torch)
    tg = per_expert_tinygemm(torch)
    for t in TOKENS:
        id_sets = routings(torch, t, 8, seed=t)
        ids = id_sets[0].clone()
        x = torch.randn(t, D, device="cuda").half()
        tw = torch.rand(t, K, device="cuda")
        out = torch.empty(t, D, device="cuda")
        base, gemv = choose_moe_config(D, I, t), choose_moe_config(D, I, 1)
        tiled = {**gemv, "tiled": True, "rows": TILE_ROWS}
        p = t * (K + S)                              # pairs: at most min(E + S, p) + p / 8 tiles
        tile_each = {**gemv, "tiled": True, "rows": min(E + S, p) + p // 8}
        ws = moe_workspace(t, K, mw, config=gemv)   # room for every path (a stream-K part buffer too)
        paths = {id(gemv): "GEMV path ", id(tiled): "tiled GEMV path ",
                 id(tile_each): "tiled GEMV path, a grid row per tile "}
        cfgs = [("fused_moe (numba, default)", base)] + [
            (f"fused_moe alt config {paths.get(id(c), 'stream-K ')}{c['gu']}/{c['dn']}", c)
            for c in [stream_k_config(D, I, t), *ALT_CONFIGS, gemv, tiled, tile_each]
            if c != base]
        floor_us = None
        for impl, cfg in cfgs:
            run = functools.partial(ops.experts_fused, x, ids, tw, mw, out, ws, config=cfg)   # the engine's
            g = graph_of(torch, lambda run=run: run(stream=torch.cuda.current_stream()))
            samples, uniq = timed_replays(torch, g, ids, id_sets, 24)
            floor_us = np.median(uniq) * EXPERT_BYTES / (copy * 1e3)
            st = stats(samples)
            nbytes = float(np.median(uniq)) * EXPERT_BYTES
            row = {"case": f"moe T={t}", "impl": impl, "timing": "graph, routing rotated", "T": t,
                   "unique_experts": float(np.median(uniq)), "config": str(cfg),
                   **{k: round(v, 2) for k, v in st.items()}, "bytes": int(nbytes),
                   "gbs": round(nbytes / (st["median_us"] * 1e-6) / 1e9, 1),
                   "floor_us": round(floor_us, 2), "pct_floor": round(100 * floor_us / st["median_us"], 1)}
            row["pct_copy"] = row["pct_floor"]
            rows.append(row)
            log(row)
        stages = dict(moe_stages(x, ids, tw, mw, out, ws)[0]) if t in (1, 64) else {}
        if "align" in stages:                      # the stream-K path's align launch captured alone
            align = stages["align"]
            ga = graph_of(torch, functools.partial(_on_current_stream, torch, align))
            sa, _ = timed_replays(torch, ga, ids, id_sets, 12)
            rows.append({"case": f"moe T={t}", "impl": "fused_moe stage: align (1 block)", "timing": "graph",
                         "T": t, **{k: round(v, 2) for k, v in stats(sa).items()}})
            log(rows[-1])
        samples = []
        for r in range(6 if t < 64 else 3):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            torch_moe_loop(torch, x, id_sets[r % 8], tw, tg)
            torch.cuda.synchronize()
            samples.append((time.perf_counter() - t0) * 1e6)
        st = stats(samples[1:])
        rows.append({"case": f"moe T={t}", "impl": "torch per-expert loop (tinygemm, eager)",
                     "timing": "wall, eager",
                     "T": t, **{k: round(v, 1) for k, v in st.items()},
                     "pct_floor": round(100 * floor_us / st["median_us"], 1)})
        log(rows[-1])


def per_expert_tinygemm(torch):
    """tinygemm operands for every expert: (gate, up, down) int4packs + (scale, zero) tables."""
    def one(n, k):
        u8 = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, device="cuda")
        sz = torch.zeros(k // G, n, 2, dtype=torch.bfloat16, device="cuda")
        sz[..., 0] = 0.002
        return torch.ops.aten._convert_weight_to_int4pack(u8, 8), sz
    return [(one(I, D), one(I, D), one(D, I)) for _ in range(E + S)]


def torch_moe_loop(torch, x, ids, tw, tg):
    """The straightforward torch MoE: loop over the experts present, tinygemm for each projection."""
    xb = x.bfloat16()
    y = torch.zeros(x.shape[0], D, device="cuda", dtype=torch.float32)
    mm = torch.ops.aten._weight_int4pack_mm
    for e in torch.unique(ids).tolist():
        rows, slot = torch.nonzero(ids == e, as_tuple=True)
        xe = xb[rows]
        (g_, gs), (u_, us), (d_, ds) = tg[e]
        h = torch.nn.functional.silu(mm(xe, g_, G, gs)) * mm(xe, u_, G, us)
        y.index_add_(0, rows, (mm(h, d_, G, ds).float() * tw[rows, slot, None]))
    (g_, gs), (u_, us), (d_, ds) = tg[E]
    y += mm(torch.nn.functional.silu(mm(xb, g_, G, gs)) * mm(xb, u_, G, us), d_, G, ds).float()
    return y


TOKENS = (1, 2, 4, 8, 16, 32, 64)
# stream-K tilings timed beside the default (warps/block, chunks/step, steps in flight, n-tiles/unit)
ALT_CONFIGS = [{"gu": (16, 1, 3, 1), "dn": (16, 1, 3, 2), "blocks": 132, "maxreg": 128},
               {"gu": (16, 2, 2, 1), "dn": (16, 4, 2, 1), "blocks": 132, "maxreg": 128},
               {"gu": (16, 2, 2, 1), "dn": (16, 2, 2, 2), "blocks": 132, "maxreg": 128}]

"""Version ladder for the fused W4A16 MoE (style.md §2.4): validate, then time at the K2 shape.

Run on a GPU:  python dev/kernels/moe.py
Versions (docs/perf.md has predictions and measurements):
  v1  align (1 block) -> gate/up GEMM over (I/16 n-tiles x W workers) with SiLU*up epilogue ->
      down GEMM (x router weight) -> combine; 4 launches, graph-captured. Swept: warps per block
      (KS), chunks per warp per batch (CPW) and workers W.
"""

from __future__ import annotations

import sys

import numpy as np

from workbench.bench.kernels_moe import EXPERT_BYTES, graph_of, k2_random_experts, timed_replays


def time_moe(torch, mw, t, k, cfg, reps=20, sets=8, seed=0):
    """Median/min/max us of one graph-captured fused_moe call, rotating over ``sets`` routings."""
    from kernels_numba.moe import fused_moe, moe_workspace
    gen = torch.Generator(device="cuda").manual_seed(seed)
    e = mw.n_routed
    ids_sets = [torch.stack([torch.randperm(e, device="cuda", generator=gen)[:k] for _ in range(t)]).int()
                for _ in range(sets)]
    x = torch.randn(t, mw.w13.k, device="cuda").half()
    ids = ids_sets[0].clone()
    tw = torch.rand(t, k, device="cuda")
    out = torch.empty(t, mw.w13.k, device="cuda")
    ws = moe_workspace(t, k, mw)

    def fn():
        fused_moe(x, ids, tw, mw, out=out, workspace=ws, stream=torch.cuda.current_stream(), config=cfg)
    return timed_replays(torch, graph_of(torch, fn), ids, ids_sets, reps, n_shared=mw.n_shared)


def check_small(torch):
    """prepare_moe on gen_quant4 experts vs workbench.reference.moe at D=1024, I=512, E=16."""
    from dataclasses import replace

    from numba import cuda

    from kernels_numba.moe import fused_moe, prepare_moe
    from workbench.config import preset
    from workbench.quant.int4 import gen_quant4
    from workbench.reference.moe import moe, moe_gate
    cfg = replace(preset("tiny"), hidden_size=1024, moe_intermediate_size=512, n_routed_experts=16,
                  num_experts_per_tok=4, n_group=1, topk_group=1)
    e, i, d, s = 16, 512, 1024, cfg.n_shared_experts
    rng = np.random.default_rng(0)
    W, st = {}, {}
    for ex in [*range(e), "shared"]:
        for nm, (n, k) in (("w1", (i, d)), ("w3", (i, d)), ("w2", (d, i))):
            if ex == "shared":
                n, k = (s * n, k) if nm != "w2" else (n, s * k)
            _, p, sc = gen_quant4(n, k, 32, seed=int(rng.integers(1 << 30)))
            pre = f"layers.0.ffn.experts.{ex}" if ex != "shared" else "layers.0.ffn.shared"
            W[f"{pre}.{nm}.packed"], W[f"{pre}.{nm}.scale"] = p, sc
            st.setdefault((ex == "shared", nm), []).append((p, sc))
    W["layers.0.ffn.gate"] = rng.standard_normal((e, d)).astype(np.float32) * 0.05
    W["layers.0.ffn.gate_bias"] = rng.standard_normal(e).astype(np.float32) * 0.01

    def stk(nm, j):
        return np.stack([t[j] for t in st[(False, nm)]])
    shared = [a for nm in ("w1", "w3", "w2") for a in st[(True, nm)][0]]
    mw = prepare_moe(stk("w1", 0), stk("w1", 1), stk("w3", 0), stk("w3", 1), stk("w2", 0), stk("w2", 1),
                     shared=shared).to_device()
    worst = 0.0
    for t in (1, 5, 33):
        x = rng.standard_normal((t, d)).astype(np.float16)
        idx, w = moe_gate(cfg, x.astype(np.float32), W["layers.0.ffn.gate"], W["layers.0.ffn.gate_bias"])
        ref = moe(cfg, W, 0, x.astype(np.float32))
        out = cuda.to_device(np.full((t, d), np.nan, np.float32))
        fused_moe(cuda.to_device(x), cuda.to_device(idx.astype(np.int32)),
                  cuda.to_device(w.astype(np.float32)), mw, out=out, check_routing=True)
        err = float(np.abs(out.copy_to_host() - ref).max() / np.abs(ref).max())
        worst = max(worst, err)
        print(f"check fused_moe T={t}: rel err {err:.2e}", "OK" if err < 1e-3 else "FAIL")
    return worst


def main() -> int:
    import torch

    from kernels_numba.moe import choose_moe_config
    from workbench.bench.common import copy_bandwidth
    check_small(torch)
    copy = copy_bandwidth()
    print(f"copy {copy:.0f} GB/s")
    mw = k2_random_experts(torch)
    eb = EXPERT_BYTES
    for t in (1, 4, 16, 64):
        p = t * 9
        base = choose_moe_config(7168, 2048, p)
        cfgs = [base] + [{"gu": gu, "dn": dn, "workers": w} for gu, dn, w in
                         [((16, 2), (16, 2), min(p, 16)), ((8, 4), (8, 2), min(p, 64)),
                          ((28, 4), (16, 2), min(p, 64)), ((16, 2), (8, 4), min(p, 128)),
                          ((16, 4), (16, 2), min(p, 64))]]
        for cfg in cfgs:
            try:
                samples, uniq = time_moe(torch, mw, t, 8, cfg)
            except Exception as e:  # noqa: BLE001 - a config that does not launch is reported
                print(f"v1 T={t} cfg={cfg}: failed {type(e).__name__}: {str(e)[:100]}")
                continue
            floor = [u * eb / (copy * 1e3) for u in uniq]                     # us at copy bandwidth
            frac = [f / s for f, s in zip(floor, samples, strict=True)]
            print(f"v1 T={t} cfg={cfg}: median {np.median(samples):.1f} us, "
                  f"unique experts ~{np.mean(uniq):.1f}, floor {np.median(floor):.1f} us, "
                  f"{100 * np.median(frac):.0f}% of floor")
    return 0


if __name__ == "__main__":
    sys.exit(main())

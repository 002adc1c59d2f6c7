"""The fused W4A16 MoE on a GPU (docs/conventions.md): validate the package kernels, then time them at
the K2 shape.

Run on a GPU:  python dev/kernels/moe.py [--quick | --diag | --sweep-tokens T ... | --ncu]
What it runs (every path checked against workbench.reference.moe at a small shape first):
  default         the package layer call (align -> gate/up -> down -> combine; the GEMMs two-level
                  stream-K, v6) at its default config and the alternatives (warps per block, chunks
                  per step SC, steps in flight DP, n-tiles per unit NT, blocks per SM, register cap)
                  at T = 1, 4, 16, 64 against the floor, then each stage's time.
  --sweep-tokens  the default config beside the GEMV path (v7 / v8, moe_gemv.py) at these T.
  --diag          each stage's time from prefix graphs at the default config and any EXTRA_CONFIGS.
  --gemv-sweep    the per-pair GEMV path at T = 1 and 8 over its gate/up and down tilings (warps per
                  block, chunks per warp) and register caps (more resident blocks an SM against
                  weights held in registers), and gate/up forming h itself (``glu``: no act launch),
                  each config's output first compared with the default's.
The earlier rungs (v1-v5, the v6dp and load-only variants made by text patches) are in git history;
docs/perf.md's ladder names the commit of each (the last tree that held them all:
``git show 0841025:dev/kernels/moe.py``). The package kernels are reached through kernels_numba.ops only
(dev/import_map.py --check).
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from kernels_numba import ops
from workbench.bench.kernels_moe import (
    ALT_CONFIGS,
    EXPERT_BYTES,
    graph_of,
    k2_random_experts,
    routings,
    timed_replays,
)


def check_small(torch):
    """prepare_moe on gen_quant4 experts vs workbench.reference.moe at D=1024, I=512, E=16."""
    from dataclasses import replace

    from numba import cuda

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
    mw = ops.prepare_moe(stk("w1", 0), stk("w1", 1), stk("w3", 0), stk("w3", 1), stk("w2", 0), stk("w2", 1),
                     shared=shared).to_device()
    for t in (1, 5, 33):
        x = rng.standard_normal((t, d)).astype(np.float16)
        idx, w = moe_gate(cfg, x.astype(np.float32), W["layers.0.ffn.gate"], W["layers.0.ffn.gate_bias"])
        ref = moe(cfg, W, 0, x.astype(np.float32))
        xd, idd, wd = (torch.from_numpy(a).cuda() for a in (x, idx.astype(np.int32), w.astype(np.float32)))
        nt_cfgs = [{"gu": (16, 1, 2, 2), "dn": (16, 1, 2, 4), "blocks": 132, "maxreg": 128},
                   {"gu": (16, 1, 3, 4), "dn": (16, 1, 2, 8), "blocks": 132, "maxreg": 128}]
        for name, kcfg in [("package", None), ("NT=2/4", nt_cfgs[0]), ("NT=4/8", nt_cfgs[1]),
                           ("GEMV path", ops.choose_moe_config(d, i, 1))]:
            out = torch.full((t, d), float("nan"), device="cuda")
            ws = ops.moe_workspace(t, 4, mw, config=kcfg)
            ops.fused_moe(xd, idd, wd, mw, out=out, workspace=ws, config=kcfg, check_routing=True)
            cuda.synchronize()
            err = float(np.abs(out.cpu().numpy() - ref).max() / np.abs(ref).max())
            print(f"check {name} fused_moe T={t}: rel err {err:.2e}", "OK" if err < 1e-3 else "FAIL")


def token_sweep(torch, tokens):
    """The default config beside the GEMV path (its config at T = 1) at every T of ``tokens`` (the 70%
    target is for T = 1 to 64)."""
    from workbench.bench.common import copy_bandwidth
    copy = copy_bandwidth()
    print(f"copy {copy:.0f} GB/s")
    mw = k2_random_experts(torch)
    for t in tokens:
        base = ops.choose_moe_config(7168, 2048, t)
        for name, cfg in (("default", base), ("GEMV path", ops.choose_moe_config(7168, 2048, 1))):
            if name == "default" or "gemv" not in base:
                med, uniq = time_version(torch, mw, t, cfg)
                floor = uniq * EXPERT_BYTES / (copy * 1e3)
                print(f"T={t} {name} {cfg}: {med:.1f} us, unique experts {uniq:.0f}, floor {floor:.1f} us, "
                      f"{100 * floor / med:.1f}% of floor", flush=True)
    return 0


def gemv_sweep(torch, tokens=(1, 8)):
    """The GEMV path's tilings and register caps beside its default at each T; a config whose output
    differs from the default's by more than 1e-3 (relative to its largest value) is reported, not timed."""
    from workbench.bench.common import copy_bandwidth
    copy = copy_bandwidth()
    print(f"copy {copy:.0f} GB/s")
    mw = k2_random_experts(torch)
    base = ops.choose_moe_config(7168, 2048, 1)
    key = (base["gu"], base["dn"], base["maxreg"])
    cfgs = [base] + [{**base, "gu": gu, "dn": dn, "maxreg": reg} for gu in ((8, 14), (14, 8), (16, 7))
                     for dn in ((4, 8), (8, 4)) for reg in (64, 96, 128) if (gu, dn, reg) != key]
    cfgs += [{**base, "gu": gu, "maxreg": reg, "glu": True}                # gate/up forms h: no act launch
             for gu, reg in (((16, 7), 128), ((14, 8), 128))]    # (at 14 chunks a warp it does not unroll)
    for t in tokens:
        ids = routings(torch, t, 1, seed=t)[0]
        x = torch.randn(t, 7168, device="cuda").half()
        tw = torch.rand(t, 8, device="cuda")
        want = None
        for cfg in cfgs:
            out = torch.empty(t, 7168, device="cuda")
            ws = ops.moe_workspace(t, 8, mw, config=cfg)
            ops.fused_moe(x, ids, tw, mw, out=out, workspace=ws, config=cfg)
            torch.cuda.synchronize()
            if want is None:
                want = out.clone()
            err = float((out - want).abs().max() / want.abs().max())
            name = f"gemv T={t} {cfg['gu']}/{cfg['dn']}@{cfg['maxreg']}{' glu' if cfg.get('glu') else ''}"
            if not err < 1e-3:
                print(f"{name}: differs from the default by {err:.1e}")
                continue
            med, uniq = time_version(torch, mw, t, cfg)
            floor = uniq * EXPERT_BYTES / (copy * 1e3)
            print(f"{name}: {med:.1f} us, floor {floor:.1f} us, "
                  f"{100 * floor / med:.1f}% of floor", flush=True)
    return 0


def time_version(torch, mw, t, cfg, reps=24):
    """(median us, floor us) of one graph-captured layer call, routing rotated over 8 sets."""
    id_sets = routings(torch, t, 8, seed=t)
    ids = id_sets[0].clone()
    x = torch.randn(t, mw.w13.k, device="cuda").half()
    tw = torch.rand(t, 8, device="cuda")
    out = torch.empty(t, mw.w13.k, device="cuda")
    ws = ops.moe_workspace(t, 8, mw, config=cfg)

    def fn():
        ops.fused_moe(x, ids, tw, mw, out=out, workspace=ws, stream=torch.cuda.current_stream(), config=cfg)
    samples, uniq = timed_replays(torch, graph_of(torch, fn), ids, id_sets, reps, n_shared=mw.n_shared)
    return float(np.median(samples)), float(np.median(uniq))


EXTRA_CONFIGS = [{"gu": (16, 1, 2, 1), "dn": (16, 2, 2, 1), "blocks": 132, "maxreg": 128},
                 {"gu": (8, 2, 2, 1), "dn": (8, 2, 2, 2), "blocks": 264, "maxreg": 128},
                 {"gu": (16, 1, 2, 2), "dn": (16, 1, 2, 4), "blocks": 132, "maxreg": 128},
                 # v6 with enough registers for no stack at DP = 2 / 3 / 4 (as few warps as fit)
                 {"gu": (13, 2, 2, 1), "dn": (13, 2, 2, 2), "blocks": 132, "maxreg": 144},
                 {"gu": (11, 2, 3, 1), "dn": (11, 2, 3, 2), "blocks": 132, "maxreg": 176},
                 {"gu": (8, 2, 4, 1), "dn": (8, 2, 4, 2), "blocks": 132, "maxreg": 240}]


def v3_configs(quick):
    """(warps per block, chunks per step, steps in flight, n-tiles per unit) per GEMM, blocks, regs."""
    out = [ops.choose_moe_config(7168, 2048, tokens=64)] + ALT_CONFIGS + EXTRA_CONFIGS
    return out[:3] if quick else out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--ncu", action="store_true", help="one eager layer call at T = 1 and 64, for ncu")
    ap.add_argument("--diag", action="store_true", help="stage times at the default and EXTRA_CONFIGS")
    ap.add_argument("--tokens", type=int, nargs="+", default=[1, 4, 16, 64], help="token counts of --diag")
    ap.add_argument("--configs", type=int, nargs="+", default=[], help="--diag: also these EXTRA_CONFIGS "
                    "(indices)")
    ap.add_argument("--no-check", action="store_true", help="--diag / --sweep-tokens without the small-shape "
                    "checks")
    ap.add_argument("--sweep-tokens", type=int, nargs="+", help="the default config beside the GEMV path "
                    "at these token counts (after the small-shape checks)")
    ap.add_argument("--gemv-sweep", action="store_true", help="the GEMV path's tilings and register caps")
    args = ap.parse_args(argv)
    import torch
    if args.gemv_sweep:
        if not args.no_check:
            check_small(torch)
        return gemv_sweep(torch)
    if args.ncu:
        return ncu_calls(torch)
    if args.sweep_tokens:
        if not args.no_check:
            check_small(torch)
        return token_sweep(torch, args.sweep_tokens)
    if args.diag:
        if not args.no_check:
            check_small(torch)
        return diagnose(torch, args.tokens, [EXTRA_CONFIGS[i] for i in args.configs])

    from workbench.bench.common import copy_bandwidth
    check_small(torch)
    copy = copy_bandwidth()
    print(f"copy {copy:.0f} GB/s")
    mw = k2_random_experts(torch)
    for t in (1, 4, 16, 64):
        for cfg in v3_configs(args.quick):
            try:
                med, uniq = time_version(torch, mw, t, cfg)
            except Exception as e:  # noqa: BLE001 - a config that does not launch is reported
                print(f"package T={t} cfg={cfg}: failed {type(e).__name__}: {str(e)[:120]}")
                continue
            floor = uniq * EXPERT_BYTES / (copy * 1e3)
            print(f"package T={t} cfg={cfg}: {med:.1f} us, unique experts {uniq:.0f}, floor {floor:.1f} us, "
                  f"{100 * floor / med:.0f}% of floor", flush=True)
    stage_breakdown(torch, mw)
    return 0


def ncu_calls(torch):
    """One eager v3 layer call per T (ncu profiles its launches); prints the GEMMs' register use."""
    mw = k2_random_experts(torch)
    for t in (1, 64):
        ids = routings(torch, t, 1, seed=t)[0]
        x = torch.randn(t, 7168, device="cuda").half()
        cfg = ops.choose_moe_config(7168, 2048, tokens=64)
        ops.fused_moe(x, ids, torch.rand(t, 8, device="cuda"), mw,
                      workspace=ops.moe_workspace(t, 8, mw, config=cfg), config=cfg)
        torch.cuda.synchronize()
        for name, args in (("gate_up", (7168, 2048, 32, True, *cfg["gu"])), ("down", (2048, 7168, 32, False,
                                                                                     *cfg["dn"]))):
            k = ops.make_moe_gemm_kernel(*args, cfg["maxreg"])
            print(f"T={t} {name} {cfg}: regs/thread {k.get_regs_per_thread()}, "
                  f"local bytes/thread {k.get_local_mem_per_thread()}", flush=True)
    return 0


def prefix_times(torch, stages, ids, id_sets, reps, n_shared):
    """Median us of graphs of the first 1, 2, ... launches of a layer call (each prefix is a valid
    sequence: counters are zeroed), and the median count of experts read."""
    from numba import cuda
    times = []
    for n in range(1, len(stages) + 1):
        def fn(n=n):
            s = cuda.external_stream(torch.cuda.current_stream().cuda_stream)
            for _, launch in stages[:n]:
                launch(s)
        samples, uniq = timed_replays(torch, graph_of(torch, fn), ids, id_sets, reps, n_shared=n_shared)
        times.append(float(np.median(samples)))
    return times, float(np.median(uniq))


def stage_breakdown(torch, mw):
    """Each stage of the package layer call (T = 1 and 64): the difference of consecutive prefixes."""
    for t in (1, 64):
        id_sets = routings(torch, t, 1, seed=t)
        ids = id_sets[0].clone()
        x = torch.randn(t, 7168, device="cuda").half()
        stages, _, _ = ops.moe_stages(x, ids, torch.rand(t, 8, device="cuda"), mw)
        times, _ = prefix_times(torch, stages, ids, id_sets, 12, mw.n_shared)
        for n, med in enumerate(times):
            print(f"stages T={t} up to {stages[n][0]}: {med:.1f} us "
                  f"(this stage {med - (times[n - 1] if n else 0.0):.1f} us)", flush=True)


def diagnose(torch, tokens, extra):
    """Per-stage and whole-layer time of the package at the default config and ``extra`` ones: each
    stage is the difference of consecutive prefix graphs (align; + gate/up; + down; + combine)."""
    from workbench.bench.common import copy_bandwidth
    copy = copy_bandwidth()
    print(f"copy {copy:.0f} GB/s")
    mw = k2_random_experts(torch)
    base = ops.choose_moe_config(7168, 2048, tokens=64)
    for t in tokens:
        id_sets = routings(torch, t, 8, seed=t)
        ids = id_sets[0].clone()
        x = torch.randn(t, 7168, device="cuda").half()
        tw = torch.rand(t, 8, device="cuda")
        for cfg in [base, *extra]:
            try:
                ws = ops.moe_workspace(t, 8, mw, config=cfg)
                stages, _, _ = ops.moe_stages(x, ids, tw, mw, workspace=ws, config=cfg)
                times, ue = prefix_times(torch, stages, ids, id_sets, 16, mw.n_shared)
            except Exception as e:  # noqa: BLE001 - a config that does not build or launch
                print(f"diag T={t} {cfg}: failed {type(e).__name__}: {str(e)[:160]}", flush=True)
                continue
            gu_mb, dn_mb = ue * EXPERT_BYTES * 2 / 3 / 1e6, ue * EXPERT_BYTES / 3 / 1e6
            gu, dn = times[1] - times[0], times[2] - times[1]
            floor = ue * EXPERT_BYTES / (copy * 1e3)
            print(f"diag T={t} {cfg['gu']}/{cfg['dn']}@{cfg['maxreg']}: align {times[0]:.1f} us, "
                  f"gate/up {gu:.1f} us ({gu_mb / gu:.2f} TB/s), down {dn:.1f} us ({dn_mb / dn:.2f} TB/s), "
                  f"combine {times[3] - times[2]:.1f} us; layer "
                  f"{times[3]:.1f} us, floor {floor:.1f} us: {100 * floor / times[3]:.0f}%", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Version ladder for the fused W4A16 MoE (docs/conventions.md): validate, then time at the K2 shape.

Run on a GPU:  python dev/kernels/moe.py [--quick | --diag | --sweep-tokens T ... | --ncu]
Versions (docs/perf.md has predictions and measurements), all timed in the same run:
  v2  align (1 block) -> gate/up GEMM over (I/16 n-tiles x W workers), one 8-row expert tile per
      block pass, KS warps split K and meet in shared memory -> down GEMM -> combine
      (the previous package kernel, kept as _moe_gemm_v2_snapshot.py.txt).
  v3  the same 4 launches; both GEMMs are persistent stream-K grids: every warp takes an equal
      contiguous share of (unit, K-step) work, DP steps of 16-byte weight loads in flight per warp,
      units split between warps summed deterministically by the last part (the package kernel).
  v4  v3 with NT n-tiles per unit (2 NT gate/up matrices, NT down matrices share each activation load,
      the unit's index math and its epilogue).
  v5  v4 with fewer instructions in the hot loop (v4 is issue-bound): running step / unit counters
      instead of 64-bit divisions per step, scale words through ld_u32 (no index wraparound code;
      constant offsets fold into the loads), no masking of padding columns (their results are never
      stored). Kept as _moe_gemm_v5_snapshot.py.txt.
  v6  two-level stream-K: warps of a block sum their split units from shared memory after one
      syncthreads at the end; only block-crossing pieces use the global part buffer (the package).
--diag times each stage of v5, v6 and variants of the package kernel made by textual patches (a
load-only one for timing, the v6dp candidate) from prefix graphs, at the default config and any
of EXTRA_CONFIGS.
Swept: warps per block, chunks per step (SC), steps in flight (DP), n-tiles per unit (NT), blocks per
SM, register cap.
"""

from __future__ import annotations

import argparse
import importlib.machinery
import importlib.util
import re
import sys
from pathlib import Path

import numpy as np

from workbench.bench.kernels_moe import (
    ALT_CONFIGS,
    EXPERT_BYTES,
    graph_of,
    k2_random_experts,
    routings,
    timed_replays,
)


def load_snapshot(stem: str):
    """An earlier package module kept as dev/kernels/<stem>.py.txt, imported inside kernels_numba."""
    path = Path(__file__).with_name(f"{stem}.py.txt")
    loader = importlib.machinery.SourceFileLoader(f"kernels_numba.{stem}", str(path))
    mod = importlib.util.module_from_spec(importlib.util.spec_from_loader(loader.name, loader))
    loader.exec_module(mod)
    return mod


def fused_moe_v2(v2, x, ids, tw, mw, out, ws, stream, cfg):
    """The v2 launch sequence (align and combine are unchanged in v3)."""
    from kernels_numba.moe_align import align_threads, make_align_kernel, make_combine_kernel
    w13, w2 = mw.w13, mw.w2
    d, i, g, xe = w13.k, w13.n, w13.group_size, w13.experts
    t, k = ids.shape
    p = t * (k + mw.n_shared)
    nthr = align_threads(xe)
    make_align_kernel(xe, nthr)[1, nthr, stream](ws.tile_expert, ws.tile_rows, ws.meta, ids.view(-1), t, k,
                                                 mw.n_routed, p, ws.cnt_gu, 0)
    h32 = ws.h.view(np.uint32)
    ks, cpw = cfg["gu"]
    v2.make_moe_gemm_kernel(d, i, g, ks, cpw, True)[(w13.n16, cfg["workers"]), ks * 32, stream](
        h32, x.view(-1), w13.wq, w13.sq, ws.tile_expert, ws.tile_rows, ws.meta, tw.view(-1), t, k)
    ks, cpw = cfg["dn"]
    v2.make_moe_gemm_kernel(i, d, g, ks, cpw, False)[(w2.n16, cfg["workers"]), ks * 32, stream](
        ws.y, ws.h, w2.wq, w2.sq, ws.tile_expert, ws.tile_rows, ws.meta, tw.view(-1), t, k)
    make_combine_kernel(d, k, mw.n_shared)[(-(-d // 128), t), 128, stream](out.view(-1), ws.y, t,
                                                                          ids.view(-1), mw.n_routed)


def check_small(torch, v2):
    """prepare_moe on gen_quant4 experts vs workbench.reference.moe at D=1024, I=512, E=16."""
    from dataclasses import replace

    from numba import cuda

    from kernels_numba.moe import choose_moe_config, fused_moe, moe_workspace, prepare_moe
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
    for t in (1, 5, 33):
        x = rng.standard_normal((t, d)).astype(np.float16)
        idx, w = moe_gate(cfg, x.astype(np.float32), W["layers.0.ffn.gate"], W["layers.0.ffn.gate_bias"])
        ref = moe(cfg, W, 0, x.astype(np.float32))
        xd, idd, wd = (torch.from_numpy(a).cuda() for a in (x, idx.astype(np.int32), w.astype(np.float32)))
        nt_cfgs = [{"gu": (16, 1, 2, 2), "dn": (16, 1, 2, 4), "blocks": 132, "maxreg": 128},
                   {"gu": (16, 1, 3, 4), "dn": (16, 1, 2, 8), "blocks": 132, "maxreg": 128}]
        for name, kcfg in [("v2", None), ("package", None), ("v4 NT=2/4", nt_cfgs[0]),
                           ("v4 NT=4/8", nt_cfgs[1]), ("GEMV path", choose_moe_config(d, i, 1))]:
            out = torch.full((t, d), float("nan"), device="cuda")
            ws = moe_workspace(t, 4, mw, config=kcfg)
            if name == "v2":
                fused_moe_v2(v2, xd, idd, wd, mw, out, ws, 0, v2_config(t * 5))
            else:
                fused_moe(xd, idd, wd, mw, out=out, workspace=ws, config=kcfg, check_routing=True)
            cuda.synchronize()
            err = float(np.abs(out.cpu().numpy() - ref).max() / np.abs(ref).max())
            print(f"check {name} fused_moe T={t}: rel err {err:.2e}", "OK" if err < 1e-3 else "FAIL")


def token_sweep(torch, tokens):
    """The default config beside the GEMV path (its config at T = 1) at every T of ``tokens`` (the 70%
    target is for T = 1 to 64)."""
    from kernels_numba.moe import choose_moe_config
    from workbench.bench.common import copy_bandwidth
    copy = copy_bandwidth()
    print(f"copy {copy:.0f} GB/s")
    mw = k2_random_experts(torch)
    for t in tokens:
        base = choose_moe_config(7168, 2048, t)
        for name, cfg in (("default", base), ("GEMV path", choose_moe_config(7168, 2048, 1))):
            if name == "default" or "gemv" not in base:
                med, uniq = time_version(torch, name, mw, t, cfg, None)
                floor = uniq * EXPERT_BYTES / (copy * 1e3)
                print(f"T={t} {name} {cfg}: {med:.1f} us, unique experts {uniq:.0f}, floor {floor:.1f} us, "
                      f"{100 * floor / med:.1f}% of floor", flush=True)
    return 0


def v2_config(p):
    return {"gu": (8, 2), "dn": (8, 2), "workers": min(p, 64)}


def time_version(torch, name, mw, t, cfg, v2, reps=24):
    """(median us, floor us) of one graph-captured layer call, routing rotated over 8 sets."""
    from kernels_numba.moe import fused_moe, moe_workspace
    id_sets = routings(torch, t, 8, seed=t)
    ids = id_sets[0].clone()
    x = torch.randn(t, mw.w13.k, device="cuda").half()
    tw = torch.rand(t, 8, device="cuda")
    out = torch.empty(t, mw.w13.k, device="cuda")
    ws = moe_workspace(t, 8, mw, config=None if name == "v2" else cfg)

    def fn():
        s = torch.cuda.current_stream()
        if name == "v2":
            from numba import cuda
            fused_moe_v2(v2, x, ids, tw, mw, out, ws, cuda.external_stream(s.cuda_stream), cfg)
        else:
            fused_moe(x, ids, tw, mw, out=out, workspace=ws, stream=s, config=cfg)
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
    from kernels_numba.moe import choose_moe_config
    out = [choose_moe_config(7168, 2048, tokens=64)] + ALT_CONFIGS + EXTRA_CONFIGS
    return out[:3] if quick else out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--ncu", action="store_true", help="one eager layer call at T = 1 and 64, for ncu")
    ap.add_argument("--diag", action="store_true", help="stage times: v5, v6, variants (stream, v6dp)")
    ap.add_argument("--tokens", type=int, nargs="+", default=[1, 4, 16, 64], help="token counts of --diag")
    ap.add_argument("--variants", nargs="+", default=["v5", "v6", "stream"], help="versions of --diag")
    ap.add_argument("--configs", type=int, nargs="+", default=[], help="--diag: also these EXTRA_CONFIGS "
                    "(indices), for every variant but v5")
    ap.add_argument("--no-check", action="store_true", help="--diag / --sweep-tokens without the small-shape "
                    "checks")
    ap.add_argument("--sweep-tokens", type=int, nargs="+", help="the default config beside the GEMV path "
                    "at these token counts (after the small-shape checks)")
    args = ap.parse_args(argv)
    import torch
    if args.ncu:
        return ncu_calls(torch)
    if args.sweep_tokens:
        if not args.no_check:
            check_small(torch, load_snapshot("_moe_gemm_v2_snapshot"))
        return token_sweep(torch, args.sweep_tokens)
    if args.diag:
        if not args.no_check:
            check_small(torch, load_snapshot("_moe_gemm_v2_snapshot"))
        return diagnose(torch, args.tokens, args.variants, [EXTRA_CONFIGS[i] for i in args.configs])

    from workbench.bench.common import copy_bandwidth
    v2 = load_snapshot("_moe_gemm_v2_snapshot")
    check_small(torch, v2)
    copy = copy_bandwidth()
    print(f"copy {copy:.0f} GB/s")
    mw = k2_random_experts(torch)
    for t in (1, 4, 16, 64):
        runs = [("v2", v2_config(t * 9))] + [("v3", c) for c in v3_configs(args.quick)]
        for name, cfg in runs:
            try:
                med, uniq = time_version(torch, name, mw, t, cfg, v2)
            except Exception as e:  # noqa: BLE001 - a config that does not launch is reported
                print(f"{name} T={t} cfg={cfg}: failed {type(e).__name__}: {str(e)[:120]}")
                continue
            floor = uniq * EXPERT_BYTES / (copy * 1e3)
            label = name if name == "v2" else "v5"
            print(f"{label} T={t} cfg={cfg}: {med:.1f} us, unique experts {uniq:.0f}, floor {floor:.1f} us, "
                  f"{100 * floor / med:.0f}% of floor", flush=True)
    stage_breakdown(torch, mw)
    return 0


def ncu_calls(torch):
    """One eager v3 layer call per T (ncu profiles its launches); prints the GEMMs' register use."""
    from kernels_numba.moe import choose_moe_config, fused_moe, moe_workspace
    from kernels_numba.moe_gemm import make_moe_gemm_kernel
    mw = k2_random_experts(torch)
    for t in (1, 64):
        ids = routings(torch, t, 1, seed=t)[0]
        x = torch.randn(t, 7168, device="cuda").half()
        cfg = choose_moe_config(7168, 2048, tokens=64)
        fused_moe(x, ids, torch.rand(t, 8, device="cuda"), mw, workspace=moe_workspace(t, 8, mw, config=cfg),
                  config=cfg)
        torch.cuda.synchronize()
        for name, args in (("gate_up", (7168, 2048, 32, True, *cfg["gu"])), ("down", (2048, 7168, 32, False,
                                                                                     *cfg["dn"]))):
            k = make_moe_gemm_kernel(*args, cfg["maxreg"])
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
    from kernels_numba.moe import moe_stages
    for t in (1, 64):
        id_sets = routings(torch, t, 1, seed=t)
        ids = id_sets[0].clone()
        x = torch.randn(t, 7168, device="cuda").half()
        stages, _, _ = moe_stages(x, ids, torch.rand(t, 8, device="cuda"), mw)
        times, _ = prefix_times(torch, stages, ids, id_sets, 12, mw.n_shared)
        for n, med in enumerate(times):
            print(f"stages T={t} up to {stages[n][0]}: {med:.1f} us "
                  f"(this stage {med - (times[n - 1] if n else 0.0):.1f} us)", flush=True)


# Variants of the package GEMM made by textual patches of kernels_numba/moe_gemm.py:
#   stream  timing only (wrong results by construction): no math and no split-unit sums, the ring's
#           weight and scale words are only XORed and every segment runs the epilogue (the load
#           pipeline alone, at the package's grid)
#   v6dp    candidate (correct results): step shares in whole groups of DP steps (every _share call
#           splits steps // DP groups), so units and shares end only in the last unrolled slot and
#           finish() is inlined once per loop body, not DP times (needs KSTEPS % DP == 0)
_MATH_START = "                xs = cto[CX] + ks * (SC * 64)\n"
_MATH_END = "                if ks == KSTEPS - 1 or s == b - 1:"
_XOR_ONLY = """                xo = uint32(0)
                for q in range(STW):
                    xo ^= rw[r * STW + q]
                for q in range(STS):
                    xo ^= rs[r * STS + q]
                acc[0] += float32(xo & uint32(1))
"""
_PATCHES = {
    "stream": [("            if lo == u0 and s == u0 + KSTEPS - 1:", "            if True:")],
    "v6dp": [("    KSTEPS = KC // SC\n",
              "    KSTEPS = KC // SC\n    assert KSTEPS % DP == 0, 'v6dp: steps per unit % DP != 0'\n"),
             ("                bb = ((u0 + 1) * nb - 1) // total ",         # the block holding group u0 / DP
              "                bb = ((u0 // DP + 1) * nb - 1) // (total // DP) "),
             (_MATH_END, "                if r == DP - 1 and (ks == KSTEPS - 1 or s == b - 1):")],
}
_SHARE_CALL = re.compile(r"_share\(([^,()]+), ([^,()]+), ([^,()]+)\)")


def patched_module(name):
    import kernels_numba.moe_gemm as pkg
    src = Path(pkg.__file__).read_text()
    for old, new in _PATCHES[name]:
        assert old in src, (name, old)
        src = src.replace(old, new)
    if name == "stream":
        i, j = src.index(_MATH_START), src.index(_MATH_END)
        src = src[:i] + _XOR_ONLY + src[j:]
    if name == "v6dp":                       # every share boundary inside the kernel on whole DP groups
        k = src.index("def make_moe_gemm_kernel")
        body, n = _SHARE_CALL.subn(r"_share(\1, \2, (\3) // DP) * DP", src[k:])
        assert n == 8, n
        src = src[:k] + body
    mod = type(sys)(f"kernels_numba._moe_gemm_{name}")
    mod.__package__ = "kernels_numba"
    exec(compile(src, f"<moe_gemm {name}>", "exec"), mod.__dict__)
    return mod


def diagnose(torch, tokens, variants, extra):
    """Per-stage and whole-layer time of v5 (snapshot; per-warp parts in global memory), v6 (package)
    and the patched variants, at the default config and ``extra`` ones: each stage is the difference
    of consecutive prefix graphs (align; + gate/up; + down; + combine)."""
    from dataclasses import replace

    from numba import cuda

    import kernels_numba.moe as moe_mod
    from workbench.bench.common import copy_bandwidth
    copy = copy_bandwidth()
    print(f"copy {copy:.0f} GB/s")
    mw = k2_random_experts(torch)
    base = moe_mod.choose_moe_config(7168, 2048, tokens=64)
    v5 = load_snapshot("_moe_gemm_v5_snapshot")
    factories = {"v5": v5.make_moe_gemm_kernel, "v6": moe_mod.make_moe_gemm_kernel}
    factories.update({v: patched_module(v).make_moe_gemm_kernel for v in variants if v in _PATCHES})
    v5_part = 2 * base["blocks"] * 16 * 2 * 128                  # v5: two slots per warp
    for t in tokens:
        id_sets = routings(torch, t, 8, seed=t)
        ids = id_sets[0].clone()
        x = torch.randn(t, 7168, device="cuda").half()
        tw = torch.rand(t, 8, device="cuda")
        for name, cfg in [(v, c) for v in variants for c in [base, *extra] if v != "v5" or c is base]:
            saved = moe_mod.make_moe_gemm_kernel
            moe_mod.make_moe_gemm_kernel = factories[name]
            try:
                ws = moe_mod.moe_workspace(t, 8, mw, config=cfg)
                if name == "v5":
                    ws = replace(ws, part=cuda.device_array(v5_part, np.float32))
                stages, _, _ = moe_mod.moe_stages(x, ids, tw, mw, workspace=ws, config=cfg)
                times, ue = prefix_times(torch, stages, ids, id_sets, 16, mw.n_shared)
            except Exception as e:  # noqa: BLE001 - a variant / config that does not build or launch
                print(f"diag {name} T={t} {cfg}: failed {type(e).__name__}: {str(e)[:160]}", flush=True)
                continue
            finally:
                moe_mod.make_moe_gemm_kernel = saved
            gu_mb, dn_mb = ue * EXPERT_BYTES * 2 / 3 / 1e6, ue * EXPERT_BYTES / 3 / 1e6
            gu, dn = times[1] - times[0], times[2] - times[1]
            floor = ue * EXPERT_BYTES / (copy * 1e3)
            print(f"diag {name:6s} T={t} {cfg['gu']}/{cfg['dn']}@{cfg['maxreg']}: align {times[0]:.1f} us, "
                  f"gate/up {gu:.1f} us ({gu_mb / gu:.2f} TB/s), down {dn:.1f} us ({dn_mb / dn:.2f} TB/s), "
                  f"combine {times[3] - times[2]:.1f} us; layer "
                  f"{times[3]:.1f} us, floor {floor:.1f} us: {100 * floor / times[3]:.0f}%", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The W4A16 GEMV/GEMM on a GPU (docs/conventions.md): validate the package kernels, then time them.

Run on a GPU:  python dev/kernels/int4_matmul.py [--quick | --ms M ...] [--ncu | --m16 | --paired
                | --staged]
Offline:       NUMBA_ENABLE_CUDASIM=1 python dev/kernels/int4_matmul.py --check
What it runs (every kernel checked against the reference before it is timed):
  default    the package kernel (v7: tensor cores with the weights as the A operand, repacked tiles,
             PDL, the PIN wait and coherent loads where measured faster) over the (MT, KS, CPW, KB)
             tilings at M = 1 .. 64 beside a same-size copy; choose_config is the winner of this sweep.
  --m16      M = 1 against 16 / 32 / 64 at the tunings that matter.
  --paired   v14 tile pairs (4-tuple configs, clusters of 2) beside the 3-tuple configs.
  --staged   int4_staged.py's tilings (v19) at M = 33 .. 64 beside the tiled kernel and cuBLAS bf16.
  --wgmma    int4_wgmma.py's tilings (exact and prescaled scales) at M = 33 .. 64, the same way, beside
             the staged default.
The earlier rungs (v1-v6, v8-v13, v15-v18, v20), the text-patched variants and the timeline, floor
and staged-part probes are in git history; docs/perf.md's ladders name the commit of each rung
(the last tree that held them all: ``git show 0841025:dev/kernels/int4_matmul.py``). The load-only
ceiling probe (s0, --ceiling), whose own kernel no ladder row rests on, is in
``git show 5bc5dca:dev/kernels/int4_matmul.py``. The package kernels are reached through
kernels_numba.ops only (dev/import_map.py --check).
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
from numba import cuda

from kernels_numba import ops
from kernels_numba.device import SIMULATED


def random_weights(n, k, gs, count, torch):
    """``count`` random repacked weights on the GPU (random words = random nibbles in any layout)."""
    n16 = -(-n // 16)
    ws = []
    for _ in range(count):
        wq = torch.randint(-2**31, 2**31 - 1, (n16 * k * 2,), dtype=torch.int32, device="cuda")
        s = (torch.rand(n16 * 16 * (k // gs), device="cuda") * 0.01 + 0.001).half()
        ws.append(ops.Int4Weight(cuda.as_cuda_array(wq).view(np.uint32),
                                 cuda.as_cuda_array(s.view(torch.int32)).view(np.uint32), n, k, gs))
    return ws


def check_against_reference(rng, m, n, k, gs, config=None, int4_matmul=None):
    """Real repack of a gen_quant4 weight; returns max |out - ref| / max |ref| (of the package's
    int4_matmul unless another is given)."""
    from workbench.quant.int4 import gen_quant4, int4_linear
    _, packed, scales = gen_quant4(n, k, gs, seed=int(rng.integers(1 << 30)))
    int4_matmul = int4_matmul or ops.int4_matmul
    x = rng.standard_normal((m, k)).astype(np.float16)
    w = ops.repack_int4(packed, scales)
    out = np.full((m, n), np.nan, np.float32)
    if not SIMULATED:                      # the simulator (offline checks of the variants) takes numpy
        w, x_in, out = w.to_device(), cuda.to_device(x), cuda.to_device(out)
    int4_matmul(x if SIMULATED else x_in, w, out=out, config=config)
    ref = int4_linear(x, packed, scales)
    got = out if SIMULATED else out.copy_to_host()
    return float(np.abs(got - ref).max() / np.abs(ref).max())


def configs_for(m, k):
    mt = ops.tiled_config(m, k)[0]
    kc = k // 64
    out = [ops.tiled_config(m, k)]
    for cpw in (1, 2, 4, 7, 8, 14, 16):
        ks = kc // cpw
        if kc % cpw == 0 and 2 <= ks <= 32 and (mt, ks, cpw) not in out:
            out.append((mt, ks, cpw))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--ms", type=int, nargs="+", help="M values to sweep (default 1 4 16 32 64)")
    ap.add_argument("--ncu", action="store_true", help="one launch of each shape, for ncu")
    ap.add_argument("--m16", action="store_true", help="M = 1 vs 16, 32, 64 at the tunings that matter")
    ap.add_argument("--check", action="store_true", help="only check the package kernel against the "
                    "reference at small shapes (no torch; also in the simulator: NUMBA_ENABLE_CUDASIM=1)")
    ap.add_argument("--paired", action="store_true", help="v14: tile pairs over clusters of 2 (4-tuple "
                    "configs) beside the package's 3-tuple configs, checked first and after the timed chain")
    ap.add_argument("--staged", action="store_true", help="the staged kernel's tilings at M = 33..64 "
                    "beside the tiled kernel and cuBLAS bf16, checked first")
    ap.add_argument("--wgmma", action="store_true", help="the wgmma kernel's tilings at M = 33..64 beside "
                    "the staged default, the tiled kernel and cuBLAS bf16, checked first")
    args = ap.parse_args(argv)
    if args.check:
        return check_package()
    import torch
    if args.m16:
        return m16_ratio(torch)
    if args.paired:
        return paired_sweep(torch)
    if args.staged or args.wgmma:
        return staged_sweep(torch, _wgmma_plans() if args.wgmma else _staged_plans())

    from workbench.bench.common import copy_bandwidth, time_op
    if args.ncu:
        for (n, k) in [(2048, 7168), (7168, 2048)]:
            w = random_weights(n, k, 32, 1, torch)[0]
            for m in (1, 16):
                x = torch.randn(m, k, device="cuda").half()
                for _ in range(3):
                    ops.int4_matmul(x, w)
        torch.cuda.synchronize()
        return 0
    rng = np.random.default_rng(0)
    for (m, n, k, gs, cfg) in [(1, 2048, 7168, 32, None), (16, 7168, 2048, 32, None),
                               (5, 1000, 1024, 64, None),
                               (40, 48, 512, 128, None), (3, 2048, 7168, 32, (1, 14, 8)),
                               (16, 7168, 2048, 32, (2, 8, 4)), (32, 7168, 2048, 32, None)]:
        err = check_against_reference(rng, m, n, k, gs, cfg)
        print(f"check M={m} N={n} K={k} G={gs} cfg={cfg}: rel err {err:.2e}", "OK" if err < 1e-4 else "FAIL")
    copy = copy_bandwidth()
    print(f"copy {copy:.0f} GB/s")
    count = 64
    for (n, k) in [(2048, 7168), (7168, 2048)]:
        ws = random_weights(n, k, 32, count, torch)
        nbytes = n * k // 2 + n * (k // 32) * 2
        srcs = [torch.empty(nbytes // 4, dtype=torch.int16, device="cuda") for _ in range(count)]
        dsts = [torch.empty_like(t) for t in srcs]

        def fc(dsts=dsts, srcs=srcs):
            for i in range(count):
                dsts[i].copy_(srcs[i])
        st = time_op(fc, calls=count, reps=10)
        print(f"s1 copy of {nbytes / 1e6:.2f} MB traffic per launch: {st['median_us']:.2f} us "
              f"{nbytes / (st['median_us'] * 1e-6) / 1e9:.0f} GB/s")
        for m in args.ms or ((1, 16) if args.quick else (1, 4, 16, 32, 64)):
            x = torch.randn(m, k, device="cuda").half()
            outs = [torch.empty(m, n, device="cuda") for _ in range(count)]
            for cfg in configs_for(m, k):
                label = f"v4 N={n} K={k} M={m} cfg={cfg}"
                us = time_rotating(torch, ops.int4_matmul, x, ws, outs, cfg, label)
                if us is not None:
                    gbs = nbytes / (us * 1e-6) / 1e9
                    print(f"{label}: {us:.2f} us {gbs:.0f} GB/s {100 * gbs / copy:.0f}% copy")
    return 0


def time_rotating(torch, matmul, x, ws, outs, cfg, label):
    """Median us per launch of ``matmul`` over the weights ``ws`` back to back in one graph (None and
    a printed line if the config does not launch)."""
    from workbench.bench.common import time_op

    def fn():
        st = torch.cuda.current_stream()
        for i in range(len(ws)):
            matmul(x, ws[i], out=outs[i], stream=st, config=cfg)
    try:
        return time_op(fn, calls=len(ws), reps=10)["median_us"]
    except Exception as e:  # noqa: BLE001 - a config that does not launch is reported
        print(f"{label}: failed {type(e).__name__}: {str(e)[:80]}")
        return None


def check_print(rng, name, m, n, k, cfg, fn) -> bool:
    """One check_against_reference line; True if it passed (within 1e-4 of the largest output; 1e-3 for
    a ``prescale`` wgmma tiling, whose weights are rounded to f16: about 1e-4 at K2 sizes)."""
    err = check_against_reference(rng, m, n, k, 32, cfg, fn)
    tol = 1e-3 if getattr(cfg, "prescale", False) else 1e-4
    print(f"check {name} M={m} N={n} K={k} cfg={cfg}: rel err {err:.2e}", "OK" if err < tol else "FAIL")
    return err < tol


def time_plans(torch, impls, plans, runs=lambda name, cfg: True, compare=False):
    """Per K2 shape of ``plans`` ({(N, K): [(M, config), ...]}) 64 random weights, then every
    implementation ``runs`` allows at every (M, config), timed over them back to back; ``compare``:
    each timed chain's outputs (NaN before it) against the package default's."""
    for (n, k), plan in plans.items():
        ws = random_weights(n, k, 32, 64, torch)
        for m, cfg in plan:
            x = torch.randn(m, k, device="cuda").half()
            if compare:
                ref = torch.stack([torch.zeros(m, n, device="cuda") for _ in ws])
                for w, r in zip(ws, ref, strict=True):
                    ops.int4_matmul(x, w, out=r)
            for name, fn in impls.items():
                if runs(name, cfg):
                    outs = [torch.full((m, n), float("nan"), device="cuda") for _ in ws]
                    label = f"{name} N={n} K={k} M={m} cfg={cfg}"
                    us = time_rotating(torch, fn, x, ws, outs, cfg, label)
                    if us is None:
                        continue
                    tail = ""
                    if compare:
                        err = float(((torch.stack(outs) - ref).abs().max() / ref.abs().max()).nan_to_num(1e9))
                        tail = f", chained outputs vs default rel err {err:.1e}"
                    print(f"{label}: {us:.2f} us{tail}", flush=True)


def check_package() -> int:
    """The package kernel against the reference at M = 1 / 3 / 16, one 16-row tile or two, K = 1024; 1 if
    any fails (no torch: runs in the simulator too; --paired checks the tile pairs on a GPU)."""
    rng = np.random.default_rng(11)
    bad = 0
    for m, n, k, cfg in [(1, 16, 1024, (1, 2, 8)), (3, 32, 1024, (1, 4, 4)), (16, 16, 1024, (2, 2, 8))]:
        bad += not check_print(rng, "package", m, n, k, cfg, ops.int4_matmul)
    return int(bad > 0)


def m16_ratio(torch):
    """M = 1 vs 16 (and 32, 64) on both K2 shapes, one run over the same 64 weights per shape: the
    package kernel at the tunings that matter, each checked first."""
    impls = {"package": ops.int4_matmul}
    rng = np.random.default_rng(1)
    for name, fn in impls.items():
        for m, n, k, cfg in [(5, 2048, 7168, (1, 16, 7)), (1, 7168, 2048, (1, 4, 8)),
                             (3, 2048, 7168, (1, 8, 14)), (1, 7168, 2048, (1, 8, 4)),
                             (16, 7168, 2048, (2, 4, 8)), (29, 7168, 2048, None), (29, 2048, 7168, None),
                             (61, 7168, 2048, None), (61, 2048, 7168, None)]:
            check_print(rng, name, m, n, k, cfg, fn)
    time_plans(torch, impls, {
        (2048, 7168): [(1, (1, 16, 7)), (1, (1, 8, 14)), (16, (2, 16, 7)), (32, None), (64, None)],
        (7168, 2048): [(1, (1, 4, 8)), (1, (1, 8, 4)), (16, (2, 4, 8)), (32, None), (64, None)]})
    return 0


# --paired: v14 = tile pairs (KP = 2 in a 4-tuple config): block b of a cluster of 2 computes tiles
# b & ~1 and (b & ~1) + 1 over half b & 1 of K, so warps w and w + KS / 2 read the same x (the second
# from L1) and each SM takes in half of x; the halves meet through distributed shared memory.
_PAIRED_PLANS = {(2048, 7168): [(1, (1, 16, 7)), (16, (2, 16, 7)), (16, (2, 16, 7, 2)), (32, None),
                                (32, (4, 16, 7, 2))],
                 (7168, 2048): [(16, (2, 4, 8)), (16, (2, 8, 4, 2))]}

def paired_sweep(torch):
    """_PAIRED_PLANS: every config checked against the reference (odd M inside its bucket), timed over
    64 weights back to back, and its chained outputs then compared with the package default's."""
    impls = {"package": ops.int4_matmul}
    rng = np.random.default_rng(14)
    for (n, k), plan in _PAIRED_PLANS.items():
        for m, cfg in plan:
            for mm in sorted({m, max(m - 3, 1)}):
                check_print(rng, "package", mm, n, k, cfg, ops.int4_matmul)
    time_plans(torch, impls, _PAIRED_PLANS, compare=True)
    return 0


# --staged: int4_staged.py's tilings (MT, NT, S, PW, PX) per K2 shape, beside the tiled kernel's config
# for the same rows and cuBLAS bf16
def _staged_plans():
    Staged = ops.Staged
    # the tilings the v19 ladder kept an eye on (docs/perf.md; the rest are in its logs)
    # the first of each: the package's default (choose_config at M = 64)
    gu = [Staged(4, 4, 8, 4, 4), Staged(4, 8, 8, 4, 4), Staged(8, 8, 8, 4, 3), Staged(4, 8, 8, 2, 2)]
    dn = [Staged(4, 4, 1, 4, 4), Staged(4, 8, 2, 4, 4), Staged(8, 8, 2, 4, 3), Staged(4, 4, 2, 4, 4)]
    return {(2048, 7168): gu, (7168, 2048): dn}


# --wgmma: int4_wgmma.py's tilings (MT, WG, S, PW, PX, prescale), the staged default first; then the
# package's wgmma_config in both scale modes
def _wgmma_plans():
    W = ops.Wgmma
    gu, dn = (2048, 7168), (7168, 2048)
    return {gu: [ops.choose_config(64, 7168, 32, 2048), ops.wgmma_config(7168, 2048),
                 ops.wgmma_config(7168, 2048, prescale=True), W(8, 1, 4, 3, 4), W(8, 2, 8, 3, 3),
                 W(5, 1, 8, 3, 4), W(8, 1, 8, 6, 4, True)],
            dn: [ops.choose_config(64, 2048, 32, 7168), ops.wgmma_config(2048, 7168),
                 ops.wgmma_config(2048, 7168, prescale=True), W(8, 1, 1, 3, 4), W(8, 1, 4, 3, 4),
                 W(8, 2, 2, 3, 3), W(8, 1, 2, 6, 4, True)]}


def _workspace(torch, cfgs, n, m=64):
    """A split-K workspace (torch tensors) for M rows of N outputs at any of ``cfgs``."""
    words, cells = (max(v) for v in zip(*(ops.staged_partials(c, -(-n // 16), -(-m // (8 * c.mt)))
                                          for c in cfgs), strict=True))
    return ops.GemmWorkspace(torch.zeros(max(words, 1), device="cuda"),
                             torch.zeros(max(cells, 1), dtype=torch.int32, device="cuda"))


def staged_sweep(torch, plans, ms=(33, 48, 64)):
    """Per K2 shape and M: cuBLAS bf16, the tiled kernel and every tiling of ``plans`` (_staged_plans,
    _wgmma_plans), each checked against the reference first."""
    import functools as ft

    from workbench.bench.common import time_op
    rng = np.random.default_rng(15)
    ok = True
    for (n, k), cfgs in plans.items():
        for i, cfg in enumerate(cfgs):
            for m in (64, 37, 100) if i == 0 else (64, 37):
                ok &= check_print(rng, "package", m, n, k, cfg, ops.int4_matmul)
    if not ok:
        print("a tiling failed its check: not timed")
        return 1
    for (n, k), cfgs in plans.items():
        ws = random_weights(n, k, 32, 64, torch)
        wbf = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) for _ in range(64)]
        fn = ft.partial(ops.int4_matmul, workspace=_workspace(torch, cfgs, n, max(ms)))
        for m in ms:
            x = torch.randn(m, k, device="cuda").half()
            xbf = x.bfloat16()
            outs = [torch.empty(m, n, device="cuda") for _ in ws]

            def cublas(xbf=xbf, wbf=wbf):
                for w in wbf:
                    xbf @ w.t()
            cub = time_op(cublas, calls=64, reps=10)["median_us"]
            print(f"cuBLAS bf16 N={n} K={k} M={m}: {cub:.2f} us", flush=True)
            plan = [("tiled", ops.tiled_config(m, k, 32, n))] + [("package", c) for c in cfgs]
            for bname, cfg in plan:
                tag = "default " if cfg == ops.choose_config(m, k, 32, n) and bname != "tiled" else ""
                label = f"{tag}{bname} N={n} K={k} M={m} cfg={cfg}"
                us = time_rotating(torch, fn, x, ws, outs, cfg, label)
                if us is not None:
                    print(f"{label}: {us:.2f} us, x cuBLAS {cub / us:.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

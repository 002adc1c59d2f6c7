"""Prototype (session 12, not in the package): the fused MoE at T = 1 as grouped GEMVs.

Run on a GPU:  python dev/kernels/moe_t1.py        (check at D=1024, I=512, then time at K2 width)
Offline:       NUMBA_ENABLE_CUDASIM=1 python dev/kernels/moe_t1.py --check

Why: at T = 1 the package's fused_moe (align -> stream-K gate/up -> stream-K down -> combine) runs
95 us against a 52.6 us floor (55%); its stream variant (the same loads, no math) already takes 71
of the 75 us that 70% allows. int4_matmul's M = 1 blocks, many of them resident and not waiting on
each other, stream 3.0-3.4 TB/s (session 11's no-wait runs: (1, 8, 14) at 128 registers 2.45 us per
K2 matrix). Here every (pair, 16-row tile) is one such block, in one launch per GEMM:

  gate_up  grid (2 I/16, P): block (2 tile + half, p) is tile ``tile`` of the gate (half 0) or up
           (half 1) matrix of pair p's expert (the pair layout of prepare_moe), x row = p's token;
           writes gu[p, half I + n] (f32). It reads topk_ids, so it waits first.
  act      h[p, i] = f16(silu(gu[p, i]) * gu[p, I + i]), as the package's gate/up epilogue.
  down     grid (D/16, P): tile of pair p's w2, x = h[p]; y[p, n] = w_p * acc (w = 1 for shared).
           Its weight loads come before its wait: topk_ids is final once act has started (every
           kernel here triggers its dependents only after its own wait).
  combine  the package's (moe_align.make_combine_kernel).

No align, no stream-K, no split sums: each block owns whole outputs. The GEMV body is int4_matmul's
at MT = 1 (one activation row; MMA columns past it read the same row and are never stored).
"""

from __future__ import annotations

import argparse
import functools
import math
import sys

import numpy as np
from numba import cuda, float32, uint16, uint32

from kernels_numba.intrinsics import (
    SIMULATED,
    dequant_i4x8,
    f32_to_h2,
    griddep_launch_dependents,
    griddep_wait,
    h2_to_f32,
    ld_once_v4,
    ld_stream_v4,
    ld_v4,
    mma_16816,
)
from kernels_numba.launch import launch

ZERO = float32(0.0)


@functools.cache
def make_gemv_kernel(K: int, KS: int, CPW: int, GATE_UP: bool, maxreg: int, ONCE: bool = False):
    """One 16-row tile of one expert matrix times one activation row, G = 32, KS * CPW == K / 64.
    ONCE: coherent weight loads (ptxas keeps them before down's wait; offline SASS: 4 of 8 .nc loads
    of down (4, 8) sink past it)."""
    KC = K // 64
    assert KS * CPW == KC, (K, KS, CPW)
    NS = K // 32
    TILE_W = KC * 128
    NRED = KS * 4 * 32
    NWL, NSL = CPW * 4, CPW * 2
    opts = {} if SIMULATED else {"max_registers": maxreg}

    @cuda.jit(**opts)
    def gemv_kernel(out, x, wq, sq, topk_ids, topk_w, n_tok, k_top, n_routed, n16):
        p = cuda.blockIdx.y
        tid = cuda.threadIdx.x
        warp = tid >> 5
        lane = tid & 31
        g = lane >> 2
        t4 = lane & 3
        red = cuda.shared.array(NRED, float32)
        if GATE_UP:
            griddep_wait()                                    # topk_ids may be the previous kernel's
        griddep_launch_dependents()                           # after a wait: ids final for the next ones
        tk = n_tok * k_top
        if p < tk:
            tok = p // k_top
            e = topk_ids[p]
            wgt = topk_w[p]
        else:
            tok = (p - tk) % n_tok
            e = n_routed + (p - tk) // n_tok
            wgt = float32(1.0)
        tile = cuda.blockIdx.x
        mat = (e * n16 + (tile >> 1)) * 2 + (tile & 1) if GATE_UP else e * n16 + tile
        c0 = warp * CPW
        wbase = mat * TILE_W + c0 * 128 + lane * 4
        sbase = (mat * NS + c0 * 2) * 8 + g
        wl = cuda.local.array(NWL, uint32)
        sl = cuda.local.array(NSL, uint32)
        for ci in range(CPW):
            if ONCE:
                w = ld_once_v4(wq, wbase + ci * 128)
            else:
                w = ld_stream_v4(wq, wbase + ci * 128)
            for j in range(4):
                wl[ci * 4 + j] = w[j]
            for j in range(2):
                sl[ci * 2 + j] = sq[sbase + (ci * 2 + j) * 8]
        if not GATE_UP:
            griddep_wait()                                    # h is act's output
        acc = cuda.local.array(4, float32)
        for i in range(4):
            acc[i] = ZERO
        xb = (tok if GATE_UP else p) * K + c0 * 64 + 8 * t4     # x: the token's row / h: the pair's
        for ci in range(CPW):
            for h in range(2):
                a = dequant_i4x8(wl[ci * 4 + 2 * h])
                b = dequant_i4x8(wl[ci * 4 + 2 * h + 1])
                s_lo, s_hi = h2_to_f32(sl[ci * 2 + h])
                xv = ld_v4(x, xb + ci * 64 + 32 * h)
                d = mma_16816(a[0], a[1], a[2], a[3], xv[0], xv[1], ZERO, ZERO, ZERO, ZERO)
                d = mma_16816(b[0], b[1], b[2], b[3], xv[2], xv[3], d[0], d[1], d[2], d[3])
                acc[0] += s_lo * d[0]
                acc[1] += s_lo * d[1]
                acc[2] += s_hi * d[2]
                acc[3] += s_hi * d[3]
        for i in range(4):
            red[(warp * 4 + i) * 32 + lane] = acc[i]
        cuda.syncthreads()
        if tid < 16:                                          # row tid of the tile, activation column 0
            r = 2 * (tid >> 3)
            ln = 4 * (tid & 7)
            s = ZERO
            for w_ in range(KS):
                s += red[(w_ * 4 + r) * 32 + ln]
            if GATE_UP:
                out[p * 2 * n16 * 16 + (tile & 1) * n16 * 16 + (tile >> 1) * 16 + tid] = s
            else:
                out[p * n16 * 16 + tile * 16 + tid] = wgt * s

    return gemv_kernel


@cuda.jit
def act_kernel(h, gu, width):
    """h[p, i] = f16(silu(gate) * up) of gu[p] = [gate (width), up (width)]; grid (width/128, P)."""
    griddep_wait()
    griddep_launch_dependents()
    p = cuda.blockIdx.y
    i = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    if i < width:
        gv = gu[p * 2 * width + i]
        hv = gv / (float32(1.0) + math.exp(-gv)) * gu[p * 2 * width + width + i]
        h[p * width + i] = uint16(f32_to_h2(hv, ZERO) & 0xFFFF)


def make_moe_t1(mw, n_tok, k_top, stream, gu_cfg=(8, 14, 128), dn_cfg=(4, 8, 128)):
    """Buffers and the four launches for ``n_tok`` tokens: returns run(x, ids, tw, out). Configs:
    (warps per block, chunks per warp, register cap[, coherent loads])."""
    from kernels_numba._validate import as_array, empty, flat
    from kernels_numba.moe_align import make_combine_kernel
    d, i = mw.w13.k, mw.w13.n
    p = n_tok * (k_top + mw.n_shared)
    gu = empty(p * 2 * i, np.float32, stream)
    h = empty(p * i, np.uint16, stream)
    y = empty(p * d, np.float32, stream)
    gate_up = make_gemv_kernel(d, *gu_cfg[:2], True, *gu_cfg[2:])
    down = make_gemv_kernel(i, *dn_cfg[:2], False, *dn_cfg[2:])
    combine = make_combine_kernel(d, k_top, mw.n_shared)
    hv = h.view(np.float16)

    def run(x, ids, tw, out, stream=stream):
        x, ids, tw, out = (flat(as_array(a, "arg")) for a in (x, ids, tw, out))
        launch(gate_up, (2 * (i // 16), p), gu_cfg[0] * 32, stream,
               (gu, x, mw.w13.wq, mw.w13.sq, ids, tw, n_tok, k_top, mw.n_routed, i // 16))
        launch(act_kernel, (-(-i // 128), p), 128, stream, (h, gu, i))
        launch(down, (d // 16, p), dn_cfg[0] * 32, stream,
               (y, hv, mw.w2.wq, mw.w2.sq, ids, tw, n_tok, k_top, mw.n_routed, d // 16))
        launch(combine, (-(-d // 128), n_tok), 128, stream, (out, y, n_tok))
    return run


def check(torch=None) -> int:
    """Against workbench.reference.moe at D=1024, I=512, E=16, K=4, T = 1 and 2 (simulator: D=128)."""
    from dataclasses import replace

    from kernels_numba.moe import prepare_moe
    from workbench.config import preset
    from workbench.quant.int4 import gen_quant4
    from workbench.reference.moe import moe, moe_gate
    d, i, e = (128, 64, 6) if SIMULATED else (1024, 512, 16)
    cfg = replace(preset("tiny"), hidden_size=d, moe_intermediate_size=i, n_routed_experts=e,
                  num_experts_per_tok=4, n_group=1, topk_group=1)
    s = cfg.n_shared_experts
    rng = np.random.default_rng(3)
    W, st = {}, {}
    for ex in [*range(e), "shared"]:
        for nm, (n, k) in (("w1", (i, d)), ("w3", (i, d)), ("w2", (d, i))):
            if ex == "shared":
                n, k = (s * n, k) if nm != "w2" else (n, s * k)
            _, pk, sc = gen_quant4(n, k, 32, seed=int(rng.integers(1 << 30)))
            pre = f"layers.0.ffn.experts.{ex}" if ex != "shared" else "layers.0.ffn.shared"
            W[f"{pre}.{nm}.packed"], W[f"{pre}.{nm}.scale"] = pk, sc
            st.setdefault((ex == "shared", nm), []).append((pk, sc))
    W["layers.0.ffn.gate"] = rng.standard_normal((e, d)).astype(np.float32) * 0.05
    W["layers.0.ffn.gate_bias"] = rng.standard_normal(e).astype(np.float32) * 0.01

    def stk(nm, j):
        return np.stack([t_[j] for t_ in st[(False, nm)]])
    shared = [a for nm in ("w1", "w3", "w2") for a in st[(True, nm)][0]]
    mw = prepare_moe(stk("w1", 0), stk("w1", 1), stk("w3", 0), stk("w3", 1), stk("w2", 0), stk("w2", 1),
                     shared=shared)
    if not SIMULATED:
        mw = mw.to_device()
    cfgs = ((2, 1, 128), (1, 1, 128, True)) if SIMULATED else ((8, 2, 128), (4, 2, 128, True))
    bad = 0
    for t in (1, 2):
        x = rng.standard_normal((t, d)).astype(np.float16)
        idx, w = moe_gate(cfg, x.astype(np.float32), W["layers.0.ffn.gate"], W["layers.0.ffn.gate_bias"])
        ref = moe(cfg, W, 0, x.astype(np.float32))
        out = np.full((t, d), np.nan, np.float32)
        args = [x, idx.astype(np.int32), w.astype(np.float32), out]
        if not SIMULATED:
            args = [cuda.to_device(a) for a in args]
        make_moe_t1(mw, t, 4, 0, *cfgs)(*args)
        got = out if SIMULATED else args[3].copy_to_host()
        err = float(np.abs(got - ref).max() / np.abs(ref).max())
        bad += not err < 1e-3
        print(f"check moe_t1 T={t}: rel err {err:.2e}", "OK" if err < 1e-3 else "FAIL", flush=True)
    return int(bad > 0)


def time_k2(torch) -> int:
    """T = 1 at K2 width: the package's fused_moe and this prototype at a few tilings, same graph
    timing and routing rotation as ``bench kernels``."""
    from kernels_numba.moe import fused_moe, moe_workspace
    from workbench.bench.kernels_moe import EXPERT_BYTES, graph_of, k2_random_experts, routings, timed_replays
    mw = k2_random_experts(torch)
    t = 1
    id_sets = routings(torch, t, 8, seed=t)
    ids = id_sets[0].clone()
    x = torch.randn(t, mw.w13.k, device="cuda").half()
    tw = torch.rand(t, 8, device="cuda")
    out = torch.empty(t, mw.w13.k, device="cuda")
    ws = moe_workspace(t, 8, mw)

    def on_stream():
        return cuda.external_stream(torch.cuda.current_stream().cuda_stream)
    impls = {"fused_moe (package)": lambda: fused_moe(x, ids, tw, mw, out=out, workspace=ws,
                                                      stream=torch.cuda.current_stream())}
    for gu_cfg, dn_cfg in [((8, 14, 128), (4, 8, 128)), ((16, 7, 128), (4, 8, 128)),
                           ((16, 7, 64), (8, 4, 64)), ((8, 14, 128), (8, 4, 128)),
                           ((8, 14, 128), (4, 8, 128, True)), ((8, 14, 128), (8, 4, 128, True))]:
        run = make_moe_t1(mw, t, 8, 0, gu_cfg, dn_cfg)
        impls[f"moe_t1 gu {gu_cfg} dn {dn_cfg}"] = (lambda run=run: run(x, ids, tw, out, on_stream()))
    floor = None
    for name, fn in impls.items():
        samples, uniq = timed_replays(torch, graph_of(torch, fn), ids, id_sets, 24)
        us = float(np.median(samples))
        if floor is None:
            from workbench.bench.common import copy_bandwidth
            floor = float(np.median(uniq)) * EXPERT_BYTES / (copy_bandwidth() * 1e3)
        print(f"T=1 {name}: {us:.1f} us ({100 * floor / us:.0f}% of the {floor:.1f} us floor)", flush=True)
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--check", action="store_true", help="only the reference check (simulator too)")
    args = ap.parse_args(argv)
    if args.check or SIMULATED:
        return check()
    import torch
    bad = check(torch)
    return bad or time_k2(torch)


if __name__ == "__main__":
    sys.exit(main())

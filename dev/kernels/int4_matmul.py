"""Version ladder for the W4A16 GEMV/GEMM (docs/conventions.md): validate every version, then time them.

Run on a GPU:  python dev/kernels/int4_matmul.py [--quick | --ms M ...] [--ncu | --m16 | --ceiling
                | --timeline DIR | --xs | --paired | --floor [DIR]]
Offline:       NUMBA_ENABLE_CUDASIM=1 python dev/kernels/int4_matmul.py --check
Versions (docs/perf.md has the predictions and measurements of each):
  s0  stream-only: the same 16-byte weight loads and grid, no math (the attainable rate per launch)
  v1  tensor cores, swap A/B (weights = A of mma.m16n8k16), repacked tile layout, one 16-row tile per
      block, KS warps split K, all CPW 16-byte weight loads of a warp issued before use (KB = 1).
  v2  v1 + index math hoisted out of the unrolled loops + K split over KB blocks per tile (atomics).
  v3  v2 + activation fragments loaded in phase 1 too (v2's serial L2 round trips per MMA step);
      split-K partials reduced by the last-arriving block (deterministic, no memset, no atomics on out).
      Slower than v2 (register spills at M=16): reverted.
  v4  v2 without split-K; branch-free inner loop (exact slices, masked activation rows), G = 32 groups
      start their MMA chain at zero (no partial-sum registers).
  v5  v4 launched with programmatic dependent launch (weight loads before griddep_wait), one-pass
      cross-warp sum, row mask only for MT = 1.
  v6  v5 with registers capped at 128 for MT >= 2 (K2 down at M = 16: 4 blocks per SM, one wave
      instead of two; capping MT = 1 too made K2 down M = 1 slower).
  v7  v6 waiting on the XOR of the phase-1 words (griddep_wait_for: ptxas keeps every weight load
      before the wait) where measured faster: K2 down at M = 16 only (PINNED); coherent weight loads
      (ld_once_v4) where measured faster: K2 down at M = 32 only (COHERENT).
      This is the package kernel; --m16 times it beside patched variants (_VARIANTS).
  v8  (snapshot _int4_matmul_v8_snapshot.py.txt) phase 1 copies weights and scales to shared memory
      with cp.async at a 64-register cap, so that grids of the PDL chain are resident together:
      slower; not kept.
  v9  v7 with coherent weight loads (ld_once_v4: unlike .nc loads, ptxas keeps them all before the
      wait without a data dependency), MT = 1 capped at 64 / 80 / 128 registers: slower in the PDL
      chain, faster only without the wait; not kept.
  v10 v9 with x staged in shared memory after the wait at M = 1: slower; not kept.
  v11 v7 dequantizing the first PRE chunks before the wait, no M = 1 row mask (_V11): less work after
      the wait, but the release comes later by as much; not kept.
  v12 (snapshot _int4_matmul_v12xs_snapshot.py.txt, --xs) XS tiles per block, K split over XS
      blocks, so each x fragment serves XS tiles: slower at every tiling; not kept.
  v13 (snapshot _int4_matmul_v13xc_snapshot.py.txt) x staged in shared memory by bulk copies multicast
      to a cluster of XC blocks: correct, no robust gain (the SM's intake of x, not the L2, limits).
  v14 tile pairs (KP = 2 in a 4-tuple config; --paired): each block of a cluster of 2 computes two
      tiles over its half of K, so warp pairs share x through L1; the halves meet by st.async. The
      package's config for gate/up at M = 16 / 32.
  --ceiling, --timeline, --floor: the probes behind docs/perf.md's account of the M = 1 time
      (load-only kernels, global-timer stamps, every weight load served from L2).
The package's choose_config is the winner of the (MT, KS, CPW, KB) sweep below.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import re
import sys

import numpy as np
from numba import cuda, uint32

from kernels_numba.intrinsics import (
    SIMULATED,
    griddep_launch_dependents,
    griddep_wait,
    ld_once_v4,
    ld_stream_v4,
)


@functools.cache
def make_stream_kernel(K, KS, CPW, KB, PDL=False, TAIL=False, FLAT=False, PAD=0, ONCE=False):
    """s0: the weight loads of a K x 16-row tile per block, no math; PDL: with the package's PDL pair
    (next grid may launch at once; wait for the previous one after the loads are issued); TAIL: after
    the wait, one read and one write per block (``out`` holds 1 + blocks words), the least a kernel
    whose input is the previous kernel's output does after its wait. KB blocks split a tile's K: on
    grid y, or with FLAT on x, next to each other in launch order (block b then reads bytes b * tile /
    KB on, as the down tiling does). PAD: words of shared memory per block, to cap blocks per SM.
    ONCE: coherent loads (ld_once_v4). With the .nc loads ptxas hoists the wait above every load
    (offline SASS), so those builds wait before loading."""
    load = ld_once_v4 if ONCE else ld_stream_v4
    KC, TILE_W, NPAD = K // 64, K * 2, max(PAD, 32)

    @cuda.jit
    def stream_kernel(out, wq):
        if PDL:
            griddep_launch_dependents()
        warp, lane = cuda.threadIdx.x >> 5, cuda.threadIdx.x & 31
        bx, by = cuda.blockIdx.x, cuda.blockIdx.y
        tile, kb = (bx // KB, bx % KB) if FLAT else (bx, by)
        c0 = (kb * KS + warp) * CPW
        base = tile * TILE_W + c0 * 128 + lane * 4
        acc = uint32(0)
        for ci in range(CPW):
            if c0 + ci < KC:
                w = load(wq, base + ci * 128)
                acc ^= w[0] ^ w[1] ^ w[2] ^ w[3]
        if PDL:
            griddep_wait()
        if TAIL and cuda.threadIdx.x == 0:
            out[1 + cuda.blockIdx.x + cuda.gridDim.x * cuda.blockIdx.y] = out[0] ^ acc
        elif acc == uint32(0x9E3779B9):          # practically never: keeps the loads alive
            out[0] = acc
        if PAD:
            pad = cuda.shared.array(NPAD, uint32)
            if acc == uint32(0x7F4A7C15):        # practically never: keeps the shared array
                pad[lane] = acc
                out[0] = pad[(lane + 1) & 31]
    return stream_kernel


def random_weights(n, k, gs, count, torch):
    """``count`` random repacked weights on the GPU (random words = random nibbles in any layout)."""
    from kernels_numba.int4_layout import Int4Weight
    n16 = -(-n // 16)
    ws = []
    for _ in range(count):
        wq = torch.randint(-2**31, 2**31 - 1, (n16 * k * 2,), dtype=torch.int32, device="cuda")
        s = (torch.rand(n16 * 16 * (k // gs), device="cuda") * 0.01 + 0.001).half()
        ws.append(Int4Weight(cuda.as_cuda_array(wq).view(np.uint32),
                             cuda.as_cuda_array(s.view(torch.int32)).view(np.uint32), n, k, gs))
    return ws


def check_against_reference(rng, m, n, k, gs, config=None, int4_matmul=None):
    """Real repack of a gen_quant4 weight; returns max |out - ref| / max |ref| (of the package's
    int4_matmul unless another is given)."""
    from kernels_numba import repack_int4
    from workbench.quant.int4 import gen_quant4, int4_linear
    _, packed, scales = gen_quant4(n, k, gs, seed=int(rng.integers(1 << 30)))
    if int4_matmul is None:
        from kernels_numba import int4_matmul
    x = rng.standard_normal((m, k)).astype(np.float16)
    w = repack_int4(packed, scales)
    out = np.full((m, n), np.nan, np.float32)
    if not SIMULATED:                      # the simulator (offline checks of the variants) takes numpy
        w, x_in, out = w.to_device(), cuda.to_device(x), cuda.to_device(out)
    int4_matmul(x if SIMULATED else x_in, w, out=out, config=config)
    ref = int4_linear(x, packed, scales)
    got = out if SIMULATED else out.copy_to_host()
    return float(np.abs(got - ref).max() / np.abs(ref).max())


def configs_for(m, k):
    from kernels_numba.int4_matmul import tiled_config
    mt = tiled_config(m, k)[0]
    kc = k // 64
    out = [tiled_config(m, k)]
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
    ap.add_argument("--m16", action="store_true", help="M = 1 vs 16: the package kernel beside its patched "
                    "variants (_VARIANTS)")
    ap.add_argument("--timeline", metavar="DIR", help="global-timer stamps of every block of 64 chained "
                    "M = 1 launches per _VARIANTS entry and K2 shape; raw stamps saved under DIR")
    ap.add_argument("--check", action="store_true", help="only check every _VARIANTS entry against the "
                    "reference at small shapes (no torch; also in the simulator: NUMBA_ENABLE_CUDASIM=1)")
    ap.add_argument("--xs", action="store_true", help="M = 1 / 16 / 32: the package beside the v12 "
                    "snapshot (XS tiles per block, K split over XS blocks), each checked first")
    ap.add_argument("--paired", action="store_true", help="v14: tile pairs over clusters of 2 (4-tuple "
                    "configs) beside the package's 3-tuple configs, checked first and after the timed chain")
    ap.add_argument("--staged", action="store_true", help="the staged kernel's tilings and variants "
                    "(_STAGED_VARIANTS) at M = 33..64 beside the tiled kernel and cuBLAS bf16, checked first")
    ap.add_argument("--staged-probe", action="store_true", help="the staged kernel at M = 64 with parts "
                    "removed (_STAGED_PROBES, timing only) and with PDL off")
    ap.add_argument("--ceiling", action="store_true", help="per-launch ceilings at M = 1: the load-only "
                    "kernel without and with PDL beside the package kernel")
    ap.add_argument("--floor", metavar="DIR", nargs="?", const="", help="M = 1 with the weights read "
                    "from L2 (_FLOOR, timing only) beside the package, and their timeline (stamps under DIR)")
    args = ap.parse_args(argv)
    if args.check:
        return check_variants()
    import torch
    if args.m16:
        return m16_ratio(torch)
    if args.xs:
        return xs_sweep(torch)
    if args.paired:
        return paired_sweep(torch)
    if args.staged:
        return staged_sweep(torch)
    if args.staged_probe:
        return staged_probe(torch)
    if args.ceiling:
        return ceiling(torch)
    if args.floor is not None:
        return floor_probe(torch, args.floor)
    if args.timeline:
        return timeline(torch, args.timeline)

    from kernels_numba import int4_matmul
    from workbench.bench.common import copy_bandwidth, time_op
    if args.ncu:
        for (n, k) in [(2048, 7168), (7168, 2048)]:
            w = random_weights(n, k, 32, 1, torch)[0]
            for m in (1, 16):
                x = torch.randn(m, k, device="cuda").half()
                for _ in range(3):
                    int4_matmul(x, w)
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
                us = time_rotating(torch, int4_matmul, x, ws, outs, cfg, label)
                if us is not None:
                    gbs = nbytes / (us * 1e-6) / 1e9
                    print(f"{label}: {us:.2f} us {gbs:.0f} GB/s {100 * gbs / copy:.0f}% copy")
    return 0


def ceiling(torch):
    """Per launch, 64 back-to-back over distinct weights in one graph: s0 (loads only), s0 with the
    PDL pair launched with PDL (loads overlap the previous grid, the wait orders the grids as the
    package kernel's does), and that with the least dependent work after the wait, at the package's
    M = 1 tiling and, for gate/up, at smaller blocks that split K over KB blocks per tile (what a
    split-K kernel could reach); each with .nc and with coherent loads (ONCE: only these stay before
    the wait); then the package kernel."""
    from kernels_numba import int4_matmul
    from kernels_numba.launch import launch
    from workbench.bench.common import copy_bandwidth, time_op
    copy = copy_bandwidth()
    print(f"copy {copy:.0f} GB/s")
    count = 64
    tilings = {(7168, 2048): [(4, 8, 1)], (2048, 7168): [(16, 7, 1), (8, 14, 1), (8, 7, 2), (4, 7, 4)]}
    variants = [("s0 loads only", False, False), ("s0 loads only + PDL pair", True, False),
                ("s0 + PDL pair + a read and a write per block after the wait", True, True)]
    # TAIL variant only: gate/up K split over 2 / 4 blocks adjacent in launch order (FLAT), and the
    # down tiling with 46 KB of shared memory per block (<= 4 blocks per SM, as the kernel)
    probes = {(7168, 2048): [(4, 8, 1, False, 46 * 256)],
              (2048, 7168): [(8, 7, 2, True, 0), (4, 7, 4, True, 0)]}
    for (n, k), shape_tilings in tilings.items():
        ws = random_weights(n, k, 32, count, torch)
        nbytes = n * k // 2 + n * (k // 32) * 2
        sink = cuda.device_array(1 + n // 16 * max(t[2] for t in shape_tilings), np.uint32)

        def pct(us, nbytes=nbytes):
            return f"{us:.2f} us, {100 * nbytes / (us * 1e-6) / 1e9 / copy:.0f}% copy"
        runs = [((*t, False, 0), v) for t, v in itertools.product(shape_tilings, variants)] + \
            [(t, variants[2]) for t in probes[(n, k)]]
        for ((ks, cpw, kb, flat, pad), (name, pdl, tail)), once in itertools.product(runs, (False, True)):
            kern = make_stream_kernel(k, ks, cpw, kb, pdl, tail, flat, pad, once)
            grid = (n // 16 * kb, 1) if flat else (n // 16, kb)
            calls = [(kern, grid, ks * 32, (sink, w.wq), pdl) for w in ws]

            def fn(calls=calls):
                st = cuda.external_stream(torch.cuda.current_stream().cuda_stream)
                for kern, grid, block, args, pdl in calls:
                    launch(kern, grid, block, st, args, pdl)
            extra = (" FLAT" if flat else "") + (f" PAD={pad * 4 // 1024} KB" if pad else "")
            print(f"{name} N={n} K={k} KS={ks} CPW={cpw} KB={kb}{extra} {'once' if once else 'nc'}: "
                  f"{pct(time_op(fn, calls=count, reps=10)['median_us'])}")
        x = torch.randn(1, k, device="cuda").half()
        outs = [torch.empty(1, n, device="cuda") for _ in ws]
        us = time_rotating(torch, int4_matmul, x, ws, outs, None, "package")
        print(f"package int4_matmul M=1 N={n} K={k}: {pct(us)}")
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


# textual patches of the package kernel, all launched as the package launches (with PDL); the
# variants measured so far are in docs/perf.md (most patches left with them; v8 in its snapshot):
#   v9 (once, cap C) coherent weight loads (ld_once_v4: ptxas keeps them before the plain wait), no
#                    PIN, MT = 1 capped at C registers (_ONCE + _cap1(C))
#   (no wait)        timing only (back-to-back results race): the grids of the chain do not serialize
#   PIN everywhere   the PIN wait at every config (_PIN_ALL)
#   PRE n            (v11) the first n chunks of each warp's slice dequantized before the wait (the
#                    nibbles do not depend on x); the PIN wait on their XOR keeps them there
#   no mask          MT = 1 without the row-mask ANDs (rows past M are never stored)
#   u32 red          the cross-warp sum indexes shared memory with uint32 (no negative-index
#                    wraparound code)
_ONCE = [("w = ld_stream_v4(wq,", "w = ld_once_v4(wq,"), ("PINNED = {(2, 2048, 4, 8)}", "PINNED = set()")]
_NOWAIT = [("            griddep_wait()\n", "            pass\n"), _ONCE[1]]
_PIN_ALL = [("PIN = EXACT and G == 32 and (MT, K, KS, CPW) in PINNED", "PIN = EXACT")]
_NOMASK = [("MASK = MT == 1 ", "MASK = False ")]
_RED_U32 = [("            red[(warp * NACC + i) * 32 + lane] = acc[i]\n",
             "            red[uint32((warp * NACC + i) * 32 + lane)] = acc[i]\n"),
            ("                s += red[(w_ * NACC + (o >> 5)) * 32 + (o & 31)]\n",
             "                s += red[uint32(o) + uint32(w_ * NACC * 32)]\n")]


def _cap1(c):
    return [("min(128 if MT > 1 else 255, 65536", f"min(128 if MT > 1 else {c}, 65536")]


def _pre(n):
    dq_a = "                    a = dequant_i4x8(wl[ci * 4 + 2 * h])\n"
    dq_b = "                    b = dequant_i4x8(wl[ci * 4 + 2 * h + 1])\n"
    pin_xor = "            for j in range(NSL):\n                pin ^= sl[j]\n"
    nsl = "    NSL = CPW * SPC "
    return _PIN_ALL + [
        ("@functools.cache\n", f"PRE_CHUNKS = {n}\n\n\n@functools.cache\n"),
        (nsl, "    PRE = min(PRE_CHUNKS, CPW)\n    NDQ = max(PRE * 16, 1)\n" + nsl),
        ("        if PIN:", "        dq = cuda.local.array(NDQ, uint32)\n"
                          "        for ci in range(PRE):\n"
                          "            for q in range(4):\n"
                          "                d4 = dequant_i4x8(wl[ci * 4 + q])\n"
                          "                for j in range(4):\n"
                          "                    dq[ci * 16 + q * 4 + j] = d4[j]\n"
                          "        if PIN:"),
        (pin_xor, pin_xor + "            for j in range(PRE * 16):\n                pin ^= dq[j]\n"),
        (dq_a + dq_b, "                    if ci < PRE:\n"
                      "                        o = ci * 16 + 8 * h\n"
                      "                        a = (dq[o], dq[o + 1], dq[o + 2], dq[o + 3])\n"
                      "                        b = (dq[o + 4], dq[o + 5], dq[o + 6], dq[o + 7])\n"
                      "                    else:\n    " + dq_a + "    " + dq_b)]


# v11: PRE n + no mask at a 128-register cap; less post-wait work, but the wait releases later (the
# dequantization sits in the block's life before it), so no gain per launch: not kept
# _CAPS: register caps where 2 grids fit per SM, for --timeline
_V11 = {**{f"v11 (PRE {n}, no mask)": _pre(n) + _cap1(128) + _NOMASK for n in (3, 5, 6)},
        "v11 (PRE 5, no mask, u32 red)": _pre(5) + _cap1(128) + _NOMASK + _RED_U32}
_CAPS = {"v9 (once, cap 128)": _ONCE + _cap1(128), "v9 (once, cap 64)": _ONCE + _cap1(64),
         "v7 (cap 128)": _cap1(128)}
# x traffic (timing only, results wrong): every block reads all of x for its rows, so at M = 16 the L2
# serves 128 x 229 KB = 29 MB of x per gate launch beside 8.3 MB of weights; aliased, every x read
# falls in the first 4 KB of x (L1 hits)
_XALIAS = [("xb[mt] = min(m, m_rows - 1) * K + c0 * 64 + 8 * t",
            "xb[mt] = (min(m, m_rows - 1) * K + c0 * 64 + 8 * t) & 1023")]
# v7 beside v7 with coherent weight loads at M = 1..64 (where COHERENT came from)
_VARIANTS = {"v7": [], "v7 once": _ONCE}
# --timeline configs per K2 shape: the package's, and tilings where 2 grids fit per SM at a cap
_TIMELINE_CFGS = {(2048, 7168): [(1, 16, 7), (1, 8, 14)], (7168, 2048): [(1, 4, 8), (1, 8, 4)]}


def _variant_impls(extra=(), variants=None, source=None):
    """``variants`` (default ``_VARIANTS``; each followed by the patches ``extra``) applied to
    ``source`` (default the package module's source): {name: int4_matmul of that variant}."""
    from pathlib import Path

    import kernels_numba.int4_matmul  # noqa: F401 - the module (the package's name is the function)
    src = source or Path(sys.modules["kernels_numba.int4_matmul"].__file__).read_text()
    impls = {}
    for name, patches in (_VARIANTS if variants is None else variants).items():
        text = src
        for old, new in [*patches, *extra]:
            assert old in text, (name, old)
            text = text.replace(old, new)
        impls[name] = _module_from("_int4_matmul_" + re.sub(r"\W", "_", name), text).int4_matmul
    return impls


def check_print(rng, name, m, n, k, cfg, fn) -> bool:
    """One check_against_reference line; True if it passed."""
    err = check_against_reference(rng, m, n, k, 32, cfg, fn)
    print(f"check {name} M={m} N={n} K={k} cfg={cfg}: rel err {err:.2e}", "OK" if err < 1e-4 else "FAIL")
    return err < 1e-4


def time_plans(torch, impls, plans, runs=lambda name, cfg: True, compare=False):
    """Per K2 shape of ``plans`` ({(N, K): [(M, config), ...]}) 64 random weights, then every
    implementation ``runs`` allows at every (M, config), timed over them back to back; ``compare``:
    each timed chain's outputs (NaN before it) against the package default's."""
    from kernels_numba import int4_matmul
    for (n, k), plan in plans.items():
        ws = random_weights(n, k, 32, 64, torch)
        for m, cfg in plan:
            x = torch.randn(m, k, device="cuda").half()
            if compare:
                ref = torch.stack([torch.zeros(m, n, device="cuda") for _ in ws])
                for w, r in zip(ws, ref, strict=True):
                    int4_matmul(x, w, out=r)
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


# --timeline: thread 0 of every block stamps the global timer at its start, after the wait and at its
# end into out[3 * tile ...] (ns mod 2**24, exact in float32); the outputs are then not stored (a
# never-true test keeps the math), so the stamps are the only writes
_WAITED = "            for mt in range(MT):\n                m = m0 + mt * 8 + g\n"    # after the wait
_START = "        m0 = cuda.blockIdx.y * (8 * MT) "
_STAMPS = [(_START, "        t_start = globaltimer()\n" + _START),
           (_WAITED, "            t_wait = globaltimer()\n" + _WAITED),
           ("                out[m * n_rows + n] = s\n",
            "                if s == float32(1.2345e-30):\n                    out[m * n_rows + n] = s\n"
            "        if tid == 0:\n            t_end = globaltimer()\n"
            "            out[tile * 3] = float32(t_start & 0xFFFFFF)\n"
            "            out[tile * 3 + 1] = float32(t_wait & 0xFFFFFF)\n"
            "            out[tile * 3 + 2] = float32(t_end & 0xFFFFFF)\n"),
           ("    griddep_wait_for,\n", "    griddep_wait_for,\n    globaltimer,\n")]


def timeline(torch, out_dir=None):
    """Per _VARIANTS entry and K2 shape, 64 M = 1 launches in one graph with the global-timer stamps
    of _STAMPS: when each grid's blocks start, pass the wait and end, relative to the grid before it."""
    import os
    stamps = {}
    for (n, k), cfgs in _TIMELINE_CFGS.items():
        for cfg in cfgs:
            stamps.update(timeline_shape(torch, n, k, cfg))
    if out_dir:                                               # [launch, block, start / wait / end] ns
        np.savez_compressed(os.path.join(out_dir, "timeline.npz"), **stamps)
    return 0


def timeline_shape(torch, n, k, cfg, variants=None):
    count, tiles = 64, n // 16
    ws = random_weights(n, k, 32, count, torch)
    x = torch.randn(1, k, device="cuda").half()
    outs = [torch.zeros(1, n, device="cuda") for _ in range(count)]
    stamps = {}
    for name, fn in _variant_impls(_STAMPS, variants).items():
        us = time_rotating(torch, fn, x, ws, outs, cfg, name)   # the last replay's stamps stay in outs
        if us is None:
            continue
        raw = np.stack([o[0, :3 * tiles].cpu().numpy().reshape(tiles, 3) for o in outs]).astype(np.int64)
        t = (raw - raw[0, :, 0].min()) % (1 << 24)                # ns since the first block's start
        start, wait, end = t[..., 0], t[..., 1], t[..., 2]        # [launch, block]
        mid = slice(8, count - 8)
        d = {"per launch (median us/launch)": us,
             "grid end to next grid end": np.diff(end.max(1))[mid],
             "first block start after previous grid end": (start.min(1)[1:] - end.max(1)[:-1])[mid],
             "last block start after previous grid end": (start.max(1)[1:] - end.max(1)[:-1])[mid],
             "first wait release after previous grid end": (wait.min(1)[1:] - end.max(1)[:-1])[mid],
             "last wait release after previous grid end": (wait.max(1)[1:] - end.max(1)[:-1])[mid],
             "block start to wait release (mean)": (wait - start).mean(1)[mid],
             "wait release to block end (mean)": (end - wait).mean(1)[mid],
             "first wait release to grid end": (end.max(1) - wait.min(1))[mid],
             "# blocks started before the previous grid's end":
                 (start[1:] < end.max(1)[:-1, None]).sum(1)[mid],
             "# blocks started before the previous grid's last release":
                 (start[1:] < wait.max(1)[:-1, None]).sum(1)[mid]}
        print(f"== {name} N={n} K={k} {cfg}")
        for key, v in d.items():
            if key.startswith("#"):
                print(f"  {key[2:]}: {np.median(v):.0f} of {tiles}")
            else:
                print(f"  {key}: {np.median(v) / (1 if key.startswith('per') else 1000):.2f} us")
        stamps[f"{n}x{k}_{'_'.join(map(str, cfg))}_" + re.sub(r"\W", "_", name)] = t
    return stamps


def _module_from(name, text):
    mod = type(sys)(f"kernels_numba.{name}")
    mod.__package__ = "kernels_numba"
    sys.modules[mod.__name__] = mod                       # dataclasses look their module up
    exec(compile(text, f"<{name}>", "exec"), mod.__dict__)
    return mod


def check_variants() -> int:
    """Every _VARIANTS entry against the reference at M = 1 / 3 / 16, one 16-row tile or two, K = 1024
    (slices of 8 and 4 chunks, so PRE also covers all chunks of a slice); 1 if any fails."""
    rng = np.random.default_rng(11)
    bad = 0
    for name, fn in _variant_impls().items():
        for m, n, k, cfg in [(1, 16, 1024, (1, 2, 8)), (3, 32, 1024, (1, 4, 4)), (16, 16, 1024, (2, 2, 8))]:
            bad += not check_print(rng, name, m, n, k, cfg, fn)
    return int(bad > 0)


def m16_ratio(torch):
    """M = 1 vs 16 (and 32, 64) on both K2 shapes, one run over the same 64 weights per shape: the
    package kernel and its patched variants (``_VARIANTS``) at the tunings that matter, each checked
    first."""
    impls = _variant_impls()
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


# --xs (v12, not kept): XS tiles of 16 rows per block, K split over XS blocks, so that x is read once
# per XS tiles; the group's last block sums the XS partial tiles in K order (a scratch buffer and
# counters). Snapshot _int4_matmul_v12xs_snapshot.py.txt (3- or 4-tuple configs); its XS > 1 builds
# have every .nc weight load after the wait (offline SASS), so they are also timed pinned (PIN at
# XS > 1) and with coherent loads (_ONCE)
_PIN_XS = [("XS == 1 and (MT, K, KS, CPW) in PINNED", "(XS > 1 or (MT, K, KS, CPW) in PINNED)")]
_XS_PLANS = {(2048, 7168): [(1, None), (16, None), (16, (2, 14, 4, 2)), (16, (2, 28, 2, 2)),
                            (32, None), (32, (4, 14, 4, 2))],
             (7168, 2048): [(1, None), (16, None), (16, (2, 4, 4, 2)), (16, (2, 8, 2, 2)),
                            (32, None), (32, (4, 4, 4, 2))]}


def xs_sweep(torch):
    """_XS_PLANS: the package kernel beside the v12 snapshot (as is, pinned, coherent loads), over the
    same 64 weights per shape, each checked against the reference first."""
    from pathlib import Path

    from kernels_numba import int4_matmul
    snap = Path(__file__).with_name("_int4_matmul_v12xs_snapshot.py.txt").read_text()
    once = [*_ONCE, ("    ld_stream_v4,\n", "    ld_once_v4,\n    ld_stream_v4,\n")]   # its imports lack it
    impls = {"package": int4_matmul,
             **_variant_impls(variants={"v12": [], "v12 pin": _PIN_XS, "v12 once": once}, source=snap)}

    def runs(name, cfg):                                  # XS configs exist only in the snapshot
        return cfg is None or name != "package"
    rng = np.random.default_rng(12)
    for (n, k), plan in _XS_PLANS.items():
        for m, cfg in plan:
            for name, fn in impls.items():
                if runs(name, cfg):
                    check_print(rng, name, max(m - 3, 1), n, k, cfg, fn)   # odd M inside the bucket
    time_plans(torch, impls, _XS_PLANS, runs)
    return 0


# --paired: v14 = tile pairs (KP = 2 in a 4-tuple config): block b of a cluster of 2 computes tiles
# b & ~1 and (b & ~1) + 1 over half b & 1 of K, so warps w and w + KS / 2 read the same x (the second
# from L1) and each SM takes in half of x; the halves meet through distributed shared memory. (v13's
# snapshot, _int4_matmul_v13xc_snapshot.py.txt, needs the mbarrier / bulk-copy intrinsics of commit
# 1c0b1d3.)
_PAIRED_PLANS = {(2048, 7168): [(1, (1, 16, 7)), (16, (2, 16, 7)), (16, (2, 16, 7, 2)), (32, None),
                                (32, (4, 16, 7, 2))],
                 (7168, 2048): [(16, (2, 4, 8)), (16, (2, 8, 4, 2))]}
# paired configs with coherent weight loads (which ptxas keeps before the wait; the paired gate build
# has most of its .nc weight loads after it, offline SASS)
_PAIRED_ONCE = [("ONCE = G == 32 and (MT, K, KS, CPW) in COHERENT",
                  "ONCE = G == 32 and (KP > 0 or (MT, K, KS, CPW) in COHERENT)")]


def paired_sweep(torch):
    """_PAIRED_PLANS: the package and (paired configs only) _PAIRED_ONCE, each config checked against
    the reference (odd M inside its bucket), timed over 64 weights back to back, and its chained
    outputs then compared with the package default's."""
    from kernels_numba import int4_matmul
    impls = {"package": int4_matmul, **_variant_impls(variants={"paired once": _PAIRED_ONCE})}

    def runs(name, cfg):
        return name == "package" or (cfg is not None and len(cfg) == 4)
    rng = np.random.default_rng(14)
    for (n, k), plan in _PAIRED_PLANS.items():
        for m, cfg in plan:
            for name, fn in impls.items():
                if runs(name, cfg):
                    for mm in sorted({m, max(m - 3, 1)}):
                        check_print(rng, name, mm, n, k, cfg, fn)
    time_plans(torch, impls, _PAIRED_PLANS, runs, compare=True)
    return 0


# --staged: int4_staged.py's tilings (MT, NT, S, PW, PX) per K2 shape, beside the tiled kernel's config
# for the same rows and cuBLAS bf16
def _staged_plans():
    from kernels_numba.int4_staged import Staged
    # the tilings the v19 ladder kept an eye on (docs/perf.md; the rest are in its logs)
    # the first of each: the package's default (choose_config at M = 64; --staged-probe times it)
    gu = [Staged(4, 4, 8, 4, 4), Staged(4, 8, 8, 4, 4), Staged(8, 8, 8, 4, 3), Staged(4, 8, 8, 2, 2)]
    dn = [Staged(4, 4, 1, 4, 4), Staged(4, 8, 2, 4, 4), Staged(8, 8, 2, 4, 3), Staged(4, 4, 2, 4, 4)]
    return {(2048, 7168): gu, (7168, 2048): dn}


_STAGED_VARIANTS = {}                                     # patches of int4_staged.py: none pending


def _workspace(torch, cfgs, n, m=64):
    """A split-K workspace (torch tensors) for M rows of N outputs at any of ``cfgs``."""
    import kernels_numba.int4_staged as st
    from kernels_numba.int4_matmul import GemmWorkspace
    words, cells = (max(v) for v in zip(*(st.partials(c, -(-n // 16), -(-m // (8 * c.mt))) for c in cfgs),
                                        strict=True))
    return GemmWorkspace(torch.zeros(max(words, 1), device="cuda"),
                         torch.zeros(max(cells, 1), dtype=torch.int32, device="cuda"))


def _staged_builds(variants):
    """{name: make_int4_staged_kernel}: the package's and each of ``variants`` (patches of int4_staged.py)."""
    from pathlib import Path

    import kernels_numba.int4_staged as st
    src = Path(st.__file__).read_text()
    builds = {"package": st.make_int4_staged_kernel}
    for name, patches in variants.items():
        text = src
        for old, new in patches:
            assert old in text, (name, old)
            text = text.replace(old, new)
        builds[name] = _module_from("_staged_" + re.sub(r"\W", "_", name), text).make_int4_staged_kernel
    return builds


def staged_sweep(torch, ms=(33, 48, 64)):
    """Per K2 shape and M: cuBLAS bf16, the tiled kernel and every staged tiling of _staged_plans in the
    package's build and each _STAGED_VARIANTS build, each build checked against the reference first."""
    import functools as ft

    import kernels_numba.int4_staged as st
    from kernels_numba import int4_matmul
    from kernels_numba.int4_matmul import choose_config, tiled_config
    from workbench.bench.common import time_op
    im = sys.modules["kernels_numba.int4_matmul"]            # (the package's name is the function)
    builds = _staged_builds(_STAGED_VARIANTS)
    rng = np.random.default_rng(15)
    ok = True
    for bname, make in builds.items():
        im.make_int4_staged_kernel = make
        for (n, k), cfgs in _staged_plans().items():
            for i, cfg in enumerate(cfgs):
                for m in (64, 37, 100) if i == 0 else (64, 37):
                    ok &= check_print(rng, bname, m, n, k, cfg, int4_matmul)
    im.make_int4_staged_kernel = st.make_int4_staged_kernel
    if not ok:
        print("a staged build failed its check: not timed")
        return 1
    for (n, k), cfgs in _staged_plans().items():
        ws = random_weights(n, k, 32, 64, torch)
        wbf = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) for _ in range(64)]
        fn = ft.partial(int4_matmul, workspace=_workspace(torch, cfgs, n, max(ms)))
        for m in ms:
            x = torch.randn(m, k, device="cuda").half()
            xbf = x.bfloat16()
            outs = [torch.empty(m, n, device="cuda") for _ in ws]

            def cublas(xbf=xbf, wbf=wbf):
                for w in wbf:
                    xbf @ w.t()
            cub = time_op(cublas, calls=64, reps=10)["median_us"]
            print(f"cuBLAS bf16 N={n} K={k} M={m}: {cub:.2f} us", flush=True)
            plan = [("tiled", tiled_config(m, k, 32, n))] + [(b, c) for b in builds for c in cfgs]
            for bname, cfg in plan:
                im.make_int4_staged_kernel = builds.get(bname, st.make_int4_staged_kernel)
                tag = "default " if cfg == choose_config(m, k, 32, n) and bname != "tiled" else ""
                label = f"{tag}{bname} N={n} K={k} M={m} cfg={cfg}"
                us = time_rotating(torch, fn, x, ws, outs, cfg, label)
                if us is not None:
                    print(f"{label}: {us:.2f} us, x cuBLAS {cub / us:.2f}", flush=True)
            im.make_int4_staged_kernel = st.make_int4_staged_kernel
    return 0


# --staged-probe (timing only, results wrong): where the staged kernel's time goes, each probe one part
# of int4_staged.py's chunk loop or epilogue taken out
_STAGED_PROBES = {
    "no x copies": [("                    cp_async16(sm, at, x, (m0 + r) * K + (c0 + c) * 64 + 8 * j)\n",
                     "                    pass\n")],
    "no weight copies": [("            b = c % PW\n            cp_async16(sm, W0",
                          "            return\n            b = c % PW\n            cp_async16(sm, W0")],
    "no math": [("            for h in range(2):\n                a = dequant_i4x8(wa[2 * h])",
                 "            for h in range(0):\n                a = dequant_i4x8(wa[2 * h])")],
    "no split sums": [("    SPLIT = S > 1\n", "    SPLIT = False\n")],
    "no syncthreads in the loop": [
        ("            cuda.syncthreads()                                # everyone's", "            #")],
}


def staged_probe(torch, m=64):
    import kernels_numba.int4_staged as st
    im = sys.modules["kernels_numba.int4_matmul"]            # (the package's name is the function)
    from kernels_numba import int4_matmul
    from workbench.bench.common import time_op
    builds = _staged_builds(_STAGED_PROBES)
    for (n, k), cfgs in _staged_plans().items():
        ws = random_weights(n, k, 32, 64, torch)
        cfg = cfgs[0]
        work = _workspace(torch, [cfg], n)
        x = torch.randn(m, k, device="cuda").half()
        outs = [torch.empty(m, n, device="cuda") for _ in ws]
        for (name, make), pdl in itertools.product(builds.items(), (True, False)):
            im.make_int4_staged_kernel = make
            name = name if pdl else f"{name}, PDL off"

            def fn(pdl=pdl, x=x, ws=ws, outs=outs, cfg=cfg, work=work):
                s_ = torch.cuda.current_stream()
                for i in range(len(ws)):
                    int4_matmul(x, ws[i], out=outs[i], stream=s_, config=cfg, pdl=pdl, workspace=work)
            try:
                us = time_op(fn, calls=len(ws), reps=10)["median_us"]
                print(f"{name} N={n} K={k} M={m} cfg={cfg}: {us:.2f} us", flush=True)
            except Exception as e:  # noqa: BLE001 - a probe that does not build is reported
                print(f"{name} N={n} K={k} M={m} cfg={cfg}: failed {type(e).__name__}: {str(e)[:120]}")
            finally:
                im.make_int4_staged_kernel = st.make_int4_staged_kernel
    return 0


# --floor (timing only, results wrong): what the dependent M = 1 chain costs with DRAM out
# of the way. "weights from L2": every weight and scale load aliased into the first 4 KB of wq / sq
# (one more AND per load; the loads hit L2), so a launch is the wait's release, the post-wait work and
# the blocks' spread; "no dequant": the MMAs take the raw weight words (4 LOP3 + SHR + 4 HFMA2 fewer
# per word)
_WALIAS = [("w = ld_stream_v4(wq, wbase + ci * 128)", "w = ld_stream_v4(wq, (wbase + ci * 128) & 1023)"),
           ("sl[ci * SPC + j] = sq[sbase + ((ci * 64) // G + j) * 8]",
            "sl[ci * SPC + j] = sq[(sbase + ((ci * 64) // G + j) * 8) & 1023]")]
_NODQ = [("a = dequant_i4x8(wl[ci * 4 + 2 * h])",
          "wa = wl[ci * 4 + 2 * h]\n" + " " * 24 + "a = (wa, wa, wa, wa)"),
         ("b = dequant_i4x8(wl[ci * 4 + 2 * h + 1])",
          "wb = wl[ci * 4 + 2 * h + 1]\n" + " " * 24 + "b = (wb, wb, wb, wb)")]
_FLOOR_STAMPED = {"v7": [], "v7 weights from L2": _WALIAS}          # also timelined
_FLOOR = {**_FLOOR_STAMPED, "v7 weights from L2, no wait": _WALIAS + _NOWAIT,
          "v7 weights from L2, no dequant": _WALIAS + _NODQ, "v7 no dequant": _NODQ}


def floor_probe(torch, out_dir=None):
    """_FLOOR at the package's M = 1 configs, timed over 64 weights back to back, then the timeline of
    v7 and v7 weights from L2 (where the per-launch time goes without DRAM traffic)."""
    import os
    impls = _variant_impls(variants=_FLOOR)
    plans = {(2048, 7168): [(1, (1, 16, 7))], (7168, 2048): [(1, (1, 4, 8))]}
    time_plans(torch, impls, plans)
    stamps = {}
    for (n, k), plan in plans.items():
        stamps.update(timeline_shape(torch, n, k, plan[0][1], _FLOOR_STAMPED))
    if out_dir:
        np.savez_compressed(os.path.join(out_dir, "timeline_floor.npz"), **stamps)
    return 0


if __name__ == "__main__":
    sys.exit(main())

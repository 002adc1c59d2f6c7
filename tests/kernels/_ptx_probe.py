"""Run WITHOUT the simulator (subprocess of test_compile_ptx.py): compile every shipped kernel for sm_90
with cuda.compile_ptx (no GPU or driver needed) and print one JSON object of instruction counts.

    python tests/kernels/_ptx_probe.py [GROUP ...]      # GROUPS below; none: all
"""

import json
import sys

from numba import config, cuda
from numba import types as T

from kernels_numba.blockops import KS, TPB
from kernels_numba.draft_attention import QB as DRAFT_QB
from kernels_numba.draft_attention import make_draft_attention
from kernels_numba.int4_matmul import choose_config, make_int4_matmul_kernel, tiled_config, wgmma_config
from kernels_numba.int4_staged import make_int4_staged_kernel
from kernels_numba.int4_wgmma import make_int4_wgmma_kernel
from kernels_numba.intrinsics import stored_as
from kernels_numba.mla import make_mla_core_bf16, mla_prep_kernel, q_rope_kernel, softmax16_kernel
from kernels_numba.mla_flash import CS as FLASH_CS
from kernels_numba.mla_flash import make_flash_mla
from kernels_numba.moe import choose_moe_config, stream_k_config
from kernels_numba.moe_align import make_align_kernel, make_combine_kernel
from kernels_numba.moe_gemm import make_moe_gemm_kernel
from kernels_numba.moe_gemv import make_moe_gemv_kernel, moe_act_kernel
from kernels_numba.persistent import make_persistent_swiglu
from kernels_numba.resources import sm90_build
from kernels_numba.rmsnorm import norm_slices, rmsnorm_kernel
from kernels_numba.router import SLICE_WARPS, logit_slices_f16_kernel, logit_slices_kernel, make_route
from kernels_numba.rows import add_rows_kernel, to_f16_kernel
from kernels_numba.tokens import argmax_kernel, argmax_slices
from kernels_numba.w16a16 import Groups, make_norm_rows_kernel, make_w16a16_kernel, w16_tiling

KEYS = {"mma": "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32",
        "mma_bf16": "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32", "cvt_bf16x2": "cvt.rn.bf16x2.f32",
        "ldg_nc_v4": "ld.global.nc.L1::no_allocate.v4.u32",
        "ldg_v4": "ld.global.v4.u32", "ldg_once_v4": "ld.global.L1::no_allocate.v4.u32",
        "lop3": "lop3.b32", "hfma2": "fma.rn.f16x2", "local": ".local",
        "atom_shared": "atom.shared", "bar": "bar.sync", "pdl_wait": "griddepcontrol.wait",
        "pdl_wait_for": "@!p griddepcontrol.wait", "pdl_launch": "griddepcontrol.launch_dependents",
        "st_async": "st.async.shared::cluster", "lds_v4": "ld.shared.v4.u32",
        "cp_async": "cp.async.cg.shared.global", "atom_global": "atom.global.add",
        "ld_cg": "ld.global.cg.f32",
        "mbar_wait": "mbarrier.try_wait", "cvt_f16": "cvt.rn.f16.f32", "cvt_bf16": "cvt.rn.bf16.f32",
        "fma_f32": "fma.rn.f32", "bar_warp": "bar.warp.sync", "shfl_bfly": "shfl.sync.bfly.b32",
        "f64": ".f64", "wgmma": "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16",
        "wgmma_fence": "wgmma.fence.sync.aligned", "wgmma_wait": "wgmma.wait_group.sync.aligned",
        "fence_proxy": "fence.proxy.async.shared::cta", "cp_async4": "cp.async.ca.shared.global",
        "hmul2": "mul.rn.f16x2", "div64": "div.s64", "rem64": "rem.s64",
        "grid_sync": "cudaCGSynchronize,", "prefetch_l2": "cp.async.bulk.prefetch.L2.global"}


@cuda.jit
def _store(out, v):
    """The latent-cache store of mla_prep and store_normed alone (a kernel that calls device functions needs
    a device to compile)."""
    out[0, 0] = stored_as(out, v[0])


def counts(kernel, sig):
    ptx, _ = cuda.compile_ptx(kernel, sig, cc=(9, 0))
    return {k: ptx.count(v) for k, v in KEYS.items()}


def _sig(t):
    return t[::1]


def int4_matmul_builds() -> dict:
    a, out = _sig, {}
    mm_sig = (a(T.float32), a(T.float16), a(T.uint32), a(T.uint32), T.int64, T.int64)
    builds = [(m, k, g) for m, k in ((1, 7168), (16, 7168), (1, 2048), (16, 2048), (32, 2048), (64, 2048),
                                     (3, 1024)) for g in (32, 128)] + [(32, 7168, 32)]
    for m, k, g in builds:
        cfg = tiled_config(m, k, g)
        out[f"int4_matmul M={m} K={k} G={g} {cfg}"] = counts(make_int4_matmul_kernel(k, g, *cfg), mm_sig)
    return out


def int4_staged_builds() -> dict:
    a, out = _sig, {}
    for n, k, g in ((2048, 7168, 32), (7168, 2048, 32), (7168, 2048, 128)):     # M = 64: the staged kernel
        cfg = choose_config(64, k, g, n)
        cnt = T.int32 if cfg.splits > 1 else T.uint32                          # (no split K: sq stands in)
        sig = (a(T.float32), a(T.float16), a(T.uint32), a(T.uint32), a(T.float32), a(cnt), T.int64, T.int64)
        out[f"int4_staged N={n} K={k} G={g} {cfg}"] = counts(
            make_int4_staged_kernel(k, g, cfg.mt, cfg.nt, cfg.splits, cfg.pw, cfg.px), sig)
    return out


def int4_wgmma_builds() -> dict:
    """The wgmma kernel (sm_90a) at wgmma_config for both K2 shapes and both scale modes, and down at
    G = 128: instruction counts and what ptxas makes of it, with whether it serialized the wgmma
    (a C7510 .. C7519 notice: registers of a wgmma in flight touched, waits it inserted)."""
    a, out = _sig, {}
    for n, k, g, pre in ((2048, 7168, 32, False), (2048, 7168, 32, True), (7168, 2048, 32, False),
                         (7168, 2048, 32, True), (7168, 2048, 128, False)):
        cfg = wgmma_config(k, n, pre)
        cnt = T.int32 if cfg.splits > 1 else T.uint32
        sig = (a(T.float32), a(T.float16), a(T.uint32), a(T.uint32), a(T.float32), a(cnt), T.int64, T.int64)
        b = sm90_build(make_int4_wgmma_kernel(k, g, cfg.mt, cfg.wg, cfg.splits, cfg.pw, cfg.px, pre), sig)
        c = {key: b.ptx.count(v) for key, v in KEYS.items()}
        c.update(registers=b.registers, spill=b.spill_bytes, fits=b.fits(cfg.nt * 32),
                 serialized=any(f"C751{d}" in b.log for d in range(10)))
        out[f"int4_wgmma N={n} K={k} G={g} {cfg}"] = c
    return out


def moe_gemm_builds() -> dict:
    a, out = _sig, {}
    gsig = (a(T.uint16), a(T.float16), a(T.uint32), a(T.uint32), a(T.int32), a(T.int32), a(T.int32),
            a(T.float32), T.int64, T.int64, a(T.float32), a(T.int32), a(T.int32), T.int64)
    cfg = stream_k_config(7168, 2048, tokens=64)      # stream-K serves G != 32 (G = 32 takes moe_gemv):
    dsig = (a(T.float32), a(T.uint16)) + gsig[2:]       # its down GEMM at G = 128 (one build: ~20 s)
    out["moe down"] = counts(make_moe_gemm_kernel(2048, 7168, 128, False, *cfg["dn"], cfg["maxreg"]), dsig)
    return out


def moe_glue_builds() -> dict:
    a, out = _sig, {}
    out["moe align"] = counts(make_align_kernel(385, 512),
                              (a(T.int32), a(T.int32), a(T.int32), a(T.int32), *(T.int64,) * 4,
                               a(T.int32), T.int64, a(T.int32)))
    vsig = (a(T.float32), a(T.float16), a(T.uint32), a(T.uint32), a(T.int32), a(T.float32), a(T.int32),
            *(T.int64,) * 4, a(T.int32), a(T.int32))
    cfg = choose_moe_config(7168, 2048, 1)
    for tiled in (False, True):                             # per pair (T <= 8) and over expert tiles
        name = "moe gemv tiled" if tiled else "moe gemv"
        for stage, k, tiling, up in (("gate_up", 7168, cfg["gu"], True), ("down", 2048, cfg["dn"], False)):
            out[f"{name} {stage}"] = counts(make_moe_gemv_kernel(k, *tiling, up, cfg["maxreg"], tiled), vsig)
        glu = make_moe_gemv_kernel(7168, 16, 7, True, cfg["maxreg"], tiled, True)   # gate/up forms h
        out[f"{name} gate_up glu"] = counts(glu, (a(T.uint16), *vsig[1:]))
    out["moe act"] = counts(moe_act_kernel, (a(T.uint16), a(T.float32), T.int64))
    csig = (a(T.float32), a(T.float32), T.int64, a(T.int32), T.int64, a(T.float32))   # out, y, n_tok, ids,
    out["moe combine"] = counts(make_combine_kernel(7168, 8, 1), csig)                  # n_routed, extra
    out["moe combine + shared"] = counts(make_combine_kernel(7168, 8, 0, True, True), csig)
    return out


def row_builds() -> dict:
    a, out = _sig, {}
    rows2d = T.float32[:, ::1]                               # the engine's [T, N] buffers
    out["rows to_f16"] = counts(to_f16_kernel, (T.uint16[:, ::1], rows2d, a(T.int32)))
    out["rows add"] = counts(add_rows_kernel, (rows2d, rows2d, a(T.int32)))
    for name, lat in (("float32", rows2d), ("bf16", T.int16[:, ::1])):      # the latent cache's two dtypes
        out[f"stored_as {name}"] = counts(_store, (lat, a(T.float32)))
    out["rmsnorm K=7168"] = counts(rmsnorm_kernel, (rows2d, rows2d, a(T.float32), T.float32, a(T.int32)))
    out["argmax"] = counts(argmax_kernel, (a(T.int32), rows2d, a(T.int32)))
    return out


def router_builds() -> dict:
    """The sliced router logits and K2's route kernel over 14 slices (router.py)."""
    f2, i2 = T.float32[:, ::1], T.int32[:, ::1]
    route = make_route(384, 8, 1, 1, True, 2.827, 8, 14)
    sig = (f2, f2, f2, _sig(T.int32))
    return {"router slices": counts(logit_slices_kernel, (*sig, f2)),
            "router slices f16": counts(logit_slices_f16_kernel, (*sig, T.uint16[:, ::1])),
            "route K2": counts(route, (i2, f2, f2, f2, _sig(T.float32), _sig(T.int32)))}


def w16a16_builds() -> dict:
    a, out = _sig, {}
    rows2d = T.float32[:, ::1]
    args = (a(T.float32), a(T.uint32), T.int64, a(T.float32), T.float32)     # x, wq, n_rows, nw, eps
    for k, mt, nt, acc in ((7168, 1, 1, False), (8192, 9, 1, True), (7168, 3, 4, False), (8192, 5, 2, True)):
        ks, cpw, nb = w16_tiling(k)       # a1 at decode, wo at B = 64; NT tiles a block at B = 16 and 32
        out[f"w16a16 K={k} MT={mt} NT={nt}"] = counts(make_w16a16_kernel(k, ks, cpw, nb, mt, nt, acc),
                                               (rows2d, *args))
    ks, cpw, nb = w16_tiling(7168)                # a1 at decode: 132 blocks, two batches in flight a warp
    out["w16a16 K=7168 pipelined"] = counts(make_w16a16_kernel(7168, ks, cpw, nb, 1, 1, False, PIPE=True),
                                            (rows2d, *args))
    normed = make_w16a16_kernel(7168, ks, cpw, nb, 1, 1, False, PIPE=True, NORM=True)   # ... and its RMSNorm
    out["w16a16 K=7168 norm"] = counts(normed, (rows2d, *args))
    ks, cpw, nb = w16_tiling(2048)                # the shared expert's down projection, silu(g) * u read in
    out["w16a16 K=2048 GLU"] = counts(make_w16a16_kernel(2048, ks, cpw, nb, 1, 1, True, True),
                                      (rows2d, *args))
    for name, k, g, o, rnd in (("W_UK", 128, Groups(512, 12288, 192, 576), T.int16[:, ::1], False),   # K2's
                               ("W_UV", 512, Groups(128, 32768, 512, 128), rows2d, True)):   # absorptions
        ks, cpw, nb = w16_tiling(k)          # (bf16 bits into int16 round as they are stored: no ROUND)
        out[f"w16a16 {name}"] = counts(make_w16a16_kernel(k, ks, cpw, nb, 1, 1, False, False, g, rnd),
                                       (o, *args))
    return out


def mla_core_builds() -> dict:
    """The W16A16 attention core's chunk kernel at K2's heads and latent width, 16 and 1 heads a block."""
    a = lambda t, n: T.Array(t, n, "C")                                    # noqa: E731
    sig = (a(T.float32, 4), a(T.int16, 3), a(T.float32, 3), a(T.float32, 3), a(T.int32, 2), a(T.int32, 1),
           a(T.uint8, 2), a(T.int32, 1), T.float32)
    chunks = lambda hg: make_mla_core_bf16(64, 512, 4096, hg)[1]            # noqa: E731
    return {f"mla_core chunks hg={hg}": counts(chunks(hg), sig) for hg in (16, 1)}


def mla_flash_builds() -> dict:
    """The one-pass attention core at K2's shape: its chunk kernel's instruction counts, registers and
    spill at the block it launches with."""
    f1, i1 = _sig(T.float32), _sig(T.int32)
    chunks, combine = make_flash_mla(64, 512, 64)
    sig = (f1, f1, i1, f1, f1, i1, T.uint8[:, ::1], i1, T.float32, T.int32, T.int32, T.int32)
    return {"mla_flash chunks": {**counts(chunks, sig), **fit(chunks, sig, TPB * 4 * FLASH_CS)},
            "mla_flash combine": {**counts(combine, (f1, f1, f1, T.int32)),
                                  **fit(combine, (f1, f1, f1, T.int32), TPB * 4)}}


def persistent_builds() -> dict:
    """The persistent SwiGLU at K2's shared expert and dense MLP, one row tile: instruction counts,
    registers and spill (linked with the device runtime its grid sync calls)."""
    f1, f2, u1 = _sig(T.float32), T.float32[:, ::1], _sig(T.uint32)
    out = {}
    for name, (d, i) in {"shared": (7168, 2048), "dense": (7168, 18432)}.items():
        b = sm90_build(make_persistent_swiglu(d, i, 1, True), (f2, f1, f2, f1, u1, u1, T.int64))
        out[f"persistent {name}"] = {**{k: b.ptx.count(v) for k, v in KEYS.items()}, "registers": b.registers,
                                     "spill": b.spill_bytes, "threads": 256, "fits": b.fits(2 * 256)}
    return out


def fit(kernel, sig, threads: int) -> dict:
    """Registers and spill bytes ptxas gives ``kernel`` for sm_90, with the threads it launches with."""
    b = sm90_build(kernel, sig)
    return {"registers": b.registers, "spill": b.spill_bytes, "threads": threads, "fits": b.fits(threads)}


def launch_fit_builds() -> dict:
    """The kernels of a K2 layer with blocks past 256 threads or many values a thread, at K2's widths and
    the block their wrappers launch: the norms and the argmax on up to 32 warps, mla_prep, the sliced
    router logits (32 gate values a thread), the route kernel and the W16A16 linear at its most row tiles."""
    f2, i1 = T.float32[:, ::1], _sig(T.int32)
    route = make_route(384, 8, 1, 1, True, 2.827, KS, 14)
    ks, cpw, nb = w16_tiling(8192)
    f1, u2 = _sig(T.float32), T.uint16[:, ::1]
    prep = (f2, T.int16[:, ::1], f2, f1, f1, f2, f2, i1, i1, T.int64, T.int64, T.float32)
    return {"rmsnorm K=7168": fit(rmsnorm_kernel, (f2, f2, f1, T.float32, i1), TPB * norm_slices(7168)),
            "mla_prep": fit(mla_prep_kernel, prep, TPB * norm_slices(1536)),
            "argmax V=163840": fit(argmax_kernel, (i1, f2, i1), TPB * argmax_slices(163840)),
            "router slices": fit(logit_slices_kernel, (f2, f2, f2, i1, f2), TPB * SLICE_WARPS),
            "router slices f16": fit(logit_slices_f16_kernel, (f2, f2, f2, i1, u2), TPB * SLICE_WARPS),
            "route K2": fit(route, (T.int32[:, ::1], f2, f2, f2, f1, i1), TPB * KS),
            "softmax16": fit(softmax16_kernel, (T.int16[:, ::1], f2, T.uint8[:, ::1], T.int32, T.float32),
                             TPB * KS),
            "q_rope": fit(q_rope_kernel, (T.int16[:, ::1], f2, f2, f2, i1, i1, *(T.int32,) * 3), TPB),
            "w16a16 K=8192 MT=9": fit(make_w16a16_kernel(8192, ks, cpw, nb, 9, 1, True),
                                      (f2, f1, _sig(T.uint32), T.int64, f1, T.float32), ks * 32),
            **{f"w16a16 K=7168 norm MT={mt}": fit(make_w16a16_kernel(7168, 8, 8, 7, mt, 1, False, PIPE=True,
                                                                     NORM=True),
                                                  (f2, f1, _sig(T.uint32), T.int64, f1, T.float32), 256)
               for mt in (1, 2)},                 # the attention norm folded in, up to ops.FOLD_ROWS
            "norm_rows K=7168": fit(make_norm_rows_kernel(7168, 8), (f2, f1, f1, T.float32, T.int64), 256),
            "draft_attention part d=128": fit(make_draft_attention(128)[0],
                                              (T.float32[:, :, :, ::1], f2, f2, f2, f2, f2, T.int32, i1,
                                               T.float32, T.int32, T.int32), 8 * DRAFT_QB)}


GROUPS = {"int4_matmul": int4_matmul_builds, "int4_staged": int4_staged_builds,
          "int4_wgmma": int4_wgmma_builds, "moe_gemm": moe_gemm_builds,
          "moe_glue": moe_glue_builds, "rows": row_builds, "router": router_builds, "w16a16": w16a16_builds,
          "mla_core": mla_core_builds, "mla_flash": mla_flash_builds, "persistent": persistent_builds,
          "launch_fit": launch_fit_builds}


def main(groups: list[str]) -> None:
    if config.ENABLE_CUDASIM:
        raise SystemExit("must run without NUMBA_ENABLE_CUDASIM")
    unknown = sorted(set(groups) - set(GROUPS))
    if unknown:
        raise SystemExit(f"unknown groups {unknown} (choose from {', '.join(GROUPS)})")
    out = {}
    for g in groups or list(GROUPS):
        out.update(GROUPS[g]())
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main(sys.argv[1:])

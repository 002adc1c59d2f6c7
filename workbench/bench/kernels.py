"""``python -m workbench bench kernels``: W4A16 GEMV/GEMM and fused MoE on the GPU, side by side.

Rows of the CSV (one per case x implementation), all timed with CUDA events on torch's stream:
- matmul at K2 shapes (gate/up 7168 -> 2048, down 2048 -> 7168), M in 1..64: this workbench's
  ``int4_matmul`` through ``kernels_numba.ops.int4_gemm``, the call the engine makes (as shipped, with
  programmatic dependent launch; and with PDL off; where the default is the staged kernel, M = 33..64,
  also the one-tile-per-block kernel and, on an sm_90 GPU, the wgmma kernel with exact and with
  f16-prescaled scales), torch cuBLAS bf16 ``x @ w.t()``, torch tinygemm
  INT4 g32 (``_weight_int4pack_mm``), each rotating over 64 distinct weight matrices (far more than
  the L2) and captured as 64 back-to-back launches in one CUDA graph (time per launch = replay / 64);
  a torch device copy of the same byte count, captured the same way, is the per-launch ceiling.
- fused MoE at the K2 shape (384 experts + 1 shared, top-8, INT4 g32) for T = 1..64 tokens
  (kernels_moe.TOKENS): ``fused_moe`` through ``ops.experts_fused``, the engine's call (4 launches, one
  graph, routing rotated over 8 random sets between replays; its default is the per-pair GEMV path up
  to moe.GEMV_TOKENS tokens, the tiled GEMV path above, and the other paths and stream-K's tilings are
  timed beside it),
  against the floor = (unique experts touched + shared) x 24.77 MB at the copy bandwidth, and
  against an eager torch per-expert loop (tinygemm per projection).
GB/s = bytes the implementation must move (weights + scales + activations + outputs) / median time;
pct_copy = GB/s / copy bandwidth measured in the same run (2 GiB device-to-device copy).
Writes the result set ``kernels_<commit>.csv / .json / .png`` (workbench/results.py).
"""

from __future__ import annotations

import functools
import time
import traceback
from pathlib import Path

import numpy as np

from ..fileio import write_json_atomic
from ..results import result_set, write_csv
from .common import copy_bandwidth, run_metadata, time_op

SHAPES = {"gate_up": (2048, 7168), "down": (7168, 2048)}       # (N, K)
MS = (1, 2, 4, 8, 16, 32, 33, 64)
ROT = 64
G = 32


def _int4_weights(torch, n, k, count):
    """Random repacked weights (random words = random nibbles); the kernels' own tests cover values."""
    from numba import cuda

    from kernels_numba.ops import Int4Weight
    out = []
    for _ in range(count):
        wq = torch.randint(-2**31, 2**31 - 1, (n // 16 * k * 2,), dtype=torch.int32, device="cuda")
        s = (torch.rand(n * (k // G), device="cuda") * 0.004 + 0.001).half()
        out.append(Int4Weight(cuda.as_cuda_array(wq).view(np.uint32),
                              cuda.as_cuda_array(s.view(torch.int32)).view(np.uint32), n, k, G))
    return out


def _tinygemm_weights(torch, n, k, count):
    """tinygemm operands: int4pack of random uint8 [N, K/2] nibbles, (scale, zero=0) bf16 [K/G, N, 2]."""
    packs = []
    for _ in range(count):
        u8 = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, device="cuda")
        sz = torch.zeros(k // G, n, 2, dtype=torch.bfloat16, device="cuda")
        sz[..., 0] = torch.rand(k // G, n, device="cuda") * 0.004 + 0.001
        packs.append((torch.ops.aten._convert_weight_to_int4pack(u8, 8), sz))
    return packs


def _row(case, impl, mode, st, nbytes, copy, **extra):
    gbs = nbytes / (st["median_us"] * 1e-6) / 1e9
    return {"case": case, "impl": impl, "timing": mode, **extra, "median_us": round(st["median_us"], 3),
            "min_us": round(st["min_us"], 3), "max_us": round(st["max_us"], 3), "bytes": int(nbytes),
            "gbs": round(gbs, 1), "pct_copy": round(100 * gbs / copy, 1)}


def _copies(dst, src):
    for d, s in zip(dst, src, strict=True):
        d.copy_(s)


def _impls(torch, m, n, k, x16, w4, wbf, tg, o32):
    """impl name -> (fn making ROT calls, bytes one call must move, the int4_matmul config it runs or
    None)."""
    from kernels_numba import ops
    from kernels_numba.ops import choose_config, gemm_workspace, tiled_config
    xbf = x16.bfloat16()
    work = gemm_workspace(m, [(n, k, G)])

    def numba_int4(pdl=True, config=None, work=work):   # the engine's W4A16 GEMM (ops.swiglu runs it)
        for i in range(ROT):
            ops.int4_gemm(x16, w4[i], o32[i], work, torch.cuda.current_stream(), pdl=pdl, config=config)

    def cublas():
        for i in range(ROT):
            xbf @ wbf[i].t()

    def tinygemm():
        for i in range(ROT):
            torch.ops.aten._weight_int4pack_mm(xbf, tg[i][0], G, tg[i][1])
    act = m * k * 2
    int4_bytes = n * k // 2 + n * (k // G) * 2 + act + m * n * 4
    cfg, tiled = choose_config(m, k, G, n), tiled_config(m, k, G, n)
    beside = {}
    if cfg != tiled:                                    # the staged kernel: the tiled one beside
        one = functools.partial(numba_int4, config=tiled)
        beside["int4_matmul, one tile per block"] = (one, int4_bytes, tiled)
        if torch.cuda.get_device_capability() == (9, 0):  # and the wgmma kernel (not a default yet)
            for label, pre in (("exact scales", False), ("f16-prescaled", True)):
                wc = ops.wgmma_config(k, n, pre)
                words, cells = ops.staged_partials(wc, -(-n // 16), -(-m // (8 * wc.mt)))
                ws = ops.GemmWorkspace(torch.zeros(max(words, 1), device="cuda"),
                                       torch.zeros(max(cells, 1), dtype=torch.int32, device="cuda"))
                fn = functools.partial(numba_int4, config=wc, work=ws)
                beside[f"int4_matmul, wgmma ({label})"] = (fn, int4_bytes, wc)
    return {"int4_matmul (numba W4A16)": (numba_int4, int4_bytes, cfg),
            "int4_matmul, PDL off": (functools.partial(numba_int4, pdl=False), int4_bytes, cfg), **beside,
            "cuBLAS bf16 (x @ w.t())": (cublas, n * k * 2 + act + m * n * 2, None),
            "tinygemm int4 g32": (tinygemm, n * k // 2 + (k // G) * n * 4 + act + m * n * 2, None)}


def bench_matmul(torch, copy, rows, log):
    mode = f"graph x{ROT} back-to-back"
    for name, (n, k) in SHAPES.items():
        w4 = _int4_weights(torch, n, k, ROT)
        wbf = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) for _ in range(ROT)]
        tg = _tinygemm_weights(torch, n, k, ROT)
        w4_bytes = n * k // 2 + n * (k // G) * 2
        src = [torch.empty(w4_bytes // 2, dtype=torch.uint8, device="cuda") for _ in range(ROT)]
        dst = [torch.empty_like(t) for t in src]
        st = time_op(functools.partial(_copies, dst, src), calls=ROT)
        rows.append(_row(f"{name} copy ceiling", "torch copy (same bytes per launch)", mode, st, w4_bytes,
                         copy, M=0, N=n, K=k))
        log(rows[-1])
        for m in MS:
            x16 = torch.randn(m, k, device="cuda").half()
            o32 = [torch.empty(m, n, device="cuda") for _ in range(ROT)]
            impls = _impls(torch, m, n, k, x16, w4, wbf, tg, o32)
            for impl, (fn, nbytes, cfg) in impls.items():
                try:
                    st = time_op(fn, calls=ROT)
                except Exception as e:  # noqa: BLE001 - a failing baseline is reported, not fatal
                    log(f"{name} M={m} {impl}: FAILED {type(e).__name__}: {e}")
                    continue
                extra = {"M": m, "N": n, "K": k}
                if cfg is not None:
                    extra["config"] = "x".join(map(str, cfg)) if isinstance(cfg, tuple) else str(cfg)
                rows.append(_row(f"{name} M={m}", impl, mode, st, nbytes, copy, **extra))
                log(rows[-1])


def run(out_dir: Path, progress=None) -> dict:
    """Run everything, write the result set (CSV, metadata, plot) under ``out_dir``; returns rows, meta,
    the log lines and the ``ResultSet`` as "set". progress: ``progress(done, total, what)`` per section."""
    import torch

    from . import kernels_moe
    out_dir = Path(out_dir)
    rows: list[dict] = []
    lines: list[str] = []

    def log(item):
        s = item if isinstance(item, str) else ", ".join(f"{k}={v}" for k, v in item.items())
        print(s, flush=True)
        lines.append(s)
    t0 = time.time()
    copy = copy_bandwidth()
    log(f"copy bandwidth (2 GiB device-to-device, read + write): {copy:.0f} GB/s")
    meta = run_metadata(copy_gbs=round(copy, 1), rotation=ROT, group_size=G)
    rs = result_set(out_dir, "kernels", meta["git_sha"])
    sections = [("matmul", bench_matmul), ("moe", kernels_moe.bench_moe)]
    for i, (name, fn) in enumerate(sections):
        if progress is not None:
            progress(i, len(sections), f"section {name}")
        try:
            fn(torch, copy, rows, log)
        except Exception:  # noqa: BLE001 - keep what was measured, report the failure
            log(f"section {name} FAILED:\n{traceback.format_exc()}")
        write_csv(rows, rs.csv)
    if progress is not None:
        progress(len(sections), len(sections), "done")
    meta["wall_s"] = round(time.time() - t0, 1)
    write_json_atomic(rs.meta, meta, indent=2)
    try:
        from .kernels_plot import plot
        plot(rows, rs.plot, copy)
    except Exception:  # noqa: BLE001
        log(f"plot FAILED:\n{traceback.format_exc()}")
    return {"rows": rows, "meta": meta, "log": lines, "set": rs}

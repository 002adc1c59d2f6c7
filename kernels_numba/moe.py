"""Fused W4A16 MoE layer: route -> align on device -> gate/up (SiLU*up) -> down (x router weight) -> combine.

Legend: T tokens, D model width, I expert width, E routed experts, K experts per token, S shared
pseudo-experts, P = T*(K + S) (token, expert) pairs, G group size.

Four launches, no host synchronisation, fixed grids (graph-capturable with a preallocated
``MoEWorkspace``): ``moe_align_kernel`` (1 block), ``moe_gemm_kernel`` gate/up and down, each a
persistent stream-K grid (moe_gemm.py), ``moe_combine_kernel``. At G = 32 the default is moe_gemv.py's
path instead: gate/up, act, down as grouped GEMVs, then the same combine, per pair up to GEMV_TOKENS
tokens (decode and small draft trees) and over the align kernel's expert tiles above (each pair's sum
as alone, so a verify's rows equal decode's). Mirrors workbench/reference/moe.py ``moe``:
sum_k w_k SwiGLU_e(x) + shared SwiGLU(x), each linear the W4A16 definition (activations rounded to
f16, f32 accumulation); h = silu(gate) * up is rounded to f16 as the reference's down linear does.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ._validate import KernelInputError, as_stream, check, empty, flat, zeroed
from .device import SIMULATED, sm_count
from .int4_layout import Int4Weight, repack_int4
from .launch import launch
from .moe_align import align_threads, make_align_kernel, make_combine_kernel
from .moe_gemm import make_moe_gemm_kernel
from .moe_gemv import gemv_tiling, make_moe_gemv_kernel, moe_act_kernel


@dataclass(frozen=True)
class MoEWeights:
    """Repacked experts: ``w13`` gate/up pairs (X = E + S experts, n = I, k = D), ``w2`` (n = D, k = I)."""
    w13: Int4Weight
    w2: Int4Weight
    n_routed: int
    n_shared: int

    def to_device(self, stream=0) -> MoEWeights:
        return MoEWeights(self.w13.to_device(stream), self.w2.to_device(stream), self.n_routed, self.n_shared)

    def routed(self, experts: range) -> MoEWeights:
        """Routed experts ``experts`` (ids start.., step 1) as a stack of their own, local ids 0.., no
        shared expert: views of these arrays (the expert is their outermost dimension), no copy."""
        if not (isinstance(experts, range) and experts.step == 1 and 0 <= experts.start < experts.stop
                <= self.n_routed):
            raise KernelInputError(f"experts must be a range inside 0..{self.n_routed}, got {experts!r}")

        def part(w: Int4Weight) -> Int4Weight:
            q, s = len(w.wq) // w.experts, len(w.sq) // w.experts                # words per expert
            a, b = experts.start, experts.stop
            return Int4Weight(w.wq[a * q:b * q], w.sq[a * s:b * s], w.n, w.k, w.group_size, len(experts),
                              w.pair)
        return MoEWeights(part(self.w13), part(self.w2), len(experts), 0)


@dataclass(frozen=True)
class MoEWorkspace:
    """Scratch of one fused_moe call shape (T tokens): reuse it across calls and graph replays."""
    tile_expert: object   # int32 [P]
    tile_rows: object     # int32 [P*8]
    arrival: object       # int32 [P*8]: moe_align's pair ids per expert before they are put in order
    meta: object          # int32 [2]: tile count, bad-expert-id flag
    h: object             # uint16 [P*I]: float16 bits of the down GEMM's activations
    y: object             # float32 [P*D]: weighted expert outputs per pair
    part: object          # float32 [2 * blocks * NMAT * 128]: block pieces of units split between blocks
    cnt_gu: object        # int32 [P*I/16]: per-unit step counters of the gate/up GEMM
    cnt_dn: object        # int32 [P*D/16]: and of the down GEMM
    n_tok: int
    gu: object = None     # float32 [P*2I]: gate and up outputs of the GEMV path (moe_gemv.py)


def prepare_moe(w1, w1s, w3, w3s, w2, w2s, shared=None) -> MoEWeights:
    """Host repack. Routed: ``w1``/``w3`` packed int32 [E, I, D/8] with float16 scales [E, I, D/G];
    ``w2`` [E, D, I/8] with [E, D, I/G]. ``shared`` = (s1, s1s, s3, s3s, s2, s2s) of width S*I
    ([S*I, D/8] ... [D, S*I/8]) or None; it is split into S experts of width I (SwiGLU is separable
    over intermediate columns), routed to every token with weight 1."""
    w1, w3, w2 = np.asarray(w1), np.asarray(w3), np.asarray(w2)
    if w1.ndim != 3 or w1.shape != w3.shape or w2.ndim != 3 or w2.shape[0] != w1.shape[0]:
        raise KernelInputError(f"expert stacks must be [E, I, D/8] x2 and [E, D, I/8], "
                               f"got {w1.shape} {w3.shape} {w2.shape}")
    e, i, d = w1.shape[0], w1.shape[1], w1.shape[2] * 8
    parts = [(w1, np.asarray(w1s), w3, np.asarray(w3s), w2, np.asarray(w2s))]
    s = 0
    if shared is not None:
        s1, s1s, s3, s3s, s2, s2s = (np.asarray(a) for a in shared)
        if s1.shape[0] % i or s2.shape[0] != d:
            raise KernelInputError(f"shared width {s1.shape[0]} is not a multiple of the expert width {i}")
        s = s1.shape[0] // i

        def split_rows(a):
            return a.reshape(s, i, a.shape[-1])                                # [S, I, *]

        def split_cols(a):
            return a.reshape(d, s, a.shape[-1] // s).swapaxes(0, 1)           # [S, D, */S]
        parts.append((split_rows(s1), split_rows(s1s), split_rows(s3), split_rows(s3s),
                      np.ascontiguousarray(split_cols(s2)), np.ascontiguousarray(split_cols(s2s))))
    cat = [np.concatenate([p[j] for p in parts]) for j in range(6)]
    r1, r3, r2 = repack_int4(cat[0], cat[1]), repack_int4(cat[2], cat[3]), repack_int4(cat[4], cat[5])
    x, n16 = e + s, r1.n16
    wq = np.stack([np.asarray(r1.wq).reshape(x, n16, -1), np.asarray(r3.wq).reshape(x, n16, -1)], axis=2)
    sq = np.stack([np.asarray(r1.sq).reshape(x, n16, -1), np.asarray(r3.sq).reshape(x, n16, -1)], axis=2)
    w13 = Int4Weight(wq.reshape(-1), sq.reshape(-1), i, d, r1.group_size, x, pair=True)
    return MoEWeights(w13, r2, e, s)


def moe_workspace(n_tok: int, k_top: int, weights: MoEWeights, stream=0,
                  config: dict | None = None) -> MoEWorkspace:
    """Scratch for ``n_tok`` tokens; ``config`` (default ``choose_moe_config``) sizes the part buffer
    (for the default stream-K config where it is the GEMV path's) and whether the GEMV path's gate/up
    buffer is there (always up to GEMV_TOKENS tokens)."""
    p = n_tok * (k_top + weights.n_shared)
    i, d, g = weights.w13.n, weights.w2.n, weights.w13.group_size
    stream = as_stream(stream)
    cfg = _check_config(config or choose_moe_config(d, i, n_tok, g), d, i, g)
    gemv = "gemv" in cfg
    part = _part_size(stream_k_config(d, i, n_tok) if gemv else cfg)     # either path fits by default
    # gu zeroed: act reads the gate/up rows of pairs the tiled path drops, which are never written
    return MoEWorkspace(empty(p, np.int32, stream), empty(p * 8, np.int32, stream),
                        empty(p * 8, np.int32, stream), empty(2, np.int32, stream),
                        empty(p * i, np.uint16, stream), empty(p * d, np.float32, stream),
                        empty(part, np.float32, stream),
                        empty(p * (i // 16), np.int32, stream), empty(p * (d // 16), np.int32, stream),
                        n_tok, zeroed(p * 2 * i if gemv or n_tok <= GEMV_TOKENS else 1, np.float32, stream))


def _check_config(cfg, d: int, i: int, g: int = 32) -> dict:
    """``cfg`` if it is a valid kernel config for widths D and I and group size G, else
    KernelInputError (checked before anything is allocated or launched)."""
    if isinstance(cfg, dict) and "gemv" in cfg:
        try:
            (ksgu, cpwgu), (ksdn, cpwdn), reg = cfg["gu"], cfg["dn"], int(cfg["maxreg"])
        except (KeyError, TypeError, ValueError):
            raise KernelInputError(f"bad MoE config {cfg}: the GEMV path needs gu and dn (warps per "
                                   "block, chunks per warp) and maxreg") from None
        tiled, rows = cfg.get("tiled", False), cfg.get("rows", 1)          # rows: the tiled path's grid
        if (cfg["gemv"] is not True or g != 32 or ksgu * cpwgu != d // 64 or ksdn * cpwdn != i // 64
                or not 32 <= reg <= 255 or not 1 <= ksgu <= 32 or not 1 <= ksdn <= 32
                or not isinstance(cfg.get("glu", False), bool)
                or not isinstance(tiled, bool) or (tiled and "rows" not in cfg)
                or not isinstance(rows, int) or not 1 <= rows <= 65535):
            raise KernelInputError(f"bad MoE config {cfg} for D={d} I={i} G={g}")
        return cfg
    try:
        nb, reg = int(cfg["blocks"]), int(cfg["maxreg"])
        (wgu, scgu, dpgu, ntgu), (wdn, scdn, dpdn, ntdn) = cfg["gu"], cfg["dn"]
    except (KeyError, TypeError, ValueError):
        raise KernelInputError(f"bad MoE config {cfg}: needs gu and dn (warps per block, chunks per step, "
                               "steps in flight, n-tiles per unit), blocks and maxreg") from None
    if (nb < 1 or not 32 <= reg <= 255 or not 1 <= wgu <= 32 or not 1 <= wdn <= 32 or (d // 64) % scgu
            or (i // 64) % scdn or min(scgu, scdn, dpgu, dpdn, ntgu, ntdn) < 1 or not 1 <= dpgu <= 4
            or not 1 <= dpdn <= 4 or (i // 16) % ntgu or (d // 16) % ntdn):
        raise KernelInputError(f"bad MoE config {cfg} for D={d} I={i}")
    return cfg


def _part_size(cfg: dict) -> int:
    """Floats of the part buffer a stream-K config needs: 2 slots per block, NMAT 16 x 8 fragments
    per slot."""
    return 2 * cfg["blocks"] * max(2 * cfg["gu"][3], cfg["dn"][3]) * 128


# the per-pair GEMV path is the default up to this many tokens (G = 32): it measured faster than the tiled
# path at T = 8 and 16 (561 / 1,101 against 600 / 1,123 us), slower at 32 (kernels_9f3c2313bae9); above,
# the tiled GEMV path reads each expert once per 8-pair tile and computes every pair exactly as the
# per-pair path does (a verify's rows equal decode's)
GEMV_TOKENS = 16
TILE_ROWS = 64                 # the tiled path's grid rows: each walks tiles row, row + 64, ...


def choose_moe_config(d: int, i: int, tokens: int = 1, g: int = 32) -> dict:
    """At G = 32: the GEMV path (moe_gemv.py; its tiling per GEMM as (warps per block, chunks per warp):
    K2 gate/up (8, 14) and down (4, 8), measured best of four at T = 1), per pair up to GEMV_TOKENS
    tokens, over moe_align's expert tiles above (``tiled``, TILE_ROWS grid rows). Otherwise, per
    stream-K GEMM (warps per block, chunks per step, steps in flight, n-tiles per unit), the persistent
    grid's block count and the register cap: the best of the v3-v5 sweeps on the H200 at T = 1..64
    (docs/perf.md). Stream-K balances any amount of work; only down changes with ``tokens``: 4 chunks
    per step and one n-tile per unit measured faster at T = 4, 16 and 32 (slower at T = 64), so it is
    used for 2 <= T <= 32."""
    if g == 32:
        gu_t, dn_t = gemv_tiling(d, 2 if SIMULATED else 8), gemv_tiling(i, 1 if SIMULATED else 4)
        if gu_t and dn_t:
            cfg = {"gemv": True, "gu": gu_t, "dn": dn_t, "maxreg": 128}
            return cfg if tokens <= GEMV_TOKENS else {**cfg, "tiled": True, "rows": TILE_ROWS}
    return stream_k_config(d, i, tokens)


def stream_k_config(d: int, i: int, tokens: int) -> dict:
    def sc(k, want):
        kc = k // 64
        return max(c for c in range(1, want + 1) if kc % c == 0)
    if SIMULATED:
        return {"gu": (2, sc(d, 2), 2, 1), "dn": (2, sc(i, 2), 2, 1), "blocks": 3, "maxreg": 128}
    dn = (16, sc(i, 4), 2, 1) if 2 <= tokens <= 32 else (16, sc(i, 2), 2, 2 if (d // 16) % 2 == 0 else 1)
    return {"gu": (16, sc(d, 2), 2, 1), "dn": dn, "blocks": sm_count(), "maxreg": 128}


def fused_moe(x, topk_ids, topk_w, weights: MoEWeights, out=None, workspace: MoEWorkspace | None = None,
              stream=None, config: dict | None = None, check_routing: bool = False, accumulate: bool = False,
              extra=None, before_combine=None):
    """``out [T, D] float32`` (+= with ``accumulate``) = the MoE layer for ``x`` float16 [T, D] routed by
    ``topk_ids`` int32 [T, K] (values in [0, E)) with ``topk_w`` float32 [T, K] (routed_scaling_factor
    included), plus ``extra`` [T, D] float32 where given (added last, in the combine). ``before_combine()``
    runs just before the combine is launched: it may launch what writes ``extra`` on another stream and
    join it.

    ``weights`` from ``prepare_moe(...).to_device()``; ``workspace`` from ``moe_workspace`` (pass
    one for CUDA-graph capture: allocating inside a capture fails). Expert ids outside [0, E) are
    dropped on the device and flagged in ``workspace.meta[1]``; ``check_routing=True`` synchronises
    and raises KernelInputError for them. Raises KernelInputError before launching on bad shapes.
    """
    stream = as_stream(stream)
    stages, out, ws = moe_stages(x, topk_ids, topk_w, weights, out, workspace, stream, config, accumulate,
                                 extra)
    for name, run in stages:
        if name == "combine" and before_combine is not None:
            before_combine()
        run(stream)
    if check_routing:
        if not isinstance(ws.meta, np.ndarray):
            from numba import cuda
            cuda.synchronize()
        meta = ws.meta if isinstance(ws.meta, np.ndarray) else ws.meta.copy_to_host()
        if int(meta[1]):
            raise KernelInputError(f"topk_ids holds expert ids outside [0, {weights.n_routed})")
    return out


def moe_stages(x, topk_ids, topk_w, weights: MoEWeights, out=None, workspace: MoEWorkspace | None = None,
               stream=None, config: dict | None = None, accumulate: bool = False, extra=None):
    """Every check of ``fused_moe`` (same arguments), then ``(stages, out, workspace)``: stages are
    ``(name, launch(stream))`` for align, gate_up, down and combine in launch order; ``fused_moe``
    runs them all, a benchmark may time a prefix. ``out`` / ``workspace`` are allocated on
    ``stream`` when None."""
    if not isinstance(weights, MoEWeights):
        raise KernelInputError("weights must come from prepare_moe(...).to_device()")
    w13, w2 = weights.w13, weights.w2
    d, i, g, xe = w13.k, w13.n, w13.group_size, w13.experts
    if i % 64 or d % 64 or w2.n != d or w2.k != i or w2.experts != xe:
        raise KernelInputError(f"inconsistent expert shapes D={d} I={i} (both multiples of 64 required)")
    x = check(x, "x", np.float16, (None, d))
    t = x.shape[0]
    ids = check(topk_ids, "topk_ids", np.int32, (t, None), align=4)
    k = ids.shape[1]
    tw = check(topk_w, "topk_w", np.float32, (t, k), align=4)
    if t < 1 or not 1 <= k <= weights.n_routed:
        raise KernelInputError(f"need T >= 1 tokens and 1 <= K <= E experts per token, got T={t} K={k}")
    p = t * (k + weights.n_shared)
    if p * max(d, i) * 8 > 2**31 - 1 or xe > 1024:
        raise KernelInputError(f"T={t} tokens x {k + weights.n_shared} experts exceed the int32 / "
                               "block limits")
    stream = as_stream(stream)
    cfg = _check_config(config or choose_moe_config(d, i, t, g), d, i, g)
    ws = workspace or moe_workspace(t, k, weights, stream, cfg)
    if ws.n_tok != t:
        raise KernelInputError(f"workspace was made for T={ws.n_tok} tokens, x has {t}")
    w13q = check(w13.wq, "w13.wq", np.uint32, (xe * w13.n16 * 2 * d * 2,))
    w13s = check(w13.sq, "w13.sq", np.uint32, (xe * w13.n16 * 2 * (d // g) * 8,), align=4)
    w2q = check(w2.wq, "w2.wq", np.uint32, (xe * w2.n16 * i * 2,))
    w2s = check(w2.sq, "w2.sq", np.uint32, (xe * w2.n16 * (i // g) * 8,), align=4)
    if out is None:
        if accumulate:
            raise KernelInputError("accumulate needs an out to add into")
        out = empty((t, d), np.float32, stream)
    out = check(out, "out", np.float32, (t, d), align=4)
    if extra is not None:
        extra = check(extra, "extra", np.float32, (t, d), align=4)
    combine = make_combine_kernel(d, k, weights.n_shared, accumulate, extra is not None)
    extra = ws.y if extra is None else flat(extra)    # unread without: y, which the combine only reads
    if "gemv" in cfg:
        wts = (w13q, w13s, w2q, w2s)
        return _gemv_stages(x, ids, tw, weights, out, ws, cfg, wts, combine, extra), out, ws
    nb, wgu, wdn = cfg["blocks"], cfg["gu"][0], cfg["dn"][0]
    if _part_size(cfg) > ws.part.size:
        raise KernelInputError(f"MoE config {cfg} needs a part buffer of {_part_size(cfg)} floats, the "
                               f"workspace has {ws.part.size}: make it with moe_workspace(..., config=...)")
    nthr = align_threads(xe)
    align = make_align_kernel(xe, nthr)
    gate_up = make_moe_gemm_kernel(d, i, g, True, *cfg["gu"], cfg["maxreg"])
    down = make_moe_gemm_kernel(i, d, g, False, *cfg["dn"], cfg["maxreg"])
    tiles = (ws.tile_expert, ws.tile_rows, ws.meta, flat(tw), t, k, ws.part)
    stages = [
        ("align", lambda s: align[1, nthr, s](ws.tile_expert, ws.tile_rows, ws.meta, flat(ids), t, k,
                                              weights.n_routed, p, ws.cnt_gu, p * w13.n16, ws.arrival)),
        ("gate_up", lambda s: gate_up[nb, wgu * 32, s](ws.h, flat(x), w13q, w13s, *tiles, ws.cnt_gu,
                                                       ws.cnt_dn, p * w2.n16)),
        ("down", lambda s: down[nb, wdn * 32, s](ws.y, ws.h, w2q, w2s, *tiles, ws.cnt_dn, ws.cnt_dn, 0)),
        ("combine", lambda s: combine[(-(-d // 128), t), 128, s](flat(out), ws.y, t, flat(ids),
                                                                  weights.n_routed, extra)),
    ]
    return stages, out, ws


def _gemv_stages(x, ids, tw, weights: MoEWeights, out, ws: MoEWorkspace, cfg: dict, wts, combine, extra):
    """The GEMV path's stages (moe_gemv.py), all launched with PDL: gate_up, act, down, combine, after
    moe_align's expert tiles when ``cfg`` is tiled; with ``cfg["glu"]`` gate_up forms h itself (no act)."""
    w13q, w13s, w2q, w2s = wts
    t, k = ids.shape
    d, i = weights.w13.k, weights.w13.n
    p = t * (k + weights.n_shared)
    glu = cfg.get("glu", False)
    if not glu and (ws.gu is None or ws.gu.size < p * 2 * i):
        raise KernelInputError("workspace has no room for the GEMV path's gate/up outputs: make it with "
                               "moe_workspace(..., config=...)")
    (ksgu, cpwgu), (ksdn, cpwdn), reg = cfg["gu"], cfg["dn"], cfg["maxreg"]
    tiled = cfg.get("tiled", False)
    gate_up = make_moe_gemv_kernel(d, ksgu, cpwgu, True, reg, tiled, glu)
    down = make_moe_gemv_kernel(i, ksdn, cpwdn, False, reg, tiled)
    route = (flat(ids), flat(tw), ws.meta, t, k, weights.n_routed)
    tiles = (ws.tile_expert, ws.tile_rows)
    rows = min(p, cfg["rows"]) if tiled else p
    h16 = ws.h.view(np.float16)
    stages = [("gate_up", lambda s: launch(gate_up, ((1 if glu else 2) * (i // 16), rows), ksgu * 32, s,
                                          (ws.h if glu else ws.gu, flat(x), w13q, w13s, *route, i // 16,
                                           *tiles)))]
    if not glu:                                       # (glu: gate_up wrote h itself)
        stages.append(("act", lambda s: launch(moe_act_kernel, (-(-i // 128), p), 128, s, (ws.h, ws.gu, i))))
    stages += [
        ("down", lambda s: launch(down, (d // 16, rows), ksdn * 32, s,
                                  (ws.y, h16, w2q, w2s, *route, d // 16, *tiles))),
        ("combine", lambda s: launch(combine, (-(-d // 128), t), 128, s,
                                     (flat(out), ws.y, t, flat(ids), weights.n_routed, extra))),
    ]
    if tiled:
        nthr, xe = align_threads(weights.w13.experts), weights.w13.experts
        align = make_align_kernel(xe, nthr)
        args = (*tiles, ws.meta, flat(ids), t, k, weights.n_routed, p, ws.cnt_gu, 0, ws.arrival)
        stages.insert(0, ("align", lambda s: align[1, nthr, s](*args)))
    return stages

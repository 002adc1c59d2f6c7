"""Kernels of the DFlash drafter on the device, mirroring ``workbench.ddtree.dflash.dflash_propose``.

Legend: T buffer rows, n = meta[1] live rows, F tapped target layers, D model width, H drafter query
heads, Hkv KV heads, G = H / Hkv, d drafter head dim (even), S drafter cache rows, Bs block rows,
P context rows in the cache, MK = most keys one attention launch may see (P + Bs).

- ``gather_rows``: the context input [n, F*D] = the tapped target features of the committed rows,
  concatenated in the drafter's layer order (``speculative.features``), read in place from the
  engine's tap buffer [F', T', D].
- ``head_norm_rope``: per (row, head) of y's columns from col0 (one part of a stacked q || k || v
  projection), RMSNorm over d (weight [d], like ``dflash._heads``) then RoPE
  (the cos / sin table's, YaRN included) at position pos0 + meta[3] + row on interleaved pairs
  (2i, 2i+1) or, with ``half``, rotate-half pairs (i, i + d/2), written to rows out_row0 + meta[2] + row
  of out (a projection buffer in place, or the drafter cache); with ``norm`` False a plain copy (values).
- ``draft_attention``: non-causal attention of the block's queries over [cache K/V rows 0..P) ||
  block K/V (Bs rows), P = n_ctx + meta[4], softmax(q.k * scale) per query head in float32, every
  block row sees every key; query head h reads KV head h // G (GQA). Two kernels: the keys in chunks,
  each chunk's key tiles read once for all Bs G queries of a KV head, then the chunks combined.

The meta parts of the offsets let one captured launch sequence (a CUDA graph) follow the drafter's
position from round to round; the host parts are checked at launch, the meta parts by the caller.

Blocks are 32 threads (blockops.TPB), the gather GATHER_THREADS, the attention's part 8 QB; each host
wrapper checks shapes and dtypes before launching (KernelInputError).
"""

from __future__ import annotations

import functools
import math

import numpy as np
from numba import cuda, uint32

from ._validate import KernelInputError
from .blockops import NEG_INF, TPB, block_sum
from .device import SIMULATED
from .intrinsics import as_f32, griddep_launch_dependents, griddep_wait, ld_shared_v4
from .launch import launch
from .rmsnorm import held_sumsq, hold_row
from .rope import rope_pair

GATHER_THREADS = 128
GATHER_UNROLL = 8               # words a thread loads before it stores them (the stores may alias the loads)


@cuda.jit
def gather_rows_kernel(out, feats, rows, taps, meta):
    """out [T, F*D] row i = feats[taps[0], rows[i]] || ... || feats[taps[F-1], rows[i]]; grid (T, F, Z),
    block (GATHER_THREADS,): block (i, f, z) copies tap f of row i, its z-th GATHER_THREADS *
    GATHER_UNROLL words (and every Z-th after), GATHER_UNROLL words a thread at a time."""
    griddep_wait()                                          # PDL: the inputs are earlier kernels'
    griddep_launch_dependents()
    i = cuda.blockIdx.x
    f = cuda.blockIdx.y
    if i >= meta[1]:
        return
    r = rows[i]
    src = taps[f]
    d = feats.shape[2]
    buf = cuda.local.array(GATHER_UNROLL, np.float32)
    span = GATHER_THREADS * GATHER_UNROLL
    for j0 in range(cuda.blockIdx.z * span + cuda.threadIdx.x, d, span * cuda.gridDim.z):
        for u in range(GATHER_UNROLL):
            j = j0 + u * GATHER_THREADS
            buf[u] = feats[src, r, j] if j < d else np.float32(0.0)
        for u in range(GATHER_UNROLL):
            j = j0 + u * GATHER_THREADS
            if j < d:
                out[i, f * d + j] = buf[u]


@functools.cache
def make_head_norm_rope(DN: int, PN: int):
    """head_norm_rope_kernel for heads of at most 32 DN dims (PN = ceil(d / 64) rope pairs a lane): a
    lane's strided features (for the norm's sum: a lane's in index order, then ``block_sum``'s), its
    pairs' features and their weights (loaded before the PDL wait) held in registers, so a head costs
    one memory round trip (the strided form read the head for the sum, then again pair by pair)."""

    @cuda.jit
    def head_norm_rope_kernel(out, y, w, cos, sin, out_row0, pos0, meta, eps, norm, half, col0):
        """y [T, >= col0 + H*d] columns col0 .. -> out [S, H*d] rows out_row0 + meta[2] + row; grid (T, H),
        block (32,). In-place ok (a head is read before any store). half: 0 pairs (2i, 2i+1), 1 pairs
        (i, i + d/2)."""
        tid = cuda.threadIdx.x
        d = w.shape[0]
        h2 = d // 2
        w0 = cuda.local.array(PN, np.float32)
        w1 = cuda.local.array(PN, np.float32)
        for m in range(PN):
            i = tid + m * TPB
            ok = i < h2
            w0[m] = w[i if half else 2 * i] if ok else ZERO
            w1[m] = w[i + h2 if half else 2 * i + 1] if ok else ZERO
        griddep_wait()                                      # PDL: the inputs are earlier kernels'
        griddep_launch_dependents()
        row = cuda.blockIdx.x
        h = cuda.blockIdx.y
        if row >= meta[1]:
            return
        off = h * d
        src = col0 + off                                     # this head's columns of y
        dst = out_row0 + meta[2] + row
        if norm == 0:                                        # uniform over the block
            for j in range(tid, d, TPB):
                out[dst, off + j] = y[row, src + j]
            return
        xs = cuda.local.array(DN, np.float32)
        x0 = cuda.local.array(PN, np.float32)
        x1 = cuda.local.array(PN, np.float32)
        hold_row(xs, y, row, src, DN, d, tid, TPB)
        for m in range(PN):
            i = tid + m * TPB
            ok = i < h2
            x0[m] = y[row, src + (i if half else 2 * i)] if ok else ZERO
            x1[m] = y[row, src + (i + h2 if half else 2 * i + 1)] if ok else ZERO
        sh = cuda.shared.array(TPB, np.float32)
        ms = block_sum(sh, held_sumsq(xs, DN, d, tid, TPB)) / np.float32(d)
        r = np.float32(1.0) / math.sqrt(ms + eps)
        pos = pos0 + meta[3] + row
        for m in range(PN):
            i = tid + m * TPB
            if i < h2:
                a, b = rope_pair(w0[m] * (x0[m] * r), w1[m] * (x1[m] * r), cos, sin, pos, i)
                out[dst, off + (i if half else 2 * i)] = a
                out[dst, off + (i + h2 if half else 2 * i + 1)] = b

    return head_norm_rope_kernel


head_norm_rope_kernel = make_head_norm_rope(4, 2)   # d = 128, the Kimi-K2.6-DFlash heads (the PTX probe's)


ZERO = np.float32(0.0)
KT = 16                         # keys a tile: staged in shared memory once for a block's QB queries
NSPLIT = 16                     # most key chunks (blocks) a KV head's queries are split over
QB = 8 if SIMULATED else 32     # queries a block: (block row, query head) pairs of one KV head


def splits(max_keys: int) -> int:
    """Key chunks of a launch: at most NSPLIT, one tile each at least (a host constant, so a captured
    launch keeps its grid while the live key count moves with the meta)."""
    return max(1, min(NSPLIT, -(-max_keys // KT)))


def workspace_shape(n: int, n_heads: int, head_dim: int) -> tuple[int, int, int, int]:
    """The float32 workspace ``draft_attention`` takes: per key chunk, block row and query head its
    unnormalised output (d), running max and sum of exponentials."""
    return (NSPLIT, n, n_heads, head_dim + 2)


@functools.cache
def make_draft_attention(head_dim: int):
    """(part, combine) kernels of the drafter's attention, flash-decoding style.

    part(work, q, kc, vc, kb, vb, n_ctx int32, meta, scale float32, group int32 = G, nsplit int32);
    grid (Hkv, nsplit, ceil(n G / QB)), block (8 QB,): the QB queries of one KV head, over chunk y of
    the keys (whole tiles of KT), each key tile's K and V staged in shared memory once for them all. A
    thread scores KT / 8 (key, query) pairs over d in order; then 8 threads a query keep d / 8 output
    columns in registers under an online softmax (running max, rescaled sum) and write them with the
    max and the sum to work[chunk, row, head].
    combine(o, work, meta, nsplit); grid (Bs, H), block (32,): o = the chunks' outputs and sums
    rescaled to their common max, summed in chunk order, divided."""
    D = head_dim
    SV = D % 4 == 0                                          # scores from 16-byte shared loads
    PV = D % 32 == 0                                         # p @ V from 16-byte shared loads
    D1 = D + 4 if SV else D + 1                              # K and Q rows padded: no bank conflicts
    NTHR = 8 * QB
    NCV = -(-D // 8)                                         # output columns a thread keeps
    NQ = -(-QB * D // NTHR)                                  # q words a thread stages
    NKV = -(-KT * D // NTHR)                                 # K (and V) words a thread stages a tile
    PAIRS = QB * KT // NTHR                                  # scores a thread computes a tile
    QSTEP = NTHR // KT
    CU = 8                                                   # dot-product columns a step (unrolled)
    FULL = D % 8 == 0                                        # every thread's NCV columns exist
    QS_WORDS, KS_WORDS, VS_WORDS, SC_WORDS = QB * D1, KT * D1, KT * D, QB * KT
    ALIGN = None if SIMULATED else 16                        # (the simulator takes no alignment argument)
    opts = {} if SIMULATED else {"max_registers": 128}       # two blocks of 8 QB threads an SM

    @cuda.jit(**opts)
    def draft_attention_part(work, q, kc, vc, kb, vb, n_ctx0, meta, scale, group, nsplit):
        griddep_wait()                                       # PDL: the inputs are earlier kernels'
        griddep_launch_dependents()
        g = cuda.blockIdx.x
        nb = meta[1]
        n_ctx = n_ctx0 + meta[4]
        nk = n_ctx + nb
        nq = nb * group
        q0 = cuda.blockIdx.z * QB
        if q0 >= nq:
            return
        t = cuda.threadIdx.x
        qs = cuda.shared.array(QS_WORDS, np.float32, alignment=ALIGN)   # flat, rows padded to D1
        ks = cuda.shared.array(KS_WORDS, np.float32, alignment=ALIGN)
        vs = cuda.shared.array(VS_WORDS, np.float32, alignment=ALIGN)
        sc = cuda.shared.array(SC_WORDS, np.float32)
        mx = cuda.shared.array(QB, np.float32)               # each query's running max, for the exps
        rq = cuda.local.array(NQ, np.float32)                # words staged: every load issued before the
        ra = cuda.local.array(NKV, np.float32)               # first shared store (a generic pointer may
        rb = cuda.local.array(NKV, np.float32)               # alias shared memory: no reordering across)
        ap = cuda.local.array(PAIRS, np.float32)
        kv = g * D                                           # the KV head's columns
        gq = uint32(group)                                   # (32-bit unsigned: a division each, not a
        for i in range(NQ):                                  # 64-bit signed routine) query qq: block row
            idx = t + i * NTHR                               # qq // G, head g G + qq % G
            qq = uint32(q0 + idx // D)
            row = qq // gq
            ok = idx < QB * D and qq < nq
            rq[i] = q[row, uint32((g * gq + qq - row * gq) * D + idx % D)] if ok else ZERO
        for i in range(NQ):
            idx = t + i * NTHR
            if idx < QB * D:
                qs[(idx // D) * D1 + idx % D] = rq[i]
        step = nsplit * KT
        chunk = (nk + step - 1) // step * KT
        k0 = cuda.blockIdx.y * chunk
        k1 = min(k0 + chunk, nk)
        qv = t >> 3                                          # the query this thread accumulates
        dg = t & 7                                           # ... its columns (dg + 8 i, or PV's)
        kj = t % KT                                          # the key this thread scores, for PAIRS queries
        m = NEG_INF
        lsum = ZERO
        acc = cuda.local.array(NCV, np.float32)
        for i in range(NCV):
            acc[i] = ZERO

        def load_tile(j0):                                   # K and V of keys j0 .. j0 + KT into registers
            for i in range(NKV):
                idx = t + i * NTHR
                j = j0 + idx // D
                c = kv + idx % D
                a = ZERO
                b = ZERO
                if idx < KT * D and j < k1:                  # (unsigned indices: no wraparound code)
                    if j < n_ctx:
                        a = kc[uint32(j), uint32(c)]
                        b = vc[uint32(j), uint32(c)]
                    else:
                        a = kb[uint32(j - n_ctx), uint32(c)]
                        b = vb[uint32(j - n_ctx), uint32(c)]
                ra[i] = a
                rb[i] = b

        if k0 < k1:
            load_tile(k0)
        for j0 in range(k0, k1, KT):
            cuda.syncthreads()                               # the last tile's reads are done
            for i in range(NKV):
                idx = t + i * NTHR
                if idx < KT * D:
                    ks[(idx // D) * D1 + idx % D] = ra[i]
                    vs[idx] = rb[i]
            cuda.syncthreads()
            if j0 + KT < k1:
                load_tile(j0 + KT)                           # the next tile's loads fly during this one
            for p_ in range(PAIRS):                          # each pair's dot in c order, the pairs side by
                ap[p_] = ZERO                                # side so one K load serves them all
            if SV:                                           # 4 columns a 16-byte load, in c order
                for c0 in range(0, D - D % CU, CU):
                    for c4 in range(0, CU, 4):
                        kw = ld_shared_v4(ks, kj * D1 + c0 + c4)
                        for p_ in range(PAIRS):
                            qw = ld_shared_v4(qs, (t // KT + QSTEP * p_) * D1 + c0 + c4)
                            for u in range(4):
                                ap[p_] += as_f32(qw[u]) * as_f32(kw[u])
            else:
                for c0 in range(0, D - D % CU, CU):
                    for u in range(CU):
                        kx = ks[kj * D1 + c0 + u]
                        for p_ in range(PAIRS):
                            ap[p_] += qs[(t // KT + QSTEP * p_) * D1 + c0 + u] * kx
            for c in range(D - D % CU, D):
                kx = ks[kj * D1 + c]
                for p_ in range(PAIRS):
                    ap[p_] += qs[(t // KT + QSTEP * p_) * D1 + c] * kx
            for p_ in range(PAIRS):
                sc[(t // KT + QSTEP * p_) * KT + kj] = ap[p_] * scale if j0 + kj < k1 else NEG_INF
            cuda.syncthreads()
            mt = m
            for j in range(KT):
                mt = max(mt, sc[qv * KT + j])
            if dg == 0:
                mx[qv] = mt
            cuda.syncthreads()
            for p_ in range(PAIRS):                          # each exp once (the 8 threads of a query took
                qi = t // KT + QSTEP * p_                    # all KT each), by the thread that scored it
                sc[qi * KT + kj] = math.exp(sc[qi * KT + kj] - mx[qi])
            cuda.syncthreads()
            alpha = math.exp(m - mt)                         # 0 at the first tile (m = -inf)
            lsum *= alpha
            for i in range(NCV):
                acc[i] *= alpha
            for j in range(KT):
                pj = sc[qv * KT + j]
                lsum += pj
                if PV:                                       # columns 4 dg + 32 i + u, 16 bytes a load
                    for i in range(NCV // 4):
                        vw = ld_shared_v4(vs, j * D + 4 * dg + 32 * i)
                        for u in range(4):
                            acc[4 * i + u] += pj * as_f32(vw[u])
                else:                                        # columns dg + 8 i
                    for i in range(NCV):
                        if FULL or dg + 8 * i < D:
                            acc[i] += pj * vs[j * D + dg + 8 * i]
            m = mt
        qq = q0 + qv
        if qq < nq:
            row = qq // group
            h = g * group + qq % group
            sp = cuda.blockIdx.y
            for i in range(NCV):
                c = 4 * dg + 32 * (i >> 2) + (i & 3) if PV else dg + 8 * i
                if c < D:
                    work[sp, row, h, c] = acc[i]
            if dg == 0:
                work[sp, row, h, D] = m
                work[sp, row, h, D + 1] = lsum

    @cuda.jit
    def draft_attention_combine(o, work, meta, nsplit):
        griddep_wait()
        griddep_launch_dependents()
        row = cuda.blockIdx.x
        h = cuda.blockIdx.y
        if row >= meta[1]:
            return
        f = cuda.local.array(NSPLIT, np.float32)             # a chunk's weight: exp(m - max), 0 if empty
        lw = cuda.local.array(NSPLIT, np.float32)
        for sp in range(NSPLIT):                             # NSPLIT, not nsplit: the loads unroll
            f[sp] = work[sp, row, h, D] if sp < nsplit else NEG_INF
            lw[sp] = work[sp, row, h, D + 1] if sp < nsplit else ZERO
        mx = NEG_INF
        for sp in range(NSPLIT):
            if lw[sp] > 0:
                mx = max(mx, f[sp])
        den = ZERO
        for sp in range(NSPLIT):
            f[sp] = math.exp(f[sp] - mx) if lw[sp] > 0 else ZERO
            den += f[sp] * lw[sp]
        inv = np.float32(1.0) / den
        for c in range(cuda.threadIdx.x, D, TPB):
            a = ZERO
            for sp in range(NSPLIT):
                if f[sp] > 0:
                    a += f[sp] * work[sp, row, h, c]
            o[row, h * D + c] = a * inv

    return draft_attention_part, draft_attention_combine


def _info(a, name: str) -> tuple[tuple[int, ...], np.dtype]:
    """(shape, dtype) of a device array (a memoryview under the engine's simulator path)."""
    if isinstance(a, memoryview):
        x = np.asarray(a)
        return x.shape, x.dtype
    if hasattr(a, "shape") and hasattr(a, "dtype"):
        return tuple(a.shape), np.dtype(a.dtype)
    raise KernelInputError(f"{name}: expected a device array, got {type(a).__name__}")


def _want(a, name: str, dtype, ndim: int) -> tuple[int, ...]:
    shape, dt = _info(a, name)
    if dt != np.dtype(dtype) or len(shape) != ndim:
        raise KernelInputError(f"{name}: {dt} of rank {len(shape)} but {np.dtype(dtype)} of rank {ndim} "
                               "is required")
    return shape


def gather_rows(out, feats, rows, taps, meta, n: int, stream=0) -> None:
    """Launch ``gather_rows_kernel`` over n rows (n >= meta[1]): out [T, F*D] float32, feats [F', T', D]
    float32, rows [>= n] int32 (< T'), taps [F] int32 (< F')."""
    o = _want(out, "out", np.float32, 2)
    f = _want(feats, "feats", np.float32, 3)
    r = _want(rows, "rows", np.int32, 1)
    t = _want(taps, "taps", np.int32, 1)
    if o[1] != t[0] * f[2] or not 0 < n <= min(o[0], r[0]):
        raise KernelInputError(f"gather_rows: out {o}, feats {f}, rows {r}, taps {t}, n {n} disagree")
    z = -(-f[2] // (GATHER_THREADS * GATHER_UNROLL))       # a block a row's tap's span: one pass a thread
    launch(gather_rows_kernel, (n, t[0], z), GATHER_THREADS, stream, (out, feats, rows, taps, meta))


def head_norm_rope(out, y, w, cos, sin, out_row0: int, pos0: int, meta, eps: float, n: int, n_heads: int,
                   norm: bool = True, stream=0, half: bool = False, col0: int = 0) -> None:
    """Launch ``head_norm_rope_kernel`` over (n, n_heads) blocks: y [T, >= col0 + h*d] float32 (its
    columns col0 .., a stacked projection's part), out [S, h*d] float32 (rows out_row0 + meta[2] + 0 ..
    n-1 written, at positions pos0 + meta[3] + 0 .. n-1), w [d], cos / sin [>= pos0 + n, d/2] float32;
    ``half``: rotate-half pairs. The meta parts are the caller's to keep in range."""
    ys = _want(y, "y", np.float32, 2)
    os_ = _want(out, "out", np.float32, 2)
    (d,) = _want(w, "w", np.float32, 1)
    cs = _want(cos, "cos", np.float32, 2)
    if _want(sin, "sin", np.float32, 2) != cs:
        raise KernelInputError("head_norm_rope: cos and sin differ in shape")
    if d % 2 or col0 < 0 or ys[1] < col0 + n_heads * d or os_[1] != n_heads * d or cs[1] != d // 2:
        raise KernelInputError(f"head_norm_rope: y {ys}, out {os_}, w ({d},), cos {cs}, heads {n_heads} "
                               "disagree")
    if not 0 < n <= ys[0] or out_row0 < 0 or out_row0 + n > os_[0] or pos0 < 0 or pos0 + n > cs[0]:
        raise KernelInputError(f"head_norm_rope: rows {n} at out row {out_row0} / position {pos0} exceed "
                               f"y {ys}, out {os_} or the rope table {cs}")
    launch(make_head_norm_rope(-(-d // TPB), -(-d // (2 * TPB))), (n, n_heads), TPB, stream,
           (out, y, w, cos, sin, np.int32(out_row0), np.int32(pos0), meta, np.float32(eps),
            np.int32(1 if norm else 0), np.int32(1 if half else 0), np.int32(col0)))


def draft_attention(o, q, kc, vc, kb, vb, n_ctx: int, meta, scale: float, n: int, n_heads: int,
                    head_dim: int, max_keys: int, work, stream=0, n_kv_heads: int | None = None) -> None:
    """Launch the attention for n block rows (= meta[1]) and n_heads query heads over n_ctx + meta[4]
    cache rows (the meta part is the caller's to keep in range): o, q [>= n, H*d] float32, kb, vb
    [>= n, Hkv*d] float32, kc, vc [S >= n_ctx, Hkv*d] float32 (Hkv = n_kv_heads, default H, dividing H),
    n_ctx + n <= max_keys; work float32 of ``workspace_shape(n, n_heads, head_dim)``."""
    hkv = n_heads if n_kv_heads is None else n_kv_heads
    if hkv < 1 or n_heads % hkv:
        raise KernelInputError(f"draft_attention: {n_heads} query heads are not a multiple of {hkv} KV heads")
    shapes = {name: _want(a, name, np.float32, 2)
              for name, a in (("o", o), ("q", q), ("kc", kc), ("vc", vc), ("kb", kb), ("vb", vb))}
    widths = {"o": n_heads, "q": n_heads, "kc": hkv, "vc": hkv, "kb": hkv, "vb": hkv}
    if any(shapes[k][1] != widths[k] * head_dim for k in shapes):
        raise KernelInputError(f"draft_attention: widths {shapes} differ from H*d = {n_heads * head_dim} "
                               f"(o, q) and Hkv*d = {hkv * head_dim} (keys, values)")
    if not 0 < n <= min(shapes[k][0] for k in ("o", "q", "kb", "vb")):
        raise KernelInputError(f"draft_attention: {n} block rows exceed the buffers {shapes}")
    if 4 * ((QB + KT) * (head_dim + 1) + KT * (head_dim + QB)) > 48 * 1024:
        raise KernelInputError(f"draft_attention: head_dim {head_dim} does not fit 48 KiB of static shared "
                               "memory")
    if n_ctx < 0 or n_ctx > min(shapes["kc"][0], shapes["vc"][0]) or not 0 < n_ctx + n <= max_keys:
        raise KernelInputError(f"draft_attention: {n_ctx} context rows + {n} block rows exceed the cache "
                               f"{shapes['kc']} or max_keys {max_keys}")
    if _want(work, "work", np.float32, 4) != workspace_shape(n, n_heads, head_dim):
        raise KernelInputError(f"draft_attention: work {_info(work, 'work')[0]} is not "
                               f"{workspace_shape(n, n_heads, head_dim)}")
    part, combine = make_draft_attention(head_dim)
    ns = np.int32(splits(max_keys))
    group = n_heads // hkv
    launch(part, (hkv, int(ns), -(-n * group // QB)), 8 * QB, stream,
           (work, q, kc, vc, kb, vb, np.int32(n_ctx), meta, np.float32(scale), np.int32(group), ns))
    launch(combine, (n, n_heads), TPB, stream, (o, work, meta, ns))

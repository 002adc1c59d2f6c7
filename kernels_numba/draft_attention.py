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
  block row sees every key; query head h reads KV head h // G (GQA).

The meta parts of the offsets let one captured launch sequence (a CUDA graph) follow the drafter's
position from round to round; the host parts are checked at launch, the meta parts by the caller.

Blocks are 32 threads (blockops.TPB); each host wrapper checks shapes and dtypes before launching
(KernelInputError).
"""

from __future__ import annotations

import math

import numpy as np
from numba import cuda

from ._validate import KernelInputError
from .blockops import TPB, block_max, block_sum
from .intrinsics import griddep_launch_dependents, griddep_wait
from .launch import launch
from .rmsnorm import row_rms_scale
from .rope import rope_pair


@cuda.jit
def gather_rows_kernel(out, feats, rows, taps, meta):
    """out [T, F*D] row i = feats[taps[0], rows[i]] || ... || feats[taps[F-1], rows[i]]; grid (T,)."""
    griddep_wait()                                          # PDL: the inputs are earlier kernels'
    griddep_launch_dependents()
    i = cuda.blockIdx.x
    if i >= meta[1]:
        return
    r = rows[i]
    d = feats.shape[2]
    for f in range(taps.shape[0]):
        src = taps[f]
        for j in range(cuda.threadIdx.x, d, TPB):
            out[i, f * d + j] = feats[src, r, j]


@cuda.jit
def head_norm_rope_kernel(out, y, w, cos, sin, out_row0, pos0, meta, eps, norm, half, col0):
    """y [T, >= col0 + H*d] columns col0 .. -> out [S, H*d] rows out_row0 + meta[2] + row; grid (T, H),
    block (32,). In-place ok. half: 0 pairs (2i, 2i+1), 1 pairs (i, i + d/2)."""
    griddep_wait()                                          # PDL: the inputs are earlier kernels'
    griddep_launch_dependents()
    row = cuda.blockIdx.x
    h = cuda.blockIdx.y
    if row >= meta[1]:
        return
    tid = cuda.threadIdx.x
    d = w.shape[0]
    off = h * d
    src = col0 + off                                         # this head's columns of y
    dst = out_row0 + meta[2] + row
    if norm == 0:                                            # uniform over the block
        for j in range(tid, d, TPB):
            out[dst, off + j] = y[row, src + j]
        return
    sh = cuda.shared.array(TPB, np.float32)
    r = row_rms_scale(sh, y, row, src, d, eps)               # ends with a barrier: reads done
    pos = pos0 + meta[3] + row
    h2 = d // 2
    for i in range(tid, h2, TPB):
        j0 = i if half else 2 * i                            # the pair's two dims
        j1 = i + h2 if half else 2 * i + 1
        x0 = w[j0] * (y[row, src + j0] * r)
        x1 = w[j1] * (y[row, src + j1] * r)
        a, b = rope_pair(x0, x1, cos, sin, pos, i)
        out[dst, off + j0] = a
        out[dst, off + j1] = b


_ATTN: dict = {}
KT = TPB                        # keys a score tile holds (one a lane), DT dims at a time ...
DT = 32                         # ... in shared memory, rows padded to DT + 1 words (no bank conflicts)
DT1 = DT + 1                    # (numba sizes shared arrays from constants, not expressions)
MAX_KEYS = 10_240               # p[] in static shared memory: 4 * (MAX_KEYS + KT (DT + 1) + d + 32) < 48 KiB


def make_draft_attention(head_dim: int, max_keys: int):
    """kernel(o [Bs, H*d], q [Bs, H*d], kc [S, Hkv*d], vc [S, Hkv*d], kb [Bs, Hkv*d], vb [Bs, Hkv*d],
    n_ctx int32, meta, scale float32, group int32 = G); grid (Bs, H), block (32,); keys
    n_ctx + meta[4] + meta[1] <= max_keys. Shared memory: 4 * (max_keys + KT (DT + 1) + d + 32) bytes.

    Scores: the warp stages KT keys x DT dims at a time in shared memory, each lane reading DT
    consecutive floats of one key row (a lane per key row read 32 rows an instruction), then lane l sums
    key j0 + l over the dims in order. p @ V: lane l keeps the d / 32 columns l, l + 32, ... in
    registers and walks the keys once. Every sum runs in the same order as a plain loop over the dims
    (scores) and the keys (outputs)."""
    key = (head_dim, max_keys)
    if key in _ATTN:
        return _ATTN[key]
    HD, MK = head_dim, max_keys
    NC = -(-HD // TPB)                                       # output columns a lane keeps

    @cuda.jit
    def draft_attention_kernel(o, q, kc, vc, kb, vb, n_ctx0, meta, scale, group):
        griddep_wait()                                          # PDL: the inputs are earlier kernels'
        griddep_launch_dependents()
        row = cuda.blockIdx.x
        h = cuda.blockIdx.y
        nb = meta[1]
        if row >= nb:
            return
        n_ctx = n_ctx0 + meta[4]
        tid = cuda.threadIdx.x
        off = h * HD                                         # this query head's columns of q / o
        kv = (h // group) * HD                               # its KV head's columns of the keys / values
        nk = n_ctx + nb
        sh = cuda.shared.array(TPB, np.float32)
        qs = cuda.shared.array(HD, np.float32)
        p = cuda.shared.array(MK, np.float32)
        for c in range(tid, HD, TPB):
            qs[c] = q[row, off + c]
        cuda.syncthreads()
        kt = cuda.shared.array((KT, DT1), np.float32)
        m = -math.inf
        for j0 in range(0, nk, KT):                          # scores over cache || block keys
            j = j0 + tid
            acc = np.float32(0.0)
            for c0 in range(0, HD, DT):
                for i in range(KT):                          # key j0 + i, dim c0 + lane: coalesced
                    jj = j0 + i
                    v = np.float32(0.0)
                    if jj < nk and c0 + tid < HD:
                        v = kc[jj, kv + c0 + tid] if jj < n_ctx else kb[jj - n_ctx, kv + c0 + tid]
                    kt[i, tid] = v
                cuda.syncthreads()
                if j < nk:
                    for c in range(min(DT, HD - c0)):
                        acc += qs[c0 + c] * kt[tid, c]
                cuda.syncthreads()
            if j < nk:
                s = acc * scale
                p[j] = s
                m = max(m, s)
        m = block_max(sh, m)
        z = np.float32(0.0)
        for j in range(tid, nk, TPB):
            e = math.exp(p[j] - m)
            p[j] = e
            z += e
        z = block_sum(sh, z)                                 # barriers inside: p[] is complete
        inv = np.float32(1.0) / z
        out = cuda.local.array(NC, np.float32)               # o = softmax @ [vc || vb], columns in registers
        for i in range(NC):
            out[i] = np.float32(0.0)
        for j in range(n_ctx):
            pj = p[j]
            for i in range(NC):
                c = tid + TPB * i
                if c < HD:
                    out[i] += pj * vc[j, kv + c]
        for j in range(nb):
            pj = p[n_ctx + j]
            for i in range(NC):
                c = tid + TPB * i
                if c < HD:
                    out[i] += pj * vb[j, kv + c]
        for i in range(NC):
            c = tid + TPB * i
            if c < HD:
                o[row, off + c] = out[i] * inv

    _ATTN[key] = draft_attention_kernel
    return draft_attention_kernel


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
    launch(gather_rows_kernel, n, TPB, stream, (out, feats, rows, taps, meta))


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
    launch(head_norm_rope_kernel, (n, n_heads), TPB, stream,
           (out, y, w, cos, sin, np.int32(out_row0), np.int32(pos0), meta, np.float32(eps),
            np.int32(1 if norm else 0), np.int32(1 if half else 0), np.int32(col0)))


def draft_attention(o, q, kc, vc, kb, vb, n_ctx: int, meta, scale: float, n: int, n_heads: int,
                    head_dim: int, max_keys: int, stream=0, n_kv_heads: int | None = None) -> None:
    """Launch the attention for n block rows (= meta[1]) and n_heads query heads over n_ctx + meta[4]
    cache rows (the meta part is the caller's to keep in range): o, q [>= n, H*d] float32, kb, vb
    [>= n, Hkv*d] float32, kc, vc [S >= n_ctx, Hkv*d] float32 (Hkv = n_kv_heads, default H, dividing H),
    n_ctx + n <= max_keys <= MAX_KEYS (the drafter cache of one generation must stay under ~10k rows)."""
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
    if not 0 < max_keys <= MAX_KEYS or head_dim > 512:
        raise KernelInputError(f"draft_attention: max_keys {max_keys} must lie in 1..{MAX_KEYS} and head_dim "
                               f"{head_dim} <= 512 (static shared memory)")
    if n_ctx < 0 or n_ctx > min(shapes["kc"][0], shapes["vc"][0]) or n_ctx + n > max_keys:
        raise KernelInputError(f"draft_attention: {n_ctx} context rows + {n} block rows exceed the cache "
                               f"{shapes['kc']} or max_keys {max_keys}")
    launch(make_draft_attention(head_dim, max_keys), (n, n_heads), TPB, stream,
           (o, q, kc, vc, kb, vb, np.int32(n_ctx), meta, np.float32(scale), np.int32(n_heads // hkv)))

"""Absorbed MLA over the latent cache, mirroring ``workbench.reference.mla.mla_absorbed``.

Legend: T rows (new tokens) in the buffers, n = meta[1] live rows, start = meta[0] cached rows
before them, H heads, N qk_nope dims, R rope dims, V v_head dims, C kv_lora_rank, Q q_lora_rank,
S cache rows. Cache row = [c_kv (C, normalised) || k_pe (R, rotated)] (interleaved rope order).

One kernel shape serves prefill (causal ``vis``), decode (n = 1) and DDTree verify (the
ancestor-or-self ``vis`` of the tree): new row i sees every cached row < start and new row j iff
vis[i, j] != 0; its rope position is start + depth[i].

- ``mla_prep_kernel``: per new row, q_norm(c_q) and the latent row (kv_norm(c_kv) || rope(k_pe)),
  written to cache rows start + i.
- ``make_mla_attention``: per (row, head) block, q_lat = W_UK^T q_nope, rope(q_pe), masked softmax
  over the cache in shared memory, ctx = p @ c_kv, o = W_UV ctx. W_UK / W_UV are read from wkv_b
  [H*(N+V), C] in place (no per-token absorption in a separate launch).
"""

from __future__ import annotations

import math

import numpy as np
from numba import cuda

from ._validate import KernelInputError, check
from .blockops import KS, ROW_THREADS, TPB, block_lane, scale_row
from .device import SIMULATED
from .intrinsics import bf162_to_f32, stored_as
from .rmsnorm import row_rms_scale
from .rope import rope_pair


@cuda.jit
def mla_prep_kernel(qn, cache, a1, q_norm, kv_norm, cos, sin, depth, meta, q_rank, c_rank, eps):
    """a1 [T, Q+C+R] (or [T, H*(N+R)+C+R] when q_rank == 0) -> qn [T, Q], cache rows start+i (float32,
    or bf16 bits in an int16 cache: the W16A16 attention's latent cache).

    grid (T,), block (32, ks). q_rank 0 skips the query norm (q comes straight from a1).
    """
    row = cuda.blockIdx.x
    if row >= meta[1]:
        return
    sh = cuda.shared.array(ROW_THREADS, np.float32)
    lt, nt = block_lane()
    start = meta[0]
    off = a1.shape[1] - cache.shape[1]                       # column where c_kv starts in a1
    if q_rank > 0:
        r = row_rms_scale(sh, a1, row, 0, q_rank, eps)
        scale_row(qn, row, a1, row, 0, q_norm, r, q_rank)
    r2 = row_rms_scale(sh, a1, row, off, c_rank, eps)
    dst = start + row
    scale_row(cache, dst, a1, row, off, kv_norm, r2, c_rank)
    pos = start + depth[row]
    half = (cache.shape[1] - c_rank) // 2
    for i in range(lt, half, nt):
        y0, y1 = rope_pair(a1[row, off + c_rank + 2 * i], a1[row, off + c_rank + 2 * i + 1], cos, sin, pos, i)
        cache[dst, c_rank + 2 * i] = stored_as(cache, y0)
        cache[dst, c_rank + 2 * i + 1] = stored_as(cache, y1)


_ATTN_CACHE: dict = {}


@cuda.jit(device=True)
def _red(sh, v, lt, nt, op_max):
    """Max (op_max) or sum of v over the block's nt threads (linear id lt); same result everywhere."""
    sh[lt] = v
    cuda.syncthreads()
    r = sh[0]
    for i in range(1, nt):
        r = max(r, sh[i]) if op_max else r + sh[i]
    cuda.syncthreads()
    return r


def make_mla_attention(n_heads: int, c_rank: int, r_dim: int, nope: int, v_dim: int, max_keys: int,
                       ks: int = KS):
    """The attention kernel specialised (closure constants) for these dims and <= max_keys keys.

    kernel(o [T, H*V], q [T, >= H*(N+R)], cache [S, C+R], wkv_b [H*(N+V), C], cos, sin,
           depth [T] int32, vis [T', T'] uint8, meta, scale); grid (T, H), block (32, ks).
    Keys are spread over all 32*ks threads for the scores; for ctx = p @ c_kv, thread (c, s) sums
    keys s, s + ks, ... of column c and the slices meet in shared memory.
    Shared memory: 4 * (2C + R + ks*C + max_keys + 32*ks) bytes.
    """
    key = (n_heads, c_rank, r_dim, nope, v_dim, max_keys, ks)
    if key in _ATTN_CACHE:
        return _ATTN_CACHE[key]
    C, R, N, V, MK = c_rank, r_dim, nope, v_dim, max_keys
    QW = N + R                                               # query width per head
    KW = N + V                                               # wkv_b rows per head
    NT = TPB * ks

    @cuda.jit
    def mla_attention_kernel(o, q, cache, wkv_b, cos, sin, depth, vis, meta, scale):
        row = cuda.blockIdx.x
        h = cuda.blockIdx.y
        if row >= meta[1]:
            return
        tx = cuda.threadIdx.x
        ty = cuda.threadIdx.y
        lt = ty * TPB + tx
        start = meta[0]
        nk = start + meta[1]
        sh = cuda.shared.array(NT, np.float32)
        q_lat = cuda.shared.array(C, np.float32)
        q_pe = cuda.shared.array(R, np.float32)
        ctx = cuda.shared.array(C, np.float32)
        pc = cuda.shared.array((ks, C), np.float32)
        p = cuda.shared.array(MK, np.float32)
        qo = h * QW
        wo = h * KW
        pos = start + depth[row]
        for i in range(lt, R // 2, NT):                      # rope the query's rope part
            y0, y1 = rope_pair(q[row, qo + N + 2 * i], q[row, qo + N + 2 * i + 1], cos, sin, pos, i)
            q_pe[2 * i] = y0
            q_pe[2 * i + 1] = y1
        for c in range(lt, C, NT):                           # q_lat[c] = sum_n W_UK[n, c] q_nope[n]
            acc = np.float32(0.0)
            for d in range(N):
                acc += q[row, qo + d] * wkv_b[wo + d, c]
            q_lat[c] = acc
        cuda.syncthreads()
        m = -math.inf                                        # scores, masked, into p[]
        for j in range(lt, nk, NT):
            s = -math.inf
            if j < start or vis[row, j - start] != 0:
                a = np.float32(0.0)
                for c in range(C):
                    a += q_lat[c] * cache[j, c]
                b = np.float32(0.0)
                for r in range(R):
                    b += q_pe[r] * cache[j, C + r]
                s = (a + b) * scale
            p[j] = s
            m = max(m, s)
        m = _red(sh, m, lt, NT, True)
        z = np.float32(0.0)
        for j in range(lt, nk, NT):                          # unnormalised probabilities
            e = np.float32(0.0)
            if p[j] != -math.inf:
                e = math.exp(p[j] - m)
            p[j] = e
            z += e
        z = _red(sh, z, lt, NT, False)                       # ends with a barrier: p[] is complete
        inv = np.float32(1.0) / z
        for c in range(tx, C, TPB):                          # ctx = p @ c_kv, keys split over slices
            a0 = np.float32(0.0)
            a1 = np.float32(0.0)
            a2 = np.float32(0.0)
            a3 = np.float32(0.0)
            j = ty
            while j + 3 * ks < nk:                           # 4 independent loads in flight
                a0 += p[j] * cache[j, c]
                a1 += p[j + ks] * cache[j + ks, c]
                a2 += p[j + 2 * ks] * cache[j + 2 * ks, c]
                a3 += p[j + 3 * ks] * cache[j + 3 * ks, c]
                j += 4 * ks
            while j < nk:
                a0 += p[j] * cache[j, c]
                j += ks
            pc[ty, c] = (a0 + a1) + (a2 + a3)
        cuda.syncthreads()
        for c in range(lt, C, NT):
            acc = np.float32(0.0)
            for y in range(ks):
                acc += pc[y, c]
            ctx[c] = acc * inv
        cuda.syncthreads()
        for v in range(lt, V, NT):                           # o = W_UV ctx
            acc = np.float32(0.0)
            for c in range(C):
                acc += wkv_b[wo + N + v, c] * ctx[c]
            o[row, h * V + v] = acc

    _ATTN_CACHE[key] = mla_attention_kernel
    return mla_attention_kernel


# ---- the W16A16 attention core in logical key order ---------------------------------------------------

# warps of a core block: key k goes to slice k % S, then to accumulator (k // S) % 4 (under the simulator
# S = 2 keeps its thread count low: the same source, sums in another fixed grouping, as blockops.KS)
CORE_SLICES = 2 if SIMULATED else 8
CORE_UNROLL = 4
CORE_THREADS = 32 * CORE_SLICES
CORE_COLS = 64                      # latent columns per block: a bf16 pair per lane
MAX_TREE_DEPTH = 128                # a tree row's depth bound (its ancestors' map in shared memory)
_CORE_CACHE: dict = {}


def make_mla_core_bf16(n_heads: int, c_rank: int, max_keys: int, hg: int):
    """The W16A16 attention core after the scores: masked softmax and ctx = bf16(p) @ c_kv, with every
    row's keys in logical order (the cached rows by position, then its ancestors by depth, then
    itself), so a sum's order depends on the key's position in the sequence only: a verify row equals,
    bit for bit, the decode row of the same token at the same position, whatever slots its ancestors
    and their siblings took.

    kernel(ctx int16 [H, T, C] (bf16 bits), scores float32 [H, T, S8] (unscaled q . k over the cache
    rows), cache int32 [S8, (C+R)/2] (bf16 pairs), depth [T] int32, vis [T', T'] uint8, meta, scale);
    grid (T, H / hg, ceil(C / 64)), block (32, S). Row i sees its nk = start + depth[i] + 1 keys: key k
    is cache row k below start, then start + (the slot of i's ancestor at depth k - start). A row whose
    depth is its slot (prefill, a chain) sees slots 0..i. p = bf16(softmax(scale * scores)); slice s
    of the block's S = CORE_SLICES sums keys k = s (mod S), in four accumulators by (k // S) mod 4, the
    slices meet in fixed order, and ctx is rounded to bf16. A tree row deeper than MAX_TREE_DEPTH writes
    NaN, a row past meta[1] zeros.
    Shared memory: 4 * (hg * max_keys + S * hg * 64 + 64 S hg) + 512 bytes.
    """
    key = (n_heads, c_rank, max_keys, hg)
    if key in _CORE_CACHE:
        return _CORE_CACHE[key]
    C2, MK, HG = c_rank // 2, max_keys, hg
    S, U, NT, CW, MD = CORE_SLICES, CORE_UNROLL, CORE_THREADS, CORE_COLS, MAX_TREE_DEPTH

    @cuda.jit
    def mla_core_kernel(ctx, scores, cache, depth, vis, meta, scale):
        row = cuda.blockIdx.x
        h0 = cuda.blockIdx.y * HG
        lane = cuda.threadIdx.x
        sl = cuda.threadIdx.y
        lt = sl * TPB + lane
        col0 = cuda.blockIdx.z * CW
        if row >= meta[1]:                                     # a row past the live ones: zeros
            for i in range(lt, HG * CW, NT):
                if col0 + i % CW < 2 * C2:
                    ctx[h0 + i // CW, row, col0 + i % CW] = stored_as(ctx, np.float32(0.0))
            return
        c2 = cuda.blockIdx.z * (CW // 2) + lane                 # this lane's column pair
        anc = cuda.shared.array(MD, np.int32)                  # slot of the ancestor at each depth
        p = cuda.shared.array((HG, MK), np.float32)
        red = cuda.shared.array((HG, NT), np.float32)          # per head: thread maxima ...
        zs = cuda.shared.array((HG, NT), np.float32)           # ... and sums (no barrier between)
        part = cuda.shared.array((S, HG, CW), np.float32)
        start = meta[0]
        dr = depth[row]
        tree = dr != row
        bad = tree and dr >= MD
        if tree and not bad:
            for t in range(lt, row + 1, NT):
                if vis[row, t] != 0 and depth[t] < MD:
                    anc[depth[t]] = t
        cuda.syncthreads()
        nk = 0 if bad else start + dr + 1
        for hh in range(HG):                                   # scale * scores by logical key
            m = -math.inf
            for k in range(lt, nk, NT):
                j = start + anc[k - start] if tree and k >= start else k
                s = scores[h0 + hh, row, j] * scale
                p[hh, k] = s
                m = max(m, s)
            red[hh, lt] = m
        cuda.syncthreads()
        st = NT // 2                                           # every head's max, by halving strides
        while st > 0:
            if lt < st:
                for hh in range(HG):
                    red[hh, lt] = max(red[hh, lt], red[hh, lt + st])
            cuda.syncthreads()
            st //= 2
        for hh in range(HG):
            m = red[hh, 0]
            z = np.float32(0.0)
            for k in range(lt, nk, NT):
                e = math.exp(p[hh, k] - m)
                p[hh, k] = e
                z += e
            zs[hh, lt] = z
        cuda.syncthreads()
        st = NT // 2                                           # every head's sum, in the same fixed order
        while st > 0:
            if lt < st:
                for hh in range(HG):
                    zs[hh, lt] += zs[hh, lt + st]
            cuda.syncthreads()
            st //= 2
        for hh in range(HG):                                   # p = bf16(softmax)
            z = zs[hh, 0]
            for k in range(lt, nk, NT):
                p[hh, k] = bf162_to_f32(np.uint32(stored_as(ctx, p[hh, k] / z)) & np.uint32(0xFFFF))[0]
        cuda.syncthreads()
        acc = cuda.local.array((U, HG, 2), np.float32)
        for u in range(U):
            for hh in range(HG):
                acc[u, hh, 0] = np.float32(0.0)
                acc[u, hh, 1] = np.float32(0.0)
        if c2 < C2:
            k = sl
            while k < nk:                                      # keys k, k + 8, ... of this slice
                for u in range(U):
                    kk = k + u * S
                    if kk < nk:
                        j = start + anc[kk - start] if tree and kk >= start else kk
                        lo, hi = bf162_to_f32(cache[j, c2])
                        for hh in range(HG):
                            acc[u, hh, 0] += p[hh, kk] * lo
                            acc[u, hh, 1] += p[hh, kk] * hi
                k += U * S
        for hh in range(HG):
            for w in range(2):
                part[sl, hh, 2 * lane + w] = (acc[0, hh, w] + acc[1, hh, w]) + (acc[2, hh, w] + acc[3, hh, w])
        cuda.syncthreads()
        for i in range(lt, HG * CW, NT):                       # the slices in order
            hh = i // CW
            col = i - hh * CW
            if col0 + col < 2 * C2:
                a = part[0, hh, col]
                for t in range(1, S):
                    a += part[t, hh, col]
                if bad:
                    a = math.nan
                ctx[h0 + hh, row, col0 + col] = stored_as(ctx, a)

    _CORE_CACHE[key] = mla_core_kernel
    return mla_core_kernel


def mla_core_bf16(ctx, scores, cache, depth, vis, meta, scale: float, stream=0,
                  hg: int | None = None) -> None:
    """ctx int16 [H, T, C] (bf16 bits) = ``make_mla_core_bf16``'s core over scores float32 [H, T, S8] and
    the bf16 latent cache as int32 pairs [S8, (C+R)/2], for the grid's T rows (depth, vis, meta as the
    engine's); hg heads a block (default ``core_heads_per_block``; no sum depends on it)."""
    ctx = check(ctx, "ctx", np.int16, (None, None, None))
    h, t, c = ctx.shape
    scores = check(scores, "scores", np.float32, (h, t, None))
    s8 = scores.shape[2]
    cache = check(cache, "cache", np.int32, (s8, None))
    if c % 2 or 2 * cache.shape[1] < c:
        raise KernelInputError(f"the attention core's latent width {c} must be even and within the cache's "
                               f"{2 * cache.shape[1]} columns")
    hg = hg or core_heads_per_block(h, s8)
    make_mla_core_bf16(h, c, s8, hg)[(t, h // hg, -(-c // CORE_COLS)), (TPB, CORE_SLICES), stream](
        ctx, scores, cache, depth, vis, meta, np.float32(scale))


def core_heads_per_block(n_heads: int, max_keys: int) -> int:
    """Heads a core block takes (sharing its key loads): the most of 4, 2, 1 that divides H and keeps
    p's shared rows within 24 KB, the block's shared memory within 48 KB (the heads a block takes do
    not change any sum's order)."""
    for hg in (4, 2, 1):
        if n_heads % hg == 0 and hg * max_keys * 4 <= 24 * 1024:
            return hg
    raise KernelInputError(f"the attention core holds at most {24 * 1024 // 4} keys, got {max_keys}")

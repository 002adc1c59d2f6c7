"""Absorbed MLA over the latent cache, mirroring ``workbench.reference.mla.mla_absorbed``.

Legend: T rows (new tokens) in the buffers, n = meta[1] live rows, start = meta[0] cached rows
before them, H heads, N qk_nope dims, R rope dims, V v_head dims, C kv_lora_rank, Q q_lora_rank,
S cache rows. Cache row = [c_kv (C, normalised) || k_pe (R, rotated)] (interleaved rope order).

One kernel shape serves prefill (causal ``vis``), decode (n = 1) and DDTree verify (the
ancestor-or-self ``vis`` of the tree): new row i sees every cached row < start and new row j iff
vis[i, j] != 0; its rope position is start + depth[i].

- ``mla_prep_kernel``: per new row, q_norm(c_q) and the latent row (kv_norm(c_kv) || rope(k_pe)),
  written to cache rows start + i.
- ``q_rope_kernel``: the W16A16 core's query rows, rope part (the W_UK part: ``w16a16`` grouped);
  ``softmax16_kernel``: its masked softmax into bf16 probabilities (the GEMMs around it: cuBLAS).
- ``make_mla_attention``: per (row, head) block, q_lat = W_UK^T q_nope, rope(q_pe), masked softmax
  over the cache in shared memory, ctx = p @ c_kv, o = W_UV ctx. W_UK / W_UV are read from wkv_b
  [H*(N+V), C] in place (no per-token absorption in a separate launch).
"""

from __future__ import annotations

import functools
import math

import numpy as np
from numba import cuda

from ._validate import KernelInputError, check
from .blockops import KS, NEG_INF, TPB, block_lane, block_max, block_sum, row_slices
from .device import SIMULATED
from .intrinsics import bf162_to_f32, griddep_launch_dependents, griddep_wait, stored_as
from .launch import launch
from .rmsnorm import NORM_JIT, NORM_THREADS, held_sumsq, hold_row, hold_vec, store_normed, warps_max
from .rope import rope_pair


@functools.cache
def make_mla_prep_kernel(QN: int, CN: int, RN: int):
    """mla_prep_kernel for at most QN query-norm features, CN latent features and RN rope pairs a thread
    (block (32, ks): QN = ceil(Q / 32 ks), ...): every load of the row, and the two norms' weights (before
    the PDL wait: weights depend on no kernel), in flight at once; then the sums (a thread's features in
    index order, then ``block_sum``'s) and the stores. Each phase of the strided form waited out its own
    memory round trip, the later loads behind the earlier stores (generic pointers may alias)."""

    @cuda.jit(**NORM_JIT)
    def mla_prep_kernel(qn, cache, a1, q_norm, kv_norm, cos, sin, depth, meta, q_rank, c_rank, eps):
        """a1 [T, Q+C+R] (or [T, H*(N+R)+C+R] when q_rank == 0) -> qn [T, Q], cache rows start+i
        (float32, or bf16 bits in an int16 cache: the W16A16 attention's latent cache).

        grid (T,), block (32, ks) with ks = ``rmsnorm.norm_slices`` of the longer norm. q_rank 0 skips
        the query norm (q comes straight from a1). Launched with PDL (waits, then lets the next kernel
        start)."""
        lt = cuda.threadIdx.y * TPB + cuda.threadIdx.x
        nt = TPB * cuda.blockDim.y
        qw = cuda.local.array(QN, np.float32)
        cw = cuda.local.array(CN, np.float32)
        hold_vec(qw, q_norm, QN, q_rank, lt, nt)
        hold_vec(cw, kv_norm, CN, c_rank, lt, nt)
        griddep_wait()
        griddep_launch_dependents()
        row = cuda.blockIdx.x
        if row >= meta[1]:
            return
        sh = cuda.shared.array(NORM_THREADS, np.float32)
        start = meta[0]
        off = a1.shape[1] - cache.shape[1]                   # column where c_kv starts in a1
        half = (cache.shape[1] - c_rank) // 2
        pos = start + depth[row]
        qv = cuda.local.array(QN, np.float32)
        cv = cuda.local.array(CN, np.float32)
        rv = cuda.local.array((RN, 2), np.float32)
        hold_row(qv, a1, row, 0, QN, q_rank, lt, nt)
        hold_row(cv, a1, row, off, CN, c_rank, lt, nt)
        for i in range(RN):
            p = lt + i * nt
            ok = p < half
            rv[i, 0] = a1[row, off + c_rank + 2 * p] if ok else np.float32(0.0)
            rv[i, 1] = a1[row, off + c_rank + 2 * p + 1] if ok else np.float32(0.0)
        dst = start + row
        if q_rank > 0:
            ms = block_sum(sh, held_sumsq(qv, QN, q_rank, lt, nt)) / np.float32(q_rank)
            r = np.float32(1.0) / math.sqrt(ms + eps)
            store_normed(qn, row, 0, qw, qv, r, QN, q_rank, lt, nt)
        ms = block_sum(sh, held_sumsq(cv, CN, c_rank, lt, nt)) / np.float32(c_rank)
        r2 = np.float32(1.0) / math.sqrt(ms + eps)
        store_normed(cache, dst, 0, cw, cv, r2, CN, c_rank, lt, nt)
        for i in range(RN):
            p = lt + i * nt
            if p < half:
                y0, y1 = rope_pair(rv[i, 0], rv[i, 1], cos, sin, pos, p)
                cache[dst, c_rank + 2 * p] = stored_as(cache, y0)
                cache[dst, c_rank + 2 * p + 1] = stored_as(cache, y1)

    return mla_prep_kernel


def prep_counts(q_rank: int, c_rank: int, rope: int, threads: int) -> tuple[int, int, int]:
    """(QN, CN, RN) of ``make_mla_prep_kernel`` for these widths over ``threads`` threads."""
    return (max(1, -(-q_rank // threads)), max(1, -(-c_rank // threads)), max(1, -(-(rope // 2) // threads)))


mla_prep_kernel = make_mla_prep_kernel(*prep_counts(1536, 512, 64, TPB * 12))   # K2's (the PTX probes')


@cuda.jit
def q_rope_kernel(q_all, q, cos, sin, depth, meta, nope, rope, lat):
    """q_all [T, H*(C+R)] int16 bf16 bits, columns h (C+R) + C .. + R = bf16(rope(q_pe of head h)) at
    position start + depth[t] (q [T, >= H*(N+R)] float32, N = nope, R = rope, C = lat); zeros for rows
    past meta[1]. The W16A16 absorption writes the C columns before them. grid (T, H), block (32,); PDL."""
    griddep_wait()
    griddep_launch_dependents()
    t = cuda.blockIdx.x
    h = cuda.blockIdx.y
    live = t < meta[1]
    pos = meta[0] + depth[t] if live else 0
    src = h * (nope + rope) + nope
    dst = h * (lat + rope) + lat
    for i in range(cuda.threadIdx.x, rope // 2, cuda.blockDim.x):
        y0 = y1 = np.float32(0.0)
        if live:
            y0, y1 = rope_pair(q[t, src + 2 * i], q[t, src + 2 * i + 1], cos, sin, pos, i)
        q_all[t, dst + 2 * i] = stored_as(q_all, y0)
        q_all[t, dst + 2 * i + 1] = stored_as(q_all, y1)


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


@cuda.jit
def key_mask_kernel(hidden, vis, meta):
    """hidden uint8 [T, S8] (a torch bool buffer) = 1 where row i may not see key j: every key below
    start = meta[0] is seen, key start + t when t < meta[1] and vis[i, t], the rest (later keys, padding)
    is hidden: the key mask of a step's rows, built once for every layer's BLAS attention core.
    grid (T,), block (any)."""
    griddep_wait()                                          # PDL: the inputs are earlier kernels'
    griddep_launch_dependents()
    i = cuda.blockIdx.x
    start, live = meta[0], meta[1]
    for j in range(cuda.threadIdx.x, hidden.shape[1], cuda.blockDim.x):
        t = j - start
        seen = t < 0 or (t < live and vis[i, t] != 0)
        hidden[i, j] = 0 if seen else 1


SOFTMAX_KPT = 16                    # most keys a thread of the softmax kernel holds
SOFTMAX_MAX_KEYS = SOFTMAX_KPT * TPB * 32   # its longest row (32 warps); torch's softmax beyond


@functools.cache
def make_softmax16(KPT: int):
    """softmax16_kernel for rows of at most KPT keys a thread: a thread's scores and mask bytes loaded at
    once and held (v2 read the row three times, each mask load ahead of its score load, and took the
    block's max over every thread's slot in one thread); the max by shuffles (exact in any order),
    the sum of each thread's exponentials in key order, then ``blockops.block_sum``'s order."""

    @cuda.jit(**NORM_JIT)
    def softmax16_kernel(p16, scores, hidden, n_heads, scale):
        """p16 [T*H, S8] int16 bf16 bits = bf16(softmax over the keys of scale * scores [T*H, S8]) with
        key j of row t hidden where hidden[t, j] (uint8 [T, S8], the step's key mask), hidden keys 0; a
        row with every key hidden (a padding row) all 0, float32 exponentials and quotient as torch's
        masked softmax. grid (T*H,), block (32, ks) with S8 <= KPT 32 ks; PDL."""
        griddep_wait()
        griddep_launch_dependents()
        sh = cuda.shared.array(NORM_THREADS, np.float32)
        wm = cuda.shared.array(TPB, np.float32)              # a warp's max (at most 32 warps)
        sv = cuda.local.array(KPT, np.float32)
        row = cuda.blockIdx.x
        t = row // n_heads
        lt = cuda.threadIdx.y * TPB + cuda.threadIdx.x
        nt = TPB * cuda.blockDim.y
        nk = scores.shape[1]
        for i in range(KPT):                                 # every load in flight before a use
            j = lt + i * nt
            s = scores[row, j] if j < nk else np.float32(0.0)
            hv = hidden[t, j] if j < nk else np.uint8(1)
            sv[i] = s * scale if hv == 0 else NEG_INF
        m = NEG_INF
        for i in range(KPT):
            m = max(m, sv[i])
        m = warps_max(wm, m)
        total = np.float32(0.0)
        if m != NEG_INF:                                     # the same in every thread
            for i in range(KPT):
                e = math.exp(sv[i] - m) if sv[i] != NEG_INF else np.float32(0.0)
                sv[i] = e
                total += e
        total = np.float32(block_sum(sh, total))
        for i in range(KPT):
            j = lt + i * nt
            if j < nk:
                v = sv[i] / total if m != NEG_INF else np.float32(0.0)
                p16[row, j] = stored_as(p16, v)

    return softmax16_kernel


def softmax16(p16, scores, hidden, n_heads: int, scale: float, rows: int, stream=0) -> None:
    """Launch ``make_softmax16``'s kernel over rows x heads: (32, ks) threads a row, ks the fewest warps
    (at least ``row_slices``) that hold S8 keys at SOFTMAX_KPT a thread."""
    s8 = scores.shape[1]
    if s8 > SOFTMAX_MAX_KEYS:
        raise KernelInputError(f"the softmax kernel holds at most {SOFTMAX_MAX_KEYS} keys a row, got {s8}")
    ks = min(32, max(row_slices(s8), -(-s8 // (TPB * SOFTMAX_KPT))))
    kern = make_softmax16(-(-s8 // (TPB * ks)))
    launch(kern, rows * n_heads, (TPB, ks), stream,
           (p16, scores, hidden, np.int32(n_heads), np.float32(scale)))


softmax16_kernel = make_softmax16(SOFTMAX_KPT)      # at 4,096 keys on 8 warps (the PTX probes')


# ---- the W16A16 attention core in logical key order ---------------------------------------------------

# a row's nk keys split into CORE_CHUNKS chunks of ceil(nk / CORE_CHUNKS) logical positions: the split
# depends on nk alone, so a tree row and the decode row of its token sum alike (fewer under the
# simulator, as blockops.KS: the same source, sums in another fixed grouping)
CORE_CHUNKS = 4 if SIMULATED else 16
CORE_UNROLL = 4                     # cache rows a chunk thread loads before it sums them (in key order)
MAX_TREE_DEPTH = 128                # a tree row's depth bound (its ancestors' map in shared memory)
_CORE_CACHE: dict = {}


def core_chunk_keys(max_keys: int) -> int:
    """The most keys a chunk of a row with up to ``max_keys`` keys holds."""
    return -(-max_keys // CORE_CHUNKS)


def make_mla_core_bf16(n_heads: int, c_rank: int, max_keys: int, hg: int):
    """The W16A16 attention core after the scores: masked softmax and ctx = bf16(p) @ c_kv, with every
    row's keys in logical order (the cached rows by position, then its ancestors by depth, then
    itself), so a sum's order depends on the key's position in the sequence only: a verify row equals,
    bit for bit, the decode row of the same token at the same position, whatever slots its ancestors
    and their siblings took. Three kernels (scores float32 [H, T, S8], unscaled q . k over the cache
    rows; cache int32 [S8, (C+R)/2] bf16 pairs; depth [T], vis [T', T'] uint8, meta as the engine's):

    stats(stats [H, T, 2], scores, depth, vis, meta, scale), grid (T, H), block (32, KS): the row's max m
    of scale * scores over its nk = start + depth + 1 keys and z = sum exp(scale * s - m) (threads over
    k mod 32 KS, then ``blockops.block_sum``'s fixed order). Key k is cache row k below start, then
    start + (the slot of the row's ancestor at depth k - start); a row whose depth is its slot (prefill,
    a chain) sees slots 0..i.
    chunks(part [NC, H, T, C], ctx (its dtype only), stats, scores, cache, depth, vis, meta, scale),
    grid (T, NC, H / hg), a thread per latent column pair: chunk c takes the keys c kc .. (c + 1) kc - 1,
    kc = ceil(nk / NC), p = bf16(exp(scale * s - m) / z) in shared memory, each of its hg heads summed
    key after key from one read of the chunk's cache rows.
    combine(ctx int16 [H, T, C] (bf16 bits), part, meta, depth),
    grid (T, H): the used chunks added in order, rounded to bf16. A tree row deeper than MAX_TREE_DEPTH
    writes NaN, a row past meta[1] zeros.
    """
    key = (n_heads, c_rank, max_keys, hg)
    if key in _CORE_CACHE:
        return _CORE_CACHE[key]
    C2, HG, NC, NS, MD, U = c_rank // 2, hg, CORE_CHUNKS, TPB * KS, MAX_TREE_DEPTH, CORE_UNROLL
    KC = core_chunk_keys(max_keys)

    @cuda.jit
    def core_stats_kernel(stats, scores, depth, vis, meta, scale):
        row, h = cuda.blockIdx.x, cuda.blockIdx.y
        lt, nt = block_lane()
        anc = cuda.shared.array(MD, np.int32)                  # slot of the ancestor at each depth
        red = cuda.shared.array(NS, np.float32)
        start, dr = meta[0], depth[row]
        tree = dr != row
        if row >= meta[1] or (tree and dr >= MD):
            return
        if tree:
            for t in range(lt, row + 1, nt):
                if vis[row, t] != 0 and depth[t] < MD:
                    anc[depth[t]] = t
        cuda.syncthreads()
        nk = start + dr + 1
        m = -math.inf
        for k in range(lt, nk, nt):
            m = max(m, scores[h, row, start + anc[k - start] if tree and k >= start else k] * scale)
        m = block_max(red, m)
        z = np.float32(0.0)
        for k in range(lt, nk, nt):
            z += math.exp(scores[h, row, start + anc[k - start] if tree and k >= start else k] * scale - m)
        z = block_sum(red, z)
        if lt == 0:
            stats[h, row, 0] = m
            stats[h, row, 1] = z

    @cuda.jit
    def core_chunks_kernel(part, ctx, stats, scores, cache, depth, vis, meta, scale):
        row, ch, h0 = cuda.blockIdx.x, cuda.blockIdx.y, cuda.blockIdx.z * HG
        lt, nt = cuda.threadIdx.x, cuda.blockDim.x
        anc = cuda.shared.array(MD, np.int32)
        p = cuda.shared.array((HG, KC), np.float32)
        start, dr = meta[0], depth[row]
        tree = dr != row
        if row >= meta[1] or (tree and dr >= MD):
            return
        nk = start + dr + 1
        kc = (nk + NC - 1) // NC
        k0 = ch * kc
        n = min(kc, nk - k0)
        if n <= 0:
            return
        if tree:                                               # as the stats kernel's, written out: the
            for t in range(lt, row + 1, nt):                   # PTX probe compiles this kernel without a
                if vis[row, t] != 0 and depth[t] < MD:         # driver, which a device function needs
                    anc[depth[t]] = t
        cuda.syncthreads()
        for i in range(lt, HG * n, nt):                        # p = bf16(softmax) of the chunk's keys
            hh = i // n
            kk = i - hh * n
            k = k0 + kk
            j = start + anc[k - start] if tree and k >= start else k
            e = math.exp(scores[h0 + hh, row, j] * scale - stats[h0 + hh, row, 0])
            pb = np.uint32(stored_as(ctx, e / stats[h0 + hh, row, 1])) & np.uint32(0xFFFF)
            p[hh, kk] = bf162_to_f32(pb)[0]
        cuda.syncthreads()
        if lt >= C2:
            return
        acc = cuda.local.array((HG, 2), np.float32)
        for hh in range(HG):
            acc[hh, 0] = np.float32(0.0)
            acc[hh, 1] = np.float32(0.0)
        kk = 0
        while kk < n:                                          # key after key: the sum's order, with
            v = cuda.local.array(U, np.int32)                  # U cache rows' loads issued first
            for u in range(U):
                k = min(k0 + kk + u, k0 + n - 1)
                v[u] = cache[start + anc[k - start] if tree and k >= start else k, lt]
            for u in range(U):
                if kk + u < n:
                    lo, hi = bf162_to_f32(v[u])
                    for hh in range(HG):
                        acc[hh, 0] += p[hh, kk + u] * lo
                        acc[hh, 1] += p[hh, kk + u] * hi
            kk += U
        for hh in range(HG):
            part[ch, h0 + hh, row, 2 * lt] = acc[hh, 0]
            part[ch, h0 + hh, row, 2 * lt + 1] = acc[hh, 1]

    @cuda.jit
    def core_combine_kernel(ctx, part, meta, depth):
        row, h, lt, nt = cuda.blockIdx.x, cuda.blockIdx.y, cuda.threadIdx.x, cuda.blockDim.x
        dr = depth[row]
        live = row < meta[1]
        bad = dr != row and dr >= MD
        nk = meta[0] + dr + 1
        kc = (nk + NC - 1) // NC
        used = (nk + kc - 1) // kc
        for col in range(lt, 2 * C2, nt):
            a = np.float32(0.0)
            if live and not bad:
                a = part[0, h, row, col]
                for c in range(1, used):
                    a += part[c, h, row, col]
            if live and bad:
                a = math.nan
            ctx[h, row, col] = stored_as(ctx, a)

    kernels = (core_stats_kernel, core_chunks_kernel, core_combine_kernel)
    _CORE_CACHE[key] = kernels
    return kernels


def mla_core_bf16(ctx, scores, cache, depth, vis, meta, scale: float, part, stats, stream=0,
                  hg: int | None = None) -> None:
    """ctx int16 [H, T, C] (bf16 bits) = ``make_mla_core_bf16``'s core over scores float32 [H, T, S8] and
    the bf16 latent cache as int32 pairs [S8, (C+R)/2], for the grid's T rows (depth, vis, meta as the
    engine's), through the scratch part float32 [CORE_CHUNKS, H, T, C] and stats float32 [H, T, 2];
    hg heads a chunk's block (default ``core_heads_per_block``; no sum depends on it)."""
    ctx = check(ctx, "ctx", np.int16, (None, None, None))
    h, t, c = ctx.shape
    scores = check(scores, "scores", np.float32, (h, t, None))
    s8 = scores.shape[2]
    cache = check(cache, "cache", np.int32, (s8, None))
    if c % 2 or 2 * cache.shape[1] < c:
        raise KernelInputError(f"the attention core's latent width {c} must be even and within the cache's "
                               f"{2 * cache.shape[1]} columns")
    part = check(part, "part", np.float32, (CORE_CHUNKS, h, t, c))
    stats = check(stats, "stats", np.float32, (h, t, 2))
    hg = hg or core_heads_per_block(h, s8)
    k_stats, k_chunks, k_combine = make_mla_core_bf16(h, c, s8, hg)
    s = np.float32(scale)
    k_stats[(t, h), (TPB, KS), stream](stats, scores, depth, vis, meta, s)
    k_chunks[(t, CORE_CHUNKS, h // hg), TPB * -(-c // (2 * TPB)), stream](part, ctx, stats, scores, cache,
                                                                         depth, vis, meta, s)
    k_combine[(t, h), TPB * -(-c // (2 * TPB)), stream](ctx, part, meta, depth)


def core_heads_per_block(n_heads: int, max_keys: int) -> int:
    """Heads a chunk's block takes (sharing its cache rows' loads): the most of 16, 8, 4, 2, 1 that
    divides H and keeps p's shared rows of a chunk within 24 KB (the heads a block takes do not change
    any sum's order)."""
    kc = core_chunk_keys(max_keys)
    for hg in (16, 8, 4, 2, 1):
        if n_heads % hg == 0 and hg * kc * 4 <= 24 * 1024:
            return hg
    raise KernelInputError(f"the attention core holds at most {CORE_CHUNKS * 24 * 1024 // 4} keys, "
                           f"got {max_keys}")

"""The W16A16 linear on tensor cores: out [T, N] (+)= bf16(x) [T, K] @ W.T, bf16 weights, float32 sums.

Legend: T rows (at most 8 MT, MT row tiles of 8), K input features, N output features (both multiples
of 16), NT column tiles of 16 a block, K16 = K/16 steps of the MMA, KS warps per block, CPW steps per
warp and batch, NB batches (K16 = NB KS CPW).

Every row is computed exactly as it would be alone: a row is one activation column of the MMA, and
its sum runs in one order fixed by (K, KS, CPW, NB), whatever T is or where the row sits. So a
verify's rows equal the decode rows of the same tokens bit for bit (cuBLAS picks another algorithm,
and another summation order, as T grows), and DDTree's output can equal AR's token for token.

Layout (``repack_w16``): W [N, K] in m16n8k16 A fragments: tile ``nt`` of 16 rows, step ``s`` of
16 columns, 128 uint32 words, lane ``l = 4 g + t`` holding a0..a3 at words 4 l .. 4 l + 3 (a0: row g,
a1: row g + 8; a0, a1 the step's columns 4t, 4t + 1, a2, a3 its columns 4t + 2, 4t + 3; low half the
lower column): one 16-byte load per lane and step. The MMA's k index 2t, 2t + 1, 2t + 8, 2t + 9 thus
stands for the columns 4t .. 4t + 3, so a lane's activations are one 16-byte load of 4 floats too.

A block (grid N/16/NT, KS warps) owns NT column tiles: per batch b, warp w loads steps b KS CPW +
w CPW .. + CPW of its tiles into registers, CPW/NT steps at a time (the first before the PDL wait),
then runs them over every row tile, chaining the MMA accumulators: row tile m, column g is row 8 m + g
of x (rows past the last read the last row and are never stored; no branch, so the loops unroll and
the NT x MT x 4 accumulators stay in registers), its two bf16 pairs rounded from the 4 floats as they
are read and fed to all NT tiles. Then the warps' partial sums meet in shared memory and add in warp
order. Every accumulator still sums its steps in the same order, so NT changes no bit of the output;
it divides the x each block reads (all of it) by NT, which is what bounds the kernel from 17 rows on.

Grouped (``Groups``): W stacks G matrices of GN rows each (an attention's per-head absorptions: W_UK
and W_UV of every head in one launch); output columns g GN .. (g + 1) GN take x columns g XG .. g XG + K
of a row XS long and land at columns g OG .. of out, so each head reads its own slice of q (or of ctx)
and writes into its slot of a wider row (q_lat beside q_pe). ``round_out``: the sums rounded to bf16
(stored as float32, or as bits into an int16 out), the reference's r(.) after a product.

With its RMSNorm (``norm``): x is rmsnorm(x) * nw, each block summing its rows' scales after the PDL
wait while its first weights load (``make_row_scales``: an order set by K and KS, so a row's scale does
not depend on the row count); ``norm_rows`` writes the same normed rows for a plain product.
Pipelined (``pipelined``): a warp keeps two batches of weights in registers, one loading while the
other multiplies, where a small grid would otherwise keep one batch an SM in flight.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from numba import cuda, float32, uint32

from ._validate import KernelInputError, as_array, check, flat
from .blockops import silu_mul
from .device import SIMULATED
from .intrinsics import (
    as_f32,
    bf162_to_f32,
    bits_to_bf162,
    f32_to_bf162,
    griddep_launch_dependents,
    griddep_wait,
    ld_stream_v4,
    ld_v4,
    mma_16816_bf16,
    stored_as,
)
from .launch import launch
from .rmsnorm import held_sumsq

ZERO = float32(0.0)
ROW_TILES = (1, 2, 3, 5, 9)    # the row-tile counts compiled: T <= 8, 16, 24, 40, 72 rows (a verify of
                               # B + 1 rows at B = 1..64 takes 1, 1, 1, 2, 3, 5, 9)
PIPE_TILES = 2                 # up to this many row tiles (16 rows), one column tile a block and ...
PIPE_BLOCKS = 264              # ... at most this many blocks (two an SM: more blocks keep more batches in
                               # flight already): two batches of weights in registers, one loading while
                               # the other multiplies (`pipelined`)
MIN_BLOCKS = 132               # a wave of blocks on the H200's 132 SMs (tiles_per_block keeps one)


@dataclass(frozen=True)
class Bf16Weight:
    """A repacked W16A16 matrix where the kernel reads it: ``words`` uint32 [N/16 * K/16 * 128] (a view
    of ``owner``'s memory, which it keeps alive)."""
    words: Any
    n: int
    k: int
    owner: Any = None


@dataclass(frozen=True)
class Groups:
    """A grouped product's strides (elements): GN output columns a group (a multiple of 16), x rows XS
    long with group g's K inputs at g XG, group g's outputs at out column g OG."""
    gn: int
    xs: int
    xg: int
    og: int


@cuda.jit(device=True, inline="always")
def normed(w_bits, x_bits, r):
    """w * (x * r) of a float32 weight and input given as their bits (a 16-byte load's words)."""
    return as_f32(w_bits) * (as_f32(x_bits) * r)


def _torch():
    import torch
    return torch


def repack_w16(w_t) -> Bf16Weight:
    """W.T [K, N] bfloat16 (a torch tensor, on the device or the host) into the fragment layout, on the
    same device (a GPU's weights never visit the host)."""
    torch = _torch()
    k, n = w_t.shape
    if w_t.dtype != torch.bfloat16 or k % 16 or n % 16:
        raise KernelInputError(f"a W16A16 weight is bfloat16 [K, N] with K, N multiples of 16, got "
                               f"{w_t.dtype} {tuple(w_t.shape)}")
    w = w_t.T.reshape(n // 16, 2, 8, k // 16, 4, 2, 2)        # (nt, row half, g, step, t, column half, lo/hi)
    frag = w.permute(0, 3, 2, 4, 5, 1, 6).contiguous()        # (nt, step, g, t, a-register, lo/hi)
    words = frag.view(torch.int16).view(-1).view(torch.int32)
    view = words.numpy() if words.device.type == "cpu" else cuda.as_cuda_array(words)
    return Bf16Weight(view.view(np.uint32), n, k, words)


def unrepack_w16(w: Bf16Weight) -> np.ndarray:
    """The inverse of ``repack_w16``: W [N, K] as uint16 bfloat16 bits on the host."""
    a = np.asarray(w.words) if SIMULATED or isinstance(w.words, np.ndarray) else w.words.copy_to_host()
    frag = a.view(np.uint16).reshape(w.n // 16, w.k // 16, 8, 4, 2, 2, 2)   # (nt, step, g, t, ch, rh, lo/hi)
    return np.ascontiguousarray(frag.transpose(0, 5, 2, 1, 3, 4, 6)).reshape(w.n, w.k)


@functools.cache
def w16_tiling(k: int) -> tuple[int, int, int]:
    """(KS warps, CPW steps per warp and batch, NB batches) with KS CPW NB = K/16: the most steps per
    batch with KS <= 8 (255 registers a thread still fit an SM: nine row tiles' accumulators) and
    CPW <= 8 (a warp's weights stay in registers), then the most per warp."""
    k16 = k // 16
    fits = [(ks * cpw, cpw, ks) for ks in range(1, 9) for cpw in range(1, 9) if k16 % (ks * cpw) == 0]
    _, cpw, ks = max(fits)
    return ks, cpw, k16 // (ks * cpw)


def row_tiles(rows: int) -> int:
    """The compiled row-tile count for ``rows`` rows (ROW_TILES)."""
    need = -(-rows // 8)
    for mt in ROW_TILES:
        if mt >= need:
            return mt
    raise KernelInputError(f"the W16A16 linear takes at most {8 * ROW_TILES[-1]} rows, got {rows}")


def tiles_per_block(w: Bf16Weight, mt: int, multi: bool) -> int:
    """NT column tiles a block for ``mt`` row tiles (each block reads all of x: NT tiles a block cut
    those reads NT-fold): with ``multi``, from 17 rows, the most of 4, 2 that keeps a wave of blocks
    (MIN_BLOCKS), divides CPW and keeps NT MT <= 12 accumulator tiles (past 48 floats numba's LLVM
    leaves the accumulators in local memory); else 1."""
    if not multi or mt <= 2:
        return 1
    tiles, cpw = w.n // 16, w16_tiling(w.k)[1]
    for nt in (4, 2):
        if tiles % nt == 0 and tiles // nt >= MIN_BLOCKS and cpw % nt == 0 and nt * mt <= 12:
            return nt
    return 1


def sq_slots(ks: int) -> int:
    """Shared float32 slots ``row_scales`` takes with ``ks`` warps."""
    return 8 * ks * 32 + 8 * ks


@functools.cache
def make_row_scales(K: int, KS: int, NRS: int):
    """The RMSNorm scales of a W16A16 product's rows (``linear(..., norm=)``), an inline device function
    row_scales(nr, sq, x, n_rows, eps, tid, warp, lane) for a block of KS warps: nr[r] = 1 / sqrt(mean(
    x[r]^2) + eps) for rows r < n_rows <= NRS of x [*, K], float32, 8 rows at a time:
    thread tid sums its strided features of each row, lane i of each warp its warp's 32 sums of row i,
    thread i the warps' sums in order. The order is set by K and KS alone, so a row's scale is the same
    whatever the row count, fused or in ``norm_rows``."""
    NTHR = KS * 32

    @cuda.jit(device=True, inline="always")
    def row_scales(nr, sq, x, n_rows, eps, tid, warp, lane):
        for r0 in range(0, NRS, 8):
            if r0 < n_rows:                                        # the same in every thread of the block
                for r in range(min(8, n_rows - r0)):               # a runtime bound: not unrolled, the
                    a = ZERO                                       # registers stay the MMA loop's
                    for j in range(tid, K, NTHR):
                        v = x[(r0 + r) * K + j]
                        a += v * v
                    sq[r * NTHR + tid] = a
                cuda.syncthreads()
                if lane < 8 and r0 + lane < n_rows:
                    a = ZERO
                    for i in range(32):
                        a += sq[lane * NTHR + warp * 32 + i]
                    sq[8 * NTHR + lane * KS + warp] = a
                cuda.syncthreads()
                if tid < 8 and r0 + tid < n_rows:
                    a = ZERO
                    for w_ in range(KS):
                        a += sq[8 * NTHR + tid * KS + w_]
                    nr[r0 + tid] = float32(1.0) / math.sqrt(a / float32(K) + eps)
                cuda.syncthreads()

    return row_scales


@functools.cache
def make_norm_rows_kernel(K: int, KS: int):
    """out [T, K] = rmsnorm(x [T, K]) * nw for rows < n_rows, each row's scale summed in the order of a
    W16A16 product of KS warps over K features with the norm folded in (``make_row_scales``): grid (T,),
    block (32 KS,), a row a block, a thread's K / (32 KS) features loaded before the first sum; PDL."""
    NTHR = KS * 32
    KN = -(-K // NTHR)                                             # features a thread holds

    @cuda.jit
    def norm_rows_kernel(out, x, nw, eps, n_rows):
        griddep_wait()
        griddep_launch_dependents()
        sq = cuda.shared.array(NTHR, float32)
        ws = cuda.shared.array(KS, float32)
        nr = cuda.shared.array(1, float32)
        tid = cuda.threadIdx.x
        r = cuda.blockIdx.x
        if r >= n_rows:                                            # the same in every thread of the block
            return
        v = cuda.local.array(KN, float32)
        for i in range(KN):                                        # every load in flight at once
            j = tid + i * NTHR
            v[i] = x[r * K + j] if j < K else ZERO
        sq[tid] = held_sumsq(v, KN, K, tid, NTHR)                  # row_scales' order: thread, warp, block
        cuda.syncthreads()
        if tid & 31 == 0:
            a = ZERO
            for i in range(32):
                a += sq[tid + i]
            ws[tid >> 5] = a
        cuda.syncthreads()
        if tid == 0:
            a = ZERO
            for w_ in range(KS):
                a += ws[w_]
            nr[0] = float32(1.0) / math.sqrt(a / float32(K) + eps)
        cuda.syncthreads()
        s = nr[0]
        for i in range(KN):
            j = tid + i * NTHR
            if j < K:
                out[r, j] = nw[j] * (v[i] * s)

    return norm_rows_kernel


def norm_rows(out, x, w: Bf16Weight, nw, eps: float, rows: int, stream=0) -> None:
    """out [T, K] float32 = rmsnorm(x [T, K]) * nw for the first ``rows`` rows, the bits a product on
    ``w`` with the norm folded in (``linear(..., norm=)``) reads: the unfused path for row counts where
    the fold does not pay."""
    x = check(x, "x", np.float32, (None, w.k))
    out = check(out, "out", np.float32, (None, w.k))
    nw = check(nw, "norm weight", np.float32, (w.k,))
    if not 1 <= rows <= min(x.shape[0], out.shape[0]):
        raise KernelInputError(f"rows must be in 1..{min(x.shape[0], out.shape[0])}, got {rows}")
    ks = w16_tiling(w.k)[0]
    launch(make_norm_rows_kernel(w.k, ks), rows, ks * 32, stream, (out, flat(x), nw, np.float32(eps), rows))


@cuda.jit
def glu_rows_kernel(a, gu, n_rows):
    """a [T, I] = silu(g) * u of gu [T, 2I] = [g || u] in float32, rows < n_rows: the expression the
    folded product (``linear(glu=True)``) forms, so the plain product after it gives the same bits;
    grid (ceil(I / 128), T), block (128,); PDL."""
    griddep_wait()
    griddep_launch_dependents()
    row = cuda.blockIdx.y
    i = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    width = a.shape[1]
    if row < n_rows and i < width:
        a[row, i] = silu_mul(gu[row, i], gu[row, width + i])


def glu_rows(a, gu, rows: int, stream=0) -> None:
    """a [T, I] float32 = silu(g) * u for gu [T, 2I] = [g || u], the first ``rows`` rows."""
    a = check(a, "a", np.float32, (None, None))
    gu = check(gu, "gu", np.float32, (None, 2 * a.shape[1]))
    if not 1 <= rows <= min(a.shape[0], gu.shape[0]):
        raise KernelInputError(f"rows must be in 1..{min(a.shape[0], gu.shape[0])}, got {rows}")
    launch(glu_rows_kernel, (-(-a.shape[1] // 128), rows), 128, stream, (a, gu, rows))


def pipelined(w: Bf16Weight, mt: int, nt: int) -> bool:
    """Whether a launch keeps two batches of weights in flight a warp: few row tiles (the registers),
    one column tile a block and a grid of at most two blocks an SM (an SM with more blocks has more
    batches in flight already, and the extra registers would cost it one). The same bits either way."""
    return mt <= PIPE_TILES and nt == 1 and w.n // 16 <= PIPE_BLOCKS


@functools.cache
def make_steps(K: int, KS: int, CPW: int, MT: int, NT: int, GLU: bool = False, GROUPS: Groups | None = None,
               NORM: bool = False):
    """(load_steps, mma_steps): a warp's share of one batch of a product's K steps, as inline device
    functions of a block of KS warps owning NT column tiles from nt0 (``make_w16a16_kernel`` has the
    legend and the x modes; ``persistent.py`` runs them too)."""
    K16 = K // 16
    XS = GROUPS.xs if GROUPS else (2 * K if GLU else K)            # x's row stride
    PF = CPW // NT                                                 # steps per weight load, each tile

    @cuda.jit(device=True, inline="always")
    def load_steps(wl, wq, nt0, b, h, warp, lane):
        """Steps s0 + h PF .. + PF of batch b (s0 = this warp's first), every tile, into registers wl."""
        s0 = b * KS * CPW + warp * CPW
        for n in range(NT):
            base = ((nt0 + n) * K16 + s0 + h * PF) * 128 + lane * 4
            for ci in range(PF):
                w = ld_stream_v4(wq, base + ci * 128)
                wi = (n * PF + ci) * 4
                wl[wi] = w[0]
                wl[wi + 1] = w[1]
                wl[wi + 2] = w[2]
                wl[wi + 3] = w[3]

    @cuda.jit(device=True, inline="always")
    def mma_steps(acc, wl, x, b, h, warp, g, t, n_rows, xg0, nr, nw):
        """The MMAs of those steps over every row tile, chained into acc in step order."""
        s0 = b * KS * CPW + warp * CPW
        for ci in range(PF):
            col = (s0 + h * PF + ci) * 16 + 4 * t                  # this lane's 4 columns of the step
            for m in range(MT):                                    # every tile, branch-free: rows past
                row = min(m * 8 + g, n_rows - 1)                   # n_rows read the last row, never stored
                if GLU:
                    xi = row * XS + col                            # silu(g) * u, float32, rounded as x is
                    xa = f32_to_bf162(silu_mul(x[xi], x[xi + K]), silu_mul(x[xi + 1], x[xi + K + 1]))
                    xb = f32_to_bf162(silu_mul(x[xi + 2], x[xi + K + 2]), silu_mul(x[xi + 3], x[xi + K + 3]))
                elif NORM:
                    xv = ld_v4(x, row * XS + col)                  # w * (x * r): the reference's order
                    wv = ld_v4(nw, col)
                    r = nr[row]
                    xa = f32_to_bf162(normed(wv[0], xv[0], r), normed(wv[1], xv[1], r))
                    xb = f32_to_bf162(normed(wv[2], xv[2], r), normed(wv[3], xv[3], r))
                else:
                    xv = ld_v4(x, row * XS + xg0 + col)
                    xa = bits_to_bf162(xv[0], xv[1])
                    xb = bits_to_bf162(xv[2], xv[3])
                for n in range(NT):                                # one x fragment, NT weight tiles
                    wi = (n * PF + ci) * 4
                    ai = (n * MT + m) * 4
                    d = mma_16816_bf16(wl[wi], wl[wi + 1], wl[wi + 2], wl[wi + 3], xa, xb,
                                       acc[ai], acc[ai + 1], acc[ai + 2], acc[ai + 3])
                    acc[ai] = d[0]                                 # four statements, not a loop: one
                    acc[ai + 1] = d[1]                             # more loop level and LLVM stops unrolling
                    acc[ai + 2] = d[2]
                    acc[ai + 3] = d[3]

    return load_steps, mma_steps


@functools.cache
def make_pipe(K: int, KS: int, CPW: int, NB: int, MT: int, GLU: bool = False, GROUPS: Groups | None = None,
              NORM: bool = False):
    """pipe_batches(acc, wa, wb, x, wq, nt0, warp, lane, g, t, n_rows, xg0, nr, nw): one column tile's
    NB >= 2 batches with two in registers, batch b + 1's weights loading while batch b multiplies; on
    entry wa and wb hold batches 0 and 1 (loaded by the caller, before a wait)."""
    load_steps, mma_steps = make_steps(K, KS, CPW, MT, 1, GLU, GROUPS, NORM)

    @cuda.jit(device=True, inline="always")
    def pipe_batches(acc, wa, wb, x, wq, nt0, warp, lane, g, t, n_rows, xg0, nr, nw):
        for b in range(0, NB, 2):
            mma_steps(acc, wa, x, b, 0, warp, g, t, n_rows, xg0, nr, nw)
            if b + 2 < NB:
                load_steps(wa, wq, nt0, b + 2, 0, warp, lane)
            if b + 1 < NB:
                mma_steps(acc, wb, x, b + 1, 0, warp, g, t, n_rows, xg0, nr, nw)
                if b + 3 < NB:
                    load_steps(wb, wq, nt0, b + 3, 0, warp, lane)

    return pipe_batches


@functools.cache
def make_store(KS: int, MT: int, NT: int, ACC: bool, ROUND: bool = False):
    """store_tiles(out, acc, red, nt0, oc0, n_rows, tid, warp, lane): the KS warps' partial sums of NT
    column tiles met in shared memory ``red`` (KS 128 floats) and added in warp order, out[row, oc0 + c]
    (+)= the sum (rounded to bf16 with ROUND); every thread of the block calls it."""

    @cuda.jit(device=True, inline="always")
    def store_tiles(out, acc, red, nt0, oc0, n_rows, tid, warp, lane):
        for n in range(NT):
            for m in range(MT):
                if m * 8 < n_rows:                                 # the same for every thread: no split sync
                    for i in range(4):
                        red[(warp * 4 + i) * 32 + lane] = acc[(n * MT + m) * 4 + i]
                    cuda.syncthreads()
                    for o in range(tid, 128, KS * 32):             # output column r of the tile, row j
                        r = o & 15
                        j = o >> 4
                        row = m * 8 + j
                        if row < n_rows:
                            ri = 2 * (r >> 3) + (j & 1)            # c0/c1 (column g) or c2/c3 (g + 8) ...
                            li = 4 * (r & 7) + (j >> 1)            # ... of lane 4 g + j / 2
                            s = ZERO
                            for w_ in range(KS):
                                s += red[(w_ * 4 + ri) * 32 + li]
                            if ROUND:
                                s = bf162_to_f32(f32_to_bf162(s, ZERO))[0]
                            c = oc0 + (nt0 + n) * 16 + r
                            if ACC:
                                out[row, c] += s
                            else:
                                out[row, c] = stored_as(out, s)
                    cuda.syncthreads()

    return store_tiles


@functools.cache
def make_w16a16_kernel(K: int, KS: int, CPW: int, NB: int, MT: int, NT: int, ACC: bool, GLU: bool = False,
                       GROUPS: Groups | None = None, ROUND: bool = False, PIPE: bool = False,
                       NORM: bool = False):
    """out [T, N] float32 (+= when ACC) = bf16(x [T, K] float32) @ W.T for rows < n_rows (<= 8 MT),
    NT column tiles a block. GLU: x is gu [T, 2K] = [g || u] and the activation silu(g) * u, computed in
    float32 as the lane reads it (a SwiGLU's down projection without a kernel of its own between).
    GROUPS: a grouped product (module docstring; NT = 1); ROUND: sums rounded to bf16 (out float32
    or int16 bits); PIPE (NT = 1, NB >= 2): batch b + 1's weights load while batch b multiplies.
    NORM (NT = 1, no GLU or groups): x is rmsnorm(x) * nw with eps, each row's 1 / rms summed by the block
    after the PDL wait (an RMSNorm folded into the projection after it).
    Arguments (out, x, wq, n_rows, nw, eps): nw and eps are read with NORM only."""
    GN = GROUPS.gn if GROUPS else 1 << 30                          # one group: every column in group 0
    XG = GROUPS.xg if GROUPS else 0
    OSHIFT = GROUPS.og - GROUPS.gn if GROUPS else 0                # out column - W row, per group
    NRED = KS * 4 * 32
    NWL = CPW * 4                                                  # CPW / NT steps of NT tiles
    NACC = NT * MT * 4
    PIPE = PIPE and NT == 1 and NB >= 2                            # two batches of weights in flight
    NRS = 8 * MT if NORM else 1                                    # rows whose 1 / rms a block keeps
    NSQ = sq_slots(KS) if NORM else 1

    row_scales = make_row_scales(K, KS, NRS)
    load_steps, mma_steps = make_steps(K, KS, CPW, MT, NT, GLU, GROUPS, NORM)
    pipe_batches = make_pipe(K, KS, CPW, NB, MT, GLU, GROUPS, NORM)
    store_tiles = make_store(KS, MT, NT, ACC, ROUND)

    @cuda.jit
    def w16a16_kernel(out, x, wq, n_rows, nw, eps):
        nt0 = cuda.blockIdx.x * NT
        tid = cuda.threadIdx.x
        warp = tid >> 5
        lane = tid & 31
        g = lane >> 2
        t = lane & 3
        red = cuda.shared.array(NRED, float32)
        sq = cuda.shared.array(NSQ, float32)
        nr = cuda.shared.array(NRS, float32)
        acc = cuda.local.array(NACC, float32)
        for i in range(NACC):
            acc[i] = ZERO
        grp = nt0 * 16 // GN
        xg0 = grp * XG
        oc0 = grp * OSHIFT
        if PIPE:                                                   # batch b + 1 loads while b multiplies
            wa = cuda.local.array(NWL, uint32)
            wb = cuda.local.array(NWL, uint32)
            load_steps(wa, wq, nt0, 0, 0, warp, lane)
            load_steps(wb, wq, nt0, 1, 0, warp, lane)
            griddep_wait()                                         # x and out are the previous kernels'
            griddep_launch_dependents()
            if NORM:
                row_scales(nr, sq, x, n_rows, eps, tid, warp, lane)
            pipe_batches(acc, wa, wb, x, wq, nt0, warp, lane, g, t, n_rows, xg0, nr, nw)
        else:
            wl = cuda.local.array(NWL, uint32)
            for b in range(NB):
                for h in range(NT):                                # steps s0 + h PF .. + PF, every tile
                    load_steps(wl, wq, nt0, b, h, warp, lane)
                    if b == 0 and h == 0:
                        griddep_wait()
                        griddep_launch_dependents()
                        if NORM:
                            row_scales(nr, sq, x, n_rows, eps, tid, warp, lane)
                    mma_steps(acc, wl, x, b, h, warp, g, t, n_rows, xg0, nr, nw)
        store_tiles(out, acc, red, nt0, oc0, n_rows, tid, warp, lane)

    return w16a16_kernel


def linear(out, x, w: Bf16Weight, rows: int, accumulate: bool = False, stream=0,
           multi_tile: bool = False, glu: bool = False, groups: Groups | None = None,
           round_out: bool = False, norm: tuple | None = None) -> None:
    """out [T, N] (+)= bf16(x [T, K]) @ W.T for the first ``rows`` rows (float32 x and out);
    ``multi_tile``: NT column tiles a block where ``tiles_per_block`` gives them (the same bits);
    ``glu``: x is [T, 2K] = [g || u] and the activation silu(g) * u (a SwiGLU's down projection);
    ``groups``: a grouped product, x [T, XS], out [T, >= (G - 1) OG + GN] (module docstring);
    ``round_out``: the sums rounded to bf16; an int16 ``out`` takes them as bf16 bits;
    ``norm`` (nw [K] float32, eps): x is rmsnorm(x) * nw, every block summing the 1 / rms of its launch's
    rows (up to 72) itself."""
    if not isinstance(w, Bf16Weight):
        raise KernelInputError("w must come from repack_w16")
    cols, width = w.n, (2 * w.k if glu else w.k)
    if groups is not None:
        g = groups
        if glu or multi_tile or g.gn % 16 or w.n % g.gn or g.xs % 4 or g.xg % 4 or g.og < g.gn:
            raise KernelInputError(f"a grouped W16A16 product needs GN a multiple of 16 dividing N = {w.n}, "
                                   f"XS and XG multiples of 4, OG >= GN, no GLU or multi-tile: got {g}")
        ng = w.n // g.gn
        if (ng - 1) * g.xg + w.k > g.xs:
            raise KernelInputError(f"a grouped W16A16 product reads {(ng - 1) * g.xg + w.k} columns of "
                                   f"rows of {g.xs}")
        cols, width = (ng - 1) * g.og + g.gn, g.xs
    if norm is not None and (glu or groups is not None or multi_tile):
        raise KernelInputError("a W16A16 product with its RMSNorm takes no GLU, groups or column tiles")
    x = check(x, "x", np.float32, (None, width))
    out = as_array(out, "out")
    o16 = not accumulate and np.dtype(out.dtype) == np.int16
    out = check(out, "out", np.int16 if o16 else np.float32, (None, None))
    if out.shape[1] < cols or (groups is None and out.shape[1] != cols):
        raise KernelInputError(f"out: shape {tuple(out.shape)} but {cols} columns are required")
    if not 1 <= rows <= min(x.shape[0], out.shape[0]):
        raise KernelInputError(f"rows must be in 1..{min(x.shape[0], out.shape[0])}, got {rows}")
    nw, eps = (check(norm[0], "norm weight", np.float32, (w.k,)), np.float32(norm[1])) if norm is not None \
        else (flat(x), np.float32(0.0))                              # (not read without the norm)
    ks, cpw, nb = w16_tiling(w.k)
    most = 8 * ROW_TILES[-1]
    for r0 in range(0, rows, most):                    # a prefill's rows, 72 at a time (rows are independent)
        n = min(most, rows - r0)
        mt = row_tiles(n)
        nt = 1 if groups is not None or norm is not None else tiles_per_block(w, mt, multi_tile)
        kernel = make_w16a16_kernel(w.k, ks, cpw, nb, mt, nt, accumulate, glu, groups, round_out and not o16,
                                    pipelined(w, mt, nt), norm is not None)   # (int16 bits round as stored)
        launch(kernel, w.n // (16 * nt), ks * 32, stream, (out[r0:], flat(x[r0:]), w.words, n, nw, eps))

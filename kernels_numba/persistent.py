"""A W16A16 SwiGLU MLP in one persistent launch: h [T, D] (+)= bf16(silu(g) * u) @ W2.T with
[g || u] = bf16(x) @ W13.T: a dense MLP, a shared expert or the drafter's MLP, up to 8 rows.

The ops path launches three kernels chained by PDL: the W13 product, ``glu_rows``, the W2 product. PDL
lets a kernel's blocks issue their weight loads before the previous kernel ends only where they fit on
an SM beside its blocks; a W16A16 product at one row keeps two blocks an SM with 128 registers a thread,
so the next product's blocks mostly start as the last ones leave. Here a cooperative grid of blocks that
are all resident at once runs the three stages with a grid-wide barrier between them:

1. gu = bf16(x) @ W13.T, the column tiles over the blocks;
2. a = silu(g) * u, the elements over the grid's threads;
3. h (+)= bf16(a) @ W2.T, the column tiles over the blocks.

Each block loads the first two batches of its next tile's weights into registers before it stores the
tile it finished, and when it has no W13 tile left it asks the L2 for the first two batches of its first
W2 tile (one bulk prefetch), so stage 3 starts from the L2 while the other blocks finish stage 1.
Nothing is held in registers across a barrier: numba's grid sync is a call into the device runtime,
around which live registers go to the stack. A barrier costs about what a launch in a CUDA graph does (a
numba-cuda grid sync: 1.4 us at 132 blocks on an H200), so what this can win is that overlap alone. The
products run the W16A16 kernel's own steps, loads and stores (``w16a16.make_steps`` / ``make_pipe`` /
``make_store``) and the activation is ``glu_rows``' expression, so the output has the bits of the three
launches.

The simulator runs a cooperative grid of one block only (its grid sync is a block barrier).
"""

from __future__ import annotations

import functools

import numpy as np
from numba import cuda, float32, uint32

from ._validate import KernelInputError, check, flat
from .blockops import silu_mul
from .device import SIMULATED, sm_count
from .intrinsics import griddep_launch_dependents, griddep_wait, prefetch_l2
from .launch import launch
from .resources import register_cap
from .w16a16 import Bf16Weight, make_pipe, make_steps, make_store, row_tiles, w16_tiling

ZERO = float32(0.0)
MAX_ROWS = 8                   # one row tile: decode, the drafter's block (two spill at the 128 cap)
BLOCKS_PER_SM = 2              # 256 threads at the 128-register cap: two blocks an SM are resident


def tiling(d: int, i: int) -> tuple[int, int, int, int] | None:
    """(KS warps, CPW steps per warp and batch, NB of W13, NB of W2) where both products share a block
    shape and a weight-register batch and each has two batches or more, else None."""
    ks1, cpw1, nb1 = w16_tiling(d)
    ks2, cpw2, nb2 = w16_tiling(i)
    if (ks1, cpw1) != (ks2, cpw2) or min(nb1, nb2) < 2:
        return None
    return ks1, cpw1, nb1, nb2


def fits(d: int, i: int, rows: int) -> bool:
    """Whether the persistent SwiGLU takes D, I (multiples of 16) at ``rows`` rows."""
    return d % 16 == 0 and i % 16 == 0 and 1 <= rows <= MAX_ROWS and tiling(d, i) is not None


def grid_blocks() -> int:
    """The cooperative grid: every block resident at once (one block under the simulator)."""
    return 1 if SIMULATED else BLOCKS_PER_SM * sm_count()


@functools.cache
def make_persistent_swiglu(D: int, I: int, MT: int, ACC: bool):  # noqa: E741 - the legend's I
    """The kernel (h, x, gu, a, w13, w2, n_rows): x [T D] and a [T I] flat, gu [T, 2I] (a and gu float32
    scratch), rows < n_rows <= 8 MT; grid: ``grid_blocks()``, block (32 KS,)."""
    ks, cpw, nb1, nb2 = tiling(D, I)
    T1, T2 = 2 * I // 16, D // 16                                  # column tiles of W13, of W2
    NTHR = ks * 32
    NRED = ks * 128
    NWL = cpw * 4
    NACC = MT * 4
    W2_TILE = I // 16 * 128                                        # words of a W2 column tile
    PREFETCH = min(W2_TILE, 2 * ks * cpw * 128) * 4                # bytes of its first two batches
    load1, _ = make_steps(D, ks, cpw, MT, 1)
    load2, _ = make_steps(I, ks, cpw, MT, 1)
    pipe1, pipe2 = make_pipe(D, ks, cpw, nb1, MT), make_pipe(I, ks, cpw, nb2, MT)
    store1, store2 = make_store(ks, MT, 1, False), make_store(ks, MT, 1, ACC)

    @cuda.jit(**register_cap(BLOCKS_PER_SM * NTHR))
    def persistent_swiglu_kernel(h, x, gu, a, w13, w2, n_rows):
        blk = cuda.blockIdx.x
        nblk = cuda.gridDim.x
        tid = cuda.threadIdx.x
        warp = tid >> 5
        lane = tid & 31
        g = lane >> 2
        t = lane & 3
        red = cuda.shared.array(NRED, float32)
        acc = cuda.local.array(NACC, float32)
        wa = cuda.local.array(NWL, uint32)
        wb = cuda.local.array(NWL, uint32)
        if blk < T1:                                               # weights first: they depend on nothing
            load1(wa, w13, blk, 0, 0, warp, lane)
            load1(wb, w13, blk, 1, 0, warp, lane)
        griddep_wait()                                             # x and h are the previous kernels'
        griddep_launch_dependents()
        if blk >= T1 and blk < T2 and tid == 0:                    # no W13 tile: the first W2 tile to L2
            prefetch_l2(w2, uint32(blk) * uint32(W2_TILE), PREFETCH)
        nt = blk                                                   # 1. gu = bf16(x) @ W13.T (while loops:
        while nt < T1:                                             # a range's trip count calls a division)
            for i in range(NACC):
                acc[i] = ZERO
            pipe1(acc, wa, wb, x, w13, nt, warp, lane, g, t, n_rows, 0, red, x)
            if nt + nblk < T1:                                     # the next tile's first weights
                load1(wa, w13, nt + nblk, 0, 0, warp, lane)
                load1(wb, w13, nt + nblk, 1, 0, warp, lane)
            elif blk < T2 and tid == 0:                            # the last: the first W2 tile to L2
                prefetch_l2(w2, uint32(blk) * uint32(W2_TILE), PREFETCH)
            store1(gu, acc, red, nt, 0, n_rows, tid, warp, lane)
            nt += nblk
        grid = cuda.cg.this_grid()                                 # (a runtime call: nothing live across)
        grid.sync()
        e = uint32(blk) * uint32(NTHR) + uint32(tid)               # 2. a = silu(g) * u (glu_rows' form)
        while e < uint32(n_rows) * uint32(I):
            r = e // uint32(I)
            c = e - r * uint32(I)
            a[e] = silu_mul(gu[r, c], gu[r, I + c])
            e += uint32(nblk) * uint32(NTHR)
        grid.sync()
        if blk < T2:                                               # (from L2 where prefetched)
            load2(wa, w2, blk, 0, 0, warp, lane)
            load2(wb, w2, blk, 1, 0, warp, lane)
        nt = blk
        while nt < T2:                                             # 3. h (+)= bf16(a) @ W2.T
            for i in range(NACC):
                acc[i] = ZERO
            pipe2(acc, wa, wb, a, w2, nt, warp, lane, g, t, n_rows, 0, red, a)
            if nt + nblk < T2:
                load2(wa, w2, nt + nblk, 0, 0, warp, lane)
                load2(wb, w2, nt + nblk, 1, 0, warp, lane)
            store2(h, acc, red, nt, 0, n_rows, tid, warp, lane)
            nt += nblk

    return persistent_swiglu_kernel


def persistent_swiglu(h, x, w13: Bf16Weight, w2: Bf16Weight, gu, a, rows: int, accumulate: bool = True,
                      stream=0, blocks: int | None = None, pdl: bool = True) -> None:
    """h [T, D] (+)= the SwiGLU of x [T, D] (float32) on W16A16 weights W13 [2I, D], W2 [D, I] (from
    ``repack_w16``), the first ``rows`` rows, in one cooperative launch of ``blocks`` blocks (default
    ``grid_blocks()``); gu [T, 2I] and a [T, I] float32 are its scratch. The bits of ``w16a16.linear``,
    ``glu_rows`` and ``linear`` on the same buffers."""
    if not isinstance(w13, Bf16Weight) or not isinstance(w2, Bf16Weight):
        raise KernelInputError("w13 and w2 must come from repack_w16")
    d, i = w13.k, w2.k
    if w13.n != 2 * i or w2.n != d:
        raise KernelInputError(f"a SwiGLU needs W13 [2I, D] and W2 [D, I]: got W13 [{w13.n}, {w13.k}], "
                               f"W2 [{w2.n}, {w2.k}]")
    if not fits(d, i, rows):
        raise KernelInputError(f"the persistent SwiGLU takes 1..{MAX_ROWS} rows and D, I whose W16A16 "
                               f"tilings share a block and batch: got D = {d}, I = {i}, {rows} rows")
    x = check(x, "x", np.float32, (None, d))
    h = check(h, "h", np.float32, (None, d))
    gu = check(gu, "gu", np.float32, (None, 2 * i))
    a = check(a, "a", np.float32, (None, i))
    if rows > min(x.shape[0], h.shape[0], gu.shape[0], a.shape[0]):
        raise KernelInputError(f"rows must be at most every buffer's rows, got {rows}")
    most = grid_blocks()
    blocks = most if blocks is None else blocks
    if not 1 <= blocks <= most:
        raise KernelInputError(f"a cooperative grid here holds 1..{most} blocks, got {blocks}")
    ks = tiling(d, i)[0]
    kernel = make_persistent_swiglu(d, i, row_tiles(rows), accumulate)
    launch(kernel, blocks, ks * 32, stream, (h, flat(x), gu, flat(a), w13.words, w2.words, rows), pdl=pdl)

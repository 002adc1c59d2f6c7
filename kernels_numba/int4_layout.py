"""Offline repack of compressed-tensors INT4 weights into the tensor-core tile layout of the kernels.

Legend: N output rows, K input columns, G group size, E experts; N16 = ceil(N/16) row tiles,
KC = K/64 chunks of 64 columns, NS = K/G scale groups, lane = 4*g + t (g in 0..7, t in 0..3).

Why a repack: the kernels compute ``y = W x`` as ``mma.m16n8k16`` with W as the A operand
("swap A/B": 16 weight rows per MMA, up to 8 activation rows as B), so each lane needs, per MMA,
8 weights scattered over two rows and four columns. The repack stores exactly those 8 nibbles in
one 32-bit word (interleaved so ``dequant_i4x8`` turns them into four half2 with two masks), and
the 4 words a lane needs for one 64-column chunk next to each other, so one warp reads 512
contiguous bytes per ``ld.global.nc.v4``.

Word layout, ``wq`` uint32 ``[..., N16, KC, 32 lanes, 4 words]``: word ``ks = 2h + s`` of lane
(g, t) in chunk c covers columns ``kA = 64c + 32h + 8t + 4s``; its fragment elements are
e0, e1 = W[g, kA], W[g, kA+1]; e2, e3 = W[g+8, kA], W[g+8, kA+1]; e4..e7 the same at kA+2, kA+3
(rows relative to the tile). MMA step ks therefore reads activation columns from one 32-column
half (one scale group for every G >= 32), and lane t's activations for a half are the 8 contiguous
columns ``64c + 32h + 8t .. +7`` (one 16-byte load). Nibble position p holds element
``NIBBLE_ORDER[p]``; values are the offset-binary u = q + 8 of the checkpoint.

Scale layout, ``sq`` uint32 ``[..., N16, NS, 8]``: low half = scale of row g, high half = row g+8
(float16 bits). Rows past N are padded with q = 0 and scale 0; K must be a multiple of 64.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .intrinsics import NIBBLE_ORDER


class LayoutError(ValueError):
    """Weights that the tile layout cannot hold (K not a multiple of 64, bad dtype or shape)."""


def _gather_table():
    """(row [32, 4, 8], col [32, 4, 8]) inside a 16 x 64 tile, for lane, word, nibble position."""
    lane = np.arange(32)[:, None, None]
    ks = np.arange(4)[None, :, None]
    e = np.array(NIBBLE_ORDER)[None, None, :]
    g, t = lane // 4, lane % 4
    h, s = ks // 2, ks % 2
    row = g + 8 * ((e >> 1) & 1)
    col = 32 * h + 8 * t + 4 * s + (e & 1) + 2 * (e >> 2)
    return np.broadcast_to(row, (32, 4, 8)), np.broadcast_to(col, (32, 4, 8))


_ROW, _COL = _gather_table()
_SHIFT = (4 * np.arange(8, dtype=np.uint32))


@dataclass(frozen=True)
class Int4Weight:
    """A repacked W4A16 weight (or a stack of E experts): ``wq``, ``sq`` flat uint32 arrays.

    ``n``, ``k``, ``group_size`` describe one matrix; ``experts`` is 0 for a single matrix, else
    the stack depth; ``pair`` is True for a gate/up pair stored tile-interleaved (moe.py).
    Arrays are numpy (host) or numba device arrays (``to_device``).
    """
    wq: object
    sq: object
    n: int
    k: int
    group_size: int
    experts: int = 0
    pair: bool = False

    @property
    def n16(self) -> int:
        return -(-self.n // 16)

    def to_device(self, stream=0) -> Int4Weight:
        from numba import cuda
        return Int4Weight(cuda.to_device(self.wq, stream=stream), cuda.to_device(self.sq, stream=stream),
                          self.n, self.k, self.group_size, self.experts, self.pair)


def _split(packed, scales):
    from numformats.int4 import unpack_int4
    packed = np.asarray(packed)
    scales = np.asarray(scales)
    if packed.ndim < 2 or packed.dtype not in (np.int32, np.uint32):
        raise LayoutError(f"packed weights must be int32 [..., N, K/8], got {packed.dtype} {packed.shape}")
    if scales.dtype != np.float16 or scales.shape[:-1] != packed.shape[:-1]:
        raise LayoutError(f"scales must be float16 [..., N, K/G] matching packed {packed.shape}, "
                          f"got {scales.dtype} {scales.shape}")
    n, k = packed.shape[-2], packed.shape[-1] * 8
    if k % 64 or scales.shape[-1] == 0 or k % scales.shape[-1]:
        raise LayoutError(f"K={k} must be a multiple of 64 and of the {scales.shape[-1]} scale columns")
    g = k // scales.shape[-1]
    if g not in (32, 64, 128):
        raise LayoutError(f"group size {g} not in (32, 64, 128)")
    u = (unpack_int4(packed).astype(np.int16) + 8).astype(np.uint32)   # [..., N, K]
    return u, scales, n, k, g


def repack_int4(packed, scales) -> Int4Weight:
    """compressed-tensors ``packed`` int32 ``[..., N, K/8]`` + float16 ``scales [..., N, K/G]``
    -> ``Int4Weight`` in the tile layout (host numpy). Leading dims = a stack of experts."""
    u, scales, n, k, g = _split(packed, scales)
    lead = u.shape[:-2]
    n16, kc = -(-n // 16), k // 64
    pad = n16 * 16 - n
    u = np.concatenate([u, np.full((*lead, pad, k), 8, np.uint32)], axis=-2) if pad else u
    s16 = scales.view(np.uint16).astype(np.uint32)
    s16 = np.concatenate([s16, np.zeros((*lead, pad, s16.shape[-1]), np.uint32)], axis=-2) if pad else s16
    tiles = u.reshape(*lead, n16, 16, kc, 64).swapaxes(-3, -2)           # [..., N16, KC, 16, 64]
    nib = tiles[..., _ROW, _COL]                                          # [..., N16, KC, 32, 4, 8]
    wq = np.bitwise_or.reduce(nib << _SHIFT, axis=-1).astype(np.uint32)   # [..., N16, KC, 32, 4]
    st = s16.reshape(*lead, n16, 16, k // g)                              # [..., N16, 16, NS]
    sq = (st[..., :8, :] | (st[..., 8:, :] << 16)).swapaxes(-2, -1)       # [..., N16, NS, 8]
    experts = int(np.prod(lead)) if lead else 0
    return Int4Weight(np.ascontiguousarray(wq).reshape(-1), np.ascontiguousarray(sq).reshape(-1),
                      n, k, g, experts)


def unrepack_int4(w: Int4Weight) -> tuple[np.ndarray, np.ndarray]:
    """Inverse of ``repack_int4`` (host): -> (packed int32 [..., N, K/8], scales float16 [..., N, K/G])."""
    from numformats.int4 import pack_int4
    if w.pair:
        raise LayoutError("unrepack_int4 takes a plain matrix or expert stack, not a gate/up pair")
    lead = (w.experts,) if w.experts else ()
    n16, kc, ns = w.n16, w.k // 64, w.k // w.group_size
    wq = np.asarray(w.wq).reshape(*lead, n16, kc, 32, 4, 1)
    nib = (wq >> _SHIFT) & np.uint32(0xF)                                 # [..., N16, KC, 32, 4, 8]
    tiles = np.zeros((*lead, n16, kc, 16, 64), np.uint32)
    tiles[..., _ROW, _COL] = nib
    u = tiles.swapaxes(-3, -2).reshape(*lead, n16 * 16, w.k)[..., :w.n, :]
    sq = np.asarray(w.sq).reshape(*lead, n16, ns, 8).swapaxes(-2, -1)     # [..., N16, 8, NS]
    s16 = np.concatenate([sq & 0xFFFF, sq >> 16], axis=-2).reshape(*lead, n16 * 16, ns)[..., :w.n, :]
    return pack_int4(u.astype(np.int8) - 8), s16.astype(np.uint16).view(np.float16)

"""bfloat16 without a bfloat16 dtype: raw uint16 bits plus explicit conversions.

bfloat16 is the top half of an IEEE float32 (1 sign, 8 exponent, 7 mantissa bits), so widening is
a 16-bit shift and narrowing is a rounding of the low 16 bits (round to nearest, ties to even).
numpy has no bfloat16 dtype; bundles hand these arrays out as ``BF16Array``.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

_LOW = 0 if sys.byteorder == "little" else 1      # where a float32's low half sits in memory


class BF16Array:
    """A bfloat16 array: ``bits`` is a uint16 ndarray of any shape (possibly a read-only memmap).

    ``float32()`` widens exactly; ``np.asarray(a)`` does the same. No arithmetic is defined.
    """

    __slots__ = ("bits",)

    def __init__(self, bits: np.ndarray) -> None:
        if not isinstance(bits, np.ndarray) or bits.dtype.kind != "u" or bits.dtype.itemsize != 2:
            raise TypeError(f"BF16Array wants a uint16 ndarray, got {getattr(bits, 'dtype', type(bits))}")
        self.bits = bits

    @property
    def shape(self) -> tuple[int, ...]:
        return self.bits.shape

    @property
    def ndim(self) -> int:
        return self.bits.ndim

    @property
    def size(self) -> int:
        return self.bits.size

    @property
    def nbytes(self) -> int:
        return self.bits.nbytes

    def float32(self) -> np.ndarray:
        """Exact widening: float32 array of the same shape (a new, writable array)."""
        wide = self.bits.astype(np.uint32) << np.uint32(16)                 # bits in the top half
        return wide.view(np.float32)

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        out = self.float32()
        return out if dtype is None else out.astype(dtype)

    def __repr__(self) -> str:
        return f"BF16Array(shape={self.shape})"


def bf16(x: Any) -> BF16Array:
    """Round float values to bfloat16 (nearest, ties to even); ``x`` is cast to float32 first.

    NaN stays NaN (quiet, sign kept), +-inf stay inf, finite values past bfloat16's max round to inf
    as IEEE rounding prescribes. A BF16Array is returned unchanged.
    """
    if isinstance(x, BF16Array):
        return x
    f = np.asarray(x, dtype=np.float32)
    return BF16Array((_rounded_top(f).reshape(-1) >> np.uint32(16)).astype(np.uint16).reshape(f.shape))


def exact_bf16(x: Any) -> BF16Array | None:
    """``x`` as a BF16Array when every value is a bfloat16 value (its float32 low half zero), else None."""
    if isinstance(x, BF16Array):
        return x
    f = np.asarray(x, dtype=np.float32)
    halves = f.reshape(-1).view(np.uint16).reshape(-1, 2)        # each float's two 16-bit halves
    if halves[:, _LOW].any():
        return None
    return BF16Array(halves[:, 1 - _LOW].reshape(f.shape).copy())


def round_bf16(x: np.ndarray) -> np.ndarray:
    """x rounded to the nearest bfloat16 value (ties to even), in x's float dtype (W16A16's rounding,
    ``workbench.quant.w16a16``)."""
    f = np.asarray(x, dtype=np.float32)
    r = _rounded_top(f)
    r &= np.uint32(0xFFFF0000)
    return r.view(np.float32).astype(x.dtype, copy=False)


def _rounded_top(f: np.ndarray) -> np.ndarray:
    """The float32 bits of f (float32) with the rounding to bfloat16 added into the top half
    (low half left over): u + 0x7FFF + lsb(top half). Without NaNs it cannot carry out of 32 bits (the
    largest, -inf, gives 0xFF808000); a NaN keeps its top half, made quiet."""
    u = f.reshape(-1).view(np.uint32)                             # 1-d: in-place ops on 0-d give scalars
    r = u >> np.uint32(16)
    r &= np.uint32(1)                                             # ties go to the even result
    r += np.uint32(0x7FFF)
    r += u
    nan = np.isnan(f.reshape(-1))
    if nan.any():
        r[nan] = (u[nan] | np.uint32(0x00400000)) & np.uint32(0xFFFF0000)
    return r.reshape(f.shape)

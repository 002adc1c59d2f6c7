"""INT4 words and their scales as the workbench and its kernels read them (numpy only).

Layout: compressed-tensors ``pack-quantized`` int32 words ``[..., N, K/8]`` (``pack_int4`` /
``unpack_int4``); scales ``[..., N, K/G]`` float16 (our format), float32 or bfloat16
(``scales_to_float32``). ``workbench.quant.int4`` builds the logical and compute layers on these;
``kernels_numba.int4_layout`` repacks the words into its tile layout. Format facts: docs/int4.md.
"""

from __future__ import annotations

import numpy as np

from .errors import InputError

_SHIFTS = np.arange(8, dtype=np.uint32) * 4          # nibble k % 8 sits at bits 4*(k % 8) .. +3


def scales_to_float32(scales) -> np.ndarray:
    """Scales as float32. Accepted: float16 (our format), float32, a ``BF16Array``-like object
    with ``.float32()``, a numpy ``bfloat16`` dtype, or uint16 holding bfloat16 bit patterns
    (the K2-Thinking checkpoint's ``weight_scale``). All conversions are exact."""
    if hasattr(scales, "float32") and callable(scales.float32):
        s = np.asarray(scales.float32())
    else:
        s = np.asarray(scales)
        if s.dtype == np.uint16:                                         # bf16 bits: top half of a float32
            s = (s.astype(np.uint32) << 16).view(np.float32)
        elif s.dtype in (np.float16, np.float32) or s.dtype.name == "bfloat16":
            s = s.astype(np.float32)
        else:
            raise InputError(f"scales must be float16, float32 or bfloat16, got {s.dtype}")
    if s.dtype != np.float32:
        s = s.astype(np.float32)
    if not (np.isfinite(s).all() and (s > 0).all()):
        raise InputError("scales must be finite and > 0")
    return s


def pack_int4(codes) -> np.ndarray:
    """Pack codes ``[..., N, K]`` (ints in [-8, 7]) into int32 ``[..., N, K/8]``.

    compressed-tensors ``pack-quantized`` order: ``u = q + 8``; column k goes to word ``k // 8``,
    bits ``4*(k % 8)`` .. ``4*(k % 8) + 3`` (the lowest nibble holds the lowest k). K % 8 == 0.
    """
    codes = np.asarray(codes)
    if codes.ndim < 1 or not np.issubdtype(codes.dtype, np.integer):
        raise InputError(f"pack_int4 wants integer codes [..., K], got {codes.dtype} {codes.shape}")
    k = codes.shape[-1]
    if k == 0 or k % 8:
        raise InputError(f"pack_int4: K={k} is not a positive multiple of 8")
    if codes.size and (codes.min() < -8 or codes.max() > 7):
        raise InputError(f"pack_int4: codes must lie in [-8, 7], got [{codes.min()}, {codes.max()}]")
    u = (codes.astype(np.int32) + 8).astype(np.uint32)
    u = u.reshape(*codes.shape[:-1], k // 8, 8)                          # [..., N, K/8, 8]
    words = np.bitwise_or.reduce(u << _SHIFTS, axis=-1)                  # [..., N, K/8] uint32
    return np.ascontiguousarray(words).view(np.int32)


def unpack_int4(packed) -> np.ndarray:
    """int32 (or uint32) words ``[..., N, K/8]`` -> int8 codes ``[..., N, K]`` in [-8, 7]."""
    packed = np.asarray(packed)
    if packed.ndim < 1 or packed.dtype not in (np.int32, np.uint32):
        raise InputError(f"unpack_int4 wants int32 words [..., K/8], got {packed.dtype} {packed.shape}")
    words = packed.view(np.uint32)[..., None]                            # [..., N, K/8, 1]
    u = (words >> _SHIFTS) & np.uint32(0xF)                              # mask after the shift
    return (u.astype(np.int8) - np.int8(8)).reshape(*packed.shape[:-1], packed.shape[-1] * 8)

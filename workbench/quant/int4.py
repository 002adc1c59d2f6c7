"""INT4 W4A16 group quantization in three layers with paired names (docs/int4.md).

- logical: ``quantize_int4`` / ``dequantize_int4``   (codes in [-7, 7], one float16 scale per group)
- layout:  ``pack_int4`` / ``unpack_int4``           (compressed-tensors ``pack-quantized`` int32 words;
                                                     defined in ``numformats.int4``, shared with the kernels)
- compute: ``int4_linear``                           (THE W4A16 definition every kernel must match)

Legend: N output rows, K input columns, G group size, K/G groups per row, K/8 int32 words per row.
A weight is ``[N, K]`` (``y = x @ W.T``); leading batch dims ``[..., N, K]`` (stacked experts) are
accepted by the logical and layout functions. Format facts: docs/int4.md.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache

import numpy as np

from numformats.int4 import pack_int4, scales_to_float32, unpack_int4
from workbench.errors import InputError

GROUP_SIZES = (32, 64, 128)
QMAX = 7                                     # symmetric range [-7, 7]; nibble 0 (q = -8) is never produced
_F16_TINY = np.float16(np.finfo(np.float16).tiny)   # 2^-14: the scale of an all-zero group


# ---- logical ---------------------------------------------------------------------------------

def quantize_int4(w, group_size: int = 32) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric per-group INT4 quantization of a float weight ``[..., N, K]``.

    Returns ``(codes int8 [..., N, K] in [-7, 7], scales float16 [..., N, K/G])``. Per group of G
    consecutive input columns: ``scale = max|w| / 7`` in float32, rounded to float16; codes are
    ``clip(rint(w / scale16), -7, 7)`` against the *stored* float16 scale, so dequantizing with the
    stored scale is what was optimised (error <= scale/2 per element). An all-zero group gets scale
    2^-14 (finite, > 0). Where a float16-subnormal scale rounded down so far that clipping would
    exceed half a step, the scale is nudged up one float16 ulp (never happens for normal scales).
    Raises InputError for a non-float or non-finite ``w``, G not in {32, 64, 128}, K % G != 0, or
    a group whose scale would overflow float16.
    """
    w = np.asarray(w)
    _check_group_size(group_size)
    if w.ndim < 2 or not np.issubdtype(w.dtype, np.floating):
        raise InputError(f"quantize_int4 wants a float array [..., N, K], got {w.dtype} {w.shape}")
    k = w.shape[-1]
    if k == 0 or k % group_size:
        raise InputError(f"input dim K={k} is not a positive multiple of group size {group_size}")
    w32 = w.astype(np.float32, copy=False)
    if not np.isfinite(w32).all():
        raise InputError("quantize_int4: weights contain inf or nan (after conversion to float32)")
    wg = w32.reshape(*w.shape[:-1], k // group_size, group_size)        # [..., N, K/G, G]
    absmax = np.abs(wg).max(axis=-1)                                     # [..., N, K/G]
    scale32 = absmax / np.float32(QMAX)
    if (scale32 > np.finfo(np.float16).max).any():
        raise InputError(f"quantize_int4: max|w| = {absmax.max():.4g} gives a scale past float16's range")
    scale16 = scale32.astype(np.float16)                                 # round to nearest
    # subnormal float16 scales are coarse: keep the clipped top code within half a step
    low = absmax > np.float32(QMAX + 0.5) * scale16.astype(np.float32)
    scale16 = np.where(low, np.nextafter(scale16, np.float16(np.inf)), scale16)
    scale16 = np.where(absmax == 0, _F16_TINY, scale16).astype(np.float16)
    s = scale16.astype(np.float32)[..., None]                            # [..., N, K/G, 1]
    codes = np.clip(np.rint(wg / s), -QMAX, QMAX).astype(np.int8)        # [..., N, K/G, G]
    return codes.reshape(w.shape), scale16


def dequantize_int4(codes, scales, group_size: int | None = None) -> np.ndarray:
    """``codes [..., N, K]`` (ints in [-8, 7]) times their group's scale -> float32 ``[..., N, K]``.

    ``scales [..., N, K/G]`` may be float16, float32, bfloat16 (see ``scales_to_float32``). G is
    inferred as K / scale columns; a given ``group_size`` must agree with it.
    """
    codes = np.asarray(codes)
    if codes.ndim < 2 or not np.issubdtype(codes.dtype, np.integer):
        raise InputError(f"dequantize_int4 wants integer codes [..., N, K], got {codes.dtype} {codes.shape}")
    s = scales_to_float32(scales)
    g = _infer_group(codes.shape, s.shape, group_size)
    cg = codes.reshape(*codes.shape[:-1], -1, g).astype(np.float32)      # [..., N, K/G, G]
    return (cg * s[..., None]).reshape(codes.shape)                      # [..., N, K]


# ---- layout: ``pack_int4`` / ``unpack_int4`` and ``scales_to_float32`` live in ``numformats.int4``
# (the kernels read the same words); imported above, part of this module's names.

# ---- compute ---------------------------------------------------------------------------------

def int4_linear(x, packed, scale) -> np.ndarray:
    """The W4A16 linear: ``y [..., N] = f16(x) @ ((u - 8) * scale).T`` with float32 accumulation.

    ``x [..., K]`` float; ``packed`` int32 ``[N, K/8]`` (pack_int4 layout); ``scale [N, K/G]`` in any
    form ``scales_to_float32`` accepts (G = K / scale columns, any G dividing K). Activations are
    rounded to float16 (values past 65504 become inf, as on the GPU), weights are dequantized
    exactly in float32 and the products summed in float32; returns float32. A float64 ``x``
    (float64 reference runs) gives float64 from the same float16-rounded activations and weights.
    """
    x = np.asarray(x)
    packed = np.asarray(packed)
    if not np.issubdtype(x.dtype, np.floating) or x.ndim < 1:
        raise InputError(f"int4_linear wants float activations [..., K], got {x.dtype} {x.shape}")
    if packed.ndim != 2:
        raise InputError(f"int4_linear wants packed weights [N, K/8], got shape {packed.shape}")
    k = packed.shape[1] * 8
    if x.shape[-1] != k:
        raise InputError(f"int4_linear: x has K={x.shape[-1]} but the packed weight has K={k}")
    w = dequantize_packed(packed, scale)                                 # [N, K] float32, exact
    acc = np.float64 if x.dtype == np.float64 else np.float32
    xh = x.astype(np.float16).astype(acc)                                # [..., K] f16-rounded
    return xh @ w.astype(acc, copy=False).T                              # [..., N]


_BYTE_CODES = np.stack([(np.arange(256) & 15) - 8, (np.arange(256) >> 4) - 8], axis=1).astype(np.float32)


def dequantize_packed(packed, scale) -> np.ndarray:
    """``dequantize_int4(unpack_int4(packed), scale)`` in one table lookup per byte (same exact values).

    packed int32 ``[N, K/8]``; scale ``[N, K/G]`` in any form ``scales_to_float32`` accepts.
    """
    packed = np.asarray(packed)
    if packed.ndim != 2 or packed.dtype not in (np.int32, np.uint32):
        raise InputError(f"dequantize_packed wants int32 words [N, K/8], got {packed.dtype} {packed.shape}")
    s = scales_to_float32(scale)
    n, k = packed.shape[0], packed.shape[1] * 8
    g = _infer_group((n, k), s.shape, None)
    byts = np.ascontiguousarray(packed, dtype=packed.dtype.newbyteorder("<")).view(np.uint8)  # [N, K/2]
    w = np.empty((n, k // g, g), np.float32)                             # [N, K/G, G]

    def rows(lo: int, hi: int) -> None:                                  # elementwise: any split is exact
        np.take(_BYTE_CODES, byts[lo:hi], axis=0, out=w[lo:hi].reshape(hi - lo, k // 2, 2), mode="clip")
        w[lo:hi] *= s[lo:hi, :, None]
    cuts = np.linspace(0, n, min(_threads(), max(1, n * k >> 22)) + 1).astype(int)   # >= 4M values a part
    if len(cuts) > 2:
        list(_pool().map(rows, cuts[:-1], cuts[1:]))
    else:
        rows(0, n)
    return w.reshape(n, k)


@lru_cache(maxsize=1)
def _threads() -> int:
    n = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(16, n))


@lru_cache(maxsize=1)
def _pool() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(_threads(), thread_name_prefix="int4-dequant")


def gen_quant4(n: int, k: int, group_size: int = 32, seed: int = 0):
    """Test helper (as Marlin's): random ``[n, k]`` weight through the public path.

    Returns ``(w_ref float32 [n, k], packed int32 [n, k/8], scales float16 [n, k/G])`` where
    ``w_ref = dequantize_int4(unpack_int4(packed), scales)`` is exactly the weight a kernel sees.
    """
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((n, k), dtype=np.float32) * np.float32(0.05)
    codes, scales = quantize_int4(w, group_size)
    packed = pack_int4(codes)
    return dequantize_int4(unpack_int4(packed), scales), packed, scales


# ---- checks ----------------------------------------------------------------------------------

def _check_group_size(group_size) -> None:
    if isinstance(group_size, bool) or group_size not in GROUP_SIZES:
        raise InputError(f"group size must be one of {GROUP_SIZES}, got {group_size!r}")


def _infer_group(codes_shape, scales_shape, group_size) -> int:
    if len(scales_shape) != len(codes_shape) or scales_shape[:-1] != codes_shape[:-1]:
        raise InputError(f"scales shape {scales_shape} does not match codes shape {codes_shape}")
    k, cols = codes_shape[-1], scales_shape[-1]
    if cols == 0 or k % cols:
        raise InputError(f"K={k} is not a multiple of the {cols} scale columns")
    g = k // cols
    if group_size is not None and group_size != g:
        raise InputError(f"group size {group_size} disagrees with the shapes (K={k}, {cols} groups)")
    return g

"""Rotary position embedding with YaRN frequency scaling, on interleaved pairs.

Legend: S positions, R rope dims (R/2 frequency pairs).

Layout: pair i is dims (2i, 2i+1) of the rope slice, treated as one complex number and rotated by
``p * f_i`` (the DeepSeek reference / vLLM layout, GPT-J style). Checkpoint weights are never
permuted; HF permutes to half-split at run time and gets the same scores.
"""

from __future__ import annotations

import math

import numpy as np

from ..config import ModelConfig, yarn_mscale


def _correction_dim(n_rotations: float, dim: int, base: float, max_pos: int) -> float:
    # the (fractional) pair index whose wavelength fits n_rotations times into max_pos tokens
    return dim * math.log(max_pos / (n_rotations * 2 * math.pi)) / (2 * math.log(base))


def yarn_correction_range(cfg: ModelConfig) -> tuple[int, int]:
    """YaRN's [low, high] pair range on the *original* context, floor/ceil, clamped to [0, R-1].

    K2 (theta 5e4, betas 1/1, R 64, 4096): (19, 20).
    """
    r = cfg.qk_rope_head_dim
    low = math.floor(_correction_dim(cfg.beta_fast, r, cfg.rope_theta, cfg.original_max_position_embeddings))
    high = math.ceil(_correction_dim(cfg.beta_slow, r, cfg.rope_theta, cfg.original_max_position_embeddings))
    return max(low, 0), min(high, r - 1)


def yarn_inv_freq(cfg: ModelConfig) -> np.ndarray:
    """Per-pair angular frequency [R/2] float64: theta^(-2i/R), YaRN-blended when rope_scaling_type='yarn'.

    Pairs below ``low`` keep f_i (extrapolation), pairs above ``high`` use f_i / factor
    (interpolation), with a linear ramp in between.
    """
    r = cfg.qk_rope_head_dim
    freq = cfg.rope_theta ** (-np.arange(0, r, 2, dtype=np.float64) / r)        # [R/2]
    if cfg.rope_scaling_type is None:
        return freq
    low, high = yarn_correction_range(cfg)
    span = (high - low) if high != low else 0.001                               # avoid 0/0 as HF does
    ramp = np.clip((np.arange(r // 2, dtype=np.float64) - low) / span, 0.0, 1.0)  # [R/2], 1 = interpolate
    return freq / cfg.rope_factor * ramp + freq * (1.0 - ramp)


def rope_attention_factor(cfg: ModelConfig) -> float:
    """The factor on cos/sin: mscale(factor, mscale) / mscale(factor, mscale_all_dim) (1 without YaRN)."""
    if cfg.rope_scaling_type is None:
        return 1.0
    return yarn_mscale(cfg.rope_factor, cfg.mscale) / yarn_mscale(cfg.rope_factor, cfg.mscale_all_dim)


def rope_cos_sin(cfg: ModelConfig, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """cos, sin [S, R/2] float64 for integer positions [S], times the YaRN attention factor."""
    ang = np.asarray(positions, dtype=np.float64)[:, None] * yarn_inv_freq(cfg)[None, :]  # [S, R/2]
    m = rope_attention_factor(cfg)
    return np.cos(ang) * m, np.sin(ang) * m


def rope_tables(cfg: ModelConfig, max_pos: int) -> tuple[np.ndarray, np.ndarray]:
    """(cos, sin) float32 [max_pos, R/2] for positions 0..max_pos-1, YaRN factor included: the tables
    the engine's kernels read (``kernels_numba.rope``)."""
    cos, sin = rope_cos_sin(cfg, np.arange(max_pos, dtype=np.int64))
    return np.ascontiguousarray(cos, dtype=np.float32), np.ascontiguousarray(sin, dtype=np.float32)


def apply_rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """Rotate interleaved pairs (2i, 2i+1) of x [..., S, R] by cos/sin [S, R/2]; returns x's dtype."""
    c = cos.astype(x.dtype, copy=False)                                         # [S, R/2]
    s = sin.astype(x.dtype, copy=False)
    x0 = x[..., 0::2]                                                           # [..., S, R/2] real parts
    x1 = x[..., 1::2]  # [..., S, R/2] imaginary parts
    out = np.empty_like(x)
    out[..., 0::2] = x0 * c - x1 * s
    out[..., 1::2] = x1 * c + x0 * s
    return out

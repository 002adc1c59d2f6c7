"""Every device buffer one engine needs, allocated once (fixed addresses, so CUDA graphs can replay).

Legend: T = max_rows (the widest step: prompt length or budget + 1), S = max_len cache rows,
Ly layers, D model width, A1 fused first-projection width, Q q_lora_rank, H heads, N/R/V/C the MLA
dims, Vo vocabulary, F tapped layers. The FFN ops' work buffers are ``kernels_numba.ops.Scratch``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from kernels_numba import ops
from kernels_numba.device import zeros
from numformats.bf16 import BF16Array, bf16

from ..errors import InputError
from .weights import DeviceModel


@dataclass
class Buffers:
    max_rows: int
    max_len: int
    h: Any          # [T, D] residual stream
    x: Any          # [T, D] normed input of a sub-block
    a1: Any         # [T, A1] fused q_a (or q) || kv_a projections
    qn: Any         # [T, Q] normed c_q
    q: Any          # [T, H*(N+R)] queries
    o: Any          # [T, H*V] attention output before wo
    logits: Any     # [T, Vo]
    amax: Any       # [T] int32 argmax per row
    ids: Any        # [T] int32 input token ids
    depth: Any      # [T] int32 position offsets (position = start + depth)
    vis: Any        # [T, T] uint8 visibility among the new rows
    meta: Any       # [8] int32: start, n, emitted count
    out: Any        # [S] int32 emitted tokens (AR decode)
    cache: Any      # [Ly, S, C+R] latent cache (``latent_cache``: float32, or bf16 bits over S8 rows)
    ctl: Any        # [5, W] int32 per-round DDTree control block (kernels_numba.tree)
    feats: Any      # [F, T, D] tapped hidden states (F >= 1; unused rows when nothing is tapped)
    att: Any        # the step's rope rows and key mask for BLAS attention cores (ops.attention_rows), or None


def allocate(model: DeviceModel, max_len: int, max_rows: int, n_taps: int) -> Buffers:
    cfg = model.cfg
    t, d = max_rows, cfg.hidden_size
    f32 = np.float32

    def z(shape, dt=f32):
        return zeros(shape, dt)

    return Buffers(
        max_rows=max_rows, max_len=max_len,
        h=z((t, d)), x=z((t, d)), a1=z((t, model.a1_width)), qn=z((t, max(cfg.q_lora_rank or 1, 1))),
        q=z((t, cfg.num_attention_heads * cfg.qk_head_dim)),
        o=z((t, cfg.num_attention_heads * cfg.v_head_dim)),
        logits=z((t, cfg.vocab_size)), amax=z(t, np.int32), ids=z(t, np.int32), depth=z(t, np.int32),
        vis=z((t, t), np.uint8), meta=z(8, np.int32), out=z(max_len, np.int32),
        cache=latent_cache([lay.attn for lay in model.layers], cfg.num_hidden_layers, max_len,
                           cfg.kv_cache_dim),
        ctl=z((5, max(t, 8)), np.int32), feats=z((max(n_taps, 1), t, d)),
        att=ops.attention_rows_buffers([lay.attn for lay in model.layers], t, max_len,
                                       cfg.qk_rope_head_dim // 2),
    )


def latent_cache(attns, n_layers: int, max_len: int, width: int):
    """The latent cache [Ly, S, C+R] of ``n_layers`` for the attention cores ``attns`` (``ops.MLA``): bf16
    bits (int16) over S8 = ops.padded_keys(S) rows when every core is W16A16 (the rows it keeps are bf16, and
    the core's GEMMs read them as they are), float32 over S rows otherwise."""
    a16 = {a.a16 for a in attns}
    if len(a16) > 1:
        raise InputError("the layers mix W16A16 and float32 attention cores; one latent cache holds one "
                         "dtype")
    if a16 == {True}:
        return zeros((n_layers, ops.padded_keys(max_len), width), np.int16)
    return zeros((n_layers, max_len, width), np.float32)


def latents_f32(rows: np.ndarray) -> np.ndarray:
    """Latent rows fetched from a cache, as float32 (a bf16 cache's bits widened exactly)."""
    if rows.dtype == np.int16:
        return BF16Array(rows.view(np.uint16)).float32()
    return np.asarray(rows, np.float32)


def latents_for(cache, rows: np.ndarray) -> np.ndarray:
    """Float latent rows in ``cache``'s dtype, to upload into it (rounded to bf16 for a bf16 cache)."""
    if cache.dtype == np.int16:
        return bf16(rows).bits.view(np.int16)
    return np.asarray(rows, np.float32)

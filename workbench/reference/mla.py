"""Multi-head latent attention (MLA) in two forms: naive (the spec) and absorbed (latent space).

Legend: S new rows (queries), P rows already cached, T = P + S keys, M model width, H heads,
N qk_nope_head_dim, R qk_rope_head_dim, V v_head_dim, C kv_lora_rank, Q q_lora_rank.

Both forms write this call's S latent rows ``[c_kv (C, normalised) || k_pe (R, rotated)]`` into rows
[P, P+S) of ``cache.layers[layer]`` (P = ``cache.length``) and attend over rows [0, P+S).
They do not advance ``cache.length``: ``model.forward`` does that once, after the last layer.

Mask: every cached row is visible; among the new rows, causal when ``visibility`` is None, else
new row i sees new row j iff ``visibility[i, j]`` (the DDTree ancestor-or-self verify mask).
Softmax scale is ``cfg.softmax_scale`` (qk_head_dim = N + R based, never C + R).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from numformats.bf16 import round_bf16

from ..config import ModelConfig
from ..errors import InputError
from .layers import dense_weight, linear, rmsnorm, weight
from .rope import apply_rope, rope_cos_sin


def _queries(cfg: ModelConfig, weights: dict[str, Any], p: str, x: np.ndarray,
             cos: np.ndarray, sin: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """q_nope [S, H, N] and rotated q_pe [H, S, R]; q_lora on (wq_a, q_norm, wq_b) or off (wq)."""
    s, h, n = x.shape[0], cfg.num_attention_heads, cfg.qk_nope_head_dim
    if cfg.q_lora_rank is None:
        q = linear(weights, p + "wq", x)                                        # [S, H*(N+R)]
    else:
        c_q = rmsnorm(linear(weights, p + "wq_a", x), weight(weights, p + "q_norm"),
                      cfg.mla_norm_eps)                                         # [S, Q]
        q = linear(weights, p + "wq_b", c_q)                                    # [S, H*(N+R)]
    q = q.reshape(s, h, cfg.qk_head_dim)                                        # [S, H, N+R]
    q_pe = apply_rope(q[..., n:].transpose(1, 0, 2), cos, sin)                  # [H, S, R]
    return q[..., :n], q_pe


def _write_latents(cfg: ModelConfig, weights: dict[str, Any], p: str, layer: int, x: np.ndarray,
                   cos: np.ndarray, sin: np.ndarray, cache: Any, a16: bool = False) -> np.ndarray:
    """Append this call's latent rows to the cache (rounded to bf16 when ``a16``: W16A16 attention);
    return all T rows [T, C+R] in x's dtype."""
    s, c = x.shape[0], cfg.kv_lora_rank
    start = cache.length
    buf = cache.layers[layer]                                                   # [max_len, C+R]
    if start + s > buf.shape[0]:
        raise InputError(f"latent cache full: {start} + {s} rows exceed max_len {buf.shape[0]}")
    a = linear(weights, p + "wkv_a", x)                                         # [S, C+R]
    lat = np.concatenate([rmsnorm(a[:, :c], weight(weights, p + "kv_norm"), cfg.mla_norm_eps),  # c_kv
                          apply_rope(a[:, c:], cos, sin)], axis=1)              # || k_pe, one for all heads
    buf[start:start + s] = round_bf16(lat) if a16 else lat
    return buf[:start + s].astype(x.dtype, copy=False)                          # [T, C+R]


def _a16(weights: dict[str, Any], p: str) -> bool:
    """True when the layer's wkv_b is marked W16A16 (its attention computes in bf16 operands)."""
    return p + "wkv_b" in weights and hasattr(weights[p + "wkv_b"], "round_input")


def attention_mask(n_cached: int, s: int, visibility: np.ndarray | None) -> np.ndarray:
    """Bool [S, T]: True where new row i may attend key t (all cached keys; causal or ``visibility``)."""
    if visibility is None:
        new = np.tril(np.ones((s, s), dtype=bool))                              # [S, S] causal
    else:
        new = np.asarray(visibility)
        if new.dtype != np.bool_ or new.shape != (s, s):
            raise InputError(f"visibility must be a bool [{s}, {s}] matrix, got {new.dtype} {new.shape}")
        if not new.diagonal().all():
            raise InputError("visibility must let every new row see itself (diagonal all True)")
    return np.concatenate([np.ones((s, n_cached), dtype=bool), new], axis=1)    # [S, T]


def _softmax(scores: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Masked softmax over the last axis of scores [H, S, T] with mask [S, T]."""
    z = np.where(mask[None], scores, -np.inf)
    z = z - z.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)


def mla_naive(cfg: ModelConfig, weights: dict[str, Any], layer: int, x: np.ndarray, positions: np.ndarray,
              cache: Any, visibility: np.ndarray | None = None) -> np.ndarray:
    """MLA with keys/values expanded per head from the latent (the specification).

    x: [S, M] (compute dtype); positions: [S] ints; returns [S, M] in x's dtype.
    """
    p = f"layers.{layer}.attn."
    if _a16(weights, p):
        raise InputError("W16A16 attention (a marked wkv_b) is defined on the absorbed form only")
    n, v_dim, c = cfg.qk_nope_head_dim, cfg.v_head_dim, cfg.kv_lora_rank
    cos, sin = rope_cos_sin(cfg, positions)                                     # [S, R/2]
    q_nope, q_pe = _queries(cfg, weights, p, x, cos, sin)                       # [S, H, N], [H, S, R]
    mask = attention_mask(cache.length, x.shape[0], visibility)                 # [S, T]
    lat = _write_latents(cfg, weights, p, layer, x, cos, sin, cache)            # [T, C+R]
    t = lat.shape[0]
    kv = linear(weights, p + "wkv_b", lat[:, :c])                               # [T, H*(N+V)]
    kv = kv.reshape(t, cfg.num_attention_heads, n + v_dim)                      # [T, H, N+V]
    k_nope, v = kv[..., :n], kv[..., n:]                                        # [T, H, N], [T, H, V]
    scores = (np.einsum("shn,thn->hst", q_nope, k_nope, optimize=True)          # [H, S, T] nope part
              + np.einsum("hsr,tr->hst", q_pe, lat[:, c:], optimize=True))      # + rope part
    scores *= x.dtype.type(cfg.softmax_scale)
    probs = _softmax(scores, mask)                                              # [H, S, T]
    o = np.einsum("hst,thv->shv", probs, v, optimize=True)                      # [S, H, V]
    return linear(weights, p + "wo", o.reshape(x.shape[0], -1))                 # [S, M]


def mla_absorbed(cfg: ModelConfig, weights: dict[str, Any], layer: int, x: np.ndarray, positions: np.ndarray,
                 cache: Any, visibility: np.ndarray | None = None) -> np.ndarray:
    """MLA computed in latent space: W_UK folded into the query, W_UV applied after attention.

    Same inputs and outputs as ``mla_naive``. One shared "KV head" of width C+R (d_qk = C + R,
    d_v = C); wkv_b viewed as [H, N+V, C] gives W_UK = [:, :N] and W_UV = [:, N:].

    With wkv_b marked W16A16 (``workbench.quant.w16a16``) every product takes bf16 operands with
    float32 sums, as a BF16 engine with a bf16 latent cache computes it: the cache rows, q_nope,
    q_lat, q_pe, the probabilities, ctx and o are rounded to bf16 (``r`` below); scores, softmax
    and the sums stay float32.
    """
    p = f"layers.{layer}.attn."
    h, n, c = cfg.num_attention_heads, cfg.qk_nope_head_dim, cfg.kv_lora_rank
    a16 = _a16(weights, p)
    r = round_bf16 if a16 else (lambda a: a)                                    # W16A16's rounding points
    cos, sin = rope_cos_sin(cfg, positions)                                     # [S, R/2]
    q_nope, q_pe = _queries(cfg, weights, p, x, cos, sin)                       # [S, H, N], [H, S, R]
    q_nope, q_pe = r(q_nope), r(q_pe)
    mask = attention_mask(cache.length, x.shape[0], visibility)                 # [S, T]
    lat = _write_latents(cfg, weights, p, layer, x, cos, sin, cache, a16)       # [T, C+R]
    wkv_b = dense_weight(weights, p + "wkv_b", x.dtype)                         # [H*(N+V), C]
    wkv_b = wkv_b.reshape(h, n + cfg.v_head_dim, c)                             # [H, N+V, C]
    w_uk, w_uv = wkv_b[:, :n], wkv_b[:, n:]                                     # [H, N, C], [H, V, C]
    q_lat = r(np.einsum("shn,hnc->shc", q_nope, w_uk, optimize=True))           # [S, H, C]
    scores = (np.einsum("shc,tc->hst", q_lat, lat[:, :c], optimize=True)        # [H, S, T] latent part
              + np.einsum("hsr,tr->hst", q_pe, lat[:, c:], optimize=True))      # + rope part
    scores *= x.dtype.type(cfg.softmax_scale)
    probs = r(_softmax(scores, mask))                                           # [H, S, T]
    ctx = r(np.einsum("hst,tc->shc", probs, lat[:, :c], optimize=True))         # [S, H, C]
    o = r(np.einsum("shc,hvc->shv", ctx, w_uv, optimize=True))                  # [S, H, V]
    return linear(weights, p + "wo", o.reshape(x.shape[0], -1))                 # [S, M]

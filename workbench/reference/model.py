"""The whole decoder: embedding, MLA + FFN blocks, final norm, lm_head, over a latent KV cache.

Legend: S new tokens, L layers, M model width, V vocab, C kv_lora_rank, R qk_rope_head_dim.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..config import ModelConfig
from ..errors import InputError
from .layers import gather_rows, linear, rmsnorm, weight
from .mla import mla_absorbed, mla_naive
from .moe import dense_mlp, moe

_ATTN = {"absorbed": mla_absorbed, "naive": mla_naive}
_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


@dataclass
class LatentCache:
    """Per-layer latent KV rows [max_len, C+R] = [c_kv normalised || k_pe rotated]; rows [0, length) valid.

    Rows are in the interleaved rope order of the checkpoint (HF's own cache holds k_pe permuted).
    """

    layers: list[np.ndarray]
    length: int = 0

    @classmethod
    def empty(cls, cfg: ModelConfig, max_len: int, dtype: Any = np.float32) -> LatentCache:
        if isinstance(max_len, bool) or not isinstance(max_len, (int, np.integer)) or max_len < 1:
            raise InputError(f"max_len must be a positive int, got {max_len!r}")
        rows = (int(max_len), cfg.kv_cache_dim)
        return cls([np.zeros(rows, dtype=dtype) for _ in range(cfg.num_hidden_layers)], 0)

    @property
    def max_len(self) -> int:
        return self.layers[0].shape[0]

    def crop(self, n: int) -> None:
        """Keep the first n rows (0 <= n <= length)."""
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or not 0 <= n <= self.length:
            raise InputError(f"crop length must be an int in [0, {self.length}], got {n!r}")
        self.length = int(n)

    def gather_commit(self, start: int, rows: Iterable[int]) -> None:
        """DDTree KV compaction: in every layer move row start+rows[j] to row start+j; then
        length = start + len(rows).

        rows are offsets into the verified block [start, length); any order, no repeats needed.
        """
        r = np.asarray(list(rows) if not isinstance(rows, np.ndarray) else rows)
        if r.ndim != 1 or (r.size and r.dtype.kind not in "iu"):
            raise InputError("gather_commit rows must be a 1-D list of ints")
        if (isinstance(start, bool) or not isinstance(start, (int, np.integer))
                or not 0 <= start <= self.length):
            raise InputError(f"gather_commit start must be an int in [0, {self.length}], got {start!r}")
        if r.size and (r.min() < 0 or start + r.max() >= self.length):
            raise InputError(f"gather_commit rows must lie in [0, {self.length - start})")
        src = start + r.astype(np.int64)
        for buf in self.layers:
            buf[start:start + r.size] = buf[src]  # fancy indexing copies first: overlap is safe
        self.length = int(start + r.size)


@dataclass
class ForwardOut:
    logits: np.ndarray                                                          # [S, V] in the compute dtype
    hidden: dict[int, np.ndarray] = field(default_factory=dict)                 # layer k -> its output [S, M]
    routes: dict[int, np.ndarray] = field(default_factory=dict)                 # MoE layer -> experts [S, K]


def _check_tokens(cfg: ModelConfig, tokens: Any) -> np.ndarray:
    t = np.asarray(tokens)
    if t.ndim != 1 or t.size == 0 or t.dtype.kind not in "iu":
        raise InputError("tokens must be a non-empty 1-D sequence of ints")
    if t.min() < 0 or t.max() >= cfg.vocab_size:
        raise InputError(f"token ids must lie in [0, {cfg.vocab_size}), got {int(t.min())}..{int(t.max())}")
    return t.astype(np.int64)


def decoder_layer(cfg: ModelConfig, weights: dict[str, Any], layer: int, h: np.ndarray, positions: np.ndarray,
                  cache: LatentCache, visibility: np.ndarray | None = None, attention: Any = mla_absorbed,
                  routes: dict[int, np.ndarray] | None = None) -> np.ndarray:
    """One block on h [S, M]: h + MLA(RMSNorm(h)), then + FFN(RMSNorm(.)) (dense or MoE by layer).

    Writes the S latent rows of ``layer`` at cache.length without advancing it (``forward`` does).
    """
    p = f"layers.{layer}."
    h = h + attention(cfg, weights, layer, rmsnorm(h, weight(weights, p + "attn_norm"), cfg.rms_norm_eps),
                      positions, cache, visibility)                           # [S, M]
    x = rmsnorm(h, weight(weights, p + "ffn_norm"), cfg.rms_norm_eps)         # [S, M]
    if cfg.is_moe_layer(layer):
        return h + moe(cfg, weights, layer, x, routes)
    return h + dense_mlp(cfg, weights, layer, x)


def forward(cfg: ModelConfig, weights: dict[str, Any], tokens: Any, cache: LatentCache,
            positions: Any = None, visibility: np.ndarray | None = None, capture: Iterable[int] = (),
            attn: str = "absorbed", dtype: Any = np.float32) -> ForwardOut:
    """Run S new tokens through the model, appending their latent rows to ``cache`` (length += S).

    tokens: [S] ints in [0, V); positions: [S] ints (default cache.length + arange(S));
    visibility: None (causal among the new rows) or bool [S, S] (row i sees new row j; all cached
    rows are always visible); capture: layer indices whose block outputs [S, M] are returned in
    ``hidden`` (every MoE layer's routed expert ids [S, K] go to ``routes``); attn: "absorbed" or
    "naive"; dtype: float32 or float64 (weights are cast on use).
    """
    dt = np.dtype(dtype)
    if dt not in _DTYPES:
        raise InputError(f"dtype must be float32 or float64, got {dt}")
    if attn not in _ATTN:
        raise InputError(f"attn must be one of {', '.join(_ATTN)}, got {attn!r}")
    toks = _check_tokens(cfg, tokens)
    s = toks.size
    if positions is None:
        pos = cache.length + np.arange(s, dtype=np.int64)
    else:
        pos = np.asarray(positions)
        if pos.shape != (s,) or pos.dtype.kind not in "iu" or (s and pos.min() < 0):
            raise InputError(f"positions must be {s} non-negative ints")
    capture = {int(k) for k in capture}
    if any(not 0 <= k < cfg.num_hidden_layers for k in capture):
        raise InputError(f"capture layers must lie in [0, {cfg.num_hidden_layers})")
    attention = _ATTN[attn]

    h = gather_rows(weight(weights, "embed"), toks, dt)                         # [S, M]
    hidden: dict[int, np.ndarray] = {}
    routes: dict[int, np.ndarray] = {}
    for layer in range(cfg.num_hidden_layers):
        h = decoder_layer(cfg, weights, layer, h, pos, cache, visibility, attention, routes)
        if layer in capture:
            hidden[layer] = h.copy()
    cache.length += s
    logits = linear(weights, "head", rmsnorm(h, weight(weights, "norm"), cfg.rms_norm_eps))  # [S, V]
    return ForwardOut(logits=logits, hidden=hidden, routes=routes)

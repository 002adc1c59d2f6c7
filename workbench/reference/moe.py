"""Feed-forward blocks: the dense SwiGLU MLP and the noaux_tc sigmoid-routed MoE with shared experts.

Legend: S rows (tokens), M model width, E routed experts, G routing groups, K experts per token.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..config import ModelConfig
from .layers import as_array, sigmoid, swiglu, weight


def _topk_lowest_index(values: np.ndarray, k: int) -> np.ndarray:
    """Indices [S, k] of the k largest entries per row, ties broken towards the lowest index."""
    return np.argsort(-values, axis=-1, kind="stable")[:, :k]


def moe_gate(cfg: ModelConfig, x: np.ndarray, gate_w: Any, bias: Any) -> tuple[np.ndarray, np.ndarray]:
    """The noaux_tc router: (topk_idx int64 [S, K], topk_w [S, K]) for x [S, M], gate_w [E, M], bias [E].

    Scores s = sigmoid(x @ gate_w.T) in float32 (float64 when x is float64). Selection uses s + bias,
    restricted to the ``topk_group`` best groups when n_group > 1 (group score = sum of its top-2
    biased scores); weights come from the unbiased s, renormalised when norm_topk_prob
    (denominator + 1e-20) and multiplied by routed_scaling_factor. Ties go to the lowest index.
    """
    dt = np.promote_types(x.dtype, np.float32)
    s_rows, e = x.shape[0], cfg.n_routed_experts
    scores = sigmoid(x.astype(dt, copy=False) @ as_array(gate_w, dt).T)         # [S, E]
    choice = scores + as_array(bias, dt)                                        # [S, E] selection only
    if cfg.n_group > 1:
        grouped = choice.reshape(s_rows, cfg.n_group, e // cfg.n_group)         # [S, G, E/G]
        top2 = -np.sort(-grouped, axis=-1)[..., :2]                             # [S, G, <=2]
        keep = _topk_lowest_index(top2.sum(axis=-1), cfg.topk_group)            # [S, topk_group]
        group_ok = np.zeros((s_rows, cfg.n_group), dtype=bool)
        np.put_along_axis(group_ok, keep, True, axis=-1)                        # [S, G]
        choice = np.where(np.repeat(group_ok, e // cfg.n_group, axis=-1), choice, -np.inf)  # [S, E]
    idx = _topk_lowest_index(choice, cfg.num_experts_per_tok)                   # [S, K]
    w = np.take_along_axis(scores, idx, axis=-1)                                # [S, K] unbiased
    if cfg.norm_topk_prob:
        w = w / (w.sum(axis=-1, keepdims=True) + dt.type(1e-20))
    return idx.astype(np.int64), w * dt.type(cfg.routed_scaling_factor)


def dense_mlp(cfg: ModelConfig, weights: dict[str, Any], layer: int, x: np.ndarray) -> np.ndarray:
    """The dense SwiGLU of layers < first_k_dense_replace: x [S, M] -> [S, M]."""
    return swiglu(weights, f"layers.{layer}.ffn", x)


def moe(cfg: ModelConfig, weights: dict[str, Any], layer: int, x: np.ndarray,
        routes: dict[int, np.ndarray] | None = None) -> np.ndarray:
    """MoE block: sum_k w_k Expert_{idx_k}(x) + SharedExperts(x); x [S, M] -> [S, M] in x's dtype.

    Experts are summed in increasing expert index (HF's order); the routed scaling factor is
    already inside w and never touches the shared experts (one fused MLP of n_shared * width).
    Only the experts some row routes to are read from ``weights``; ``routes[layer]`` gets idx [S, K].
    """
    p = f"layers.{layer}.ffn"
    gate_w, bias = weight(weights, p + ".gate"), weight(weights, p + ".gate_bias")
    idx, w = moe_gate(cfg, x, gate_w, bias)                                     # [S, K], [S, K]
    if routes is not None:
        routes[layer] = idx
    y = np.zeros_like(x)                                                        # [S, M]
    for e in np.unique(idx):
        rows, slot = np.nonzero(idx == e)                                       # tokens routed to e
        out = swiglu(weights, f"{p}.experts.{e}", x[rows])                      # [s_e, M]
        y[rows] += w[rows, slot, None].astype(x.dtype) * out
    if cfg.n_shared_experts > 0:
        y += swiglu(weights, p + ".shared", x)
    return y


def analytic_coverage(n_experts: int, k: int, n_tokens: Any) -> np.ndarray:
    """Expected distinct experts touched by n tokens each choosing k of E uniformly: E(1-(1-k/E)^n)."""
    n = np.asarray(n_tokens, dtype=np.float64)
    return n_experts * (1.0 - (1.0 - k / n_experts) ** n)

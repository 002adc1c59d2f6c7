"""Speculative-decoding analysis for the notebooks: acceptance histograms, one captured DDTree round,
MoE expert coverage of a tree and a weight-bytes model of the verify step.

Legend: N tree nodes (root not counted), K experts per token, E routed experts, M model width.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..config import ModelConfig
from ..ddtree.config import GREEDY
from ..ddtree.speculative import RoundStats, RoundTrace, ddtree_generate
from ..errors import InputError
from ..reference.layers import rmsnorm
from ..reference.moe import analytic_coverage, moe_gate  # noqa: F401  (analytic_coverage: the notebooks')


def accepted_histogram(rounds: list[RoundStats], max_len: int) -> np.ndarray:
    """counts[a] = rounds whose accepted length (bonus included) is a, for a in 0..max_len."""
    lens = np.asarray([r.accepted_len for r in rounds], dtype=np.int64)
    if lens.size and (lens.min() < 0 or lens.max() > max_len):
        raise InputError(f"accepted lengths must lie in [0, {max_len}]")
    return np.bincount(lens, minlength=max_len + 1)


class _Captured(Exception):
    """Ends the generation once the wanted round is captured (its later rounds are not needed)."""


def capture_round(cfg: ModelConfig, weights: dict[str, Any], prompt: Any, n_tokens: int,
                  round_index: int, drafter: str = "dflash", budget: int = 16, dtype: Any = np.float32,
                  **drafter_kw: Any) -> RoundTrace:
    """Round ``round_index`` (0-based) of greedy ``ddtree_generate``, as its ``on_round`` saw it.

    InputError when ``n_tokens`` are generated before that round.
    """
    rounds: list[RoundTrace] = []

    def keep(trace: RoundTrace) -> None:
        rounds.append(trace)
        if len(rounds) > round_index:
            raise _Captured

    try:
        ddtree_generate(cfg, weights, prompt, n_tokens, drafter, budget, GREEDY, dtype, on_round=keep,
                        **drafter_kw)
    except _Captured:
        return rounds[round_index]
    raise InputError(f"{n_tokens} tokens were done after {len(rounds)} rounds, before round {round_index}")


# ---- MoE expert coverage ---------------------------------------------------------------------

def coverage_curve(expert_idx: np.ndarray, sizes: Any) -> np.ndarray:
    """Distinct experts among the first n rows of expert_idx [T, K], for each n in ``sizes``."""
    idx = np.asarray(expert_idx)
    return np.asarray([np.unique(idx[:int(n)]).size for n in sizes], dtype=np.int64)


def random_router(cfg: ModelConfig, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """A random noaux_tc router: gate [E, M] ~ N(0, 1/M) float32 and a small bias [E] (float32)."""
    rng = np.random.default_rng(seed)
    gate = rng.standard_normal((cfg.n_routed_experts, cfg.hidden_size), dtype=np.float32)
    gate /= np.float32(np.sqrt(cfg.hidden_size))
    return gate, (0.01 * rng.standard_normal(cfg.n_routed_experts)).astype(np.float32)


def token_features(tokens: Any, width: int, seed: int) -> np.ndarray:
    """RMS-normalised random embedding rows [T, width] float32, one fixed row per token id."""
    toks = np.asarray(tokens, dtype=np.int64)
    vocab_ids, inverse = np.unique(toks, return_inverse=True)
    rows = np.stack([np.random.default_rng([seed, int(t)]).standard_normal(width, dtype=np.float32)
                     for t in vocab_ids]) if vocab_ids.size else np.zeros((0, width), np.float32)
    return rmsnorm(rows[inverse], np.ones(width, np.float32), 1e-6).astype(np.float32)


def route_tokens(cfg: ModelConfig, tokens: Any, gate: np.ndarray, bias: np.ndarray, seed: int) -> np.ndarray:
    """Expert ids [T, K] the reference router (moe_gate) picks for the tokens' feature rows."""
    return moe_gate(cfg, token_features(tokens, cfg.hidden_size, seed), gate, bias)[0]


# ---- weight bytes streamed by one forward (memory-bound model) ---------------------------------

def forward_weight_bytes(cfg: ModelConfig, experts_touched: float, group_size: int = 32) -> float:
    """Bytes of weights one forward reads when it touches ``experts_touched`` routed experts per MoE layer.

    MLA, router, embedding row and head in bf16 (2 B); dense and shared MLPs and routed experts in
    INT4 (0.5 B per weight plus one float16 scale per group). Activations and the KV cache are left out.
    """
    d, h = cfg.hidden_size, cfg.num_attention_heads
    q = (d * cfg.q_lora_rank + cfg.q_lora_rank * h * cfg.qk_head_dim if cfg.q_lora_rank
         else d * h * cfg.qk_head_dim)
    attn = q + d * cfg.kv_cache_dim + cfg.kv_lora_rank * h * (cfg.qk_nope_head_dim + cfg.v_head_dim) \
        + h * cfg.v_head_dim * d
    int4 = 0.5 + 2.0 / group_size
    mlp = 3 * d * cfg.intermediate_size * int4
    expert = 3 * d * cfg.moe_intermediate_size * int4
    moe = cfg.n_routed_experts * d * 2 + cfg.n_shared_experts * expert + experts_touched * expert
    dense_layers = cfg.first_k_dense_replace
    total = cfg.num_hidden_layers * attn * 2 + dense_layers * mlp + cfg.n_moe_layers * moe
    return float(total + cfg.vocab_size * d * 2)

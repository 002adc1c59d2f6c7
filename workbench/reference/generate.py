"""Greedy autoregressive generation with the reference model: one prefill, then one token per step."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..config import ModelConfig
from ..errors import InputError
from .model import LatentCache, forward


@dataclass
class GreedyResult:
    tokens: np.ndarray     # [n] int64 generated ids
    margins: np.ndarray    # [n] top-1 minus top-2 logit at each step (float64)
    logits: np.ndarray     # [n, V] the logits each token was chosen from (compute dtype)
    cache: LatentCache | None = None   # prompt + n - 1 rows (the last token is never fed back)


def check_prompt(cfg: ModelConfig, prompt: Any) -> np.ndarray:
    """The prompt as int64 [P], or InputError: a non-empty sequence of ints in [0, vocab_size)."""
    items = list(prompt) if not isinstance(prompt, np.ndarray) else list(prompt.ravel())
    if not items:
        raise InputError("prompt is empty")
    for t in items:
        if isinstance(t, (bool, np.bool_)) or not isinstance(t, (int, np.integer)):
            raise InputError(f"prompt tokens must be ints, got {t!r}")
        if not 0 <= t < cfg.vocab_size:
            raise InputError(f"prompt token {int(t)} is outside the vocabulary [0, {cfg.vocab_size})")
    if isinstance(prompt, np.ndarray) and prompt.ndim != 1:
        raise InputError("prompt must be 1-D")
    return np.asarray(items, dtype=np.int64)


def top2_margin(logits: np.ndarray) -> float:
    """top-1 minus top-2 of a [V] logit row (inf when V == 1)."""
    if logits.shape[-1] < 2:
        return float("inf")
    top = np.partition(np.asarray(logits, dtype=np.float64), -2)[-2:]
    return float(top[1] - top[0])


def greedy_generate(cfg: ModelConfig, weights: dict[str, Any], prompt: Any, n_tokens: int,
                    dtype: Any = np.float32) -> GreedyResult:
    """Generate n_tokens greedily (argmax, lowest id on ties) after prefilling the prompt in one forward."""
    toks = check_prompt(cfg, prompt)
    if isinstance(n_tokens, bool) or not isinstance(n_tokens, (int, np.integer)) or n_tokens < 0:
        raise InputError(f"n_tokens must be a non-negative int, got {n_tokens!r}")
    dt = np.dtype(dtype)
    out_tokens = np.zeros(n_tokens, dtype=np.int64)
    margins = np.zeros(n_tokens, dtype=np.float64)
    all_logits = np.zeros((n_tokens, cfg.vocab_size), dtype=dt)
    if n_tokens == 0:
        return GreedyResult(out_tokens, margins, all_logits)
    cache = LatentCache.empty(cfg, toks.size + n_tokens, dtype=dt)
    step_in = toks
    for i in range(n_tokens):
        row = forward(cfg, weights, step_in, cache, dtype=dt).logits[-1]       # [V]
        out_tokens[i] = int(np.argmax(row))
        margins[i] = top2_margin(row)
        all_logits[i] = row
        step_in = out_tokens[i:i + 1]
    return GreedyResult(out_tokens, margins, all_logits, cache)


def divergence(golden: list[int], reference: list[int]) -> int | None:
    """First index where the two token lists differ (a length difference counts); None if equal."""
    for i, (a, b) in enumerate(zip(golden, reference, strict=False)):
        if a != b:
            return i
    return None if len(golden) == len(reference) else min(len(golden), len(reference))

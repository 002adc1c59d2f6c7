"""Autoregressive sampling on the numpy reference: the baseline DDTree must match in distribution.

Legend: P prompt length, V vocabulary.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..config import ModelConfig
from ..reference.model import LatentCache, forward
from .config import GREEDY, SamplingParams
from .inputs import check_run
from .sampling import make_rng, sample_tokens


@dataclass
class ARResult:
    tokens: np.ndarray      # [n] int64 generated ids
    logits: np.ndarray      # [n, V] the logits each token was drawn from (compute dtype)


def ar_generate(cfg: ModelConfig, weights: dict[str, Any], prompt: Any, n_tokens: int,
                sampling: SamplingParams = GREEDY, dtype: Any = np.float32, *,
                progress: Callable[[int, int, str], None] | None = None) -> ARResult:
    """Prefill the prompt, then one token per forward: argmax at T = 0 (equal to ``greedy_generate``),
    else a draw from softmax(logits / T) with the run's one Generator (seeded by ``sampling.seed``).
    progress: called as ``progress(tokens done, n_tokens, "token")`` after each token."""
    toks, n_tokens = check_run(cfg, prompt, n_tokens, sampling)
    rng = make_rng(sampling)
    cache = LatentCache.empty(cfg, len(toks) + n_tokens, dtype)
    out = np.zeros(n_tokens, dtype=np.int64)
    all_logits = np.zeros((n_tokens, cfg.vocab_size), dtype=dtype)
    step_in = toks
    for i in range(n_tokens):
        row = forward(cfg, weights, step_in, cache, dtype=dtype).logits[-1:]          # [1, V]
        out[i] = sample_tokens(row, sampling, rng)[0]
        all_logits[i] = row[0]
        step_in = out[i:i + 1]
        if progress is not None:
            progress(i + 1, n_tokens, "token")
    return ARResult(tokens=out, logits=all_logits)

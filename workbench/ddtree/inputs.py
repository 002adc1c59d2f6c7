"""Validation of a generation request, shared by AR and DDTree: one-line InputError, never assert."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..config import ModelConfig
from ..errors import InputError
from ..reference.generate import check_prompt
from .config import SamplingParams


def check_run(cfg: ModelConfig, prompt: Any, n_tokens: Any, sampling: Any) -> tuple[np.ndarray, int]:
    """(prompt as int64 [P], n_tokens) or InputError; positions must stay under max_position_embeddings."""
    toks = check_prompt(cfg, prompt)
    if isinstance(n_tokens, bool) or not isinstance(n_tokens, (int, np.integer)) or n_tokens < 1:
        raise InputError(f"n_tokens must be a positive int, got {n_tokens!r}")
    if not isinstance(sampling, SamplingParams):
        raise InputError(f"sampling must be a SamplingParams, got {type(sampling).__name__}")
    if len(toks) + int(n_tokens) > cfg.max_position_embeddings:
        raise InputError(f"prompt + n_tokens = {len(toks) + int(n_tokens)} exceeds max_position_embeddings "
                         f"{cfg.max_position_embeddings}")
    return toks, int(n_tokens)


MAX_BUDGET = 1024       # tree nodes per round; a verify step's memory grows with budget x context


def check_budget(budget: Any, cfg: ModelConfig | None = None) -> int:
    """budget as an int in [1, MAX_BUDGET] and (given ``cfg``) below max_position_embeddings."""
    if isinstance(budget, bool) or not isinstance(budget, (int, np.integer)) or not 1 <= budget <= MAX_BUDGET:
        raise InputError(f"budget must be an int in [1, {MAX_BUDGET}], got {budget!r}")
    if cfg is not None and budget >= cfg.max_position_embeddings:
        raise InputError(f"budget {budget} does not fit the model's context (max_position_embeddings "
                         f"{cfg.max_position_embeddings})")
    return int(budget)

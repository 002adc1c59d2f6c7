"""What the speculative loop needs from a drafter, and the one place a drafter is picked by name.

Legend: L drafted positions (block_size - 1), V vocabulary, P prompt length.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from ..config import ConfigError, ModelConfig
from ..errors import InputError
from ..reference.generate import greedy_generate
from .config import DRAFTERS, DrafterConfig
from .dflash import DFlashDrafter, default_drafter_config
from .oracle import OracleDrafter


class Drafter(Protocol):
    """A drafter proposes draft logits [L, V] for the block after ``state.bonus`` at ``state.start``.

    capture: target layers whose outputs it needs (``state.new_features`` holds them concatenated).
    """

    block_size: int
    capture: tuple[int, ...]

    def propose(self, state: Any) -> np.ndarray: ...


def make_drafter(drafter: Any, cfg: ModelConfig, weights: dict[str, Any], prompt: np.ndarray, n_tokens: int,
                 dtype: Any, *, drafter_config: Any = None, oracle_p: float = 1.0,
                 oracle_seed: int = 0, continuation: Any = None) -> Drafter:
    """A Drafter for one generation: ``drafter`` is "dflash", "oracle" or already a Drafter (returned as is).

    dflash: ``drafter_config`` (DrafterConfig or its dict; default ``default_drafter_config(cfg)``) and the
    ``drafter.*`` weights, else InputError. oracle: block size from ``drafter_config`` (or the default);
    true continuation = ``continuation`` (generated ids, at least n_tokens + L of them for full knowledge)
    or the target's greedy tokens computed here.
    """
    if not isinstance(drafter, str):
        if not callable(getattr(drafter, "propose", None)):
            raise InputError(f"drafter must be one of {', '.join(DRAFTERS)} or a Drafter, got {drafter!r}")
        return drafter
    if drafter not in DRAFTERS:
        raise InputError(f"unknown drafter {drafter!r} (choose from {', '.join(DRAFTERS)})")
    dcfg = _drafter_config(cfg, drafter_config)
    if drafter == "dflash":
        return DFlashDrafter(cfg, weights, dcfg, len(prompt) + n_tokens + dcfg.block_size, dtype)
    if continuation is None:
        continuation = greedy_generate(cfg, weights, prompt, n_tokens + dcfg.n_drafted, dtype=dtype).tokens
    sequence = np.concatenate([prompt, np.asarray(continuation, dtype=np.int64)])
    return OracleDrafter(sequence, cfg.vocab_size, dcfg.block_size, oracle_p, oracle_seed)


def _drafter_config(cfg: ModelConfig, dc: Any) -> DrafterConfig:
    try:
        dcfg = default_drafter_config(cfg) if dc is None else (
            dc if isinstance(dc, DrafterConfig) else DrafterConfig.from_dict(dc))
        dcfg.check_target(cfg)
    except ConfigError as e:
        raise InputError(str(e)) from None
    return dcfg

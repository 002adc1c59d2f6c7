"""Runtime knobs of speculative decoding: the DFlash drafter's shape and the sampling settings.

``DrafterConfig`` travels in a bundle's ``meta["drafter"]`` (``to_dict`` / ``from_dict`` round-trip
exactly). ``SamplingParams`` is a per-run setting and never stored with weights.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from ..config import ConfigError, ModelConfig, check_int, check_number, config_from_dict

DRAFTERS = ("dflash", "oracle")


@dataclass(frozen=True)
class DrafterConfig:
    """Shape of the DFlash-style block drafter (hidden size = the target's D, no embed/head of its own).

    block_size: B_s, the block [bonus, MASK x (B_s - 1)]; L = B_s - 1 drafted positions (>= 2).
    target_layer_ids: target decoder layers whose outputs feed ``fc`` (id k = output of layer k).
    mask_token_id: a real row of the target's embedding table used for the MASK positions.
    rope_theta: plain RoPE (no YaRN) on interleaved pairs, like the target's rope layout.
    """
    block_size: int = 8
    n_layers: int = 1
    n_heads: int = 4
    head_dim: int = 32
    intermediate_size: int = 256
    target_layer_ids: tuple[int, ...] = (0, 1, 2)
    mask_token_id: int = 0
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6

    def __post_init__(self) -> None:
        for name in ("block_size", "n_layers", "n_heads", "head_dim", "intermediate_size"):
            check_int(name, getattr(self, name), 1)
        if self.block_size < 2:
            raise ConfigError(f"block_size must be >= 2, got {self.block_size}")
        if self.head_dim % 2:
            raise ConfigError(f"head_dim must be even (RoPE pairs), got {self.head_dim}")
        ids = self.target_layer_ids
        if not isinstance(ids, tuple) or not ids:
            raise ConfigError(f"target_layer_ids must be a non-empty tuple, got {ids!r}")
        for k in ids:
            if isinstance(k, bool) or not isinstance(k, int) or k < 0:
                raise ConfigError(f"target_layer_ids must hold non-negative ints, got {ids!r}")
        if len(set(ids)) != len(ids):
            raise ConfigError(f"target_layer_ids must be distinct, got {ids!r}")
        check_int("mask_token_id", self.mask_token_id, 0)
        for name in ("rope_theta", "rms_norm_eps"):
            check_number(name, getattr(self, name))

    @property
    def n_drafted(self) -> int:               # L: positions 1..B_s-1 of the block get logits
        return self.block_size - 1

    @property
    def n_features(self) -> int:              # tapped target layers; fc is [D, n_features * D]
        return len(self.target_layer_ids)

    def check_target(self, cfg: ModelConfig) -> None:
        """ConfigError unless the tapped layers and the mask id exist in the target ``cfg``."""
        bad = [k for k in self.target_layer_ids if k >= cfg.num_hidden_layers]
        if bad:
            raise ConfigError(f"drafter target_layer_ids {bad} not below num_hidden_layers "
                              f"{cfg.num_hidden_layers}")
        if self.mask_token_id >= cfg.vocab_size:
            raise ConfigError(f"drafter mask_token_id {self.mask_token_id} not below vocab_size "
                              f"{cfg.vocab_size}")

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["target_layer_ids"] = list(self.target_layer_ids)    # JSON has no tuples
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> DrafterConfig:
        if isinstance(d, dict) and isinstance(d.get("target_layer_ids"), list):
            d = {**d, "target_layer_ids": tuple(d["target_layer_ids"])}    # JSON has no tuples
        return config_from_dict(cls, d, "drafter config")


@dataclass(frozen=True)
class SamplingParams:
    """temperature 0: greedy (argmax, ties to the lowest id); > 0: sample softmax(logits / T).

    seed: seeds the one numpy Generator of a run (PCG64).
    """
    temperature: float = 0.0
    seed: int = 0

    def __post_init__(self) -> None:
        t = self.temperature
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t < 0:
            raise ConfigError(f"temperature must be a finite number >= 0, got {t!r}")
        check_int("seed", self.seed, 0)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


GREEDY = SamplingParams()       # the default of every generate function: T = 0

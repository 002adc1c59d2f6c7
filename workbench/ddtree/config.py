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
ROPE_LAYOUTS = ("interleaved", "rotate_half")


@dataclass(frozen=True)
class DrafterConfig:
    """Shape of the DFlash-style block drafter (hidden size = the target's D, no embed/head of its own).

    block_size: B_s, the block [bonus, MASK x (B_s - 1)]; L = B_s - 1 drafted positions (>= 2).
    target_layer_ids: target decoder layers whose outputs feed ``fc`` (id k = output of layer k, which
      HF's ``output_hidden_states`` list holds at index k + 1, after the embedding).
    mask_token_id: a real row of the target's embedding table used for the MASK positions.
    n_kv_heads: KV heads shared by n_heads / n_kv_heads query heads each (GQA); None = n_heads.
    rope_layout: "interleaved" pairs dims (2i, 2i+1) (the target's layout); "rotate_half" pairs
      (i, i + d/2) (Qwen3 / HF ``rotate_half``).
    rope_scaling_type: None (plain theta^(-2i/d)) or "yarn" with rope_factor,
      original_max_position_embeddings, beta_fast / beta_slow (the ramp) and rope_attention_factor
      (the factor on cos and sin, HF's resolved ``attention_factor``).
    own_norm: the drafter's own final RMSNorm (``drafter.norm``, rms_norm_eps) before the target head,
      instead of the target's final norm.

    The defaults of the fields from n_kv_heads on are the workbench's first drafter layout (no GQA,
    interleaved plain RoPE, target norm); ``to_dict`` leaves them out when they hold those defaults, so
    older bundles' ``meta["drafter"]`` read back, and write, unchanged.
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
    n_kv_heads: int | None = None
    rope_layout: str = "interleaved"
    rope_scaling_type: str | None = None
    rope_factor: float = 1.0
    original_max_position_embeddings: int = 4096
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    rope_attention_factor: float = 1.0
    own_norm: bool = False

    def __post_init__(self) -> None:
        for name in ("block_size", "n_layers", "n_heads", "head_dim", "intermediate_size",
                     "original_max_position_embeddings"):
            check_int(name, getattr(self, name), 1)
        if self.block_size < 2:
            raise ConfigError(f"block_size must be >= 2, got {self.block_size}")
        if self.head_dim % 2:
            raise ConfigError(f"head_dim must be even (RoPE pairs), got {self.head_dim}")
        if self.n_kv_heads is not None:
            check_int("n_kv_heads", self.n_kv_heads, 1)
            if self.n_heads % self.n_kv_heads:
                raise ConfigError(f"n_heads {self.n_heads} is not a multiple of n_kv_heads {self.n_kv_heads}")
        ids = self.target_layer_ids
        if not isinstance(ids, tuple) or not ids:
            raise ConfigError(f"target_layer_ids must be a non-empty tuple, got {ids!r}")
        for k in ids:
            if isinstance(k, bool) or not isinstance(k, int) or k < 0:
                raise ConfigError(f"target_layer_ids must hold non-negative ints, got {ids!r}")
        if len(set(ids)) != len(ids):
            raise ConfigError(f"target_layer_ids must be distinct, got {ids!r}")
        check_int("mask_token_id", self.mask_token_id, 0)
        for name in ("rope_theta", "rms_norm_eps", "rope_factor", "beta_fast", "beta_slow",
                     "rope_attention_factor"):
            check_number(name, getattr(self, name))
        if self.rope_layout not in ROPE_LAYOUTS:
            raise ConfigError(f"rope_layout must be one of {', '.join(ROPE_LAYOUTS)}, "
                              f"got {self.rope_layout!r}")
        if self.rope_scaling_type not in (None, "yarn"):
            raise ConfigError(f"rope_scaling_type must be None or 'yarn', got {self.rope_scaling_type!r}")
        if self.rope_scaling_type is None and (self.rope_factor, self.rope_attention_factor) != (1.0, 1.0):
            raise ConfigError("rope_factor and rope_attention_factor need rope_scaling_type 'yarn'")
        if self.rope_factor < 1:
            raise ConfigError(f"rope_factor must be >= 1, got {self.rope_factor}")
        if not isinstance(self.own_norm, bool):
            raise ConfigError(f"own_norm must be true or false, got {self.own_norm!r}")

    @property
    def kv_heads(self) -> int:                # Hkv: KV heads (n_heads without GQA)
        return self.n_heads if self.n_kv_heads is None else self.n_kv_heads

    @property
    def group(self) -> int:                   # query heads per KV head; query head h reads KV head h // group
        return self.n_heads // self.kv_heads

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
        """JSON-ready fields; those after rms_norm_eps only where they differ from their defaults."""
        d = dataclasses.asdict(self)
        d["target_layer_ids"] = list(self.target_layer_ids)    # JSON has no tuples
        fields = dataclasses.fields(self)
        first = [f.name for f in fields].index("n_kv_heads")
        for f in fields[first:]:                                # the first layout's values: left out
            if d[f.name] == f.default and type(d[f.name]) is type(f.default):
                del d[f.name]
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

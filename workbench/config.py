"""One frozen model configuration shared by the reference, kernels, engine, tests and notebooks.

Field names follow Hugging Face's ``DeepseekV3Config`` (and so the Kimi-K2 ``config.json``), so a
config round-trips through ``config.json`` without a translation table. Every behaviour that
differs between implementations is an explicit field, never inferred from a size.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any


class ConfigError(ValueError):
    """A configuration value is invalid or inconsistent (one-line message)."""


MAX_SIZE = 2**31 - 1        # every size field of ModelConfig fits a 32-bit int


def check_int(name: str, v: Any, lo: int) -> None:
    """ConfigError unless ``v`` is an int (a bool is not) >= lo; lo is 1 (positive) or 0 (non-negative)."""
    if isinstance(v, bool) or not isinstance(v, int) or v < lo:
        raise ConfigError(f"{name} must be a {'positive' if lo == 1 else 'non-negative'} int, got {v!r}")


def check_number(name: str, v: Any, positive: bool = True) -> None:
    """ConfigError unless ``v`` is a finite int or float, > 0 (positive) or >= 0."""
    if (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)
            or (v <= 0 if positive else v < 0)):
        raise ConfigError(f"{name} must be a {'positive' if positive else 'non-negative'} finite number, "
                          f"got {v!r}")


def config_from_dict(cls: type, d: Any, what: str) -> Any:
    """``cls(**d)`` for a JSON object; ConfigError for a non-object, an unknown field or a missing one."""
    if not isinstance(d, dict):
        raise ConfigError(f"{what} must be a JSON object")
    unknown = sorted(set(d) - {f.name for f in dataclasses.fields(cls)})
    if unknown:
        raise ConfigError(f"unknown {what} field(s): {', '.join(unknown)}")
    try:
        return cls(**d)
    except TypeError as e:
        raise ConfigError(f"bad {what}: {e}") from None


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int = 163840                 # V
    hidden_size: int = 7168                  # D, residual stream width
    intermediate_size: int = 18432           # dense SwiGLU width (layers < first_k_dense_replace)
    moe_intermediate_size: int = 2048        # width of one routed expert (and of each shared one)
    num_hidden_layers: int = 61
    num_attention_heads: int = 64            # H; MLA has as many KV heads (one latent "KV head")
    q_lora_rank: int | None = 1536           # None: a plain q_proj (Moonlight); else q_a/q_b pair
    kv_lora_rank: int = 512                  # C, latent width cached per token
    qk_nope_head_dim: int = 128              # per-head query/key dims without RoPE
    qk_rope_head_dim: int = 64               # R, RoPE dims; one shared rope key per token
    v_head_dim: int = 128
    n_routed_experts: int = 384              # E
    n_shared_experts: int = 1                # shared experts fused into one MLP of n * moe width
    num_experts_per_tok: int = 8             # K, routed experts per token
    first_k_dense_replace: int = 1           # layers [0, k) use the dense MLP
    n_group: int = 1                         # routing groups (1: no group limit, as in K2)
    topk_group: int = 1                      # groups kept per token
    routed_scaling_factor: float = 2.827     # multiplies routed weights only, never shared
    norm_topk_prob: bool = True              # renormalise the top-k sigmoid scores
    scoring_func: str = "sigmoid"
    topk_method: str = "noaux_tc"            # selection uses score + e_score_correction_bias
    rms_norm_eps: float = 1e-6               # eps of the block and final RMSNorms
    mla_norm_eps: float = 1e-6               # eps of q_a / kv_a norms (HF hard-codes 1e-6)
    rope_theta: float = 50000.0
    rope_scaling_type: str | None = "yarn"   # None or "yarn"
    rope_factor: float = 32.0
    original_max_position_embeddings: int = 4096
    beta_fast: float = 1.0
    beta_slow: float = 1.0
    mscale: float = 1.0
    mscale_all_dim: float = 1.0
    max_position_embeddings: int = 131072
    tie_word_embeddings: bool = False
    bos_token_id: int | None = 163584
    eos_token_id: int | None = 163585
    model_type: str = "kimi_k2"              # "kimi_k2" or "deepseek_v3"

    def __post_init__(self) -> None:
        ints = ("vocab_size", "hidden_size", "intermediate_size", "moe_intermediate_size",
                "num_hidden_layers", "num_attention_heads", "kv_lora_rank", "qk_nope_head_dim",
                "qk_rope_head_dim", "v_head_dim", "n_routed_experts", "num_experts_per_tok",
                "n_group", "topk_group", "original_max_position_embeddings",
                "max_position_embeddings")
        for name in ints:
            check_int(name, getattr(self, name), 1)
        for name in ("n_shared_experts", "first_k_dense_replace"):
            check_int(name, getattr(self, name), 0)
        for name in (*ints, "n_shared_experts", "first_k_dense_replace", "q_lora_rank"):
            v = getattr(self, name)
            if isinstance(v, int) and v > MAX_SIZE:      # kernels index with 32-bit ints
                raise ConfigError(f"{name} is {v}, over the cap {MAX_SIZE}")
        if self.q_lora_rank is not None and (isinstance(self.q_lora_rank, bool)
                                             or not isinstance(self.q_lora_rank, int)
                                             or self.q_lora_rank < 1):
            raise ConfigError(f"q_lora_rank must be None or a positive int, got {self.q_lora_rank!r}")
        if self.qk_rope_head_dim % 2:
            raise ConfigError(f"qk_rope_head_dim must be even, got {self.qk_rope_head_dim}")
        if self.num_experts_per_tok > self.n_routed_experts:
            raise ConfigError("num_experts_per_tok exceeds n_routed_experts")
        if self.n_routed_experts % self.n_group:
            raise ConfigError(f"n_routed_experts {self.n_routed_experts} is not divisible by "
                              f"n_group {self.n_group}")
        if self.topk_group > self.n_group:
            raise ConfigError("topk_group exceeds n_group")
        if self.num_experts_per_tok > self.topk_group * (self.n_routed_experts // self.n_group):
            raise ConfigError("num_experts_per_tok exceeds the experts left by the group limit")
        if self.first_k_dense_replace > self.num_hidden_layers:
            raise ConfigError("first_k_dense_replace exceeds num_hidden_layers")
        if self.scoring_func != "sigmoid" or self.topk_method != "noaux_tc":
            raise ConfigError("only scoring_func='sigmoid' with topk_method='noaux_tc' is supported")
        if self.rope_scaling_type not in (None, "yarn"):
            raise ConfigError(f"rope_scaling_type must be None or 'yarn', got {self.rope_scaling_type!r}")
        if self.model_type not in ("kimi_k2", "deepseek_v3"):
            raise ConfigError(f"model_type must be 'kimi_k2' or 'deepseek_v3', got {self.model_type!r}")
        for name in ("rms_norm_eps", "mla_norm_eps", "rope_theta", "rope_factor",
                     "routed_scaling_factor", "beta_fast", "beta_slow"):
            check_number(name, getattr(self, name))
        for name in ("mscale", "mscale_all_dim"):
            check_number(name, getattr(self, name), positive=False)
        for name in ("norm_topk_prob", "tie_word_embeddings"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{name} must be true or false, got {getattr(self, name)!r}")
        for name in ("bos_token_id", "eos_token_id"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
                raise ConfigError(f"{name} must be None or a non-negative int, got {v!r}")
        if self.tie_word_embeddings:
            raise ConfigError("tie_word_embeddings=True is not supported (K2 unties lm_head)")

    # ---- derived sizes -------------------------------------------------------------------
    @property
    def qk_head_dim(self) -> int:            # 192 for K2: nope + rope
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def kv_cache_dim(self) -> int:           # 576 for K2: latent + rope key per token per layer
        return self.kv_lora_rank + self.qk_rope_head_dim

    @property
    def n_moe_layers(self) -> int:
        return self.num_hidden_layers - self.first_k_dense_replace

    def is_moe_layer(self, layer: int) -> bool:
        return layer >= self.first_k_dense_replace

    @property
    def softmax_scale(self) -> float:
        """qk_head_dim^-0.5, times mscale(factor, mscale_all_dim)^2 under YaRN (never 576)."""
        scale = self.qk_head_dim ** -0.5
        if self.rope_scaling_type == "yarn" and self.mscale_all_dim:
            m = yarn_mscale(self.rope_factor, self.mscale_all_dim)
            scale *= m * m
        return scale

    def replace(self, **changes: Any) -> ModelConfig:
        return dataclasses.replace(self, **changes)

    # ---- HF config.json ------------------------------------------------------------------
    def to_hf_dict(self) -> dict[str, Any]:
        """A ``config.json`` dict that transformers' DeepseekV3Config loads."""
        d: dict[str, Any] = {
            "architectures": ["DeepseekV3ForCausalLM"],
            "model_type": self.model_type,
            "hidden_act": "silu",
            "attention_bias": False,
            "attention_dropout": 0.0,
            "initializer_range": 0.02,
            "use_cache": True,
            "torch_dtype": "float32",
        }
        for f in dataclasses.fields(self):
            if f.name in _NOT_HF:
                continue
            d[f.name] = getattr(self, f.name)
        d["num_key_value_heads"] = self.num_attention_heads
        d["rope_scaling"] = None if self.rope_scaling_type is None else {
            "type": "yarn", "rope_type": "yarn", "factor": self.rope_factor,
            "original_max_position_embeddings": self.original_max_position_embeddings,
            "beta_fast": self.beta_fast, "beta_slow": self.beta_slow,
            "mscale": self.mscale, "mscale_all_dim": self.mscale_all_dim,
        }
        d["rope_interleave"] = True
        return d

    @classmethod
    def from_hf_dict(cls, d: dict[str, Any]) -> ModelConfig:
        """Read a DeepseekV3 / Kimi-K2 ``config.json`` dict (rope_scaling or rope_parameters)."""
        if not isinstance(d, dict):
            raise ConfigError("config.json must hold a JSON object")
        model_type = d.get("model_type", "deepseek_v3")
        if model_type not in ("kimi_k2", "deepseek_v3"):
            raise ConfigError(f"unsupported model_type {model_type!r} (want deepseek_v3 or kimi_k2)")
        names = {f.name for f in dataclasses.fields(cls)} - _NOT_HF
        kw = {k: d[k] for k in names if k in d}
        kw["model_type"] = model_type
        rope = d.get("rope_scaling")
        params = d.get("rope_parameters")
        for key, v in (("rope_scaling", rope), ("rope_parameters", params)):
            if v is not None and not isinstance(v, dict):
                raise ConfigError(f"config.json: {key} must be a JSON object or null, got {v!r:.60}")
        rope = rope or None
        if rope is None and params:
            if "rope_theta" in params:
                kw["rope_theta"] = params["rope_theta"]
            if params.get("rope_type", params.get("type")) not in (None, "default"):
                rope = params
        where = "rope_scaling" if d.get("rope_scaling") else "rope_parameters"
        if rope is None:
            kw["rope_scaling_type"] = None
        else:
            kind = rope.get("rope_type", rope.get("type"))
            if kind != "yarn":
                raise ConfigError(f"config.json: unsupported {where} type {kind!r:.40} (only yarn)")
            if rope.get("factor") is None:
                raise ConfigError(f"config.json: {where} of type yarn needs a factor")
            kw["rope_scaling_type"] = "yarn"
            kw["rope_factor"] = _hf_number(f"{where}.factor", rope["factor"])
            for k in ("original_max_position_embeddings", "beta_fast", "beta_slow", "mscale",
                      "mscale_all_dim"):
                if rope.get(k) is not None:
                    kw[k] = rope[k]
        for k in ("rope_theta", "rope_factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim",
                  "routed_scaling_factor", "rms_norm_eps"):
            if k in kw:
                kw[k] = _hf_number(k, kw[k])
        try:
            return cls(**kw)
        except TypeError as e:
            raise ConfigError(f"bad config.json: {e}") from None

    def to_dict(self) -> dict[str, Any]:
        """All fields, for bundles and run metadata (exact round trip with from_dict)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ModelConfig:
        return config_from_dict(cls, d, "model config")


def _hf_number(field: str, v: Any) -> float:
    """A config.json float field as a finite float; ConfigError naming the field otherwise."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ConfigError(f"config.json: {field} must be a number, got {v!r:.40}")
    try:
        f = float(v)
    except OverflowError:
        f = math.inf
    if not math.isfinite(f):
        raise ConfigError(f"config.json: {field} must be a finite number, got {v!r:.40}")
    return f


_NOT_HF = {"rope_scaling_type", "rope_factor", "original_max_position_embeddings", "beta_fast",
           "beta_slow", "mscale", "mscale_all_dim", "mla_norm_eps"}


def yarn_mscale(factor: float, mscale: float) -> float:
    """YaRN attention temperature m = 0.1 * mscale * ln(factor) + 1 (1 when factor <= 1)."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


# ---- presets ---------------------------------------------------------------------------------
# tiny / tiny2: the sizes marked fixed in docs/configs.md are kept as they are; the other dims are
# chosen so each FP32 golden bundle (with drafter weights) stays under 8 MB.
PRESETS: dict[str, ModelConfig] = {
    "k2": ModelConfig(),
    "k2_slice": ModelConfig(num_hidden_layers=3),  # real dims: 1 dense + 2 MoE layers
    # Kimi-K2.6's text model: K2-Thinking's backbone (YaRN factor 64, 256k context, eps 1e-5) with
    # beta_fast 32 and eos <|im_end|>
    "k2_6": ModelConfig(rope_factor=64.0, beta_fast=32.0, beta_slow=1.0, max_position_embeddings=262144,
                        rms_norm_eps=1e-5, eos_token_id=163586),
    "tiny": ModelConfig(
        vocab_size=512, hidden_size=128, intermediate_size=256, moe_intermediate_size=64,
        num_hidden_layers=4, num_attention_heads=4, q_lora_rank=48, kv_lora_rank=32,
        qk_nope_head_dim=16, qk_rope_head_dim=16, v_head_dim=16, n_routed_experts=8,
        n_shared_experts=1, num_experts_per_tok=2, first_k_dense_replace=1,
        max_position_embeddings=4096, bos_token_id=None, eos_token_id=None,
    ),
    "tiny2": ModelConfig(
        vocab_size=400, hidden_size=192, intermediate_size=256, moe_intermediate_size=32,
        num_hidden_layers=6, num_attention_heads=6, q_lora_rank=64, kv_lora_rank=48,
        qk_nope_head_dim=16, qk_rope_head_dim=16, v_head_dim=16, n_routed_experts=6,
        n_shared_experts=1, num_experts_per_tok=2, first_k_dense_replace=2,
        routed_scaling_factor=2.5, rope_theta=10000.0, rope_factor=40.0, beta_fast=32.0,
        beta_slow=1.0, max_position_embeddings=4096, bos_token_id=None, eos_token_id=None,
        model_type="deepseek_v3",
    ),
}


def preset(name: str) -> ModelConfig:
    if name not in PRESETS:
        raise ConfigError(f"unknown preset {name!r} (choose from {', '.join(PRESETS)})")
    return PRESETS[name]

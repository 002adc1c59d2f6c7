"""Model weights: the one internal <-> Hugging Face name map, expected shapes and checks, seeded random
init. HF checkpoint folders are read and written by hf_checkpoint.py (and opened lazily by
workbench.checkpoint), which build on this module, never the other way round.

A weights dict maps internal DeepSeek-style names (docs/conventions.md) to arrays: float ndarrays,
bfloat16 arrays from ``workbench.bundle`` (``.bits`` uint16, ``.float32()``), and for INT4 W4A16
linears ``X.packed`` (int32 [N, K/8]) with ``X.scale`` ([N, K/G], float16 or bfloat16) instead of X.
Names under ``drafter.`` belong to the engine and never go to HF checkpoints.
"""

from __future__ import annotations

import re
import zlib
from typing import Any

import numpy as np

from .config import ModelConfig
from .errors import InputError

# ---- the name map ----------------------------------------------------------------------------
_TOP = {"embed": "model.embed_tokens.weight", "norm": "model.norm.weight", "head": "lm_head.weight"}
# per-layer internal suffix -> HF leaf under model.layers.{i}.
_LAYER = {
    "attn_norm": "input_layernorm.weight",
    "ffn_norm": "post_attention_layernorm.weight",
    "attn.wq": "self_attn.q_proj.weight",
    "attn.wq_a": "self_attn.q_a_proj.weight",
    "attn.q_norm": "self_attn.q_a_layernorm.weight",
    "attn.wq_b": "self_attn.q_b_proj.weight",
    "attn.wkv_a": "self_attn.kv_a_proj_with_mqa.weight",
    "attn.kv_norm": "self_attn.kv_a_layernorm.weight",
    "attn.wkv_b": "self_attn.kv_b_proj.weight",
    "attn.wo": "self_attn.o_proj.weight",
    "ffn.w1": "mlp.gate_proj.weight",
    "ffn.w3": "mlp.up_proj.weight",
    "ffn.w2": "mlp.down_proj.weight",
    "ffn.gate": "mlp.gate.weight",
    "ffn.gate_bias": "mlp.gate.e_score_correction_bias",
    "ffn.shared.w1": "mlp.shared_experts.gate_proj.weight",
    "ffn.shared.w3": "mlp.shared_experts.up_proj.weight",
    "ffn.shared.w2": "mlp.shared_experts.down_proj.weight",
}
_NOT_LINEAR = {"embed", "norm", "attn_norm", "ffn_norm", "attn.q_norm", "attn.kv_norm", "ffn.gate",
               "ffn.gate_bias"}
_EXPERT = {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"}
_TOP_REV = {v: k for k, v in _TOP.items()}
_LAYER_REV = {v: k for k, v in _LAYER.items()}
_EXPERT_REV = {v: k for k, v in _EXPERT.items()}
_IDX = r"(0|[1-9][0-9]*)"
_QUANT = ((".packed", "_packed"), (".scale", "_scale"))  # internal suffix, HF suffix after ".weight"


def _base_to_hf(base: str) -> tuple[str, bool] | None:
    """(HF name, is a linear) of an internal FP tensor name, or None."""
    if base in _TOP:
        return _TOP[base], base not in _NOT_LINEAR
    m = re.fullmatch(rf"layers\.{_IDX}\.(.+)", base)
    if m is None:
        return None
    i, rest = m.groups()
    if rest in _LAYER:
        return f"model.layers.{i}.{_LAYER[rest]}", rest not in _NOT_LINEAR
    e = re.fullmatch(rf"ffn\.experts\.{_IDX}\.(w[123])", rest)
    if e is not None:
        return f"model.layers.{i}.mlp.experts.{e.group(1)}.{_EXPERT[e.group(2)]}.weight", True
    return None


def to_hf_name(name: str) -> str:
    """Internal name -> HF name; ``X.packed`` / ``X.scale`` -> ``<hf X>_packed`` / ``_scale``.

    e.g. ``layers.3.ffn.experts.5.w1.packed`` -> ``model.layers.3.mlp.experts.5.gate_proj.weight_packed``.
    """
    base, hf_suffix = name, ""
    for suffix, hf in _QUANT:
        if name.endswith(suffix):
            base, hf_suffix = name[: -len(suffix)], hf
    mapped = _base_to_hf(base)
    if mapped is None or (hf_suffix and not mapped[1]):
        raise InputError(f"no Hugging Face name for tensor {name!r}")
    return mapped[0] + hf_suffix


def from_hf_name(hf_name: str) -> str:
    """HF name -> internal name (inverse of ``to_hf_name``); InputError for names outside the map."""
    base, suffix = hf_name, ""
    for internal, hf in _QUANT:
        if hf_name.endswith(".weight" + hf):
            base, suffix = hf_name[: -len(hf)], internal
    name = _TOP_REV.get(base)
    if name is None:
        m = re.fullmatch(rf"model\.layers\.{_IDX}\.(.+)", base)
        if m is not None:
            i, rest = m.groups()
            if rest in _LAYER_REV:
                name = f"layers.{i}.{_LAYER_REV[rest]}"
            else:
                e = re.fullmatch(rf"mlp\.experts\.{_IDX}\.(gate_proj|up_proj|down_proj)\.weight", rest)
                if e is not None:
                    name = f"layers.{i}.ffn.experts.{e.group(1)}.{_EXPERT_REV[e.group(2)]}"
    if name is None or (suffix and not is_linear_name(name)):
        raise InputError(f"unknown checkpoint tensor {hf_name!r}")
    return name + suffix


def is_linear_name(name: str) -> bool:
    """True for internal names of [out, in] projections (the ones that may be INT4-packed)."""
    mapped = _base_to_hf(name)
    return mapped is not None and mapped[1]


# ---- shapes and checks -----------------------------------------------------------------------
MAX_MODEL_TENSORS = 1 << 20    # K2 has ~71k; a config implying more is refused before listing them
MISSING_SLACK = 1024           # more missing tensors than this: refused by count, without listing them


def implied_tensor_count(cfg: ModelConfig) -> int:
    """How many FP tensors ``expected_shapes(cfg)`` lists, computed without listing them."""
    attn = 5 + (1 if cfg.q_lora_rank is None else 3)          # norms, kv_a, kv_norm, kv_b, o (+ q)
    dense = cfg.first_k_dense_replace
    moe = cfg.num_hidden_layers - dense
    per_moe = 2 + 3 * cfg.n_routed_experts + (3 if cfg.n_shared_experts else 0)
    return 3 + cfg.num_hidden_layers * (attn + 1) + dense * 3 + moe * per_moe


def implied_param_count(cfg: ModelConfig) -> int:
    """Parameters of the model ``cfg`` describes (Python int: never wraps), without listing tensors."""
    d, h, c, r = cfg.hidden_size, cfg.num_attention_heads, cfg.kv_lora_rank, cfg.qk_rope_head_dim
    hq = h * cfg.qk_head_dim
    q = hq * d if cfg.q_lora_rank is None else cfg.q_lora_rank * (d + 1 + hq)
    attn = 2 * d + q + (c + r) * d + c + h * (cfg.qk_nope_head_dim + cfg.v_head_dim) * c \
        + d * h * cfg.v_head_dim
    dense = cfg.first_k_dense_replace
    moe = cfg.num_hidden_layers - dense
    mi, e = cfg.moe_intermediate_size, cfg.n_routed_experts
    per_moe = e * d + e + 3 * d * mi * (e + cfg.n_shared_experts)
    return 2 * cfg.vocab_size * d + d + cfg.num_hidden_layers * attn + dense * 3 * d * cfg.intermediate_size \
        + moe * per_moe


def check_model_size(cfg: ModelConfig, tensors_held: int | None = None) -> None:
    """InputError when ``cfg`` implies more tensors than MAX_MODEL_TENSORS, or far more than the
    ``tensors_held`` a file actually holds (each expected tensor is one entry, or two when INT4):
    checked before anything is listed or allocated from the config's sizes. A few missing tensors
    are left to the caller, which names the first one."""
    n = implied_tensor_count(cfg)
    what = (f"{cfg.num_hidden_layers} layers x {cfg.n_routed_experts} experts declare {n} weight tensors")
    if n > MAX_MODEL_TENSORS:
        raise InputError(f"model config: {what} (cap {MAX_MODEL_TENSORS})")
    if tensors_held is not None and n > tensors_held + MISSING_SLACK:
        raise InputError(f"model config: {what}, the weights hold {tensors_held}")


def expected_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every FP tensor of the model with its shape, in canonical (checkpoint) order (InputError for a
    config implying more than MAX_MODEL_TENSORS)."""
    check_model_size(cfg)
    d, h, c, r = cfg.hidden_size, cfg.num_attention_heads, cfg.kv_lora_rank, cfg.qk_rope_head_dim
    out: dict[str, tuple[int, ...]] = {"embed": (cfg.vocab_size, d)}
    for i in range(cfg.num_hidden_layers):
        p = f"layers.{i}."
        out[p + "attn_norm"] = (d,)
        if cfg.q_lora_rank is None:
            out[p + "attn.wq"] = (h * cfg.qk_head_dim, d)
        else:
            out[p + "attn.wq_a"] = (cfg.q_lora_rank, d)
            out[p + "attn.q_norm"] = (cfg.q_lora_rank,)
            out[p + "attn.wq_b"] = (h * cfg.qk_head_dim, cfg.q_lora_rank)
        out[p + "attn.wkv_a"] = (c + r, d)
        out[p + "attn.kv_norm"] = (c,)
        out[p + "attn.wkv_b"] = (h * (cfg.qk_nope_head_dim + cfg.v_head_dim), c)
        out[p + "attn.wo"] = (d, h * cfg.v_head_dim)
        out[p + "ffn_norm"] = (d,)
        if not cfg.is_moe_layer(i):
            _mlp_shapes(out, p + "ffn.", d, cfg.intermediate_size)
            continue
        out[p + "ffn.gate"] = (cfg.n_routed_experts, d)
        out[p + "ffn.gate_bias"] = (cfg.n_routed_experts,)
        for e in range(cfg.n_routed_experts):
            _mlp_shapes(out, f"{p}ffn.experts.{e}.", d, cfg.moe_intermediate_size)
        if cfg.n_shared_experts:
            _mlp_shapes(out, p + "ffn.shared.", d, cfg.n_shared_experts * cfg.moe_intermediate_size)
    out["norm"] = (d,)
    out["head"] = (cfg.vocab_size, d)
    return out


def _mlp_shapes(out: dict[str, tuple[int, ...]], p: str, d: int, width: int) -> None:
    out[p + "w1"], out[p + "w3"], out[p + "w2"] = (width, d), (width, d), (d, width)


def is_bf16(a: Any) -> bool:
    """True for a bfloat16 bundle array (``.bits`` uint16 ndarray and ``.float32()``)."""
    return not isinstance(a, np.ndarray) and hasattr(a, "bits") and hasattr(a, "float32")


def tensor_shape(a: Any) -> tuple[int, ...]:
    return tuple(a.bits.shape) if is_bf16(a) else tuple(np.shape(a))


def _is_float(a: Any) -> bool:
    return is_bf16(a) or (isinstance(a, np.ndarray) and a.dtype.kind == "f")


def check_int4(name: str, shape: tuple[int, ...], packed: Any, scale: Any, values: bool = True) -> int:
    """Validate INT4 linear ``name`` of logical [N, K] shape; returns the group size G = K / scale columns.
    ``values`` False checks dtypes and shapes only (no data read)."""
    n, k = shape
    if k % 8:
        raise InputError(f"{name}: INT4 needs K divisible by 8, got K={k}")
    if not isinstance(packed, np.ndarray) or packed.dtype != np.int32 or packed.shape != (n, k // 8):
        raise InputError(f"{name}.packed must be int32 [{n}, {k // 8}], got "
                         f"{getattr(packed, 'dtype', type(packed).__name__)} {tensor_shape(packed)}")
    if scale is None:
        raise InputError(f"missing weight tensor {name + '.scale'!r}")
    ss = tensor_shape(scale)
    if not _is_float(scale) or len(ss) != 2 or ss[0] != n or ss[1] < 1 or k % ss[1]:
        raise InputError(f"{name}.scale must be float [{n}, K/G] (K={k} a multiple of its columns), got {ss}")
    if not values:
        return k // ss[1]
    s = scale.float32() if is_bf16(scale) else np.asarray(scale)
    if not (np.isfinite(s).all() and (s > 0).all()):
        raise InputError(f"{name}.scale must be finite and > 0")
    return k // ss[1]


def is_model_name(name: str) -> bool:
    """True for a name of the model's weights (plain, or ``X.packed`` / ``X.scale`` of a linear)."""
    base = name[: -len(".packed")] if name.endswith(".packed") else (
        name[: -len(".scale")] if name.endswith(".scale") else name)
    return _base_to_hf(base) is not None


def check_weights(cfg: ModelConfig, weights: dict[str, Any], values: bool = True) -> None:
    """One-line InputError on a missing, extra, wrong-dtype or wrong-shape tensor (``drafter.*`` skipped).

    The config's implied tensor count is compared with the tensors present first, so a tiny config
    declaring 10^9 layers fails at once instead of listing them. ``values`` False: dtypes and shapes
    only, no tensor data read (a bundle's table check).
    """
    check_model_size(cfg, sum(1 for k in weights if not k.startswith("drafter.")))
    allowed: set[str] = set()
    for name, shape in expected_shapes(cfg).items():
        allowed.update((name, name + ".packed", name + ".scale"))
        if name in weights:
            if name + ".packed" in weights:
                raise InputError(f"{name} is present both dense and INT4-packed")
            a = weights[name]
            if not _is_float(a):
                got = getattr(a, "dtype", type(a).__name__)
                raise InputError(f"{name} must be a float tensor, got {got}")
            if tensor_shape(a) != shape:
                raise InputError(f"{name} has shape {tensor_shape(a)}, expected {shape}")
        elif name + ".packed" in weights:
            if not is_linear_name(name):
                raise InputError(f"{name} is not a linear and cannot be INT4-packed")
            check_int4(name, shape, weights[name + ".packed"], weights.get(name + ".scale"), values)
        else:
            raise InputError(f"missing weight tensor {name!r}")
    extra = sorted(k for k in weights if k not in allowed and not k.startswith("drafter."))
    if extra:
        raise InputError(f"unexpected weight tensor {extra[0]!r}" + (f" (+{len(extra) - 1} more)"
                                                                     if len(extra) > 1 else ""))
    stray = sorted(k[:-6] for k in weights if k.endswith(".scale") and k[:-6] + ".packed" not in weights
                   and not k.startswith("drafter."))
    if stray:
        raise InputError(f"{stray[0]}.scale has no {stray[0]}.packed")


# ---- random init -----------------------------------------------------------------------------
_NORMS = ("attn_norm", "ffn_norm", "q_norm", "kv_norm")
HEAD_LOGIT_STD = 3.0  # logits of a random model ~ N(0, 3^2): clear top-1/top-2 margins for goldens


def random_weights(cfg: ModelConfig, seed: int, dtype: Any = np.float32) -> dict[str, np.ndarray]:
    """Deterministic seeded FP weights (each tensor from its own stream keyed by (seed, name)).

    Linears ~ N(0, 1/in) keep activations O(1) through every layer; embed ~ N(0, 1); lm_head gives
    logits of std ~ HEAD_LOGIT_STD; router ~ N(0, 1/M) with bias ~ N(0, 0.05^2); norms ~ 1 + N(0, 0.05^2).
    """
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise InputError(f"seed must be a non-negative int, got {seed!r}")
    out: dict[str, np.ndarray] = {}
    for name, shape in expected_shapes(cfg).items():
        rng = np.random.default_rng([int(seed), zlib.crc32(name.encode())])
        z = rng.standard_normal(shape)
        leaf = name.rsplit(".", 1)[-1]
        if name == "embed":
            a = z
        elif name == "head":
            a = z * (HEAD_LOGIT_STD / np.sqrt(shape[1]))
        elif leaf == "gate_bias":
            a = 0.05 * z
        elif name == "norm" or leaf in _NORMS:
            a = 1.0 + 0.05 * z
        else:  # linears and the router, [out, in]
            a = z / np.sqrt(shape[1])
        out[name] = a.astype(dtype)
    return out

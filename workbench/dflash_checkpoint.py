"""The public DFlash drafter folder (z-lab's DFlashDraftModel: config.json + safetensors) <-> a bundle's
``drafter.*`` tensors and ``DrafterConfig`` (docs/drafter.md, "The checkpoint format").

config.json is a Qwen3 config: hidden_size, num_hidden_layers, num_attention_heads, num_key_value_heads,
head_dim, intermediate_size, rms_norm_eps, rope_theta and rope_scaling (none or YaRN; transformers 5
nests both in rope_parameters), with the drafter's own keys in ``dflash_config`` (block_size,
mask_token_id, target_layer_ids; read from the top level where dflash_config lacks them). The layer is
always the public layout: rotate-half RoPE and the drafter's own final norm. What this workbench does not
implement (sliding-window or causal layers, DFlash2's extra modules, logit scaling or soft-capping,
attention biases, partial RoPE) is refused with one line. Tensors keep their stored dtype (bf16 stays
bfloat16). Export writes the same layout back; a drafter in the workbench's first layout is converted
exactly on the way (interleaved RoPE pairs become rotate-half ones by permuting each head's query and
key rows and their norms; the target's final norm becomes the drafter's own).
"""

from __future__ import annotations

import dataclasses
import math
import os
from pathlib import Path
from typing import Any

import numpy as np

from .config import ConfigError, ModelConfig
from .ddtree.config import DrafterConfig
from .ddtree.dflash import check_drafter_weights, drafter_shapes
from .errors import InputError
from .hf_checkpoint import _check_dest, _from_torch, _read_json, _write_checkpoint
from .weights import is_bf16

ARCHITECTURE = "DFlashDraftModel"
# the published layer's tensor names, local to one layer / at the top, against the bundle's drafter.*
LAYER_NAMES = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn.wq",
               "self_attn.k_proj": "attn.wk", "self_attn.v_proj": "attn.wv", "self_attn.o_proj": "attn.wo",
               "self_attn.q_norm": "attn.q_norm", "self_attn.k_norm": "attn.k_norm",
               "post_attention_layernorm": "ffn_norm", "mlp.gate_proj": "mlp.w1", "mlp.up_proj": "mlp.w3",
               "mlp.down_proj": "mlp.w2"}
TOP_NAMES = {"fc": "fc", "hidden_norm": "hidden_norm", "norm": "norm"}
_LAYER_HF = {v: k for k, v in LAYER_NAMES.items()}
_TOP_HF = {v: k for k, v in TOP_NAMES.items()}
DFLASH_KEYS = ("block_size", "mask_token_id", "target_layer_ids")
NEUTRAL = {"input_embedding_scale": 1.0, "output_multiplier": 1.0}   # implemented at these values only


def to_bundle_name(hf: str) -> str | None:
    """'layers.3.self_attn.q_proj.weight' -> 'drafter.layers.3.attn.wq'; None for a name outside the layer."""
    if not hf.endswith(".weight"):
        return None
    base = hf[: -len(".weight")]
    if base in TOP_NAMES:
        return "drafter." + TOP_NAMES[base]
    parts = base.split(".", 2)
    if len(parts) == 3 and parts[0] == "layers" and parts[1].isdigit() and parts[2] in LAYER_NAMES:
        return f"drafter.layers.{int(parts[1])}.{LAYER_NAMES[parts[2]]}"
    return None


def to_hf_name(name: str) -> str:
    """'drafter.layers.3.attn.wq' -> 'layers.3.self_attn.q_proj.weight' (the inverse of to_bundle_name)."""
    rest = name[len("drafter."):]
    if rest.startswith("layers."):
        _, i, local = rest.split(".", 2)
        return f"layers.{i}.{_LAYER_HF[local]}.weight"
    return _TOP_HF[rest] + ".weight"


# ---- config.json -> DrafterConfig -------------------------------------------------------------------

def _get(raw: dict, key: str, kind: type | tuple, default: Any = None, required: bool = False) -> Any:
    v = raw.get(key, default)
    if v is None and required:
        raise InputError(f"drafter config.json: {key} is missing")
    if v is not None and (isinstance(v, bool) and kind is not bool or not isinstance(v, kind)):
        raise InputError(f"drafter config.json: {key} = {v!r} is not a {getattr(kind, '__name__', 'number')}")
    return v


def _refuse_unsupported(raw: dict) -> None:
    arch = raw.get("architectures")
    if arch is not None and ARCHITECTURE not in (arch if isinstance(arch, list) else [arch]):
        raise InputError(f"drafter config.json: architectures {arch} is not {ARCHITECTURE} (only the plain "
                         "DFlash drafter is implemented)")
    if raw.get("model_type", "qwen3") != "qwen3":
        raise InputError(f"drafter config.json: model_type {raw['model_type']!r} is not qwen3")
    types = raw.get("layer_types") or []
    if any(t != "full_attention" for t in types) or raw.get("use_sliding_window"):
        raise InputError("drafter config.json: sliding-window layers (layer_types sliding_attention) are "
                         "not implemented")
    if raw.get("is_causal"):
        raise InputError("drafter config.json: causal drafter layers (is_causal true) are not implemented")
    if raw.get("attention_bias"):
        raise InputError("drafter config.json: attention biases are not implemented")
    if raw.get("hidden_act", "silu") != "silu":
        raise InputError(f"drafter config.json: hidden_act {raw['hidden_act']!r} is not silu")


def _rope(raw: dict) -> dict[str, Any]:
    """The DrafterConfig RoPE fields of config.json's rope_theta and rope_scaling / rope_parameters."""
    params = raw.get("rope_parameters") if isinstance(raw.get("rope_parameters"), dict) else None
    rs = params if params is not None else raw.get("rope_scaling")
    if rs is not None and not isinstance(rs, dict):
        raise InputError("drafter config.json: rope_scaling must be a JSON object or null")
    rs = rs or {}
    theta = rs.get("rope_theta", raw.get("rope_theta", 10000.0))
    kind = rs.get("rope_type", rs.get("type", "default"))
    if rs.get("partial_rotary_factor", raw.get("partial_rotary_factor", 1.0)) != 1.0:
        raise InputError("drafter config.json: partial RoPE (partial_rotary_factor) is not implemented")
    number = isinstance(theta, (int, float)) and not isinstance(theta, bool)
    out: dict[str, Any] = {"rope_theta": float(theta) if number else theta}     # DrafterConfig checks it
    if kind in (None, "default"):
        return out
    if kind != "yarn":
        raise InputError(f"drafter config.json: rope type {kind!r} is not implemented (default or yarn)")
    if rs.get("truncate", True) is not True:
        raise InputError("drafter config.json: YaRN without truncation (truncate false) is not implemented")
    orig = _get(rs, "original_max_position_embeddings", int, required=True)
    factor = rs.get("factor")
    if factor is None:                                  # transformers' fallback
        factor = _get(raw, "max_position_embeddings", int, required=True) / orig
    att = rs.get("attention_factor")
    if att is None:                                     # transformers' rule
        ms, ms_all = rs.get("mscale"), rs.get("mscale_all_dim")
        att = _mscale(factor, ms) / _mscale(factor, ms_all) if ms and ms_all else _mscale(factor, 1.0)
    out.update(rope_scaling_type="yarn", rope_factor=float(factor), original_max_position_embeddings=orig,
               beta_fast=float(rs.get("beta_fast") or 32.0), beta_slow=float(rs.get("beta_slow") or 1.0),
               rope_attention_factor=float(att))
    return out


def _mscale(factor: float, m: float) -> float:
    return 1.0 if factor <= 1 else 0.1 * m * math.log(factor) + 1.0


def drafter_config_from_json(raw: Any, cfg: ModelConfig) -> DrafterConfig:
    """The DrafterConfig of a DFlash drafter's config.json for the target ``cfg``; InputError (one line)
    for anything malformed, mismatched with the target, or not implemented."""
    if not isinstance(raw, dict):
        raise InputError("drafter config.json must be a JSON object")
    _refuse_unsupported(raw)
    dfl = raw.get("dflash_config") or {}
    if not isinstance(dfl, dict):
        raise InputError("drafter config.json: dflash_config must be a JSON object")
    for key, val in dfl.items():
        if key in NEUTRAL and val != NEUTRAL[key] or key == "final_logit_softcapping" and val:
            raise InputError(f"drafter config.json: dflash_config.{key} = {val!r} is not implemented")
        if key not in DFLASH_KEYS and key not in NEUTRAL and key != "final_logit_softcapping":
            raise InputError(f"drafter config.json: dflash_config.{key} is not implemented")
    dm = _get(raw, "hidden_size", int, required=True)
    if dm != cfg.hidden_size:
        raise InputError(f"drafter hidden_size {dm} differs from the target's {cfg.hidden_size}")
    vocab = _get(raw, "vocab_size", int)
    if vocab is not None and vocab != cfg.vocab_size:
        raise InputError(f"drafter vocab_size {vocab} differs from the target's {cfg.vocab_size}")
    heads = _get(raw, "num_attention_heads", int, required=True)
    ids = dfl.get("target_layer_ids", raw.get("target_layer_ids"))
    if not isinstance(ids, list):
        raise InputError("drafter config.json: dflash_config.target_layer_ids must be a list")
    try:
        dcfg = DrafterConfig(
            block_size=_get(dfl, "block_size", int, raw.get("block_size", 16)),
            n_layers=_get(raw, "num_hidden_layers", int, required=True), n_heads=heads,
            n_kv_heads=_get(raw, "num_key_value_heads", int, heads),
            head_dim=_get(raw, "head_dim", int, dm // heads),
            intermediate_size=_get(raw, "intermediate_size", int, required=True),
            target_layer_ids=tuple(ids),
            mask_token_id=_get(dfl, "mask_token_id", int, raw.get("mask_token_id"), required=True),
            rms_norm_eps=float(_get(raw, "rms_norm_eps", (int, float), 1e-6)),
            rope_layout="rotate_half", own_norm=True, **_rope(raw))
        dcfg.check_target(cfg)
    except ConfigError as e:
        raise InputError(f"drafter config.json: {e}") from None
    return dcfg


def drafter_config_to_json(cfg: ModelConfig, dcfg: DrafterConfig, dtype: str) -> dict[str, Any]:
    """config.json of the public layout for ``dcfg`` (rotate-half RoPE and an own norm assumed)."""
    raw: dict[str, Any] = {
        "architectures": [ARCHITECTURE], "model_type": "qwen3", "hidden_size": cfg.hidden_size,
        "num_hidden_layers": dcfg.n_layers, "num_attention_heads": dcfg.n_heads,
        "num_key_value_heads": dcfg.kv_heads, "head_dim": dcfg.head_dim,
        "intermediate_size": dcfg.intermediate_size, "hidden_act": "silu", "attention_bias": False,
        "rms_norm_eps": dcfg.rms_norm_eps, "vocab_size": cfg.vocab_size,
        "max_position_embeddings": cfg.max_position_embeddings, "rope_theta": dcfg.rope_theta,
        "rope_scaling": None, "layer_types": ["full_attention"] * dcfg.n_layers, "use_sliding_window": False,
        "tie_word_embeddings": False, "num_target_layers": cfg.num_hidden_layers, "torch_dtype": dtype,
        "dflash_config": {"block_size": dcfg.block_size, "mask_token_id": dcfg.mask_token_id,
                          "target_layer_ids": list(dcfg.target_layer_ids)}}
    if dcfg.rope_scaling_type == "yarn":
        raw["rope_scaling"] = {"rope_type": "yarn", "factor": dcfg.rope_factor,
                               "original_max_position_embeddings": dcfg.original_max_position_embeddings,
                               "beta_fast": dcfg.beta_fast, "beta_slow": dcfg.beta_slow,
                               "attention_factor": dcfg.rope_attention_factor}
    return raw


# ---- folders ------------------------------------------------------------------------------------------

def _tensors(d: Path) -> dict[str, Any]:
    """Every tensor of the folder's *.safetensors files (hf name -> array; bf16 -> bundle bfloat16)."""
    from safetensors import SafetensorError, safe_open
    files = sorted(d.glob("*.safetensors"))
    if not files:
        raise InputError(f"{d}: no *.safetensors files")
    out: dict[str, Any] = {}
    for f in files:
        try:
            with safe_open(str(f), framework="pt") as st:
                for k in st.keys():
                    if k in out:
                        raise InputError(f"{d}: tensor {k} appears in more than one file")
                    out[k] = _from_torch(st.get_tensor(k), k)
        except (OSError, SafetensorError) as e:
            raise InputError(f"{f}: not a readable safetensors file ({e})") from None
    return out


def load_dflash_drafter(path: str | os.PathLike, cfg: ModelConfig) -> tuple[DrafterConfig, dict[str, Any]]:
    """(DrafterConfig, ``drafter.*`` tensors) of the DFlash drafter folder ``path`` for the target ``cfg``."""
    d = Path(path)
    if not d.is_dir():
        raise InputError(f"{d}: not a directory")
    dcfg = drafter_config_from_json(_read_json(d / "config.json"), cfg)
    weights = {}
    for hf, a in _tensors(d).items():
        name = to_bundle_name(hf)
        if name is None:
            raise InputError(f"{d}: tensor {hf} is not part of the DFlash layer (not implemented)")
        weights[name] = a
    missing = [to_hf_name(n) for n in drafter_shapes(cfg, dcfg) if n not in weights]
    if missing:
        raise InputError(f"{d}: missing tensor {missing[0]}" + (f" (and {len(missing) - 1} more)"
                                                               if len(missing) > 1 else ""))
    extra = [to_hf_name(n) for n in weights if n not in drafter_shapes(cfg, dcfg)]
    if extra:
        raise InputError(f"{d}: tensor {extra[0]} does not fit the config ({dcfg.n_layers} layers)")
    check_drafter_weights(cfg, dcfg, weights)
    return dcfg, weights


def _permute_rows(a: Any, heads: int, perm: np.ndarray) -> Any:
    """Each head's d rows (or a [d] norm) of ``a`` reordered by ``perm``, in a's own storage (bf16 bits)."""
    bits = a.bits if is_bf16(a) else np.asarray(a)
    d = perm.size
    out = bits.reshape(heads, d, -1)[:, perm].reshape(bits.shape) if bits.ndim == 2 else bits[perm]
    return type(a)(out) if is_bf16(a) else out


def to_public_layout(cfg: ModelConfig, dcfg: DrafterConfig,
                     tensors: dict[str, Any]) -> tuple[DrafterConfig, dict[str, Any]]:
    """(config, drafter.* tensors) in the public layout, the same function as given: a first-layout
    drafter's interleaved pairs (2i, 2i+1) move to (i, i + d/2) in every head's wq / wk rows and q / k
    norms, and the target's final ``norm`` becomes ``drafter.norm`` (its eps must equal the drafter's)."""
    out = {k: v for k, v in tensors.items() if k.startswith("drafter.")}
    if dcfg.rope_layout == "interleaved":
        d = dcfg.head_dim
        perm = np.concatenate([np.arange(0, d, 2), np.arange(1, d, 2)])         # new dim j <- old dim perm[j]
        for i in range(dcfg.n_layers):
            p = f"drafter.layers.{i}.attn."
            out[p + "wq"] = _permute_rows(out[p + "wq"], dcfg.n_heads, perm)
            out[p + "wk"] = _permute_rows(out[p + "wk"], dcfg.kv_heads, perm)
            out[p + "q_norm"] = _permute_rows(out[p + "q_norm"], 1, perm)
            out[p + "k_norm"] = _permute_rows(out[p + "k_norm"], 1, perm)
    if not dcfg.own_norm:
        if dcfg.rms_norm_eps != cfg.rms_norm_eps:
            raise InputError(f"the drafter's eps {dcfg.rms_norm_eps} differs from the target norm's "
                             f"{cfg.rms_norm_eps}: one eps serves both in the DFlash format")
        out["drafter.norm"] = tensors["norm"]
    return dataclasses.replace(dcfg, rope_layout="rotate_half", own_norm=True), out


def dflash_folder(cfg: ModelConfig, dcfg: DrafterConfig,
                  tensors: dict[str, Any]) -> tuple[dict[str, Any], list[tuple[str, Any]]]:
    """(config.json, [(tensor name, array)]) of the DFlash folder for a bundle's drafter (``tensors``: its
    drafter.* and, for the first layout, the target's ``norm``); InputError for INT4-packed linears."""
    packed = sorted(k for k in tensors if k.startswith("drafter.") and k.endswith(".packed"))
    if packed:
        raise InputError(f"{packed[0]} is INT4-packed; the DFlash format holds 16-bit drafters only")
    pub, out = to_public_layout(cfg, dcfg, tensors)
    check_drafter_weights(cfg, pub, out)
    dtype = "bfloat16" if is_bf16(out["drafter.fc"]) else np.dtype(np.asarray(out["drafter.fc"]).dtype).name
    names = drafter_shapes(cfg, pub)
    return drafter_config_to_json(cfg, pub, dtype), [(to_hf_name(n), out[n]) for n in names]


def write_dflash_folder(path: str | os.PathLike, folder: tuple[dict[str, Any], list]) -> list[str]:
    """Write a ``dflash_folder`` at ``path`` (which must not exist or be empty), atomically; returns the
    file names (config.json, model.safetensors)."""
    _check_dest(Path(path))
    return _write_checkpoint(Path(path), folder[0], [folder[1]])


def save_dflash_drafter(path: str | os.PathLike, cfg: ModelConfig, dcfg: DrafterConfig,
                        tensors: dict[str, Any]) -> list[str]:
    """``write_dflash_folder(path, dflash_folder(cfg, dcfg, tensors))``."""
    return write_dflash_folder(path, dflash_folder(cfg, dcfg, tensors))
